"""faster-whisper 1.2's result and option records, field for field (names, order, types), so
code written against ``faster_whisper.transcribe`` reads audiofast's results unchanged.

They are our own dataclasses: faster-whisper is not a dependency (only the differential tests
import it, to check that these stay the same)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from audiofast.asr import types


@dataclass
class Word:
    start: float
    end: float
    word: str
    probability: float

    def _asdict(self) -> dict:  # faster-whisper keeps this for its NamedTuple past
        return asdict(self)


@dataclass
class Segment:
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[Word] | None
    temperature: float | None

    def _asdict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, segment: types.Segment, id: int) -> Segment:
        """Ours as theirs. ``id`` counts from 1, as faster-whisper's do."""
        words = None if segment.words is None else [
            Word(w.start, w.end, w.word, w.probability) for w in segment.words]
        return cls(id=id, seek=segment.seek, start=segment.start, end=segment.end,
                   text=segment.text, tokens=list(segment.tokens),
                   avg_logprob=segment.avg_logprob, compression_ratio=segment.compression_ratio,
                   no_speech_prob=segment.no_speech_prob, words=words,
                   temperature=segment.temperature)


@dataclass
class VadOptions:
    """silero VAD's knobs as faster-whisper names them (ms, not seconds)."""

    threshold: float = 0.5
    neg_threshold: float = None  # type: ignore[assignment]  # as faster-whisper declares it
    min_speech_duration_ms: int = 0
    max_speech_duration_s: float = float("inf")
    min_silence_duration_ms: int = 2000
    speech_pad_ms: int = 400

    def to_filter_options(self):
        """audiofast's :class:`VadFilterOptions`; what it has no knob for is refused."""
        from audiofast.asr.vad_filter import VadFilterOptions

        if self.neg_threshold is not None:
            raise ValueError("vad_parameters.neg_threshold is not supported by audiofast "
                             "(silero's default hysteresis, threshold - 0.15, is used)")
        if not math.isinf(self.max_speech_duration_s):
            raise ValueError("vad_parameters.max_speech_duration_s is not supported by "
                             "audiofast: speech regions are windowed by the long-form loop")
        return VadFilterOptions(threshold=self.threshold,
                                min_speech_s=self.min_speech_duration_ms / 1000,
                                min_silence_s=self.min_silence_duration_ms / 1000,
                                speech_pad_s=self.speech_pad_ms / 1000)

    @classmethod
    def of(cls, parameters: dict | VadOptions | None) -> VadOptions:
        if parameters is None:
            return cls()
        if isinstance(parameters, cls):
            return parameters
        if not isinstance(parameters, dict):  # faster_whisper.vad.VadOptions itself
            parameters = {k: getattr(parameters, k) for k in cls.__dataclass_fields__
                          if hasattr(parameters, k)}
        unknown = set(parameters) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown vad_parameters: {', '.join(sorted(unknown))}")
        return cls(**parameters)


@dataclass
class TranscriptionOptions:
    beam_size: int
    best_of: int
    patience: float
    length_penalty: float
    repetition_penalty: float
    no_repeat_ngram_size: int
    log_prob_threshold: float | None
    no_speech_threshold: float | None
    compression_ratio_threshold: float | None
    condition_on_previous_text: bool
    prompt_reset_on_temperature: float
    temperatures: list[float]
    initial_prompt: str | Iterable[int] | None
    prefix: str | None
    suppress_blank: bool
    suppress_tokens: list[int] | None
    without_timestamps: bool
    max_initial_timestamp: float
    word_timestamps: bool
    prepend_punctuations: str
    append_punctuations: str
    multilingual: bool
    max_new_tokens: int | None
    clip_timestamps: str | list[float]
    hallucination_silence_threshold: float | None
    hotwords: str | None


@dataclass
class TranscriptionInfo:
    language: str
    language_probability: float
    duration: float
    duration_after_vad: float
    all_language_probs: list[tuple[str, float]] | None
    transcription_options: TranscriptionOptions
    vad_options: VadOptions | None
