"""Text to speech with the Debian synthesizers, cached by (text, voice).

Voices are named ``backend:voice``: ``flite:slt``, ``flite:kal``, ``espeak-ng:en-us``.
TTS audio is a stand-in for speech, never the whole test: it is scored beside real recordings.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from audiofast.models.packaged import cache_dir

DEFAULT_VOICES = ("flite:slt", "flite:kal", "espeak-ng:en-us")


class TTSUnavailableError(RuntimeError):
    """The synthesizer for a voice is not installed."""


def _command(voice: str, text_file: Path, out: Path) -> list[str]:
    backend, _, name = voice.partition(":")
    if backend == "flite":
        return ["flite", "-voice", name or "slt", "-f", str(text_file), "-o", str(out)]
    if backend == "espeak-ng":
        return ["espeak-ng", "-v", name or "en-us", "-f", str(text_file), "-w", str(out)]
    raise ValueError(f"unknown TTS voice {voice!r}; use flite:NAME or espeak-ng:NAME")


def synthesize(text: str, voice: str = "flite:slt") -> Path:
    """WAV file of ``text`` spoken by ``voice``; synthesized once, then read from the cache."""
    if not text.strip():
        raise ValueError("cannot synthesize empty text")
    key = hashlib.sha256(f"{voice}\n{text}".encode()).hexdigest()[:20]
    target = cache_dir() / "tts" / f"{voice.replace(':', '-')}-{key}.wav"
    if target.is_file():
        return target
    backend = voice.partition(":")[0]
    if shutil.which(backend) is None:
        raise TTSUnavailableError(f"{backend} is not installed (apt-get install {backend})")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        text_file, out = Path(tmp) / "text.txt", Path(tmp) / "out.wav"
        text_file.write_text(text)
        subprocess.run(_command(voice, text_file, out), check=True, capture_output=True)
        out.replace(target)
    return target
