"""The fused decoder's packed weights on disk, so a process starts without re-packing them.

Quantizing and packing whisper-base's decoder took ~1.3 s of every start (and needs torch);
the packed arrays are saved once and memory-mapped on later starts: pages are read as the
decoder touches them and shared between processes. The file is one JSON header (name ->
dtype, shape, offset) and the arrays at 64-byte aligned offsets, written to a temporary name
and renamed, so a crash never leaves half a file. It is keyed by the model's bytes (path,
size, mtime), the head cut, the kernel build and the packing code, so any change packs afresh.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)
_CODE = ("int8_pack.py", "fused_decoder.py", "decoder_weights.py", "packed_cache.py")
_MAGIC = b"AFPACK1\n"
_ALIGN = 64


def _torch_version() -> str:  # packing uses torch's quantization observers
    try:
        return version("torch")
    except PackageNotFoundError:
        return "none"


def cache_key(model_file: Path, head_ids: np.ndarray | None) -> str:
    from audiofast.asr import kernels

    stat = model_file.stat()
    digest = hashlib.sha256(f"{model_file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:"
                            f"{kernels.build_key()}:{_torch_version()}".encode())
    if head_ids is not None:
        digest.update(np.asarray(head_ids, dtype=np.int64).tobytes())
    here = Path(__file__).parent
    for name in _CODE:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:20]


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` as one file (atomically: a temporary name, then a rename)."""
    header, offset = {}, 0
    for name, a in arrays.items():
        header[name] = [a.dtype.str, list(a.shape), offset]
        offset += -(-a.nbytes // _ALIGN) * _ALIGN
    head = json.dumps(header).encode()
    start = -(-(len(_MAGIC) + 8 + len(head)) // _ALIGN) * _ALIGN
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(_MAGIC + len(head).to_bytes(8, "little") + head)
        for name, a in arrays.items():
            f.seek(start + header[name][2])
            f.write(np.ascontiguousarray(a).tobytes())
        f.truncate(start + offset)
    os.replace(tmp, path)


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a :func:`save_arrays` file, memory-mapped read-only."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    if bytes(data[: len(_MAGIC)]) != _MAGIC:
        raise ValueError("not a packed-decoder file")
    size = int.from_bytes(bytes(data[len(_MAGIC) : len(_MAGIC) + 8]), "little")
    head_end = len(_MAGIC) + 8 + size
    header = json.loads(bytes(data[len(_MAGIC) + 8 : head_end]))
    start = -(-head_end // _ALIGN) * _ALIGN
    arrays = {}
    for name, (dtype, shape, offset) in header.items():
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        begin = start + offset
        if begin + count * dtype.itemsize > data.size:
            raise ValueError(f"packed-decoder file truncated at {name}")
        arrays[name] = data[begin : begin + count * dtype.itemsize].view(dtype).reshape(shape)
    return arrays


def load_or_pack(model_file: Path, head_ids: np.ndarray | None,
                 pack: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The packed arrays for ``model_file``: memory-mapped from the cache, else ``pack()``ed
    and stored (a cache that cannot be written or read is only slower, never an error)."""
    from audiofast.cache import cache_dir

    path = cache_dir() / "packed" / f"{cache_key(model_file, head_ids)}.npk"
    if path.is_file():
        try:
            return load_arrays(path)
        except Exception as exc:  # truncated by a full disk, foreign file: pack again
            log.warning("packed decoder cache %s unreadable (%s); packing again", path, exc)
    arrays = pack()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_arrays(path, arrays)
    except OSError as exc:
        log.warning("packed decoder cache not written (%s)", exc)
    return arrays
