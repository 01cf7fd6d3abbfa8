"""The int8 DiT block with its norms fused into the linears that follow them.

Each pre-norm of a :class:`~audiofast.diffusion.dit.DiTBlock` feeds an int8 linear: the
self-attention's ``to_qkv`` (after ``rms(x) * (1 + scale_sa) + shift_sa``), the cross-attention's
``to_q`` (after a plain ``rms(x)``) and the feed-forward's GLU projection (after
``rms(x) * (1 + scale_ff) + shift_ff``). In PyTorch each is six full passes over the activations
before the kernel quantizes them in a seventh; ``kernels.modulated_linear`` does the norm, the
modulation (the norm's gain folded into the per-sample multiplier) and the per-token 8-bit
quantization in one pass, then the same int8 GEMM. The gated residuals are one ``addcmul``.

Numerics: the linear sees the same W8A8 rounding as :class:`~audiofast.diffusion.qad.
FakeQuantLinear` (what QAD trains against); only float rounding order differs
(``rms(x) * (gamma * (1 + s))`` here, ``(rms(x) * gamma) * (1 + s)`` there).
tests/test_int8_block.py bounds the difference.

Self-attention: in 8 bits (``attn.int8``: int8 checkpoints that record it, and what QAD trains
with) it is one kernel pass from the QKV rows to the rows ``to_out`` reads
(``kernels.dit_attention_int8``: q/k norms, RoPE, int8 QK and PV; :mod:`~audiofast.diffusion.
int8_attention` has the arithmetic); in float32 the per-head q/k RMS norms, rotary positions
and head layout are one kernel pass (``kernels.qk_norm_rope``: two norms, two rotations and four
layout copies in PyTorch) before SDPA, equal to :class:`~audiofast.diffusion.attention.
Attention`'s own math up to rounding order.

The two gated residuals (``x + to_out(h) * sigmoid(1 - gate)`` and the feed-forward's
``x + out(value * silu(gate)) * sigmoid(1 - gate)``) are one ``kernels.gated_linear`` call each,
the gated residual in the GEMM's epilogue. The feed-forward's GLU is the epilogue of the
projection before it (``modulated_linear(..., glu_pairs=True)``: its outputs packed as value /
gate pairs of 16 channels), so the doubled-width projection never goes to memory; where that
cannot run, ``gated_linear`` applies the GLU as it quantizes its input rows.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from audiofast.diffusion.attention import Attention
from audiofast.diffusion.dit import DiTBlock
from audiofast.diffusion.int8 import Int8Linear
from audiofast.diffusion.layers import RMSNorm


def modulated_linear(
    linear: Int8Linear,
    x: torch.Tensor,
    norm: RMSNorm,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    glu_pairs: bool = False,
) -> torch.Tensor:
    """``linear(norm(x) * (1 + scale) + shift)`` for ``x [B, N, D]`` and ``scale, shift
    [B, 1, D]`` (None: no modulation), one kernel call when the kernel can take it.
    ``glu_pairs`` (kernel only): ``value * silu(gate)`` of that output's two halves, made in
    the GEMM's epilogue, so the doubled-width projection never goes to memory."""
    if not FusedInt8Block.runs_fused(linear, x):
        return linear(norm(x) if scale is None else norm(x) * (1 + scale) + shift)
    b, n, d = x.shape
    mult = norm.gamma.float().expand(b, d)
    if scale is not None:
        mult = mult * (1 + scale.reshape(b, d).float())
    offset = x.new_zeros(b, d) if shift is None else shift.reshape(b, d)
    from audiofast.asr import kernels

    kernels.set_threads(torch.get_num_threads())
    y = kernels.modulated_linear(x.detach().reshape(b * n, d).numpy(), n, mult.detach().numpy(),
                                 offset.detach().numpy(), norm.eps, linear.packed(glu_pairs),
                                 glu_pairs)
    return torch.from_numpy(y).reshape(b, n, -1)


_rope_tables: tuple[torch.Tensor, np.ndarray, np.ndarray] | None = None


def rope_tables(rope: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``cos(rope), sin(rope)`` as the kernels take them, computed once per DiT pass (every
    block gets the same ``rope`` tensor; six cos/sin pairs cost ~1.5 ms of a 140 ms pass)."""
    global _rope_tables
    tables = _rope_tables  # one read: another thread may replace it meanwhile
    if tables is None or tables[0] is not rope:
        tables = _rope_tables = (rope, rope.cos().numpy(), rope.sin().numpy())
    return tables[1], tables[2]


def attention_rows(attn: Attention, x: torch.Tensor, qkv: torch.Tensor, rope: torch.Tensor,
                   padding_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The self-attention's rows before ``to_out`` (``[B, N, heads x d]``) from the kernels,
    or None where they cannot take it: not fused, differential, non-RMS q/k norms, RoPE wider
    than a head. 8-bit attention (``attn.int8``) is one kernel pass
    (``kernels.dit_attention_int8``); float attention takes its q/k norms, rotary positions
    and head layout from ``kernels.qk_norm_rope``, then SDPA."""
    norm = getattr(attn, "q_norm", None)
    if (not FusedInt8Block.runs_fused(attn.to_qkv, x) or attn.differential
            or not isinstance(norm, RMSNorm) or rope is None
            or rope.shape[-1] > qkv.shape[-1] // (3 * attn.heads)):
        return None
    from audiofast.asr import kernels

    b, n, _ = qkv.shape
    args = (qkv.detach().reshape(b * n, -1).numpy(), n, attn.heads,
            norm.gamma.detach().float().numpy(), attn.k_norm.gamma.detach().float().numpy(),
            norm.eps, *rope_tables(rope))
    if attn.int8:  # int8_attention.py's arithmetic
        mask = None if padding_mask is None else padding_mask.float().numpy()
        return torch.from_numpy(kernels.dit_attention_int8(*args, mask)).reshape(b, n, -1)
    q, k, v = (torch.from_numpy(t) for t in kernels.qk_norm_rope(*args))
    if padding_mask is not None:  # as Attention does: padded positions give zero values
        v.mul_(padding_mask[:, None, :, None].to(v.dtype))
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, -1)


def self_attention(attn: Attention, x: torch.Tensor, qkv: torch.Tensor, rope: torch.Tensor,
                   padding_mask: torch.Tensor | None) -> torch.Tensor:
    """``attn(x, rope=rope, projected=qkv)``, through the kernels where they take it."""
    rows = attention_rows(attn, x, qkv, rope, padding_mask)
    if rows is None:
        return attn(x, rope=rope, padding_mask=padding_mask, projected=qkv)
    return attn.to_out(rows)


def cross_attention(attn: Attention, x: torch.Tensor, context: torch.Tensor,
                    q: torch.Tensor) -> torch.Tensor:
    """``x + attn(x, context=context, projected=q)``; in 8 bits (``attn.int8``) the norms and
    attention are one kernel pass (``kernels.dit_cross_attention_int8``) and the residual is
    ``to_out``'s epilogue."""
    norm = getattr(attn, "q_norm", None)
    if (not attn.int8 or not FusedInt8Block.runs_fused(attn.to_kv, context)
            or attn.differential or not isinstance(norm, RMSNorm)):
        return x + attn(x, context=context, projected=q)
    from audiofast.asr import kernels

    b, n, d = x.shape
    kv = attn.to_kv(context)
    rows = kernels.dit_cross_attention_int8(
        q.detach().reshape(b * n, -1).numpy(), kv.detach().reshape(-1, kv.shape[-1]).numpy(), b,
        attn.heads, norm.gamma.detach().float().numpy(),
        attn.k_norm.gamma.detach().float().numpy(), norm.eps)
    return gated_residual(attn.to_out, torch.from_numpy(rows).reshape(b, n, d), x,
                          x.new_ones(b, 1, d))


def gated_residual(linear: torch.nn.Module, a: torch.Tensor, x: torch.Tensor,
                   gate: torch.Tensor, glu: bool = False) -> torch.Tensor:
    """``x + linear(a') * gate`` with ``a' = a`` or (``glu``) ``value * silu(gate_half)`` of
    ``a``'s two halves; ``gate [B, 1, D]``. One kernel call (``kernels.gated_linear``: the
    GLU and quantization in one pass, the gated residual as the GEMM's epilogue) when the
    kernel runs ``linear``."""
    if not FusedInt8Block.runs_fused(linear, x):
        if glu:
            value, g = a.chunk(2, -1)
            a = value * F.silu(g)
        return torch.addcmul(x, linear(a), gate)
    from audiofast.asr import kernels

    b, n, d = x.shape
    y = kernels.gated_linear(a.detach().reshape(b * n, -1).numpy(), n, linear.packed(), glu,
                             x.detach().reshape(b * n, d).numpy(),
                             gate.detach().reshape(b, d).float().numpy())
    return torch.from_numpy(y).reshape(b, n, d)


class FusedInt8Block(DiTBlock):
    """A :class:`DiTBlock` whose linears are :class:`Int8Linear` (same parameters, same
    checkpoint keys): :func:`fuse_int8_blocks_` switches a quantized DiT's blocks to it."""

    @staticmethod
    def runs_fused(linear: torch.nn.Module, x: torch.Tensor) -> bool:
        return (isinstance(linear, Int8Linear) and linear.use_kernel and x.device.type == "cpu"
                and x.dtype == torch.float32 and linear.in_features % 32 == 0)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        modulation: torch.Tensor,
        rope: torch.Tensor,
        local_cond: torch.Tensor | None,
        padding_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        scale_sa, shift_sa, gate_sa, scale_ff, shift_ff, gate_ff = (
            (self.to_scale_shift_gate + modulation).unsqueeze(1).chunk(6, dim=-1)
        )
        qkv = modulated_linear(self.self_attn.to_qkv, x, self.pre_norm, scale_sa, shift_sa)
        rows = attention_rows(self.self_attn, x, qkv, rope, padding_mask)
        if rows is None:
            h = self.self_attn(x, rope=rope, padding_mask=padding_mask, projected=qkv)
            x = torch.addcmul(x, h, torch.sigmoid(1 - gate_sa))
        else:
            x = gated_residual(self.self_attn.to_out, rows, x, torch.sigmoid(1 - gate_sa))
        q = modulated_linear(self.cross_attn.to_q, x, self.cross_attend_norm)
        x = cross_attention(self.cross_attn, x, context, q)
        if local_cond is not None and hasattr(self, "to_local_embed"):
            local = self.to_local_embed(local_cond)
            x = x + F.pad(local, (0, 0, x.shape[1] - local.shape[1], 0))
        glu, out = self.ff.ff[0], self.ff.ff[2]
        if (not glu.sinusoidal and self.runs_fused(glu.proj, x) and self.runs_fused(out, x)
                and glu.proj.out_features % 32 == 0):  # the GLU in the first GEMM's epilogue
            act = modulated_linear(glu.proj, x, self.ff_norm, scale_ff, shift_ff, glu_pairs=True)
            return gated_residual(out, act, x, torch.sigmoid(1 - gate_ff))
        projected = modulated_linear(glu.proj, x, self.ff_norm, scale_ff, shift_ff)
        if glu.sinusoidal:
            value, gate = projected.chunk(2, -1)
            act = value * torch.sin(3.14159265359 * gate)
            return torch.addcmul(x, out(act), torch.sigmoid(1 - gate_ff))
        return gated_residual(out, projected, x, torch.sigmoid(1 - gate_ff), glu=True)


def fuse_int8_blocks_(dit: torch.nn.Module) -> torch.nn.Module:
    """Switch every block of a quantized DiT to :class:`FusedInt8Block` (in place)."""
    for layer in dit.transformer.layers:
        if type(layer) is DiTBlock:
            layer.__class__ = FusedInt8Block
    return dit
