"""Skipping Whisper's hallucinations next to long silences (``--hallucination-silence-threshold``).

On silence, music or noise Whisper often writes something anyway: a "Thank you.", a phrase
from the prompt, a sentence it never heard. Such text shows in its word timing: words the
model is unsure of (low probability), squeezed into a few milliseconds or stretched over
seconds. openai-whisper's rule (faster-whisper's too), followed here:

- a window whose first timed segment looks like that and starts after more than the threshold
  of silence is decoded again from that segment's start (the leading silence skipped): real
  speech after a long pause is often timed badly, and decodes well in a window of its own;
- a segment that looks like that with silence on both sides (more than the threshold to the
  speech before it and to the speech after, or at the window's edges, or next to another such
  segment) is dropped with whatever the window decoded after it, and decoding resumes at its
  start.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    return words_anomalous(segment.words or [])


def words_anomalous(timed: list[Word]) -> bool:
    """The first words (punctuation aside) are mostly unsure, too short or too long."""
    words = [w for w in timed if w.word.strip() not in PUNCTUATION][:8]
    if not words:
        return False
    score = sum(word_anomaly(w) for w in words)
    return score >= 3 or score + 0.01 >= len(words)


@dataclass(frozen=True)
class Skip:
    """Keep the window's first ``keep`` segments and resume decoding at ``resume`` seconds."""

    keep: int
    resume: float


EDGE_S = 2.0  # a segment this close to a window's edge counts as bordering on silence there


def find_hallucination(segments: list[Segment], window_start: float, window_end: float,
                       threshold: float, last_speech_end: float, content_end: float
                       ) -> Skip | None:
    """What to do with a window's timed ``segments`` (None: keep them all).
    ``last_speech_end``: where the speech before the window ended; ``content_end``: the end of
    the audio."""
    timed = [k for k, s in enumerate(segments) if s.words]
    if not timed:
        return None
    first = segments[timed[0]]
    if is_anomalous(first) and first.start - window_start > threshold:
        return Skip(0, first.start)
    previous_end = last_speech_end
    for n, k in enumerate(timed):
        segment = segments[k]
        if is_anomalous(segment):
            following = segments[timed[n + 1]] if n + 1 < len(timed) else None
            next_start = following.words[0].start if following else window_end
            silence_before = (segment.start - previous_end > threshold
                              or segment.start < threshold
                              or segment.start - window_start < EDGE_S)
            silence_after = (next_start - segment.end > threshold
                             or (following is not None and is_anomalous(following))
                             or window_end - segment.end < EDGE_S)
            if silence_before and silence_after:
                resume = max(window_start + 1.0, segment.start)
                if content_end - segment.end < threshold:
                    resume = content_end
                return Skip(k, resume)
        previous_end = segment.end
    return None
