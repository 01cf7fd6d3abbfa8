"""Utterance boundaries from silero VAD (the model ships inside the ``silero-vad`` wheel).

The silero network is stateful (a recurrent state carried across 32 ms chunks), so each
stream owns its state (silero_onnx.py: one onnxruntime graph for all streams, no torch); the
detector adds hysteresis and a minimum silence so a breath between words does not end an
utterance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from audiofast.stream.silero_onnx import CHUNK, SileroStream

SAMPLE_RATE = 16000


@dataclass(frozen=True)
class VadOptions:
    threshold: float = 0.5  # speech starts above this probability
    neg_threshold: float = 0.35  # ... and may end below this one
    min_silence_s: float = 0.5  # silence that ends an utterance
    min_speech_s: float = 0.1  # shorter blips are not utterances


@dataclass(frozen=True)
class VadEvent:
    kind: str  # "start" or "end"
    sample: int  # stream position (16 kHz samples) where speech started / ended


class SpeechDetector:
    """Feed 16 kHz audio of any length; get ``start``/``end`` events at chunk resolution."""

    def __init__(self, options: VadOptions = VadOptions(),
                 model: Callable[[np.ndarray], float] | None = None):
        """``model``: speech probability of one 512-sample chunk, stateful (default: silero
        on onnxruntime)."""
        self.options = options
        self.model = model if model is not None else SileroStream()
        self._pending = np.zeros(0, dtype=np.float32)
        self.position = 0  # samples consumed by the network
        self.in_speech = False
        self._speech_start = 0
        self._silence_start: int | None = None

    def feed(self, audio: np.ndarray) -> list[VadEvent]:
        audio = np.concatenate([self._pending, np.asarray(audio, dtype=np.float32)])
        usable = len(audio) - len(audio) % CHUNK
        self._pending = audio[usable:]
        events: list[VadEvent] = []
        if not usable:
            return events
        for chunk in audio[:usable].reshape(-1, CHUNK):
            events.extend(self._step(self.model(chunk)))
            self.position += CHUNK
        return events

    @property
    def pending_end(self) -> int | None:
        """Where the current utterance ends if the silence heard since then lasts: the
        sample an ``end`` event would carry, before ``min_silence_s`` confirms it."""
        if not self.in_speech or self._silence_start is None:
            return None
        return None if self._blip() else self._silence_start  # a blip ends no utterance

    def flush(self) -> list[VadEvent]:
        """End of stream: close an open utterance, where the silence it was in began (the
        sample ``pending_end`` gave, so a closing decode done ahead there is the close) or at
        the last sample."""
        if not self.in_speech:
            return []
        end = self.pending_end
        self.in_speech = False
        return [VadEvent("end", self.position + len(self._pending) if end is None else end)]

    def _step(self, prob: float) -> list[VadEvent]:
        opts = self.options
        if not self.in_speech:
            if prob >= opts.threshold:
                self.in_speech, self._speech_start, self._silence_start = True, self.position, None
                return [VadEvent("start", self.position)]
            return []
        if prob >= opts.neg_threshold:
            self._silence_start = None
            return []
        if self._silence_start is None:
            self._silence_start = self.position
        if self.position + CHUNK - self._silence_start < opts.min_silence_s * SAMPLE_RATE:
            return []
        self.in_speech = False
        if self._blip():
            return [VadEvent("end", self._speech_start)]  # an empty utterance
        return [VadEvent("end", self._silence_start)]

    def _blip(self) -> bool:
        """The speech before the current silence is too short to be an utterance."""
        return self._silence_start - self._speech_start < self.options.min_speech_s * SAMPLE_RATE
