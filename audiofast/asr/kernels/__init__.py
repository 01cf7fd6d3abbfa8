"""Our C++ kernels: ``torch.ops.audiofast.decoder_forward``, the whole int8 decoder in one op
(decoder_step.cpp, over int8_linear.cpp's ``int8_linear`` and cross_attention.cpp), and
``int8_linear`` alone (the SA3 lane's int8 DiT).

Built on first use with the system compiler (``torch.utils.cpp_extension``, ~1 min, once per
source hash; ``scripts/setup.sh`` builds it) into the audiofast cache. Where it cannot be
built - no compiler, or a CPU without AVX2/F16C - :func:`backend` says "none" with a warning
naming the reason, and transcription runs on CTranslate2 (``--engine auto``) instead.

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
    from audiofast.cache import cache_dir

    return cache_dir() / "kernels" / f"torch-{torch.__version__}-{build_key()}" / \
        "audiofast_kernels.so"


def is_built() -> bool:
    """Whether the kernels are built for these exact sources, flags and torch, on a CPU that
    runs them (nothing is built or loaded here: the CLI asks this to choose its engine)."""
    if os.environ.get("AUDIOFAST_KERNELS") == "none" or not _cpu_supports_kernel():
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


def backend() -> str:
    """Load (building if needed) the kernels: "avx2" when ``torch.ops.audiofast`` holds them,
    "none" (with a warning naming why) when they cannot run here. ``AUDIOFAST_KERNELS=none``
    forces "none"."""
    global _backend
    if _backend is not None:
        return _backend
    reason = None
    if os.environ.get("AUDIOFAST_KERNELS") == "none":
        reason = "AUDIOFAST_KERNELS=none"
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
        warnings.warn(f"audiofast: C++ decoder kernels not available: {reason}", stacklevel=2)
        _backend = "none"
    return _backend
