"""Word times of a live stream's finals, timed as offline words are.

Offline word timing gives a pause to the word before it and trims what is longer than twice
the median word at a sentence's edge (``word_timing.trim_pauses``). A live final is a slice of
that: often one or two words, cut wherever LocalAgreement or VAD cut it. So the stream keeps
what offline has from the whole text: the speaker's rate (the last ``HEARD_WORDS`` words'
durations), whether the previous final ended a sentence, and where its last word ended; and a
line's last word runs into the silence VAD heard after it, as offline's runs to the next word.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from audiofast.asr.tokenizer import WhisperTokenizer
from audiofast.asr.types import Word
from audiofast.asr.word_timing import ends_sentence, split_words, trim_pauses

HEARD_WORDS = 200  # the speaking rate for pause trimming: this many recent final words


class FinalWords:
    def __init__(self) -> None:
        self._heard: deque[float] = deque(maxlen=HEARD_WORDS)  # untrimmed word durations
        self._said_until = 0.0  # where the last final word ended (stream seconds)
        self._sentence_ended = True  # ... and whether it ended a sentence

    def time(self, words: list[Word], silent_to: float | None = None) -> list[dict]:
        """``words`` of one final, untrimmed (each runs to the next's start), in stream
        seconds, as the final's ``words``. ``silent_to``: the final closes its utterance and
        VAD heard silence after it up to there."""
        heard = list(self._heard)
        self._heard.extend(w.end - w.start for w in words if w.end > w.start)
        if silent_to is not None and words:
            words = [*words[:-1], replace(words[-1], end=max(words[-1].end, silent_to))]
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
    return [Word(offset + spans[word[0]][0], offset + spans[word[-1]][1],
                 tokenizer.decode([tokens[i] for i in word]), _mean([probs[i] for i in word]))
            for word in words]


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 4) if known else None
