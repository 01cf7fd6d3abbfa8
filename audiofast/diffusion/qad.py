"""W8A8 fake quantization for quantization-aware distillation (QAD) of the SA3 DiT.

The arithmetic is the one the int8 kernel runs (``audiofast/asr/kernels/int8_linear.cpp``, used
by :mod:`audiofast.diffusion.int8` at inference), so what the student learns to tolerate is
exactly the error it will meet:

- weights: per output channel, symmetric, ``q = round(w / s)`` in [-127, 127], ``s = max|w| / 127``;
- activations: per token (each row of a linear's input), dynamic and asymmetric over
  ``[min(0, x), max(0, x)]`` in 255 steps, so zero is exact and no calibration set is needed.

Gradients pass through both roundings unchanged (straight-through estimator). The student
keeps float weights named as before, so a QAD checkpoint in training loads like its parent;
:func:`audiofast.diffusion.int8.quantize_dit` turns it into real int8 at export.

Self-attention runs in 8 bits too (queries, keys, values and softmax weights:
:mod:`audiofast.diffusion.int8_attention`, the int8 kernel's arithmetic).

Which linears: every projection inside the transformer blocks (self/cross-attention q, k, v,
out and the SwiGLU feed-forward: >97 % of a pass's multiply-adds at SA3 sizes) and the output
projection; with ``io`` (the QAD stage's choice) also the input projection and the 1x1
pre/post convs (:data:`IO_LAYERS`, ``io_channels`` wide: 513 on the proving ground; the kernel
pads their inputs to its multiple of 32). In fp32 they were a sixth of an int8 pass.
Post-training int8 leaves them float (untrained, they raised its error by a third). The
per-clip conditioning MLPs stay float.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

QMAX_ACT = 255
QMAX_WEIGHT = 127


def weight_scale(weight: torch.Tensor) -> torch.Tensor:
    """Per-output-channel symmetric scale ``[out]`` (1 for an all-zero row)."""
    amax = weight.detach().abs().amax(dim=1).float()
    return torch.where(amax > 0, amax / QMAX_WEIGHT, torch.ones_like(amax))


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(int8 [out, in], scale [out])`` with ``weight ~= q * scale[:, None]``."""
    scale = weight_scale(weight)
    q = torch.round(weight.detach().float() / scale[:, None]).clamp(-QMAX_WEIGHT, QMAX_WEIGHT)
    return q.to(torch.int8), scale


def fake_quant_weight(weight: torch.Tensor) -> torch.Tensor:
    scale = weight_scale(weight).to(weight.dtype)[:, None]
    q = torch.round(weight / scale).clamp(-QMAX_WEIGHT, QMAX_WEIGHT) * scale
    return weight + (q - weight).detach()


def fake_quant_activation(x: torch.Tensor) -> torch.Tensor:
    """Each row (last dim) quantized alone to 8 bits over ``[min(0, x), max(0, x)]``."""
    lo = x.detach().amin(dim=-1, keepdim=True).clamp(max=0)
    hi = x.detach().amax(dim=-1, keepdim=True).clamp(min=0)
    scale = (hi - lo) / QMAX_ACT
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.round(-lo / scale).clamp(0, QMAX_ACT)
    q = (torch.round(x / scale) + zero).clamp(0, QMAX_ACT)
    return x + ((q - zero) * scale - x).detach()


class FakeQuantLinear(nn.Linear):
    """An ``nn.Linear`` (same parameter names) whose forward sees W8A8 rounding."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(fake_quant_activation(x), fake_quant_weight(self.weight), self.bias)


class FakeQuantConv1x1(nn.Conv1d):
    """A kernel-size-1 ``nn.Conv1d`` over ``[B, C, T]`` (same parameter names) as a W8A8 linear
    over channels: each time step is one activation row, as :class:`FakeQuantLinear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = fake_quant_activation(x.transpose(1, 2))
        return F.linear(rows, fake_quant_weight(self.weight[:, :, 0]), self.bias).transpose(1, 2)


IO_LAYERS = ("preprocess_conv", "transformer.project_in", "postprocess_conv")


def quantized_linear_names(dit: nn.Module, io: bool = False) -> list[str]:
    """The DiT's linears that run in int8 (see the module docstring), by qualified name;
    ``io``: also the input projection and the 1x1 pre/post convs (:data:`IO_LAYERS`)."""
    names = [n for n, m in dit.named_modules()
             if isinstance(m, nn.Linear) and n.startswith("transformer.layers.")]
    return [*names, "transformer.project_out", *(IO_LAYERS if io else ())]


def replace_module(root: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, child, new)


def fake_quantize_(dit: nn.Module, io: bool = False) -> nn.Module:
    """Swap each int8-bound linear (and, ``io``, 1x1 conv) of ``dit`` for a fake-quant one
    sharing its parameters and run its self-attention in 8 bits (:mod:`~audiofast.diffusion.
    int8_attention`), in place; returns ``dit``."""
    from audiofast.diffusion.int8_attention import set_int8_attention_

    set_int8_attention_(dit)
    for name in quantized_linear_names(dit, io):
        old = dit.get_submodule(name)
        if isinstance(old, FakeQuantLinear | FakeQuantConv1x1):
            continue
        if isinstance(old, nn.Conv1d):
            new = FakeQuantConv1x1(old.in_channels, old.out_channels, 1,
                                   bias=old.bias is not None, device="meta")
        else:
            new = FakeQuantLinear(old.in_features, old.out_features, bias=old.bias is not None,
                                  device="meta")
        new.weight, new.bias = old.weight, old.bias
        replace_module(dit, name, new)
    return dit
