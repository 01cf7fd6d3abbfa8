"""GPTQ rounding of the decoder's int4 linears (Frantar et al., 2022), onto the packer's grid.

Rounding each weight to its nearest int4 value (int4_pack.py) treats the weights as
independent; GPTQ rounds a linear's input columns one at a time and moves the error each
rounding made onto the columns not yet rounded, weighted by how the inputs co-vary (the
Hessian of the layer's squared output error, ``X^T X`` over calibration activations), so the
layer's *output* on real inputs moves as little as possible. The grid is the packer's: each
group's scale is the one nearest rounding searches (:func:`quantize_int4`), fixed before any
column is rounded, so the result packs to exactly these values and QAD can train through the
same grid afterwards.

Layers are rounded in order, each one's Hessians taken with the layers before it already
rounded (the inputs it will see). Calibration inputs are the QAD examples: the full model's
own transcripts of domain audio, teacher-forced - no labels.
"""

from __future__ import annotations

import torch
from torch import nn

from audiofast.asr.int4_pack import GROUP, QMAX, QMIN, quantize_int4

DAMPING = 0.01  # of the Hessian's mean diagonal, added for a stable inverse (the paper's)
BLOCK = 128  # columns rounded before their error is pushed to the rest in one matmul


def gptq_round(weight: torch.Tensor, hessian: torch.Tensor, group: int = GROUP,
               damping: float = DAMPING, act_order: bool = True) -> torch.Tensor:
    """``weight`` (out, in) rounded onto its int4 grid (the searched group scales of the
    weight as given), one input column at a time, each column's rounding error compensated
    on the columns after it through ``hessian`` (in, in). Returns the rounded weight
    (q x scale, the values the kernel multiplies by), float32."""
    w = weight.detach().double().clone()
    out, width = w.shape
    _, scale = quantize_int4(weight.detach().float(), group)
    scales = scale.double().repeat_interleave(group, dim=1)  # (out, in)
    h = hessian.detach().double().clone()
    dead = torch.diag(h) == 0  # inputs never active: their weights cannot matter
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h += damping * torch.diag(h).mean() * torch.eye(width, dtype=h.dtype)
    # The most active inputs first (GPTQ's "act order"): their errors are the costliest, and
    # rounded early they still have every later column to absorb them. Each column keeps its
    # own group's scale, so the grid is the packer's whatever the order.
    order = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(width)
    w, h, scales = w[:, order], h[order][:, order], scales[:, order]
    # Upper Cholesky factor of H^-1: row i holds how column i's error spreads to later ones.
    inverse = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    rounded = torch.zeros_like(w)
    for i1 in range(0, width, BLOCK):
        i2 = min(i1 + BLOCK, width)
        block = w[:, i1:i2].clone()
        errors = torch.zeros_like(block)
        inv = inverse[i1:i2, i1:i2]
        for i in range(i2 - i1):
            column, s = block[:, i], scales[:, i1 + i]
            q = torch.round(column / s).clamp(QMIN, QMAX) * s
            rounded[:, i1 + i] = q
            error = (column - q) / inv[i, i]
            block[:, i:] -= error[:, None] * inv[i, i:][None, :]
            errors[:, i] = error
        w[:, i2:] -= errors @ inverse[i1:i2, i2:]
    return rounded[:, torch.argsort(order)].float()


def _hessians(model, layer: nn.Module, names: tuple[str, ...], batches) -> dict[str, torch.Tensor]:
    """X^T X of each named linear's inputs in ``layer`` over the batches' real positions."""
    sums = {name: None for name in names}
    mask: list[torch.Tensor] = []

    def hook(name):
        def record(_module, inputs, _output):
            x = inputs[0].detach()[mask[0]].double()  # (positions, in)
            sums[name] = x.T @ x if sums[name] is None else sums[name] + x.T @ x
        return record

    handles = [layer.get_submodule(n).register_forward_hook(hook(n)) for n in names]
    try:
        with torch.no_grad():
            for encoded, inputs, fed in batches:
                mask[:] = [fed]
                model.model.decoder(input_ids=inputs, encoder_hidden_states=encoded)
    finally:
        for handle in handles:
            handle.remove()
    return sums


def gptq_decoder(model, names: tuple[str, ...], batches, group: int = GROUP,
                 progress: bool = True, act_order: bool = True) -> None:
    """Round ``model``'s decoder linears ``names`` (in every layer) in place with GPTQ, layer
    by layer. ``batches``: (encoder states, decoder inputs, bool mask of the real positions)
    for calibration."""
    from tqdm import tqdm

    layers = model.model.decoder.layers
    for layer in tqdm(layers, desc="GPTQ int4", unit="layer", disable=not progress):
        hessians = _hessians(model, layer, names, batches)
        for name in names:
            linear = layer.get_submodule(name)
            linear.weight.data = gptq_round(linear.weight, hessians[name], group,
                                            act_order=act_order).to(linear.weight.dtype)
