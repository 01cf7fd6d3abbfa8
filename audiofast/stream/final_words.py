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

from audiofast.asr.types import Word
from audiofast.asr.word_timing import ends_sentence, trim_pauses

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
