"""The SA3 lane's DiT kernels (modulated_linear.cpp, gated_linear.cpp, qk_norm_rope.cpp,
dit_attention.cpp): a transformer block's norms, modulation, gates and 8-bit attention fused
around the int8 linears, so ``diffusion/int8_block.py`` runs a block in a few calls. Re-exported
from :mod:`audiofast.asr.kernels`; call them through it (tests patch it there)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import _check, _library, as_arrays

__all__ = ["dit_attention_int8", "dit_attention_uses_vnni", "dit_cross_attention_int8",
           "gated_linear", "modulated_linear", "qk_norm_rope"]


def modulated_linear(x: np.ndarray, tokens: int, mult: np.ndarray, shift: np.ndarray,
                     eps: float, linear: Sequence[np.ndarray], glu_pairs: bool = False
                     ) -> np.ndarray:
    """``L(rms(x) * mult[b] + shift[b])`` for x ``(samples x tokens, in)`` and mult, shift
    ``(samples, in)``: the DiT's norm, adaLN modulation and row quantization in one pass, then
    one int8 linear (the four arrays of :func:`quant_linear`). ``glu_pairs``: L's outputs
    packed as (value, gate) pairs of 16 (``int8_pack.glu_pairs_order``) and the result their
    ``value * silu(gate)``, half as wide, made in the GEMM's epilogue."""
    if len(linear) != 4:
        raise ValueError("modulated_linear takes (weight, scales, zero-point terms, bias)")
    arrays = as_arrays(linear)
    x = np.ascontiguousarray(x, dtype=np.float32)
    mult = np.ascontiguousarray(mult, dtype=np.float32)
    shift = np.ascontiguousarray(shift, dtype=np.float32)
    if x.ndim != 2 or mult.shape != shift.shape:
        raise ValueError("modulated_linear: x must be (rows, in), mult and shift one shape")
    out = arrays[3].shape[0] // (2 if glu_pairs else 1)
    y = np.empty((x.shape[0], out), dtype=np.float32)
    _check(_library().audiofast_modulated_linear(
        x.ctypes.data, x.shape[0], x.shape[1], tokens, mult.ctypes.data, shift.ctypes.data,
        mult.size, eps, arrays, int(glu_pairs), y.ctypes.data, y.size))
    return y


def gated_linear(x: np.ndarray, tokens: int, linear: Sequence[np.ndarray], glu: bool = False,
                 residual: np.ndarray | None = None, gate: np.ndarray | None = None
                 ) -> np.ndarray:
    """``residual + L(a) * gate[b]`` (or ``L(a)`` without a residual) for rows of ``tokens``
    per sample: ``a = x``, or with ``glu`` ``a = x[:, :in] * silu(x[:, in:])``; ``gate
    (samples, out)``. The DiT's attention output and second feed-forward linear in one call."""
    if len(linear) != 4:
        raise ValueError("gated_linear takes (weight, scales, zero-point terms, bias)")
    if (residual is None) != (gate is None):
        raise ValueError("gated_linear: give both residual and gate, or neither")
    arrays = as_arrays(linear)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError("gated_linear: x must be (rows, in)")
    y = np.empty((x.shape[0], arrays[3].shape[0]), dtype=np.float32)
    res = gate_arr = None
    if residual is not None:
        res = np.ascontiguousarray(residual, dtype=np.float32)
        gate_arr = np.ascontiguousarray(gate, dtype=np.float32)
        if res.shape != y.shape:
            raise ValueError("gated_linear: residual must be (rows, out)")
    _check(_library().audiofast_gated_linear(
        x.ctypes.data, x.shape[0], x.shape[1], tokens, int(glu),
        None if res is None else res.ctypes.data, None if gate_arr is None else
        gate_arr.ctypes.data, 0 if gate_arr is None else gate_arr.size, arrays, y.ctypes.data,
        y.size))
    return y


def _heads_inputs(name: str, qkv: np.ndarray, tokens: int, heads: int, q_gain: np.ndarray,
                  k_gain: np.ndarray, cos: np.ndarray, sin: np.ndarray):
    """The self-attention kernels' inputs as contiguous float32, checked; plus the head dim."""
    qkv = np.ascontiguousarray(qkv, dtype=np.float32)
    gains = [np.ascontiguousarray(g, dtype=np.float32) for g in (q_gain, k_gain)]
    cos = np.ascontiguousarray(cos, dtype=np.float32)
    sin = np.ascontiguousarray(sin, dtype=np.float32)
    if qkv.ndim != 2 or qkv.shape[1] % (3 * heads) or tokens <= 0 or qkv.shape[0] % tokens:
        raise ValueError(f"{name}: qkv must be (batch x tokens, 3 x heads x head_dim)")
    d = qkv.shape[1] // (3 * heads)
    if any(g.shape != (d,) for g in gains) or cos.shape != sin.shape or cos.shape[0] != tokens:
        raise ValueError(f"{name}: gains must be (head_dim,), cos and sin (tokens, rot)")
    return qkv, gains, cos, sin, d


def qk_norm_rope(qkv: np.ndarray, tokens: int, heads: int, q_gain: np.ndarray,
                 k_gain: np.ndarray, eps: float, cos: np.ndarray, sin: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Self-attention heads ``q, k, v (batch, heads, tokens, d)`` from QKV rows ``(batch x
    tokens, 3 x heads x d)``: q and k RMS-normed per head with their gains, rotated on their
    first ``cos.shape[1]`` channels (``cos, sin (tokens, rot)``); v as it is."""
    qkv, gains, cos, sin, d = _heads_inputs("qk_norm_rope", qkv, tokens, heads, q_gain, k_gain,
                                            cos, sin)
    q, k, v = (np.empty((qkv.shape[0] // tokens, heads, tokens, d), np.float32)
               for _ in range(3))
    _check(_library().audiofast_qk_norm_rope(
        qkv.ctypes.data, qkv.shape[0] // tokens, tokens, heads, d, cos.shape[1],
        gains[0].ctypes.data, gains[1].ctypes.data, eps, cos.ctypes.data, sin.ctypes.data,
        q.ctypes.data, k.ctypes.data, v.ctypes.data))
    return q, k, v


def dit_attention_int8(qkv: np.ndarray, tokens: int, heads: int, q_gain: np.ndarray,
                       k_gain: np.ndarray, eps: float, cos: np.ndarray, sin: np.ndarray,
                       value_mask: np.ndarray | None = None) -> np.ndarray:
    """The DiT's self-attention in 8 bits (kernels/dit_attention.cpp): QKV rows ``(batch x
    tokens, 3 x heads x d)`` -> attention rows ``(batch x tokens, heads x d)`` before
    ``to_out``, the q/k norms and rotary positions as :func:`qk_norm_rope`, v times
    ``value_mask (batch, tokens)`` when given."""
    qkv, gains, cos, sin, d = _heads_inputs("dit_attention_int8", qkv, tokens, heads, q_gain,
                                            k_gain, cos, sin)
    batch = qkv.shape[0] // tokens
    mask = None
    if value_mask is not None:
        mask = np.ascontiguousarray(value_mask, dtype=np.float32)
        if mask.shape != (batch, tokens):
            raise ValueError("dit_attention_int8: value_mask must be (batch, tokens)")
    out = np.empty((qkv.shape[0], heads * d), np.float32)
    _check(_library().audiofast_dit_attention_int8(
        qkv.ctypes.data, batch, tokens, heads, d, cos.shape[1], gains[0].ctypes.data,
        gains[1].ctypes.data, eps, cos.ctypes.data, sin.ctypes.data,
        None if mask is None else mask.ctypes.data, out.ctypes.data))
    return out


def dit_cross_attention_int8(q: np.ndarray, kv: np.ndarray, batch: int, heads: int,
                             q_gain: np.ndarray, k_gain: np.ndarray, eps: float) -> np.ndarray:
    """The DiT's cross-attention in 8 bits: q rows ``(batch x tokens, heads x d)`` over kv
    rows ``(batch x context, 2 x heads x d)`` -> ``(batch x tokens, heads x d)``, q and k
    RMS-normed per head (as :func:`dit_attention_int8`, without positions or mask)."""
    q = np.ascontiguousarray(q, dtype=np.float32)
    kv = np.ascontiguousarray(kv, dtype=np.float32)
    gains = [np.ascontiguousarray(g, dtype=np.float32) for g in (q_gain, k_gain)]
    if (q.ndim != 2 or kv.ndim != 2 or batch <= 0 or q.shape[0] % batch or kv.shape[0] % batch
            or q.shape[1] % heads or kv.shape[1] != 2 * q.shape[1]):
        raise ValueError("dit_cross_attention_int8: q must be (batch x tokens, heads x d), kv "
                         "(batch x context, 2 x heads x d)")
    d = q.shape[1] // heads
    if any(g.shape != (d,) for g in gains):
        raise ValueError("dit_cross_attention_int8: gains must be (head_dim,)")
    out = np.empty_like(q)
    _check(_library().audiofast_dit_cross_attention_int8(
        q.ctypes.data, kv.ctypes.data, batch, q.shape[0] // batch, kv.shape[0] // batch, heads,
        d, gains[0].ctypes.data, gains[1].ctypes.data, eps, out.ctypes.data))
    return out


def dit_attention_uses_vnni(head_dim: int) -> bool:
    """Whether :func:`dit_attention_int8` takes the AVX-512 VNNI path for this head width."""
    return bool(_library().audiofast_dit_attention_uses_vnni(int(head_dim)))
