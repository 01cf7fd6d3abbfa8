"""What a transcription returns: segments with times, and the run's metadata."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Word:
    start: float  # seconds
    end: float
    word: str  # with its leading space, as Whisper spells it
    probability: float  # mean probability of its tokens in the forced decode


@dataclass
class Segment:
    id: int
    seek: int  # mel frame where the window that produced it started
    start: float  # seconds
    end: float
    text: str
    tokens: list[int]
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    temperature: float
    words: list[Word] | None = None  # with word_timestamps (word_timing.py)


@dataclass
class Transcription:
    segments: list[Segment]
    language: str
    language_probability: float
    duration: float  # seconds of audio
    stats: dict[str, float] = field(default_factory=dict)  # encoder_s, decoder_s, tokens, ...

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments).strip()

    def to_dict(self) -> dict:
        return asdict(self) | {"text": self.text}
