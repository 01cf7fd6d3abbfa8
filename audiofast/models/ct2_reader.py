"""Read CTranslate2's ``model.bin`` into numpy arrays.

CTranslate2 ships no CT2 -> PyTorch converter, but its file format is small and documented by
its own writer (``ctranslate2/specs/model_spec.py``): a header, named tensors, then aliases.
Reading it lets the PyTorch paths (owned decoder, vocab diet, distillation) run on the very
weights the int8 runtime uses.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

# Type ids, in the order CTranslate2 writes them.
_DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
SUPPORTED_BINARY_VERSIONS = (5, 6)


class CT2FormatError(ValueError):
    """The file is not a CTranslate2 model this reader understands."""


@dataclass
class CT2Model:
    spec: str
    revision: int
    variables: dict[str, np.ndarray] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.variables[self.aliases.get(name, name)]

    def __contains__(self, name: str) -> bool:
        return self.aliases.get(name, name) in self.variables

    def scalar(self, name: str) -> int:
        return int(self[name].reshape(-1)[0])

    def float_weight(self, name: str) -> np.ndarray:
        """A weight as float32, dequantizing int8/int16 weights with their ``weight_scale``."""
        value = self[name]
        if value.dtype in (np.int8, np.int16):
            scale_name = name.rsplit("/", 1)[0] + "/weight_scale"
            if scale_name not in self:
                raise CT2FormatError(f"{name} is quantized but {scale_name} is missing")
            scale = self[scale_name].astype(np.float32)
            return value.astype(np.float32) / scale.reshape(-1, *([1] * (value.ndim - 1)))
        return value.astype(np.float32)


def _read(f: BinaryIO, fmt: str):
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise CT2FormatError("unexpected end of file")
    return struct.unpack("<" + fmt, data)


def _read_string(f: BinaryIO) -> str:
    (length,) = _read(f, "H")
    raw = f.read(length)
    if len(raw) != length:
        raise CT2FormatError("unexpected end of file")
    return raw[:-1].decode("utf-8")


def _to_array(raw: bytes, dtype_id: int, shape: tuple[int, ...]) -> np.ndarray:
    if dtype_id >= len(_DTYPES):
        raise CT2FormatError(f"unknown dtype id {dtype_id}")
    name = _DTYPES[dtype_id]
    if name == "bfloat16":  # numpy has no bfloat16: widen the 16 bits into float32's high half
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    return np.frombuffer(raw, dtype=np.dtype(name).newbyteorder("<")).reshape(shape)


def read_ct2_model(path: str | Path) -> CT2Model:
    """Read every variable of a CTranslate2 ``model.bin`` (a file or the model directory)."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.bin"
    if not path.is_file():
        raise FileNotFoundError(f"no CTranslate2 model.bin at {path}")
    with path.open("rb") as f:
        (version,) = _read(f, "I")
        if version not in SUPPORTED_BINARY_VERSIONS:
            raise CT2FormatError(f"{path}: unsupported CTranslate2 binary version {version}")
        model = CT2Model(spec=_read_string(f), revision=_read(f, "I")[0])
        (num_variables,) = _read(f, "I")
        for _ in range(num_variables):
            name = _read_string(f)
            (rank,) = _read(f, "B")
            shape = _read(f, "I" * rank) if rank else ()
            (dtype_id,) = _read(f, "B")
            (num_bytes,) = _read(f, "I")
            raw = f.read(num_bytes)
            if len(raw) != num_bytes:
                raise CT2FormatError(f"{path}: truncated tensor {name}")
            model.variables[name] = _to_array(raw, dtype_id, tuple(shape))
        (num_aliases,) = _read(f, "I")
        for _ in range(num_aliases):
            alias = _read_string(f)
            model.aliases[alias] = _read_string(f)
    return model
