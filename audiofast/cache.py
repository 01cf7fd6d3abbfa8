"""Where audiofast keeps what it derives once: assembled models, built kernels, packed decoder
weights, TTS audio, judge transcripts, embeddings."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Root of audiofast's cache (``$AUDIOFAST_CACHE`` or ``~/.cache/audiofast``)."""
    return Path(os.environ.get("AUDIOFAST_CACHE") or Path.home() / ".cache" / "audiofast")
