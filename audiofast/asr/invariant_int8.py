"""Batch-invariant int8 linears: a row's output does not depend on the rows sharing its call.

fbgemm's dynamic int8 linear picks one activation scale from the min/max of the whole input,
so a token verified together with draft rows is quantized differently from the same token
decoded alone, and a near-tie argmax can flip: int8 drafting changed a word on 2 of the 4 real
clips. A fixed, calibrated range per linear made rows independent but cost accuracy (WER on
the real clips 1.7 -> 5.0 % on two_cities, 0 -> 20 % on clone-test), so instead each row gets
its *own* range, as if it had been decoded alone:

    x = lo + span * u,   u = (x - lo) / span in [0, 1]     (lo = min x, span = max x - lo)
    W x + b = span * (W u) + lo * (W 1) + b

Every row of ``u`` spans [0, 1]; one appended *anchor* row holding 0 and 1 pins the kernel's
range there whatever the other rows hold, so the integer arithmetic of a row is the same in a
k-row verify call as alone. ``W 1`` (the row sums of the int8 weights) is computed once. The
extra row is nearly free: a verify call is bound by reading the weights, not by rows.
Attention, the step's other cross-row operation, is made row-exact by the engine
(``rowwise``), so a row's range, and everything else about it, is computed bit for bit as if
it had been fed alone.
"""

import warnings

import torch
from torch import nn
from torch.ao.nn.quantized.modules.utils import _quantize_weight  # the observer -> qint8 step


class InvariantInt8Linear(nn.Module):
    """Dynamic int8 linear with per-row activation ranges (see the module docstring)."""

    def __init__(self, qlinear: nn.Module):
        super().__init__()
        weight, bias = qlinear.weight(), qlinear.bias()
        self.qlinear = packed_int8_linear(weight, None)
        self.rowsum = weight.dequantize().sum(1)
        self.bias = bias.detach().clone() if bias is not None else torch.zeros_like(self.rowsum)
        self.anchor = torch.zeros(1, qlinear.in_features)
        self.anchor[0, 1] = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (amin + amax: torch.aminmax along a dim was 7-13x slower for 227 rows, measured)
        low, high = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        span = (high - low).clamp(min=1e-12)
        unit = torch.cat([(x - low) / span, self.anchor])
        y = self.qlinear(unit)[:-1]
        return torch.addcmul(torch.addcmul(self.bias, low, self.rowsum), y, span)


def packed_int8_linear(qweight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
    """fbgemm's dynamic int8 linear for an already-quantized weight, packed once: its
    constructor first packs a zero weight of the full size (~0.7 s of a decoder's start-up),
    so it is built 1 x 1 and resized."""
    with warnings.catch_warnings():  # torch.ao's eager API is deprecated, still fastest
        warnings.simplefilter("ignore")
        qlinear = torch.ao.nn.quantized.dynamic.Linear(1, 1, bias_=bias is not None,
                                                       dtype=torch.qint8)
    qlinear.out_features, qlinear.in_features = qweight.shape
    qlinear.set_weight_bias(qweight, bias)
    return qlinear


def per_channel_qint8(weight: torch.Tensor) -> torch.Tensor:
    """The int8 weight ``quantize_dynamic`` with ``per_channel_dynamic_qconfig`` makes: one
    symmetric scale per output channel. With fbgemm's per-tensor default, plain greedy added a
    hallucinated sentence to beckett.wav (WER 0 -> 16.7 %)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's quantized tensors are deprecated, still used
        observer = torch.ao.quantization.per_channel_dynamic_qconfig.weight()
        observer(weight)
        return _quantize_weight(weight.float(), observer)


def quantize_per_channel(linear: nn.Linear) -> nn.Module:
    """fbgemm's dynamic int8 linear over :func:`per_channel_qint8` weights, packed once."""
    return packed_int8_linear(per_channel_qint8(linear.weight), linear.bias)


def make_invariant(module: nn.Module, skip: tuple[str, ...] = ()) -> list[str]:
    """Replace every dynamic-int8 linear under ``module`` except those whose name ends with
    one of ``skip``; the replaced names, in order."""
    names = []
    with warnings.catch_warnings():  # torch.ao's eager quantized modules are deprecated
        warnings.simplefilter("ignore")
        for name, child in list(module.named_modules()):
            if isinstance(child, torch.ao.nn.quantized.dynamic.Linear) and not name.endswith(skip):
                parent_name, _, attr = name.rpartition(".")
                parent = module.get_submodule(parent_name) if parent_name else module
                setattr(parent, attr, InvariantInt8Linear(child))
                names.append(name)
    return names
