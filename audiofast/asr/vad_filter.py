"""Decode only the speech of a file: silero VAD finds it, the rest is cut out before the
encoder sees it, and segment times are mapped back to the original timeline.

This is faster-whisper's ``vad_filter``: long silences, music and noise cost encoder windows
and are where Whisper invents text. The speech regions (each padded a little) are joined end
to end, so the long-form loop windows them up to 30 s at a time; a segment's times are then
moved back by the silence cut before it. Defaults follow faster-whisper's (silences under
2 s are kept, regions padded by 0.4 s).
"""

from __future__ import annotations

import bisect
import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from audiofast.asr.types import Segment, Transcription
from audiofast.audio import SAMPLE_RATE

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class VadFilterOptions:
    threshold: float = 0.5  # speech probability that starts a region
    min_speech_s: float = 0.25  # shorter regions are dropped
    min_silence_s: float = 2.0  # shorter silences stay inside a region
    speech_pad_s: float = 0.4  # kept on each side of a region


def vad_options(vad_filter: bool | VadFilterOptions) -> VadFilterOptions:
    """``vad_filter=True`` means the defaults."""
    return vad_filter if isinstance(vad_filter, VadFilterOptions) else VadFilterOptions()


def load_silero() -> torch.nn.Module:
    """A fresh silero VAD network (about 2 MB inside the ``silero-vad`` wheel, ~0.1 s)."""
    try:
        from silero_vad import load_silero_vad
    except ModuleNotFoundError:
        raise ModuleNotFoundError("VAD needs the silero-vad package: pip install "
                                  "'audiofast[serve]'") from None
    with warnings.catch_warnings():  # silero 6.2 still uses torch.jit.load / resources.path
        warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning))
        return load_silero_vad()


def speech_regions(audio: np.ndarray, options: VadFilterOptions = VadFilterOptions()
                   ) -> list[tuple[int, int]]:
    """(start, end) sample ranges of speech in 16 kHz ``audio``, in order, not overlapping."""
    import torch
    from silero_vad import get_speech_timestamps

    stamps = get_speech_timestamps(
        torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32)), load_silero(),
        threshold=options.threshold, sampling_rate=SAMPLE_RATE,
        min_speech_duration_ms=round(1000 * options.min_speech_s),
        min_silence_duration_ms=round(1000 * options.min_silence_s),
        speech_pad_ms=round(1000 * options.speech_pad_s))
    return [(int(s["start"]), int(s["end"])) for s in stamps]


class TimeMap:
    """Seconds in the joined speech -> seconds in the original audio."""

    def __init__(self, regions: list[tuple[int, int]]):
        self.joined_starts: list[float] = []  # where each region begins in the joined audio
        self.original_starts: list[float] = []
        position = 0
        for start, end in regions:
            self.joined_starts.append(position / SAMPLE_RATE)
            self.original_starts.append(start / SAMPLE_RATE)
            position += end - start

    def __call__(self, seconds: float, end: bool = False) -> float:
        """``end``: a time exactly on a cut belongs to the region before it (a segment that
        ends where its region ends must not jump over the silence that follows)."""
        find = bisect.bisect_left if end else bisect.bisect_right
        i = max(0, find(self.joined_starts, seconds) - 1)
        return round(self.original_starts[i] + seconds - self.joined_starts[i], 3)


def transcribe_speech(
    transcribe: Callable[[np.ndarray, Callable[[Segment], None] | None], Transcription],
    audio: np.ndarray, options: VadFilterOptions = VadFilterOptions(),
    on_segment: Callable[[Segment], None] | None = None,
    regions: list[tuple[int, int]] | None = None,
) -> Transcription:
    """``transcribe(speech, on_segment)`` run on the speech of ``audio`` only, with times on
    ``audio``'s timeline (no speech at all: no segments, nothing decoded); ``on_segment``
    gets each segment on that timeline too. ``regions``: :func:`speech_regions` already
    found (faster-whisper's API reports the speech's length before decoding)."""
    regions = speech_regions(audio, options) if regions is None else regions
    duration = len(audio) / SAMPLE_RATE
    stats = {"vad_speech_s": sum(e - s for s, e in regions) / SAMPLE_RATE}
    if not regions:
        return Transcription([], "en", 0.0, duration, stats)
    to_original = TimeMap(regions)

    def restore(seg: Segment) -> Segment:
        return dataclasses.replace(
            seg, start=to_original(seg.start), end=to_original(seg.end, end=True),
            words=None if seg.words is None else [
                dataclasses.replace(w, start=to_original(w.start),
                                    end=to_original(w.end, end=True)) for w in seg.words])

    each = (lambda seg: on_segment(restore(seg))) if on_segment else None
    result = transcribe(np.concatenate([audio[s:e] for s, e in regions]), each)
    return dataclasses.replace(result, segments=[restore(s) for s in result.segments],
                               duration=duration, stats=result.stats | stats)
