"""Float linears as the C++ int8 kernel's tensors: per-channel int8 weights, packed.

The kernel (kernels/int8_linear.cpp) quantizes each input row with its own range and sums
products exactly in int32; the weights are quantized once, here, with one symmetric scale per
output channel, and laid out in blocks of 16 outputs x 4 inputs for its dot-product
instructions. The SA3 lane's int8 DiT uses the same layout (diffusion/int8.py).
"""

from __future__ import annotations

import warnings

import torch


def per_channel_qint8(weight: torch.Tensor) -> torch.Tensor:
    """The int8 weight ``quantize_dynamic`` with ``per_channel_dynamic_qconfig`` makes: one
    symmetric scale per output channel. With a per-tensor scale, greedy decoding added a
    hallucinated sentence to beckett.wav (WER 0 -> 16.7 %)."""
    from torch.ao.nn.quantized.modules.utils import _quantize_weight

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's quantized tensors are deprecated, still used
        observer = torch.ao.quantization.per_channel_dynamic_qconfig.weight()
        observer(weight)
        return _quantize_weight(weight.float(), observer)


def pack_int8_weight(q: torch.Tensor) -> torch.Tensor:
    """(out, in) int8 -> (blocks, in / 4, 64): per block of 16 outputs and group of 4 inputs,
    the 16 outputs' 4 weights side by side (the kernel's layout; padded outputs are zero)."""
    out, width = q.shape
    if width % 32:
        raise ValueError(f"the int8 kernel needs input widths divisible by 32, not {width}")
    blocks = -(-out // 16)
    padded = torch.zeros(blocks * 16, width, dtype=torch.int8)
    padded[:out] = q
    return padded.view(blocks, 16, width // 4, 4).transpose(1, 2).reshape(blocks, width // 4, 64)


def glu_pairs_order(out: int) -> torch.Tensor:
    """The output channels of a GLU projection (``out`` = value half then gate half, a multiple
    of 32) reordered so that blocks 2k and 2k + 1 of 16 are value and gate channels
    16k..16k+15: the layout ``kernels.modulated_linear(..., glu_pairs=True)`` reads."""
    if out % 32:
        raise ValueError(f"a GLU packed in pairs needs an output width divisible by 32, not {out}")
    half = out // 2
    value = torch.arange(half).view(-1, 16)
    return torch.stack((value, value + half), 1).reshape(-1)


def int8_linear_tensors(weight: torch.Tensor, bias: torch.Tensor | None) -> list[torch.Tensor]:
    """A float linear's weight and bias as the kernel's four tensors: packed int8 weight,
    per-channel scale, int8 weight row sums, bias."""
    quantized = per_channel_qint8(weight.detach())
    q = quantized.int_repr()
    bias = torch.zeros(q.shape[0]) if bias is None else bias.detach().float()
    return [pack_int8_weight(q), quantized.q_per_channel_scales().float().contiguous(),
            q.sum(1, dtype=torch.int32), bias.contiguous()]
