"""Rectified-flow training of an SA3 DiT on fixed latents, with conditioning dropout.

``x_t = (1 - t) x0 + t noise`` and the DiT predicts ``v = noise - x0`` (the convention the
samplers in :mod:`audiofast.diffusion.sampling` invert). Times are logit-normal (SD3's choice:
most training where the velocity is hardest to predict). With probability ``uncond_prob`` an
item's whole cross-attention input is zeroed, which is exactly the null condition
:func:`~audiofast.diffusion.sampling.unconditional` feeds at sampling time: without it,
classifier-free guidance has no unconditional model to push away from.

The frozen text encoder never runs in the loop: its hidden states are computed once per distinct
caption (:func:`encode_captions`) and fed through the conditioner's learned projection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from audiofast.diffusion.checkpoint import SA3Model
from audiofast.diffusion.conditioners import TextConditioner
from audiofast.training import StepFn, TrainOptions, train


@dataclass
class LatentSet:
    """Training targets: latents, and for each an index into the distinct captions' states."""

    latents: torch.Tensor  # [N, C, T]
    caption_index: torch.Tensor  # [N] long
    hidden: torch.Tensor  # [K, S, dim] text-encoder states of the K distinct captions
    mask: torch.Tensor  # [K, S] bool
    captions: list[str]  # the K distinct captions
    seconds: float


@torch.no_grad()
def encode_captions(
    text: TextConditioner, captions: Sequence[str], batch: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen encoder's ``(hidden [K, S, dim], mask [K, S])`` for each caption."""
    states, masks = [], []
    for i in range(0, len(captions), batch):
        ids, mask = text.tokenize(captions[i : i + batch])
        states.append(text.encode_ids(ids, mask).float())
        masks.append(mask)
    return torch.cat(states), torch.cat(masks)


def flow_matching_step(
    model: SA3Model,
    data: LatentSet,
    batch: int = 32,
    uncond_prob: float = 0.15,
) -> StepFn:
    text_id = model.config.conditioning.text[0].id
    number_ids = [c.id for c in model.config.conditioning.numbers]

    def step(_: int, gen: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        idx = torch.randint(0, len(data.latents), (batch,), generator=gen)
        x0 = data.latents[idx]
        k = data.caption_index[idx]
        inputs = {text_id: (data.hidden[k], data.mask[k])}
        inputs.update({n: [data.seconds] * batch for n in number_ids})
        cond = model.condition(inputs)
        drop = torch.rand(batch, generator=gen) < uncond_prob
        cross = cond.cross_attn_cond.masked_fill(drop[:, None, None], 0.0)
        t = torch.sigmoid(torch.randn(batch, generator=gen))
        noise = torch.randn(x0.shape, generator=gen)
        xt = (1 - t[:, None, None]) * x0 + t[:, None, None] * noise
        v = model.dit(xt, t, cross, cond.global_cond)
        loss = (v - (noise - x0)).pow(2).mean()
        return loss, {}

    return step


def train_flow_matching(
    model: SA3Model,
    data: LatentSet,
    opts: TrainOptions,
    checkpoint: str | Path,
    batch: int = 32,
    uncond_prob: float = 0.15,
) -> SA3Model:
    """Train the DiT and the conditioners' learned parts (the autoencoder stays frozen);
    returns the EMA model when ``opts.ema_decay`` is set."""
    model.autoencoder.requires_grad_(False)
    params = [p for n, p in model.named_parameters() if not n.startswith("pretransform.")]
    step = flow_matching_step(model, data, batch, uncond_prob)
    return train(model, step, opts, checkpoint, desc="flow matching", params=params)
