"""Our C++ kernels: ``torch.ops.audiofast.decoder_forward``, the whole int8 decoder in one op
(decoder_step.cpp, over int8_linear.cpp's ``int8_linear``), and
``torch.ops.audiofast.cross_attention`` (cross_attention.cpp, for the TorchScript step).

Built on first use with the system compiler (``torch.utils.cpp_extension``, ~1 min, once per
torch version; ``scripts/setup.sh`` builds it) into the audiofast cache. Where it cannot be
built - no compiler, or a CPU without AVX2/F16C - the same op is registered with a PyTorch
implementation (the decoder then runs its TorchScript step instead of decoder_forward), so
the decoder runs everywhere; :func:`backend` says which one is live (the judge's transcript
cache keys on it, since the two round differently).

``python -m audiofast.asr.kernels`` builds it and prints the backend.
"""

import functools
import hashlib
import os
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).parent
SOURCES = [HERE / "cross_attention.cpp", HERE / "int8_linear.cpp", HERE / "decoder_step.cpp"]
HEADERS = [HERE / "avx2.h", HERE / "cross_attention.h", HERE / "int8_linear.h", HERE / "pool.h"]
_backend: str | None = None
_fallback: torch.library.Library | None = None  # the fallback's registration, kept alive


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags from /proc/cpuinfo (empty where it cannot be read)."""
    try:
        return frozenset(next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                              if line.startswith("flags")).split())
    except (OSError, StopIteration):
        return frozenset()


def _cpu_supports_kernel() -> bool:
    return {"avx2", "fma", "f16c"} <= cpu_flags()


CFLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c"]


@functools.cache
def build_key() -> str:
    """A hash of what the library is built from: sources, headers, this file, compiler flags
    and the torch version. A build is current exactly when its key matches (file times lie
    after a reinstall or a checkout)."""
    digest = hashlib.sha256(" ".join([torch.__version__, *CFLAGS]).encode())
    for path in [*SOURCES, *HEADERS, Path(__file__)]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _built_library() -> Path:
    from audiofast.models.packaged import cache_dir

    return cache_dir() / "kernels" / f"torch-{torch.__version__}-{build_key()}" / \
        "audiofast_kernels.so"


def is_built() -> bool:
    """Whether the kernels are built for these exact sources, flags and torch, on a CPU that
    runs them (nothing is built or loaded here: the CLI asks this to choose its engine)."""
    if os.environ.get("AUDIOFAST_KERNELS") == "torch" or not _cpu_supports_kernel():
        return False
    return _built_library().is_file()


def _build() -> None:
    built = _built_library()
    folder = built.parent
    if is_built():
        torch.ops.load_library(built)  # skips ninja's up-to-date check (~1 s)
        return
    from torch.utils.cpp_extension import load  # (imported only to build: it is slow)

    folder.mkdir(parents=True, exist_ok=True)
    load(name="audiofast_kernels", sources=[str(p) for p in SOURCES], build_directory=str(folder),
         extra_cflags=CFLAGS, is_python_module=False)


def _cross_attention_torch(q: torch.Tensor, keys: torch.Tensor,
                           values: torch.Tensor) -> torch.Tensor:
    probs = torch.einsum("hd,htd->ht", q, keys.to(q.dtype)).softmax(-1)
    return torch.einsum("ht,htd->hd", probs, values.to(q.dtype))


def _register_torch_fallback() -> None:
    global _fallback
    _fallback = torch.library.Library("audiofast", "DEF")
    _fallback.define("cross_attention(Tensor q, Tensor keys, Tensor values) -> Tensor")
    _fallback.impl("cross_attention", _cross_attention_torch, "CPU")


def backend() -> str:
    """Make ``torch.ops.audiofast.cross_attention`` available: "avx2" (the C++ kernel) or
    "torch" (the fallback). ``AUDIOFAST_KERNELS=torch`` forces the fallback."""
    global _backend
    if _backend is not None:
        return _backend
    reason = None
    if os.environ.get("AUDIOFAST_KERNELS") == "torch":
        reason = "AUDIOFAST_KERNELS=torch"
    elif not _cpu_supports_kernel():
        reason = "this CPU lacks AVX2/FMA/F16C"
    else:
        try:
            _build()
        except Exception as err:  # no compiler, headers or ninja: run, slower, without it
            reason = f"building it failed ({str(err).splitlines()[0] if str(err) else err!r})"
    if reason is None:
        _backend = "avx2"
    else:
        warnings.warn(f"audiofast: C++ decoder kernels not used: {reason}; "
                      "decoding with the PyTorch fallback", stacklevel=2)
        _register_torch_fallback()
        _backend = "torch"
    return _backend
