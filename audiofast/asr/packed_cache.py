"""The fused decoder's packed weights on disk, so a process starts without re-packing them.

Quantizing and packing whisper-base's decoder took ~1.3 s of every start (and needs torch);
the packed arrays are saved once (a safetensors file, written to a temporary name and
renamed, so a crash never leaves half a file) and memory-mapped with numpy on later starts
(the safetensors library copies arrays into memory; its format is a length, a JSON header and
the raw bytes, read here in place): pages are read as the decoder touches them and shared
between processes. It is keyed by the model's bytes (path, size, mtime), the head cut, the
kernel build and the packing code, so any change packs afresh.
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
_CODE = ("int8_pack.py", "int4_pack.py", "fused_decoder.py", "decoder_weights.py",
         "packed_cache.py", "fused_encoder.py")
_DTYPES = {"F32": np.float32, "F16": np.float16, "I8": np.int8, "U8": np.uint8, "I32": np.int32,
           "I64": np.int64}


def _torch_version() -> str:  # packing uses torch's quantization observers
    try:
        return version("torch")
    except PackageNotFoundError:
        return "none"


def cache_key(model_file: Path, head_ids: np.ndarray | None, precision: str = "int8") -> str:
    from audiofast.asr import kernels

    stat = model_file.stat()
    digest = hashlib.sha256(f"{model_file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:"
                            f"{kernels.build_key()}:{_torch_version()}:{precision}".encode())
    if head_ids is not None:
        digest.update(np.asarray(head_ids, dtype=np.int64).tobytes())
    here = Path(__file__).parent
    for name in _CODE:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:20]


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` as a safetensors file (atomically: a temporary name, then a rename)."""
    from safetensors.numpy import save_file

    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    save_file({k: np.require(a, requirements="C") for k, a in arrays.items()}, str(tmp))
    os.replace(tmp, path)


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a safetensors file, memory-mapped read-only (no copy)."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    size = int.from_bytes(bytes(data[:8]), "little")
    if not 2 <= size <= data.size - 8:
        raise ValueError("not a safetensors file")
    header = json.loads(bytes(data[8 : 8 + size]))
    arrays = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = (8 + size + offset for offset in entry["data_offsets"])
        if end > data.size:
            raise ValueError(f"safetensors file truncated at {name}")
        arrays[name] = data[begin:end].view(_DTYPES[entry["dtype"]]).reshape(tuple(entry["shape"]))
    return arrays


def load_or_pack(model_file: Path, head_ids: np.ndarray | None,
                 pack: Callable[[], dict[str, np.ndarray]], precision: str = "int8"
                 ) -> dict[str, np.ndarray]:
    """The packed arrays for ``model_file``: memory-mapped from the cache, else ``pack()``ed
    and stored (a cache that cannot be written or read is only slower, never an error)."""
    from audiofast.cache import cache_dir

    path = cache_dir() / "packed" / f"{cache_key(model_file, head_ids, precision)}.safetensors"
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
