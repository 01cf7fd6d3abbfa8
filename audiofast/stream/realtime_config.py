"""The session settings of OpenAI's Realtime transcription protocol (``session.update``, GA
and beta shapes) as this server honours them: what it cannot do is a :class:`RealtimeError`
naming the parameter, never a silent ignore (openai_realtime.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

INPUT_RATE = 24000  # OpenAI's PCM16 rate
MODELS = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe", "gpt-realtime")


class RealtimeError(ValueError):
    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code, self.param = code, param


@dataclass(frozen=True)
class RealtimeConfig:
    """What ``session.update`` set: the served subset of OpenAI's transcription session."""

    language: str | None
    prompt: str = ""
    model: str = "whisper-1"
    server_vad: bool = True
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500

    def describe(self, beta: bool) -> dict[str, Any]:
        """The session object of ``session.created`` / ``.updated`` (beta or GA shape)."""
        transcription = {"model": self.model, "language": self.language, "prompt": self.prompt}
        turn = {"type": "server_vad", "threshold": self.threshold,
                "prefix_padding_ms": self.prefix_padding_ms,
                "silence_duration_ms": self.silence_duration_ms} if self.server_vad else None
        if beta:
            return {"object": "realtime.transcription_session", "input_audio_format": "pcm16",
                    "input_audio_transcription": transcription, "turn_detection": turn}
        return {"type": "transcription", "object": "realtime.transcription_session",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": INPUT_RATE},
                                    "transcription": transcription, "turn_detection": turn,
                                    "noise_reduction": None}}}


def updated_config(config: RealtimeConfig, session: Any, beta: bool,
                   languages: set[str], served: str) -> RealtimeConfig:
    """``config`` with a ``session.update``'s ``session`` applied; RealtimeError if it asks
    for something this server does not do."""
    if not isinstance(session, dict):
        raise RealtimeError("invalid_value", "session must be an object", "session")
    where = "session" if beta else "session.audio.input"
    if beta:
        source, fmt = session, session.get("input_audio_format", "pcm16")
        transcription = session.get("input_audio_transcription")
        if fmt != "pcm16":
            raise RealtimeError("unsupported_format", f"input_audio_format {fmt!r} is not "
                                "supported here: send pcm16 (24 kHz mono)",
                                "session.input_audio_format")
        if session.get("input_audio_noise_reduction") is not None:
            raise RealtimeError("unsupported", "noise reduction is not supported here",
                                "session.input_audio_noise_reduction")
    else:
        if session.get("type", "transcription") != "transcription":
            raise RealtimeError("unsupported", "this server runs transcription sessions only "
                                "(session.type 'transcription')", "session.type")
        audio = session.get("audio") or {}
        source = audio.get("input") or {} if isinstance(audio, dict) else {}
        if not isinstance(source, dict):
            raise RealtimeError("invalid_value", "audio.input must be an object", where)
        fmt = source.get("format") or {"type": "audio/pcm"}
        if not isinstance(fmt, dict) or fmt.get("type") != "audio/pcm" \
                or fmt.get("rate", INPUT_RATE) != INPUT_RATE:
            raise RealtimeError("unsupported_format", f"audio format {fmt!r} is not supported "
                                "here: send audio/pcm at 24000 Hz", f"{where}.format")
        transcription = source.get("transcription")
        if source.get("noise_reduction") is not None:
            raise RealtimeError("unsupported", "noise reduction is not supported here",
                                f"{where}.noise_reduction")
    if session.get("include"):
        raise RealtimeError("unsupported", "include (logprobs) is not supported here",
                            "session.include")
    if transcription is not None:
        if not isinstance(transcription, dict):
            raise RealtimeError("invalid_value", "transcription must be an object",
                                f"{where}.transcription")
        model = transcription.get("model", config.model)
        if model not in (served, *MODELS):
            raise RealtimeError("invalid_model", f"model {model!r} is not served here (this "
                                f"server runs {served!r}; {', '.join(MODELS)} mean it too)",
                                f"{where}.transcription.model")
        language = transcription.get("language", config.language) or None
        if language is not None and language not in languages:
            raise RealtimeError("invalid_language", f"unknown language {str(language)[:20]!r}",
                                f"{where}.transcription.language")
        prompt = transcription.get("prompt") or ""
        if not isinstance(prompt, str):
            raise RealtimeError("invalid_value", "prompt must be a string",
                                f"{where}.transcription.prompt")
        config = replace(config, model=model, language=language, prompt=prompt)
    if "turn_detection" in source:
        config = _turn_detection(config, source["turn_detection"], f"{where}.turn_detection")
    return config


def _turn_detection(config: RealtimeConfig, turn: Any, param: str) -> RealtimeConfig:
    if turn is None:
        return replace(config, server_vad=False)
    if not isinstance(turn, dict) or turn.get("type", "server_vad") != "server_vad":
        kind = turn.get("type") if isinstance(turn, dict) else turn
        raise RealtimeError("unsupported", f"turn detection {str(kind)[:30]!r} is not "
                            "supported here: use server_vad or null", param)
    threshold = turn.get("threshold", config.threshold)
    padding = turn.get("prefix_padding_ms", config.prefix_padding_ms)
    silence = turn.get("silence_duration_ms", config.silence_duration_ms)
    if not isinstance(threshold, int | float) or not 0.0 < threshold < 1.0:
        raise RealtimeError("invalid_value", "threshold must be in (0, 1)", f"{param}.threshold")
    for name, value in (("prefix_padding_ms", padding), ("silence_duration_ms", silence)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 10_000:
            raise RealtimeError("invalid_value", f"{name} must be an integer in [0, 10000]",
                                f"{param}.{name}")
    return replace(config, server_vad=True, threshold=float(threshold),
                   prefix_padding_ms=padding, silence_duration_ms=silence)
