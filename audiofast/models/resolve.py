"""Turn a model spec into a CTranslate2 directory the runtime can load.

A spec is one of: a packaged name (``whisper-base``, ``whisper-tiny.en``), a local CTranslate2
directory (has ``model.bin``), a local Hugging Face Whisper directory (converted once to
CTranslate2 and cached), or a hub id such as ``openai/whisper-small`` (downloaded where the hub
is reachable; offline it fails with a message naming what works offline).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from audiofast.cache import cache_dir
from audiofast.models.hub import hub_failure_reason
from audiofast.models.packaged import DEFAULT_MODEL, PACKAGED_MODELS, packaged_model_dir

HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")


class ModelNotFoundError(ValueError):
    """The spec names no model audiofast can load here."""


@dataclass(frozen=True)
class ResolvedModel:
    spec: str
    kind: Literal["packaged", "ct2", "hf", "hub"]
    ct2_dir: Path  # what CTranslate2 loads
    source_dir: Path  # what the spec pointed at (HF dir for hf/hub)


def _offline_alternatives() -> str:
    return (
        f"offline alternatives: {', '.join(PACKAGED_MODELS)} (packaged), "
        "or a local CTranslate2 / Hugging Face Whisper directory"
    )


def is_ct2_dir(path: Path) -> bool:
    return (path / "model.bin").is_file()


def is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any((path / f).is_file() for f in HF_WEIGHT_FILES)


def _dir_fingerprint(path: Path) -> str:
    digest = hashlib.sha256(str(path.resolve()).encode())
    for f in sorted(path.iterdir()):
        if f.is_file():
            stat = f.stat()
            digest.update(f"{f.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def convert_hf_to_ct2(hf_dir: Path, quantization: str | None = None) -> Path:
    """Convert a Hugging Face Whisper directory with CTranslate2's converter, cached by content."""
    target = cache_dir() / "ct2" / f"{hf_dir.name}-{_dir_fingerprint(hf_dir)}"
    if is_ct2_dir(target):
        return target
    from ctranslate2.converters import TransformersConverter

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        out = staging / "model"
        # The runtime reads the tokenizer beside the weights: carry it over.
        side_files = [f for f in ("tokenizer.json", "preprocessor_config.json")
                      if (hf_dir / f).is_file()]
        TransformersConverter(str(hf_dir), copy_files=side_files).convert(
            str(out), quantization=quantization
        )
        _carry_suppress_ids(hf_dir, out)
        out.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _carry_suppress_ids(hf_dir: Path, ct2_dir: Path) -> None:
    """Keep the generation config's suppressed tokens, which the runtime reads from config.json."""
    gen_path = hf_dir / "generation_config.json"
    if not gen_path.is_file():
        return
    gen = json.loads(gen_path.read_text())
    config_path = ct2_dir / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if gen.get("suppress_tokens"):
        config["suppress_ids"] = gen["suppress_tokens"]
    if gen.get("begin_suppress_tokens"):
        config["suppress_ids_begin"] = gen["begin_suppress_tokens"]
    config_path.write_text(json.dumps(config, indent=2))


def download_from_hub(repo_id: str) -> Path:
    """Snapshot a hub repository, or fail with one clear line when the hub is unreachable."""
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                repo_id,
                allow_patterns=["*.json", "*.safetensors", "*.bin", "*.txt", "*.model"],
            )
        )
    except Exception as err:  # offline, missing, gated, disk full...: say which, in one line
        reason, offline = hub_failure_reason(err)
        hint = f"; {_offline_alternatives()}" if offline else ""
        raise ModelNotFoundError(
            f"cannot fetch {repo_id!r} from the Hugging Face hub: {reason}{hint}"
        ) from None


def resolve_model(spec: str | Path | None = None) -> ResolvedModel:
    spec = str(spec or DEFAULT_MODEL)
    if spec in PACKAGED_MODELS:
        return ResolvedModel(spec, "packaged", packaged_model_dir(spec), packaged_model_dir(spec))

    path = Path(spec).expanduser()
    if path.is_dir():
        if is_ct2_dir(path):
            return ResolvedModel(spec, "ct2", path, path)
        if is_hf_dir(path):
            return ResolvedModel(spec, "hf", convert_hf_to_ct2(path), path)
        raise ModelNotFoundError(
            f"{spec}: directory holds neither a CTranslate2 model (model.bin) "
            "nor a Hugging Face model (config.json + weights)"
        )
    looks_like_path = spec.startswith((".", "/", "~")) or path.suffix or spec.count("/") > 1
    if looks_like_path:
        raise ModelNotFoundError(f"{spec}: no such model directory; {_offline_alternatives()}")
    if spec.count("/") == 1:
        hf_dir = download_from_hub(spec)
        return ResolvedModel(spec, "hub", convert_hf_to_ct2(hf_dir), hf_dir)
    raise ModelNotFoundError(f"unknown model {spec!r}; {_offline_alternatives()}")
