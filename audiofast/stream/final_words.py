"""Word times of a live stream's finals, timed as offline words are.

Offline word timing gives a pause before the next word to the word before it (not one before
a "," or "."), and trims what is longer than twice the median word at a sentence's edge
(``word_timing.trim_pauses``). A live final is a slice of that: often one or two words, cut
wherever LocalAgreement or VAD cut it. So the stream keeps what offline has from the whole
text: the speaker's rate (the last ``HEARD_WORDS`` words' durations), whether the previous
final ended a sentence, and where its last word ended.
"""

from __future__ import annotations

from collections import deque

from audiofast.asr.tokenizer import WhisperTokenizer
from audiofast.asr.types import Word
from audiofast.asr.word_timing import ends_sentence, is_closing, split_words, trim_pauses

HEARD_WORDS = 200  # the speaking rate for pause trimming: this many recent final words


class FinalWords:
    def __init__(self) -> None:
        self._heard: deque[float] = deque(maxlen=HEARD_WORDS)  # untrimmed word durations
        self._said_until = 0.0  # where the last final word ended (stream seconds)
        self._sentence_ended = True  # ... and whether it ended a sentence

    def time(self, words: list[Word]) -> list[dict]:
        """``words`` of one final, untrimmed (each runs to the next's start), in stream
        seconds, as the final's ``words``."""
        heard = list(self._heard)
        self._heard.extend(w.end - w.start for w in words if w.end > w.start)
        timed = trim_pauses(words, heard, opens_sentence=self._sentence_ended)
        if words:
            self._sentence_ended = ends_sentence(words[-1])
        out = []
        for w in timed:
            if w.word.strip():  # words never run back into what an earlier final said
                begin = max(w.start, self._said_until)
                out.append({"w": w.word.strip(), "start": round(begin, 3),
                            "end": round(max(w.end, begin), 3), "p": w.probability})
        if out:
            self._said_until = out[-1]["end"]
        return out


def timed_words(tokens: list[int], spans: list[tuple[float, float]], probs: list[float | None],
                offset: float, tokenizer: WhisperTokenizer) -> list[Word]:
    """A hypothesis's text tokens as timed words (``offset`` + their spans: stream seconds;
    probability = the mean of its tokens'), untrimmed: each word runs to the next's start."""
    text_at = [i for i, t in enumerate(tokens) if t < tokenizer.eot]
    words, k = [], 0  # token indices of each word, as word timing groups them
    for group in split_words([tokens[i] for i in text_at], tokenizer):
        words.append(text_at[k:k + len(group)])
        k += len(group)
    # a word ends with its last token that is not closing punctuation: the pause a "," or
    # "." spans is no part of it (as offline, word_timing.py)
    ends = [[i for i in word if not is_closing(tokenizer.decode([tokens[i]]))] or word
            for word in words]
    return [Word(offset + spans[word[0]][0], offset + spans[body[-1]][1],
                 tokenizer.decode([tokens[i] for i in word]), _mean([probs[i] for i in word]))
            for word, body in zip(words, ends, strict=True)]


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 4) if known else None
