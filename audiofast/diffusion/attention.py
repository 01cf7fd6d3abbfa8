"""Multi-head attention as SA3 uses it: per-head q/k norm, partial RoPE, optional differential.

Differential attention subtracts a second softmax map over the same values:
``softmax(q k) v - softmax(q' k') v``. Self-attention fuses the projections (``to_qkv``, chunks
``q, k, v`` or ``q, k, v, q', k'``); cross-attention splits them (``to_q``, ``to_kv``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from audiofast.diffusion.int8_attention import int8_attention
from audiofast.diffusion.layers import DynamicTanh, RMSNorm, apply_rotary

# Query block length for banded (sliding-window) attention: bounds the mask to
# block x (block + window) instead of N x N.
_BAND_BLOCK = 1024


def _qk_norm(kind: str, dim: int, eps: float) -> nn.Module:
    if kind == "rms":
        return RMSNorm(dim, eps=eps)
    if kind == "dyt":
        return DynamicTanh(dim)
    return nn.Identity()


def banded_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, left: int, right: int
) -> torch.Tensor:
    """Attention where query ``i`` sees keys ``i - left .. i + right`` only (same as one
    full masked pass, computed in query blocks so memory stays linear in length)."""
    n, outs = q.shape[-2], []
    for start in range(0, n, _BAND_BLOCK):
        stop = min(start + _BAND_BLOCK, n)
        k0, k1 = max(0, start - left), min(n, stop + right)
        qi = torch.arange(start, stop, device=q.device)[:, None]
        ki = torch.arange(k0, k1, device=q.device)[None, :]
        mask = torch.zeros(qi.shape[0], ki.shape[1], dtype=q.dtype, device=q.device)
        mask = mask.masked_fill(~((ki - qi >= -left) & (ki - qi <= right)), float("-inf"))
        outs.append(
            F.scaled_dot_product_attention(
                q[..., start:stop, :], k[..., k0:k1, :], v[..., k0:k1, :], attn_mask=mask
            )
        )
    return torch.cat(outs, dim=-2)


class Attention(nn.Module):
    """Self-attention (``context_dim=None``) or cross-attention over ``context``."""

    def __init__(
        self,
        dim: int,
        head_dim: int,
        context_dim: int | None = None,
        differential: bool = False,
        qk_norm: str = "rms",
        qk_norm_eps: float = 1e-6,
    ):
        super().__init__()
        if context_dim not in (None, dim):
            raise ValueError("cross-attention context must be projected to the model width")
        self.heads = dim // head_dim
        self.differential = differential
        self.cross = context_dim is not None
        self.int8 = False  # 8-bit attention (int8_attention.py): int8 checkpoints, QAD
        streams = 2 if differential else 1  # how many (q, k) pairs
        if self.cross:
            self.to_q = nn.Linear(dim, dim * streams, bias=False)
            self.to_kv = nn.Linear(context_dim, context_dim * (streams + 1), bias=False)
        else:
            self.to_qkv = nn.Linear(dim, dim * (2 * streams + 1), bias=False)
        self.to_out = nn.Linear(dim, dim, bias=False)
        nn.init.zeros_(self.to_out.weight)
        if qk_norm != "none":
            self.q_norm = _qk_norm(qk_norm, head_dim, qk_norm_eps)
            self.k_norm = _qk_norm(qk_norm, head_dim, qk_norm_eps)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.reshape(b, n, self.heads, -1).transpose(1, 2)

    def _project(
        self, x: torch.Tensor, context: torch.Tensor | None, projected: torch.Tensor | None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """Per-head ``[q...], [k...], v``; the lists hold one entry, or two when differential."""
        if self.cross:
            q = self.to_q(x) if projected is None else projected
            qs = q.chunk(2 if self.differential else 1, dim=-1)
            *ks, v = self.to_kv(context).chunk(3 if self.differential else 2, dim=-1)
        elif self.differential:
            q, k, v, q2, k2 = (self.to_qkv(x) if projected is None else projected).chunk(5, -1)
            qs, ks = (q, q2), (k, k2)
        else:
            q, k, v = (self.to_qkv(x) if projected is None else projected).chunk(3, dim=-1)
            qs, ks = (q,), (k,)
        return [self._heads(q) for q in qs], [self._heads(k) for k in ks], self._heads(v)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        rope: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        window: tuple[int, int] | None = None,
        projected: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x [B, N, dim] -> [B, N, dim]``.

        rope: rotary angles ``[N, r]`` applied to the first ``r`` head channels (self only).
        padding_mask: ``[B, N]``, True = valid. Padded positions get zero values, as upstream
            does without flash-attn (they still take part in the softmax normalizer).
        window: ``(left, right)`` tokens of banded attention; None attends everywhere.
        projected: ``to_qkv(x)`` (self) or ``to_q(x)`` (cross) computed already (the fused int8
            block computes it with the norm before it: diffusion/int8_block.py).
        """
        qs, ks, v = self._project(x, context, projected)
        if hasattr(self, "q_norm"):
            qs = [self.q_norm(q).to(q.dtype) for q in qs]
            ks = [self.k_norm(k).to(k.dtype) for k in ks]
        if rope is not None:
            qs = [apply_rotary(q.float(), rope).to(v.dtype) for q in qs]
            ks = [apply_rotary(k.float(), rope).to(v.dtype) for k in ks]
        if padding_mask is not None:
            v = v * padding_mask[:, None, :, None].to(v.dtype)
        outs = []
        for q, k in zip(qs, ks, strict=True):
            if window is None:
                attend = int8_attention if self.int8 else F.scaled_dot_product_attention
                outs.append(attend(q, k, v))
            else:
                outs.append(banded_attention(q, k, v, *window))
        out = outs[0] - outs[1] if self.differential else outs[0]
        b, _, n, _ = out.shape
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))
