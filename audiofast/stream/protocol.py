"""The wire protocol: validating client messages and decoding their audio.

Client -> server: a JSON ``start`` message, binary audio frames, a JSON ``end`` message.
Server -> client: JSON events ``ready``, ``partial``, ``final``, ``error``, ``closed``.
The README documents it with examples; a WhisperLive-compatible dialect is mapped here too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import soxr

from audiofast.audio import SAMPLE_RATE

ENCODINGS = {"pcm_s16le": np.dtype("<i2"), "pcm_f32le": np.dtype("<f4")}
ALIASES = {"int16": "pcm_s16le", "s16le": "pcm_s16le", "float32": "pcm_f32le", "f32le": "pcm_f32le"}
MIN_RATE, MAX_RATE = 8000, 192000
END_OF_AUDIO = b"END_OF_AUDIO"  # WhisperLive's end marker (a binary frame)


ATTACHED = frozenset(",.;:!?)]}%")  # marks that follow a word without a space


def join_finals(texts: Iterable[str]) -> str:
    """The transcript of ``final`` texts: one space between them, none before a final that
    opens with punctuation (a later decode may put a comma after an already committed word)."""
    out = ""
    for text in texts:
        out += text if not out or text[:1] in ATTACHED else " " + text
    return out


class ProtocolError(ValueError):
    """A bad client message: becomes an ``error`` event with this code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class StartConfig:
    sample_rate: int = SAMPLE_RATE
    encoding: str = "pcm_s16le"
    channels: int = 1
    language: str | None = "en"
    task: str = "transcribe"
    dialect: str = "audiofast"  # or "whisperlive"
    uid: str | None = None  # WhisperLive's client id, echoed back


def parse_json(message: str | bytes) -> dict[str, Any]:
    try:
        value = json.loads(message)
    except json.JSONDecodeError as e:
        raise ProtocolError("bad_json", f"not JSON: {e.msg} at position {e.pos}") from None
    except UnicodeDecodeError:
        raise ProtocolError("bad_json", "not UTF-8 text") from None
    except RecursionError:
        raise ProtocolError("bad_json", "JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise ProtocolError("bad_message", "a message must be a JSON object")
    return value


def parse_start(message: str | bytes, languages: set[str]) -> StartConfig:
    """Validate the first message; ``languages`` are those the model knows."""
    if isinstance(message, bytes):
        raise ProtocolError("expected_start", "send a JSON start message before audio")
    msg = parse_json(message)
    if "type" not in msg and "uid" in msg:
        return _whisperlive_start(msg, languages)
    if msg.get("type") != "start":
        raise ProtocolError("expected_start", "the first message must be {\"type\": \"start\"}")
    rate = msg.get("sample_rate", SAMPLE_RATE)
    if not isinstance(rate, int) or isinstance(rate, bool) or not MIN_RATE <= rate <= MAX_RATE:
        raise ProtocolError("bad_sample_rate",
                            f"sample_rate must be an integer in [{MIN_RATE}, {MAX_RATE}] Hz")
    encoding = msg.get("encoding", "pcm_s16le")
    encoding = ALIASES.get(encoding, encoding) if isinstance(encoding, str) else None
    if encoding not in ENCODINGS:
        raise ProtocolError("bad_encoding", f"encoding must be one of {sorted(ENCODINGS)}")
    channels = msg.get("channels", 1)
    if channels not in (1, 2) or isinstance(channels, bool):
        raise ProtocolError("bad_channels", "channels must be 1 or 2")
    return StartConfig(rate, encoding, channels, *_language_task(msg, languages))


def _language_task(msg: dict[str, Any], languages: set[str]) -> tuple[str | None, str]:
    language = msg.get("language", "en")
    if language is not None and (not isinstance(language, str) or language not in languages):
        raise ProtocolError("bad_language", f"unknown language {str(language)[:20]!r}")
    task = msg.get("task", "transcribe")
    if not isinstance(task, str) or task not in ("transcribe", "translate"):
        raise ProtocolError("bad_task", "task must be 'transcribe' or 'translate'")
    return language, task


def _whisperlive_start(msg: dict[str, Any], languages: set[str]) -> StartConfig:
    """WhisperLive clients: float32 16 kHz mono unless ``audio_format`` says int16."""
    if not isinstance(msg["uid"], str) or len(msg["uid"]) > 100:
        raise ProtocolError("bad_message", "uid must be a short string")
    fmt = msg.get("audio_format", "float32")
    if not isinstance(fmt, str) or fmt not in ("float32", "int16"):
        raise ProtocolError("bad_encoding", "audio_format must be 'float32' or 'int16'")
    language, task = _language_task({"language": msg.get("language") or "en",
                                     "task": msg.get("task", "transcribe")}, languages)
    return StartConfig(SAMPLE_RATE, ALIASES[fmt], 1, language, task, "whisperlive", msg["uid"])


class AudioDecoder:
    """Bytes in the client's format -> 16 kHz mono float32, resampled as a stream (soxr keeps
    filter state across frames, so frame boundaries leave no clicks)."""

    def __init__(self, config: StartConfig):
        self.config = config
        self.dtype = ENCODINGS[config.encoding]
        self.frame_bytes = self.dtype.itemsize * config.channels
        self.resampler = (soxr.ResampleStream(config.sample_rate, SAMPLE_RATE, 1, dtype="float32")
                          if config.sample_rate != SAMPLE_RATE else None)

    def __call__(self, data: bytes, last: bool = False) -> np.ndarray:
        if len(data) % self.frame_bytes:
            raise ProtocolError("bad_frame", f"{len(data)} bytes is not a whole number of "
                                f"{self.frame_bytes}-byte samples; frame dropped")
        samples = np.frombuffer(data, dtype=self.dtype).astype(np.float32)
        if self.dtype.kind == "i":
            samples /= 32768.0
        elif not np.isfinite(samples).all():
            raise ProtocolError("bad_frame", "float32 audio contains NaN or infinity; "
                                "frame dropped")
        if self.config.channels == 2:
            samples = samples.reshape(-1, 2).mean(axis=1)
        if self.resampler is not None:
            samples = self.resampler.resample_chunk(samples, last=last)
        return np.clip(samples, -1.0, 1.0).astype(np.float32, copy=False)


def error_event(code: str, message: str) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message}


class WhisperLiveView:
    """Maps our events to WhisperLive's messages: segments with ``completed`` flags.

    WhisperLive's client keeps the last incomplete segment it saw and, when it writes its
    transcript, adds it after the completed ones unless it repeats the last of them. So a
    final first goes out as the live tail (unless the tail already said it), then completed:
    the client's tail is never a stale partial of a line long since finished. The ready
    message names the backend ``faster_whisper``: the client keeps a transcript (and writes
    its SRT) only for the backend whose segment semantics these are."""

    def __init__(self, uid: str, keep: int = 10):
        self.uid, self.keep = uid, keep
        self.completed: list[dict[str, Any]] = []
        self.tail = ""  # the text of the live tail the client holds

    def translate(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event["type"]
        if kind == "ready":
            return [{"uid": self.uid, "message": "SERVER_READY", "backend": "faster_whisper"}]
        if kind == "closed":
            return [{"uid": self.uid, "message": "DISCONNECT"}]
        if kind == "error":
            return [{"uid": self.uid, "status": "ERROR", "message": event["message"]}]
        out = []
        if kind == "final":
            if self.tail != event["text"]:
                out.append(self._with_tail(event))
            self.completed = [*self.completed, _segment(event, True)][-self.keep:]
            out.append({"uid": self.uid, "segments": self.completed})
        elif kind == "partial" and event["text"]:
            out.append(self._with_tail(event | {"end": event["start"]}))
        return out

    def _with_tail(self, event: dict[str, Any]) -> dict[str, Any]:
        self.tail = event["text"]
        return {"uid": self.uid, "segments": [*self.completed, _segment(event, False)]}


def _segment(event: dict[str, Any], completed: bool) -> dict[str, Any]:
    return {"start": f"{event['start']:.3f}", "end": f"{event['end']:.3f}",
            "text": event["text"], "completed": completed}
