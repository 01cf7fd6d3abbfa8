"""Whisper's decoder in eager fp32 PyTorch: the numerics oracle.

Tests and KL measurements compare the fused int8 decoder with this one, and ``--precision
fp32`` decodes on it. It is written for reading, not speed: one module per layer, attention
by ``scaled_dot_product_attention`` and cross-attention by two matmuls. ``rowwise`` calls
(draft verification) attend one query row at a time, because CPU attention kernels round
differently for 1 and k rows; its float GEMMs still do (~1e-5 relative), so fp32 drafting
keeps the plain transcript except at exact near-ties, where the fused int8 decoder is
bit-exact by construction.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from audiofast.asr.decoder_weights import DecoderWeights, layer_part


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """A Linear holding these tensors, not copies (built 1 x 1 and resized: a full-size one
    spends ~1 s of start-up drawing random weights that are then overwritten)."""
    layer = nn.Linear(1, 1, bias=bias is not None)
    layer.out_features, layer.in_features = weight.shape
    layer.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias, requires_grad=False)
    return layer


def _norm(weight: torch.Tensor, bias: torch.Tensor) -> nn.LayerNorm:
    norm = nn.LayerNorm(weight.shape[0])
    norm.weight, norm.bias = (nn.Parameter(t, requires_grad=False) for t in (weight, bias))
    return norm


class ReferenceLayer(nn.Module):
    def __init__(self, weights: DecoderWeights, i: int):
        super().__init__()
        for part in ("self_ln", "cross_ln", "ffn_ln"):
            setattr(self, part, _norm(*layer_part(weights, i, part)))
        for part in ("qkv", "self_out", "cross_q", "cross_kv", "cross_out", "fc1", "fc2"):
            setattr(self, part, _linear(*layer_part(weights, i, part)))


class ReferenceDecoder(nn.Module):
    """fp32 decoder with a static KV cache; cross-attention K/V from :meth:`project_audio`."""

    def __init__(self, weights: DecoderWeights, head_ids: torch.Tensor | None = None):
        super().__init__()
        self.n_heads = weights.n_heads
        self.n_ctx, self.d_model = weights.n_ctx, weights.d_model
        head_dim = self.d_model // self.n_heads
        self.scale = head_dim ** -0.5
        self.embed = nn.Embedding.from_pretrained(weights.state["embed_tokens.weight"])
        self.register_buffer("positions", weights.state["embed_positions.weight"])
        self.layers = nn.ModuleList(ReferenceLayer(weights, i) for i in range(weights.n_layers))
        self.final_ln = _norm(*weights.norm("layer_norm"))
        head = weights.head if head_ids is None else weights.head[head_ids].contiguous()
        self.lm_head = _linear(head, None)
        shape = (weights.n_layers, 1, self.n_heads, self.n_ctx, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape))
        self.register_buffer("v_cache", torch.zeros(shape))
        self.eval()

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(n, d) -> (1, heads, n, head_dim)."""
        return x.view(1, x.shape[0], self.n_heads, -1).transpose(1, 2)

    def project_audio(self, encoder_out: torch.Tensor) -> tuple[list[torch.Tensor],
                                                                list[torch.Tensor]]:
        """Cross-attention K and V per layer, (heads, frames, head_dim), once per window."""
        enc = encoder_out.reshape(-1, self.d_model).float()
        keys, values = [], []
        for layer in self.layers:
            k, v = layer.cross_kv(enc).chunk(2, dim=-1)
            keys.append(self._heads(k)[0].contiguous())
            values.append(self._heads(v)[0].contiguous())
        return keys, values

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                rowwise: bool) -> torch.Tensor:
        """Causal self-attention: query row r (position start + r) sees keys up to it."""
        n, end = q.shape[2], k.shape[2]
        if n == 1:
            return F.scaled_dot_product_attention(q, k, v)
        if not rowwise:
            causal = torch.ones(n, end, dtype=torch.bool).tril(diagonal=start)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        return torch.cat([F.scaled_dot_product_attention(
            q[:, :, r : r + 1], k[:, :, : start + r + 1], v[:, :, : start + r + 1])
            for r in range(n)], dim=2)

    @staticmethod
    def _cross_attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      rowwise: bool) -> torch.Tensor:
        """q (heads, n, head_dim), pre-scaled, over the window's frames."""
        if not rowwise:
            return torch.bmm(torch.bmm(q, keys.transpose(1, 2)).softmax(-1), values)
        return torch.cat([torch.bmm(torch.bmm(q[:, r : r + 1], keys.transpose(1, 2))
                                    .softmax(-1), values) for r in range(q.shape[1])], dim=1)

    def forward(self, tokens: torch.Tensor, start: int, last: int, cross_k: list[torch.Tensor],
                cross_v: list[torch.Tensor], rowwise: bool = False) -> torch.Tensor:
        n = tokens.shape[0]
        end = start + n
        x = self.embed(tokens) + self.positions[start:end]
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv(layer.self_ln(x)).chunk(3, dim=-1)
            self.k_cache[i, :, :, start:end] = self._heads(k)
            self.v_cache[i, :, :, start:end] = self._heads(v)
            attn = self._attend(self._heads(q), self.k_cache[i, :, :, :end],
                                self.v_cache[i, :, :, :end], start, rowwise)
            x = x + layer.self_out(attn.transpose(1, 2).reshape(n, -1))
            q = self._heads(layer.cross_q(layer.cross_ln(x)))[0] * self.scale
            attn = self._cross_attend(q, cross_k[i], cross_v[i], rowwise)
            x = x + layer.cross_out(attn.transpose(0, 1).reshape(n, -1))
            x = x + layer.fc2(F.gelu(layer.fc1(layer.ffn_ln(x))))
        if last > 0:  # logits of the last rows only (a prompt needs 1-3 of its ~100 rows)
            x = x[n - last :]
        return self.lm_head(self.final_ln(x))


class ReferenceBackend:
    """:class:`ReferenceDecoder` behind the engine's numpy interface (tokens, encoder output
    and logits as numpy arrays; the fused decoder's contract)."""

    def __init__(self, weights: DecoderWeights, head_ids: torch.Tensor | None = None):
        self.model = ReferenceDecoder(weights, head_ids)
        self.n_heads, self.n_ctx, self.d_model = (self.model.n_heads, self.model.n_ctx,
                                                  self.model.d_model)
        self.embed = self.model.embed.weight
        self.lm_head = self.model.lm_head

    @torch.inference_mode()
    def project_audio(self, encoder_out: np.ndarray) -> tuple[list[torch.Tensor],
                                                              list[torch.Tensor]]:
        return self.model.project_audio(torch.as_tensor(np.asarray(encoder_out, np.float32)))

    @torch.inference_mode()
    def __call__(self, tokens: np.ndarray, start: int, last: int, cross: tuple,
                 rowwise: bool = False) -> np.ndarray:
        return self.model(torch.from_numpy(tokens), start, last, *cross, rowwise=rowwise).numpy()
