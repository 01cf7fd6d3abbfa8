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


def int8_linear_tensors(module: nn.Module) -> list[torch.Tensor]:
    """An fbgemm dynamic int8 linear (per-channel symmetric weights) as the kernel's four
    tensors: packed int8 weight, per-channel scale, weight row sums, bias."""
    weight = module.weight()
    if weight.qscheme() != torch.per_channel_affine or bool(
            weight.q_per_channel_zero_points().any()):
        raise ValueError("the fused decoder needs symmetric per-channel int8 weights")
    q = weight.int_repr().contiguous()
    bias = module.bias()
    bias = torch.zeros(q.shape[0]) if bias is None else bias.detach().float().contiguous()
    return [pack_int8_weight(q), weight.q_per_channel_scales().float().contiguous(),
            q.sum(1, dtype=torch.int32), bias]


def _norm_tensors(norm: nn.LayerNorm) -> list[torch.Tensor]:
    return [norm.weight.detach().contiguous(), norm.bias.detach().contiguous()]


class FusedDecoder:
    """Calls the fused op with a quantized :class:`~audiofast.asr.engine.DecoderStep`'s
    tensors (shared, not copied) and its KV cache."""

    def __init__(self, step: nn.Module):
        self.step = step
        params = [step.embed.weight.detach(), step.positions, *_norm_tensors(step.final_ln),
                  *int8_linear_tensors(step.lm_head), step.exact_head]
        for layer in step.layers:
            for part in _LAYER_PARTS:
                module = getattr(layer, part)
                params += (_norm_tensors(module) if isinstance(module, nn.LayerNorm)
                           else int8_linear_tensors(module))
        self.params = params

    def __call__(self, tokens: torch.Tensor, start: int, last: int,
                 cross_k: list[torch.Tensor], cross_v: list[torch.Tensor]) -> torch.Tensor:
        return torch.ops.audiofast.decoder_forward(
            tokens, start, last, self.params, self.step.k_cache, self.step.v_cache, cross_k,
            cross_v, self.step.rescore)
