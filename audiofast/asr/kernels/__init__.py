"""Our C++ kernels: :func:`decoder_forward`, the whole int8 decoder in one call
(decoder_step.cpp, over int8_linear.cpp's linears and cross_attention.cpp), and
:func:`quant_linear` alone (cross-attention K/V, the SA3 lane's int8 DiT), int8 or int4;
the DiT block's fused kernels live in :mod:`.dit` and are re-exported here.

A plain shared library with a C interface (capi.cpp) over numpy arrays, called through
ctypes: no torch headers to compile against (a build takes seconds, not a minute) and no torch
to import (the default transcription path runs without it, which is most of a cold start).
Built on first use with the system C++ compiler (``$CXX``, else ``c++``) into the audiofast
cache, once per source hash; ``scripts/setup.sh`` builds it. Where it cannot be built - no
compiler, or a CPU without AVX2/F16C - :func:`backend` says "none" with a warning naming the
reason, and transcription runs on CTranslate2 (``--engine auto``) instead.

``python -m audiofast.asr.kernels`` builds it and prints the backend.
"""

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
SOURCES = sorted(HERE.glob("*.cpp"))
HEADERS = sorted(HERE.glob("*.h"))
CFLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-std=c++17", "-fPIC", "-pthread"]
MAX_DIMS = 5
_DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(np.int8): 2,
           np.dtype(np.int32): 3, np.dtype(np.int64): 4, np.dtype(np.uint8): 5}
_ERRORS = {1: ValueError, 2: MemoryError, 3: RuntimeError}
_backend: str | None = None
_lib: ctypes.CDLL | None = None


class Array(ctypes.Structure):
    """A numpy array as the library borrows it (kernels/array.h): pointer, shape, dtype."""

    _fields_ = [("data", ctypes.c_void_p), ("shape", ctypes.c_int64 * MAX_DIMS),
                ("ndim", ctypes.c_int32), ("dtype", ctypes.c_int32)]


def as_array(a: np.ndarray) -> Array:
    """``a``'s memory for the library; ``a`` must be C-contiguous and must outlive the call
    (the library reads the pointer, it keeps no reference)."""
    if not isinstance(a, np.ndarray) or a.dtype not in _DTYPES:
        raise TypeError(f"kernels take float32/float16/int8/uint8/int32/int64 numpy arrays, "
                        f"not {type(a).__name__} {getattr(a, 'dtype', '')}")
    if not a.flags.c_contiguous or a.ndim > MAX_DIMS:
        raise ValueError(f"kernels take C-contiguous arrays of at most {MAX_DIMS} dims")
    shape = (ctypes.c_int64 * MAX_DIMS)(*a.shape)
    return Array(a.ctypes.data, shape, a.ndim, _DTYPES[a.dtype])


def as_arrays(arrays: Sequence[np.ndarray]) -> ctypes.Array:
    """A C array of :class:`Array` (decoder parameters, per-layer cross-attention K/V)."""
    return (Array * len(arrays))(*[as_array(a) for a in arrays])


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


def compiler() -> str:
    return os.environ.get("CXX") or "c++"


@functools.cache
def build_key() -> str:
    """A hash of what the library is built from: sources, headers, compiler and flags. A
    build is current exactly when its key matches (file times lie after a reinstall or a
    checkout). This file is not in it: the Python side can change without a rebuild."""
    digest = hashlib.sha256(" ".join([compiler(), *CFLAGS]).encode())
    for path in [*SOURCES, *HEADERS]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _built_library() -> Path:
    from audiofast.cache import cache_dir

    return cache_dir() / "kernels" / f"capi-{build_key()}" / "libaudiofast_kernels.so"


def is_built() -> bool:
    """Whether the kernels are built for these exact sources and flags, on a CPU that runs
    them (nothing is built or loaded here: ``--engine auto`` asks this to choose)."""
    if os.environ.get("AUDIOFAST_KERNELS") == "none" or not _cpu_supports_kernel():
        return False
    return _built_library().is_file()


def _build() -> Path:
    """Compile the sources (into a temporary name, renamed when done: a build cut short
    never looks current)."""
    built = _built_library()
    if built.is_file():
        return built
    if shutil.which(compiler()) is None:
        raise RuntimeError(f"no C++ compiler ({compiler()!r} not found)")
    built.parent.mkdir(parents=True, exist_ok=True)
    tmp = built.with_suffix(f".{os.getpid()}.tmp")
    run = subprocess.run([compiler(), *CFLAGS, "-shared", *map(str, SOURCES), "-o", str(tmp)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        tmp.unlink(missing_ok=True)
        first = next((line for line in run.stderr.splitlines() if "error" in line),
                     run.stderr.strip()[:200]) or f"exit status {run.returncode}"
        raise RuntimeError(f"{compiler()} failed: {first}")
    os.replace(tmp, built)
    return built


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    i64, ptr, arr = ctypes.c_int64, ctypes.c_void_p, ctypes.POINTER(Array)
    lib.audiofast_last_error.restype = ctypes.c_char_p
    lib.audiofast_decoder_forward.argtypes = [ptr, i64, i64, i64, arr, i64, arr, arr, arr, arr,
                                              arr, arr, i64, i64, ptr, i64, ptr]
    arrs = ctypes.POINTER(arr)
    lib.audiofast_decoder_forward_batch.argtypes = [ptr, i64, ptr, ptr, ptr, arr, i64, arrs,
                                                    arrs, arrs, arrs, arrs, arrs, i64, i64, ptr,
                                                    i64, ptr]
    lib.audiofast_quant_linear.argtypes = [ptr, i64, i64, arr, ptr, i64]
    lib.audiofast_modulated_linear.argtypes = [ptr, i64, i64, i64, ptr, ptr, i64,
                                               ctypes.c_float, arr, ctypes.c_int, ptr, i64]
    lib.audiofast_gated_linear.argtypes = [ptr, i64, i64, i64, ctypes.c_int, ptr, ptr, i64,
                                           arr, ptr, i64]
    lib.audiofast_qk_norm_rope.argtypes = [ptr, i64, i64, i64, i64, i64, ptr, ptr,
                                           ctypes.c_float, ptr, ptr, ptr, ptr, ptr]
    lib.audiofast_dit_attention_int8.argtypes = [ptr, i64, i64, i64, i64, i64, ptr, ptr,
                                                 ctypes.c_float, ptr, ptr, ptr, ptr]
    lib.audiofast_dit_cross_attention_int8.argtypes = [ptr, ptr, i64, i64, i64, i64, i64, ptr,
                                                       ptr, ctypes.c_float, ptr]
    lib.audiofast_dit_attention_uses_vnni.argtypes = [i64]
    lib.audiofast_gelu.argtypes = [ptr, i64]
    lib.audiofast_encoder_forward.argtypes = [ptr, i64, i64, i64, arr, i64]
    lib.audiofast_split_heads_f16.argtypes = [ptr, i64, i64, ptr, ptr]
    lib.audiofast_split_heads_i8.argtypes = [ptr, i64, i64, ptr, ptr, ptr, ptr]
    lib.audiofast_pool_selftest.argtypes = [i64, i64, ctypes.POINTER(i64)]
    lib.audiofast_set_threads.argtypes = [ctypes.c_int]
    return lib


def backend() -> str:
    """Load (building if needed) the kernels: "avx2" when they run here, "none" (with a
    warning naming why) when they cannot. ``AUDIOFAST_KERNELS=none`` forces "none"."""
    global _backend, _lib
    if _backend is not None:
        return _backend
    reason = None
    if os.environ.get("AUDIOFAST_KERNELS") == "none":
        reason = "AUDIOFAST_KERNELS=none"
    elif not _cpu_supports_kernel():
        reason = "this CPU lacks AVX2/FMA/F16C"
    else:
        try:
            _lib = _load(_build())
        except Exception as err:  # no compiler or headers: run, slower, without it
            first_line = str(err).splitlines()[0] if str(err) else repr(err)
            reason = f"building it failed ({first_line})"
    if reason is None:
        _backend = "avx2"
    else:
        warnings.warn(f"audiofast: C++ decoder kernels not available: {reason}", stacklevel=2)
        _backend = "none"
    return _backend


def _library() -> ctypes.CDLL:
    if backend() != "avx2":
        raise RuntimeError("audiofast's C++ kernels are not available here")
    return _lib


def _check(status: int) -> None:
    if status:
        raise _ERRORS.get(status, RuntimeError)(_library().audiofast_last_error().decode())


def set_threads(threads: int) -> None:
    """Threads the kernels' parallel loops use (0: one per CPU core)."""
    _library().audiofast_set_threads(int(threads))


def uses_vnni() -> bool:
    """Whether quantized linears take the AVX-512 VNNI path here (else AVX2), so a test can
    assert which path it compared."""
    return bool(_library().audiofast_uses_vnni())


def quant_linear(x: np.ndarray, linear: Sequence[np.ndarray] | ctypes.Array) -> np.ndarray:
    """(rows, in) float32 -> (rows, out) through one packed linear: int8 (packed weight,
    per-channel scale, weight row sums, bias; int8_pack.py) or int4 (packed uint8 weight,
    per-group fp16 scales, zero terms, bias; int4_pack.py). ``linear``: the four arrays, or
    :func:`as_arrays` of them built once (small linears called often: a drafter's)."""
    if len(linear) != 4:
        raise ValueError("quant_linear takes (weight, scales, zero-point terms, bias)")
    # type and layout checked before any size is read
    arrays = linear if isinstance(linear, ctypes.Array) else as_arrays(linear)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError("quant_linear: x must be (rows, in) float32")
    y = np.empty((x.shape[0], arrays[3].shape[0]), dtype=np.float32)
    _check(_library().audiofast_quant_linear(x.ctypes.data, x.shape[0], x.shape[1], arrays,
                                             y.ctypes.data, y.size))
    return y


def gelu_(x: np.ndarray) -> np.ndarray:
    """Whisper's exact GELU, in place over a C-contiguous float32 array (size a multiple of
    8); returns ``x``."""
    if x.dtype != np.float32 or not x.flags.c_contiguous or not x.flags.writeable:
        raise ValueError("gelu_: x must be a writable C-contiguous float32 array")
    _check(_library().audiofast_gelu(x.ctypes.data, x.size))
    return x


def encoder_forward_(x: np.ndarray, heads: int, params: ctypes.Array) -> np.ndarray:
    """Whisper's encoder layers (kernels/encoder_forward.cpp), in place over x (batch, frames,
    width), the convolutions' output plus positions: x becomes the output (after the final
    norm); returns it. ``params``: :func:`as_arrays` of the final norm, then each layer's 20
    arrays (fused_encoder.py lists them)."""
    if (x.dtype != np.float32 or not x.flags.c_contiguous or not x.flags.writeable
            or x.ndim != 3 or x.shape[2] != heads * 64):
        raise ValueError("encoder_forward_: x must be a writable C-contiguous float32 "
                         "(batch, frames, heads x 64) array")
    _check(_library().audiofast_encoder_forward(x.ctypes.data, x.shape[0], x.shape[1], heads,
                                                params, len(params)))
    return x


def _hidden_pointer(hidden: np.ndarray | None, rows: int, width: int) -> int | None:
    """Where the kernel writes the logit rows' hidden states: ``hidden`` must be a float32
    (rows, width) C array, width the embedding's (params[0]; the kernel trusts its size)."""
    if hidden is None:
        return None
    if (hidden.dtype != np.float32 or hidden.shape != (rows, width)
            or not hidden.flags.c_contiguous):
        raise ValueError(f"hidden must be a C-contiguous float32 ({rows}, {width}) array")
    return hidden.ctypes.data


def decoder_forward(tokens: np.ndarray, start: int, last: int, params: ctypes.Array,
                    k_cache: np.ndarray, v_cache: np.ndarray, cross_k: ctypes.Array,
                    cross_v: ctypes.Array, rescore: int, vocab: int,
                    cross_scales: tuple[ctypes.Array, ctypes.Array] | None = None,
                    hidden: np.ndarray | None = None) -> np.ndarray:
    """Logits (rows, or the last ``last``, x ``vocab``) of ``tokens`` through every decoder
    layer; ``params``, ``cross_k``, ``cross_v`` (and for int8 K/V ``cross_scales``, per layer
    (heads, frames) float32): :func:`as_arrays` of the decoder's arrays (fused_decoder.py),
    built once and kept alive by the caller. ``hidden``, if given, (logit rows, width)
    float32, receives those rows' final-norm hidden states (what the head reads)."""
    tokens = np.ascontiguousarray(tokens, dtype=np.int64).reshape(-1)
    rows = tokens.shape[0]
    out = np.empty((min(last, rows) if last > 0 else rows, vocab), dtype=np.float32)
    k, v = as_array(k_cache), as_array(v_cache)
    _check(_library().audiofast_decoder_forward(
        tokens.ctypes.data, rows, start, last, params, len(params), ctypes.byref(k),
        ctypes.byref(v), cross_k, cross_v, *(cross_scales or (None, None)), len(cross_k), rescore,
        out.ctypes.data, out.size, _hidden_pointer(hidden, out.shape[0], params[0].shape[1])))
    return out


def _split_kv(kv: np.ndarray, heads: int, name: str) -> np.ndarray:
    kv = np.ascontiguousarray(kv, dtype=np.float32)
    if kv.ndim != 2 or kv.shape[1] != 2 * heads * 64:
        raise ValueError(f"{name}: kv must be (frames, {2 * heads * 64}) float32")
    return kv


def split_heads_f16(kv: np.ndarray, heads: int) -> tuple[np.ndarray, np.ndarray]:
    """A window's projected keys and values, ``kv`` (frames, 2 x heads x 64) float32, as the
    decoder reads them: keys and values (heads, frames, 64) in fp16 (F16C; the same values as
    numpy's float16 conversion, several times faster)."""
    kv = _split_kv(kv, heads, "split_heads_f16")
    frames = kv.shape[0]
    keys = np.empty((heads, frames, 64), np.float16)
    values = np.empty((heads, frames, 64), np.float16)
    _check(_library().audiofast_split_heads_f16(kv.ctypes.data, frames, heads,
                                                keys.ctypes.data, values.ctypes.data))
    return keys, values


def split_heads_i8(kv: np.ndarray, heads: int) -> tuple[np.ndarray, ...]:
    """As :func:`split_heads_f16` in int8 (``-kv8``): keys, values (heads, frames, 64) int8
    and their scales (heads, frames) float32, one per frame and head (max |x| / 127, x / scale
    rounded to nearest even). In numpy this was half of a live window's K/V projection."""
    kv = _split_kv(kv, heads, "split_heads_i8")
    frames = kv.shape[0]
    keys, values = (np.empty((heads, frames, 64), np.int8) for _ in range(2))
    key_scale, value_scale = (np.empty((heads, frames), np.float32) for _ in range(2))
    _check(_library().audiofast_split_heads_i8(
        kv.ctypes.data, frames, heads, keys.ctypes.data, values.ctypes.data,
        key_scale.ctypes.data, value_scale.ctypes.data))
    return keys, values, key_scale, value_scale


def _pointers(arrays: Sequence[ctypes.Array | Array]) -> ctypes.Array:
    """A C array of pointers to each of ``arrays`` (each an :class:`Array` or a C array of
    them), which must outlive the call."""
    return (ctypes.POINTER(Array) * len(arrays))(
        *[ctypes.cast(ctypes.byref(a), ctypes.POINTER(Array)) for a in arrays])


def decoder_forward_batch(tokens: Sequence[np.ndarray], starts: Sequence[int],
                          lasts: Sequence[int], params: ctypes.Array,
                          caches: Sequence[tuple[Array, Array]], crosses: Sequence[tuple],
                          rescore: int, vocab: int, hidden: np.ndarray | None = None
                          ) -> list[np.ndarray]:
    """Several sequences in one call, each its own ``tokens`` at ``starts``, its own cache
    (``caches``: :func:`as_array` of its (layers, 1, heads, n_ctx, 64) K and V) and window
    (``crosses``: FusedDecoder.project_audio's tuples): each sequence's logit rows (its last
    ``lasts`` rows, 0: all). Each row equals the same sequence
    decoded alone, bit for bit: the weights are read once for all of them. ``hidden``: as
    :func:`decoder_forward`'s, all sequences' logit rows in order."""
    n_seq = len(tokens)
    if not (n_seq == len(starts) == len(lasts) == len(caches) == len(crosses)) or not n_seq:
        raise ValueError("decoder_forward_batch: one start, last, cache and window per sequence")
    ids = np.ascontiguousarray(np.concatenate([np.asarray(t, np.int64).reshape(-1)
                                               for t in tokens]))
    rows = np.array([np.size(t) for t in tokens], np.int64)
    start = np.array(starts, np.int64)
    last = np.array(lasts, np.int64)
    out_rows = np.where((last > 0) & (last < rows), last, rows)
    out = np.empty((int(out_rows.sum()), vocab), dtype=np.float32)
    layers = {len(cross[1]) for cross in crosses}
    if len(layers) != 1 or {cross[3] is None for cross in crosses} not in ({True}, {False}):
        raise ValueError("decoder_forward_batch: every window needs the same layers and K/V type")
    scales = None if crosses[0][3] is None else [
        _pointers([c[3][i] for c in crosses]) for i in range(2)]
    _check(_library().audiofast_decoder_forward_batch(
        ids.ctypes.data, n_seq, start.ctypes.data, rows.ctypes.data, last.ctypes.data, params,
        len(params), _pointers([c[0] for c in caches]), _pointers([c[1] for c in caches]),
        _pointers([c[1] for c in crosses]), _pointers([c[2] for c in crosses]),
        *(scales or (None, None)), layers.pop(), rescore, out.ctypes.data, out.size,
        _hidden_pointer(hidden, out.shape[0], params[0].shape[1])))
    return np.split(out, np.cumsum(out_rows)[:-1])


def pool_selftest(n: int, throw_at: int) -> int:
    """Tests only: sum of [0, n) over the pool, bad_alloc thrown at ``throw_at`` (-1: none)."""
    total = ctypes.c_int64()
    _check(_library().audiofast_pool_selftest(n, throw_at, ctypes.byref(total)))
    return total.value


# the SA3 lane's DiT kernels, on the library loaded above (imported last: dit.py uses it)
from .dit import *  # noqa: E402, F403
