"""The data files the library reads: gate thresholds, stage configs, eval sentences, the real
recordings' references.

They live in the repository's ``configs/`` and ``evals/`` (where people edit them), and reach
the package through links under ``audiofast/_data/``: a checkout (editable install) reads them
in place, and a built wheel carries copies (``package-data`` in pyproject.toml), read through
``importlib.resources`` - so nothing here walks up from ``__file__`` into a repository that an
installed package does not have.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path


def data_root() -> Path:
    """The folder holding ``configs/`` and ``evals/`` (the repository's, or the wheel's copy)."""
    return Path(str(importlib.resources.files("audiofast") / "_data"))


def data_file(relative: str | Path) -> Path:
    """``relative`` (e.g. ``configs/gates.yaml``) under :func:`data_root`."""
    return data_root() / relative


def in_checkout() -> bool:
    """Whether the data are the repository's own files (linked), not an installed copy."""
    return (data_root() / "configs").is_symlink()


def writable_presets_dir() -> Path:
    """Where sweeps write presets: ``$AUDIOFAST_PRESETS``, else the checkout's
    ``configs/presets``, else (an installed package) the user's cache."""
    if os.environ.get("AUDIOFAST_PRESETS"):
        return Path(os.environ["AUDIOFAST_PRESETS"])
    if in_checkout():
        return data_file("configs/presets")
    from audiofast.cache import cache_dir

    return cache_dir() / "presets"
