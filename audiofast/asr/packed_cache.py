"""The fused decoder's packed weights on disk, so a process starts without re-packing them.

Quantizing and packing whisper-base's decoder took ~1.3 s of every start; the packed tensors
are saved once (``torch.save``, written to a temporary name and renamed, so a crash never
leaves half a file) and memory-mapped on later starts: pages are read as the decoder touches
them and shared between processes. A file is keyed by the model's bytes (path, size, mtime),
the head cut, and the packing and kernel code, so any change packs afresh.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)
_CODE = ("int8_pack.py", "fused_decoder.py", "decoder_weights.py", "packed_cache.py")


def cache_key(model_file: Path, head_ids: torch.Tensor | None) -> str:
    from audiofast.asr import kernels

    stat = model_file.stat()
    digest = hashlib.sha256(f"{model_file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:"
                            f"{kernels.build_key()}:{torch.__version__}".encode())
    if head_ids is not None:
        digest.update(head_ids.numpy().tobytes())
    here = Path(__file__).parent
    for name in _CODE:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:20]


def load_or_pack(model_file: Path, head_ids: torch.Tensor | None,
                 pack: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The packed tensors for ``model_file``: memory-mapped from the cache, else ``pack()``ed
    and stored (a cache that cannot be written or read is only slower, never an error)."""
    from audiofast.cache import cache_dir

    path = cache_dir() / "packed" / f"{cache_key(model_file, head_ids)}.pt"
    if path.is_file():
        try:
            return torch.load(path, mmap=True, weights_only=True)
        except Exception as exc:  # truncated by a full disk, foreign file: pack again
            log.warning("packed decoder cache %s unreadable (%s); packing again", path, exc)
    tensors = pack()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save(tensors, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("packed decoder cache not written (%s)", exc)
    return tensors
