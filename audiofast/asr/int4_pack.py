"""Float linears as the C++ int4 kernel's tensors: 4-bit weights with one fp16 scale per
group of inputs, packed (kernels/int4_linear.cpp; layout in kernels/quant_linear.h).

Half of int8's bytes per weight, for a decoder step that is memory-bound. A group scale (64
inputs by default) instead of int8's one per output row keeps an outlier weight from costing
its whole row its resolution. Each group's scale is searched (the clipping ratio with the
least squared error); QAD trains through the rounding onto those scales
(:func:`fake_quantize`), so what is trained is what is packed.
"""

from __future__ import annotations

import torch

GROUP = 64  # inputs per scale: 8% of the weights' bytes in fp16 scales
QMIN, QMAX = -8, 7
CLIP_RATIOS = torch.linspace(1.0, 0.6, 17)  # scales tried per group, as fractions of absmax/7


def quantize_int4(weight: torch.Tensor, group: int = GROUP, search: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) float -> int4 values (out, in) int8 in [-8, 7] and scales (out, in / group)
    fp16, the scale of each group chosen among ``CLIP_RATIOS`` for the least squared error
    (``search=False``: absmax / 7)."""
    out, width = weight.shape
    if width % group or group % 8:
        raise ValueError(f"int4 groups of {group} inputs must divide the width {width} "
                         "and be a multiple of 8")
    w = weight.detach().float().reshape(out, width // group, group)
    absmax = w.abs().amax(-1)
    ratios = CLIP_RATIOS if search else CLIP_RATIOS[:1]
    best_scale = best_err = None
    for ratio in ratios:
        scale = _fp16_scale(absmax * ratio / QMAX)
        err = ((_round(w, scale) * scale[..., None] - w) ** 2).sum(-1)
        if best_err is None:
            best_scale, best_err = scale, err
        else:
            better = err < best_err
            best_scale = torch.where(better, scale, best_scale)
            best_err = torch.minimum(err, best_err)
    if search:  # weights already on a grid (GPTQ's, QAD's export) get that grid back exactly
        for top in range(1, -QMIN + 1):  # absmax / |largest value| is their scale
            scale = _fp16_scale(absmax / top)
            exact = ((_round(w, scale) * scale[..., None] - w) ** 2).sum(-1) == 0
            best_scale = torch.where(exact & (best_err > 0), scale, best_scale)
            best_err = torch.where(exact, torch.zeros_like(best_err), best_err)
    q = _round(w, best_scale).to(torch.int8).reshape(out, width)
    return q, best_scale.half()


def _fp16_scale(scale: torch.Tensor) -> torch.Tensor:
    """Scales as the kernel reads them (fp16), never zero (an all-zero group)."""
    return scale.half().float().clamp_min(2.0**-24)


def _round(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.round(w / scale[..., None]).clamp(QMIN, QMAX)


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float weight the kernel multiplies by: int4 values x their group's scale."""
    group = q.shape[1] // scale.shape[1]
    return q.float() * scale.float().repeat_interleave(group, dim=1)


def fake_quantize(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``weight`` (out, in) rounded onto the int4 grid of ``scale`` (out, in / group, from
    :func:`quantize_int4`) in the forward pass, gradients straight through (STE):
    quantization-aware distillation trains the weights the packer will round."""
    out, width = weight.shape
    scale = scale.float()
    grouped = weight.reshape(out, scale.shape[1], -1)
    snapped = (_round(grouped, scale) * scale[..., None]).reshape(out, width)
    return weight + (snapped.to(weight.dtype) - weight).detach()


def pack_int4_weight(q: torch.Tensor) -> torch.Tensor:
    """(out, in) int4 values -> (blocks, in / 8, 64) uint8: per block of 16 outputs and 8
    inputs, byte 4 o + i holds input i (low nibble) and input 4 + i (high nibble) of output o,
    each stored as value + 8 (padded outputs hold zeros)."""
    out, width = q.shape
    if width % 32:
        raise ValueError(f"the int4 kernel needs input widths divisible by 32, not {width}")
    blocks = -(-out // 16)
    u = torch.full((blocks * 16, width), 8, dtype=torch.uint8)
    u[:out] = (q.to(torch.int16) + 8).to(torch.uint8)
    u = u.view(blocks, 16, width // 8, 2, 4).permute(0, 2, 3, 1, 4)  # (b, pair, nibble, o, i)
    return (u[:, :, 0] | (u[:, :, 1] << 4)).reshape(blocks, width // 8, 64).contiguous()


def int4_linear_tensors(weight: torch.Tensor, bias: torch.Tensor | None,
                        group: int = GROUP) -> list[torch.Tensor]:
    """A float linear's weight and bias as the kernel's four tensors: packed int4 weight,
    per-group fp16 scales (blocks, groups, 16), zero terms (sum over groups of scale x the
    group's weight sum: the activation zero point's share), bias."""
    q, scale = quantize_int4(weight, group)
    out, width = q.shape
    blocks = -(-out // 16)
    padded = torch.zeros(blocks * 16, width // group, dtype=torch.float16)
    padded[:out] = scale
    scales = padded.view(blocks, 16, -1).transpose(1, 2).contiguous()
    group_sums = q.view(out, -1, group).sum(-1, dtype=torch.int32)
    zero_term = (group_sums.double() * scale.double()).sum(1).float()
    bias = torch.zeros(out) if bias is None else bias.detach().float()
    return [pack_int4_weight(q), scales, zero_term.contiguous(), bias.contiguous()]
