"""The int8 decoder as one C++ call (``torch.ops.audiofast.decoder_forward``).

The TorchScript step spends most of a token between ~300 small ATen ops and in fbgemm's int8
linears, which read weights at a third of this machine's memory bandwidth. The fused op runs
every layer of a call in C++ (kernels/decoder_step.cpp) over the same int8 weights, KV cache and
fp16 cross-attention K/V, and quantizes each row with its own range and sums products exactly
in int32, so a row's logits never depend on the rows beside it: plain greedy and draft
verification share one arithmetic, and drafting is lossless without a slower invariant mode.
"""

import torch
from torch import nn

from audiofast.asr.invariant_int8 import per_channel_qint8

_LAYER_PARTS = ("self_ln", "qkv", "self_out", "cross_ln", "cross_q", "cross_out", "ffn_ln",
                "fc1", "fc2")


def pack_int8_weight(q: torch.Tensor) -> torch.Tensor:
    """(out, in) int8 -> (blocks, in / 4, 64): per block of 16 outputs and group of 4 inputs,
    the 16 outputs' 4 weights side by side (the kernel's layout; padded outputs are zero)."""
    out, width = q.shape
    if width % 32:
        raise ValueError(f"the fused decoder needs input widths divisible by 32, not {width}")
    blocks = -(-out // 16)
    padded = torch.zeros(blocks * 16, width, dtype=torch.int8)
    padded[:out] = q
    return padded.view(blocks, 16, width // 4, 4).transpose(1, 2).reshape(blocks, width // 4, 64)


def int8_linear_tensors(linear: nn.Linear) -> list[torch.Tensor]:
    """A float linear as the kernel's four tensors: packed int8 weight (the per-channel int8
    weights of the TorchScript int8 engine, :func:`per_channel_qint8`), per-channel scale,
    weight row sums, bias."""
    weight = per_channel_qint8(linear.weight.detach())
    q = weight.int_repr()
    bias = torch.zeros(q.shape[0]) if linear.bias is None else linear.bias.detach().float()
    return [pack_int8_weight(q), weight.q_per_channel_scales().float().contiguous(),
            q.sum(1, dtype=torch.int32), bias.contiguous()]


class Int8Linear(nn.Module):
    """One int8 linear of the fused decoder, callable alone (the diet sweep times the head)."""

    def __init__(self, tensors: list[torch.Tensor]):
        super().__init__()
        self.tensors = tensors

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.audiofast.int8_linear(x.reshape(-1, x.shape[-1]).float(), self.tensors)


def _norm_tensors(norm: nn.LayerNorm) -> list[torch.Tensor]:
    return [norm.weight.detach().contiguous(), norm.bias.detach().contiguous()]


class FusedDecoder:
    """Calls the fused op with a float :class:`~audiofast.asr.engine.DecoderStep`'s tensors,
    its linears quantized to int8 here, and its KV cache."""

    def __init__(self, step: nn.Module):
        self.step = step
        self.lm_head = Int8Linear(int8_linear_tensors(step.lm_head))
        params = [step.embed.weight.detach(), step.positions, *_norm_tensors(step.final_ln),
                  *self.lm_head.tensors, step.exact_head]
        for layer in step.layers:
            for part in _LAYER_PARTS:
                module = getattr(layer, part)
                params += (_norm_tensors(module) if isinstance(module, nn.LayerNorm)
                           else int8_linear_tensors(module))
        self.params = params
        # The once-per-window K/V projection of the encoder output, each frame its own range.
        self.cross_kv = [Int8Linear(int8_linear_tensors(layer.cross_kv)) for layer in step.layers]
        self.forked_k = self.forked_v = torch.empty(0)  # fork()'s caches, kept between windows

    def __call__(self, tokens: torch.Tensor, start: int, last: int,
                 cross_k: list[torch.Tensor], cross_v: list[torch.Tensor]) -> torch.Tensor:
        return torch.ops.audiofast.decoder_forward(
            tokens, start, last, self.params, self.step.k_cache, self.step.v_cache, cross_k,
            cross_v, self.step.rescore)

    def fork(self, copies: int, length: int) -> None:
        """Caches for ``copies`` sequences, each starting with the main cache's first
        ``length`` positions."""
        shape = list(self.step.k_cache.shape)
        shape[1] = copies
        if list(self.forked_k.shape) != shape:
            self.forked_k, self.forked_v = torch.zeros(shape), torch.zeros(shape)
        self.forked_k[:, :, :, :length] = self.step.k_cache[:, :, :, :length]
        self.forked_v[:, :, :, :length] = self.step.v_cache[:, :, :, :length]

    def forked(self, tokens: torch.Tensor, position: int, cross_k: list[torch.Tensor],
               cross_v: list[torch.Tensor]) -> torch.Tensor:
        """One token per forked sequence, all at ``position``: a row per sequence."""
        return torch.ops.audiofast.decoder_forward(
            tokens, position, 0, self.params, self.forked_k, self.forked_v, cross_k, cross_v,
            self.step.rescore)
