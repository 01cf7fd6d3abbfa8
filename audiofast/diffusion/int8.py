"""Real int8 inference for the SA3 DiT: the W8A8 linears of :mod:`audiofast.diffusion.qad`, run
by the project's packed int8 kernel (``kernels.quant_linear``, the ASR lane's: exact
int32 sums, AVX2 or AVX-512 VNNI).

Why this kernel and not torch's dynamic quantization: measured side by side by
``scripts/bench_dit_int8.py`` (see docs/diffusion.md). Both quantize activations per call, but
fbgemm's dynamic linear uses one range per tensor (a loud token sets every token's step) and
7-bit activations on AVX2, while the kernel gives each token its own 8-bit range, which is what
QAD trains against.

An int8 checkpoint stores ``<linear>.weight`` as int8 ``[out, in]`` beside a float
``<linear>.weight_scale [out]``: a quarter of the float file for those tensors, loaded by
:func:`audiofast.diffusion.checkpoint.load_checkpoint` when the config's ``audiofast``
section has ``quantization``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from audiofast.diffusion.int8_attention import ATTENTION_RECORD, set_int8_attention_
from audiofast.diffusion.qad import (
    fake_quant_activation,
    quantize_weight,
    quantized_linear_names,
    replace_module,
)

QUANTIZATION = {
    "scheme": "w8a8",
    "weights": "per-channel symmetric int8",
    "activations": "per-token dynamic uint8 over [min(0, x), max(0, x)]",
    "modules": "transformer block linears + project_out",
    "attention": ATTENTION_RECORD,  # absent in older int8 checkpoints: float attention there
    # absent in older int8 checkpoints: float io layers there
    "io_layers": "project_in + the 1x1 pre/post convs, inputs zero-padded to 32",
}


def kernel_available() -> bool:
    """Whether the C++ int8 kernel is built for this CPU (setup.sh builds it)."""
    from audiofast.asr import kernels

    return kernels.is_built() and kernels.backend() == "avx2"


class Int8Linear(nn.Module):
    """``y = x W^T + b`` with int8 ``W`` and per-token 8-bit ``x``.

    ``use_kernel`` False runs the same arithmetic in PyTorch (dequantized weights and
    fake-quantized activations): the reference the kernel is tested against, and the path
    where the kernel cannot be built."""

    def __init__(self, in_features: int, out_features: int, bias: bool, use_kernel: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.ones(out_features))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        self.use_kernel = use_kernel
        self._packed: dict[bool, list[np.ndarray]] = {}  # by glu_pairs

    @classmethod
    def from_linear(cls, linear: nn.Linear, use_kernel: bool = True) -> Int8Linear:
        return cls.from_weight(linear.weight, linear.bias, use_kernel)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None,
                    use_kernel: bool = True) -> Int8Linear:
        """From a float ``[out, in]`` weight (and bias)."""
        new = cls(weight.shape[1], weight.shape[0], bias is not None, use_kernel)
        q, scale = quantize_weight(weight)
        new.weight.copy_(q)
        new.weight_scale.copy_(scale)
        if bias is not None:
            new.bias.copy_(bias.detach().float())
        return new

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        self._packed = {}  # weights change: pack again on the next call
        super()._load_from_state_dict(*args, **kwargs)

    def packed(self, glu_pairs: bool = False) -> list[np.ndarray]:
        """The kernel's four arrays: packed weight, scale, weight row sums, bias. ``glu_pairs``:
        output channels in ``int8_pack.glu_pairs_order`` (a GLU projection whose kernel call
        applies the GLU in its epilogue)."""
        if glu_pairs not in self._packed:
            from audiofast.asr.int8_pack import glu_pairs_order, pack_int8_weight

            bias = self.bias if self.bias is not None else torch.zeros(self.out_features)
            # zero columns up to the kernel's multiple of 32: exact, as the activation range
            # always holds 0 and zero inputs add nothing to the sums
            weight = F.pad(self.weight, (0, self._padded_in() - self.in_features))
            scale = self.weight_scale.float()
            if glu_pairs:
                order = glu_pairs_order(self.out_features)
                weight, scale, bias = weight[order], scale[order], bias[order]
            tensors = [pack_int8_weight(weight), scale, weight.sum(1, dtype=torch.int32),
                       bias.float()]
            self._packed[glu_pairs] = [np.ascontiguousarray(t.detach().numpy())
                                       for t in tensors]
        return self._packed[glu_pairs]

    def _padded_in(self) -> int:
        return -(-self.in_features // 32) * 32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        if self.use_kernel and x.device.type == "cpu":
            from audiofast.asr import kernels

            kernels.set_threads(torch.get_num_threads())  # the DiT lane runs on torch's count
            # rows narrower than the packed weight are zero-padded inside the kernel
            rows = x.detach().reshape(-1, shape[-1]).float().numpy()
            y = torch.from_numpy(kernels.quant_linear(rows, self.packed()))
            return y.reshape(*shape[:-1], self.out_features).to(x.dtype)
        weight = self.weight.to(x.dtype) * self.weight_scale.to(x.dtype)[:, None]
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(fake_quant_activation(x), weight, bias)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, kernel={self.use_kernel}"


class Int8Conv1x1(Int8Linear):
    """A kernel-size-1 conv over ``[B, C, T]`` as an :class:`Int8Linear` over channels (the
    checkpoint stores its weight ``[out, in]``, as a linear's)."""

    @classmethod
    def from_conv(cls, conv: nn.Conv1d, use_kernel: bool = True) -> Int8Conv1x1:
        return cls.from_weight(conv.weight[:, :, 0], conv.bias, use_kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


def _int8_module(old: nn.Module, use_kernel: bool, empty: bool = False) -> Int8Linear:
    """``old`` (a linear or 1x1 conv) in int8; ``empty``: its layout only, to load into."""
    conv = isinstance(old, nn.Conv1d)
    cls, weight = (Int8Conv1x1, old.weight[:, :, 0]) if conv else (Int8Linear, old.weight)
    if empty:
        return cls(weight.shape[1], weight.shape[0], old.bias is not None, use_kernel)
    return cls.from_weight(weight, old.bias, use_kernel)


def quantize_dit(dit: nn.Module, use_kernel: bool | None = None,
                 attention: bool = True, io: bool = False) -> nn.Module:
    """Replace the DiT's int8-bound linears (``io``: and its io layers, qad.IO_LAYERS, which
    a QAD student trained through; off for post-training int8) by :class:`Int8Linear` and
    (``attention``) run its self-attention in 8 bits (in place; returns ``dit``).
    ``use_kernel`` None: the kernel where it is built, else the PyTorch reference."""
    if use_kernel is None:
        use_kernel = kernel_available()
    for name in quantized_linear_names(dit, io):
        old = dit.get_submodule(name)
        if isinstance(old, Int8Linear):
            old.use_kernel = use_kernel
        else:
            replace_module(dit, name, _int8_module(old, use_kernel))
    return _fuse(set_int8_attention_(dit, attention))


def _fuse(dit: nn.Module) -> nn.Module:
    from audiofast.diffusion.int8_block import fuse_int8_blocks_  # it builds on this module

    return fuse_int8_blocks_(dit)


def empty_int8_dit_(dit: nn.Module, attention: bool = False, io: bool = False) -> nn.Module:
    """Give a freshly built DiT the int8 layout a quantized checkpoint loads into
    (``attention``, ``io``: its record says the self-attention, the io layers, are int8 too)."""
    use_kernel = kernel_available()
    for name in quantized_linear_names(dit, io):
        replace_module(dit, name, _int8_module(dit.get_submodule(name), use_kernel, empty=True))
    return _fuse(set_int8_attention_(dit, attention))
