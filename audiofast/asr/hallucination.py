"""Skipping Whisper's hallucinations next to long silences (``--hallucination-silence-threshold``).

On silence, music or noise Whisper often writes something anyway: a "Thank you.", a phrase
from the prompt, a sentence it never heard. Such text shows in its word timing: words the
model is unsure of (low probability), squeezed into a few milliseconds or stretched over
seconds. faster-whisper's rule, followed here: a segment whose words look like that and that
borders on a silent stretch longer than the threshold (nothing decoded there) is a suspected
hallucination; it is dropped with whatever the window decoded after it, and the loop seeks
past it, so the audio after it is decoded again in a window of its own.
"""

from __future__ import annotations

from audiofast.asr.types import Segment, Word

LOW_PROBABILITY = 0.15
SHORT_WORD_S = 0.133
LONG_WORD_S = 2.0
PUNCTUATION = "\"'“¿([{-\"'.。,，!！?？:：”)]}、"


def word_anomaly(word: Word) -> float:
    """How unlike real speech a timed word looks (0: not at all)."""
    duration = word.end - word.start
    score = 0.0
    if word.probability < LOW_PROBABILITY:
        score += 1.0
    if duration < SHORT_WORD_S:
        score += (SHORT_WORD_S - duration) * 15
    if duration > LONG_WORD_S:
        score += duration - LONG_WORD_S
    return score


def is_anomalous(segment: Segment) -> bool:
    """Its first words (punctuation aside) are mostly unsure, too short or too long."""
    words = [w for w in segment.words or [] if w.word.strip() not in PUNCTUATION][:8]
    if not words:
        return False
    score = sum(word_anomaly(w) for w in words)
    return score >= 3 or score + 0.01 >= len(words)


def find_hallucination(segments: list[Segment], window_start: float, window_end: float,
                       threshold: float) -> int | None:
    """Index of the first of a window's timed ``segments`` that is anomalous and has more
    than ``threshold`` seconds of silence before or after it (to its neighbours, or to the
    window's edges); None if none is."""
    for k, segment in enumerate(segments):
        if not is_anomalous(segment):
            continue
        before = segment.start - (segments[k - 1].end if k else window_start)
        after = (segments[k + 1].start if k + 1 < len(segments) else window_end) - segment.end
        if before > threshold or after > threshold:
            return k
    return None
