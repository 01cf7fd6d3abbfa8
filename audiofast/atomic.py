"""Directories written whole or not at all: a kill mid-export never leaves half a model."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged_directory(out_dir: str | Path) -> Iterator[Path]:
    """Yield a fresh sibling folder to write into; when the block ends without an error it
    replaces ``out_dir`` (renamed into place), otherwise it is removed and ``out_dir`` is
    left as it was."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        yield staging
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
