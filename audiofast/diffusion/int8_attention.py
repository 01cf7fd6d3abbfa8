"""Attention in 8 bits: what the int8 kernels run (``kernels.dit_attention_int8``, ``kernels.
dit_cross_attention_int8``) and what QAD trains against.

After the q/k norms and rotary positions, per head:

- queries: 8 bits over each query's own range ``[min(0, q), max(0, q)]`` (the int8 linears'
  activation rounding, :func:`~audiofast.diffusion.qad.fake_quant_activation`);
- keys: symmetric int8 per key; values: symmetric int8 per channel over the head's tokens;
- softmax weights: ``round(255 exp(s - max))`` per query, so the largest is exactly 255 and the
  weighted sum of int8 values is an exact int32 sum, divided by the weights' own sum.

Why these choices: per-row scales keep one loud token from coarsening every other token's step
(as in the linears); 8-bit weights over a fixed [0, 1] range cost at most 1/510 per weight, and
weights below that vanish, which a softmax over ~130 tokens tolerates (tests bound the error
against float attention; QAD trains the rest away). Gradients pass every rounding unchanged
(straight-through), so a student trained through this sees the kernel's error.
"""

from __future__ import annotations

import torch
from torch import nn

from audiofast.diffusion.qad import fake_quant_activation

QMAX_KV = 127
QMAX_WEIGHTS = 255

ATTENTION_RECORD = ("self- and cross-attention: 8-bit queries per row, int8 keys per row, int8 "
                    "values per channel, 8-bit softmax weights")


def _symmetric(x: torch.Tensor, dim: int) -> torch.Tensor:
    amax = x.detach().abs().amax(dim=dim, keepdim=True)
    scale = torch.where(amax > 0, amax / QMAX_KV, torch.ones_like(amax))
    q = torch.round(x / scale).clamp(-QMAX_KV, QMAX_KV) * scale
    return x + (q - x).detach()


def int8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d)) v`` for ``[B, H, N, d]`` heads, with 8-bit operands."""
    qf = fake_quant_activation(q)
    kf = _symmetric(k, dim=-1)
    vf = _symmetric(v, dim=-2)
    scores = qf @ kf.transpose(-1, -2) * q.shape[-1] ** -0.5
    weights = torch.exp(scores - scores.detach().amax(dim=-1, keepdim=True))
    rounded = torch.round(weights * QMAX_WEIGHTS) / QMAX_WEIGHTS
    weights = weights + (rounded - weights).detach()
    return (weights @ vf) / weights.sum(dim=-1, keepdim=True)


def set_int8_attention_(dit: nn.Module, on: bool = True) -> nn.Module:
    """Run (or stop running) every attention of ``dit`` in 8 bits (in place)."""
    from audiofast.diffusion.attention import Attention

    for module in dit.modules():
        if isinstance(module, Attention):
            module.int8 = on
    return dit


def uses_int8_attention(dit: nn.Module) -> bool:
    from audiofast.diffusion.attention import Attention

    return any(getattr(m, "int8", False) for m in dit.modules() if isinstance(m, Attention))
