"""Eval sets: real recordings from installed packages, and texts for TTS from ``evals/texts``.

Audio is never copied into the repository: the real clips are found inside the installed
``moonshine-voice`` wheel, and TTS audio is synthesized into the cache on demand (tts.py).
"""

from __future__ import annotations

import importlib.resources
import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EvalClip:
    name: str
    audio: Path
    reference: str
    kind: str  # "real" or "tts"


def evals_dir() -> Path:
    """The shipped ``evals/`` data (sentences, references; resources.py), or
    ``$AUDIOFAST_EVALS``."""
    from audiofast.resources import data_file

    override = os.environ.get("AUDIOFAST_EVALS")
    path = Path(override) if override else data_file("evals")
    if not path.is_dir():
        raise FileNotFoundError(f"no evals/ folder at {path}; set AUDIOFAST_EVALS")
    return path


def real_speech_clips() -> list[EvalClip]:
    """The moonshine-voice recordings with their reference transcripts."""
    spec = json.loads((evals_dir() / "references" / "moonshine.json").read_text())
    package, _, folder = spec["package_dir"].partition("/")
    try:
        root = Path(str(importlib.resources.files(package).joinpath(folder)))
    except ModuleNotFoundError:
        raise FileNotFoundError(
            f"real-speech clips need the package {spec['package']}: pip install it"
        ) from None
    return [
        EvalClip(Path(c["file"]).stem, root / c["file"], c["reference"], "real")
        for c in spec["clips"]
    ]


def tts_texts(path: str | Path | None = None) -> list[str]:
    """Sentences for TTS, one a line (``#`` starts a comment); default: the evals set."""
    path = Path(path) if path else evals_dir() / "texts" / "tts_sentences.txt"
    lines = path.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


FORTUNES_DIR = Path("/usr/share/games/fortunes")
DOMAIN_FILES = ("literature", "wisdom", "humorists", "people", "fortunes", "love", "art")


def domain_corpus(files: tuple[str, ...] = DOMAIN_FILES, min_words: int = 4,
                  max_words: int = 30) -> list[str]:
    """Sentences for the ASR lane's *domain*: quotations and literature from Debian's
    ``fortunes`` package (plain English prose and dialogue, like the real eval clips).

    Attribution lines and quotes with digits or markup are dropped; the order is the files'
    own, so a fixed slice is a reproducible held-out split.
    """
    if not FORTUNES_DIR.is_dir():
        raise FileNotFoundError(f"{FORTUNES_DIR} is missing: apt-get install fortunes")
    sentences = []
    for name in files:
        text = (FORTUNES_DIR / name).read_text(encoding="utf-8", errors="replace")
        for quote in text.split("\n%\n"):
            lines = [ln.strip() for ln in quote.splitlines()]
            body = " ".join(ln for ln in lines if ln and not ln.startswith("--"))
            words = body.split()
            if not min_words <= len(words) <= max_words:
                continue
            if any(c.isdigit() or c in "<>[]{}|_\\/@#*=~^" for c in body) or '"' in body[1:-1]:
                continue
            sentences.append(body)
    return sentences
