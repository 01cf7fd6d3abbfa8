"""One training batch for the distillation stages: noisy latents, their conditioning, times and
guidance scales, drawn the same way on every process and then sharded.

Each step's randomness comes from that step's generator (:func:`audiofast.training.train`), and
the full batch is drawn before a process takes its share (items ``rank::world``). So two
processes with half the batch each compute the same mean gradient as one process with all of
it, up to float summation order, and a resumed run draws the same batches as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from diffusers.training_utils import compute_density_for_timestep_sampling

from audiofast.diffusion.checkpoint import Conditioning, SA3Model
from audiofast.diffusion.flow_matching import LatentSet


@dataclass(frozen=True)
class Shard:
    rank: int = 0
    world: int = 1

    def take(self, x: torch.Tensor) -> torch.Tensor:
        return x[self.rank :: self.world]


@dataclass
class DistillBatch:
    x0: torch.Tensor  # [B, C, T] clean latents
    noise: torch.Tensor  # [B, C, T]
    t: torch.Tensor  # [B] times in (0, 1]
    cond: Conditioning
    guidance: torch.Tensor  # [B] guidance scales
    slot: torch.Tensor  # [B] long: which sampler step each time came from (-1: drawn freely)

    def take(self, idx: torch.Tensor) -> DistillBatch:
        """The items at ``idx`` (a long tensor), conditioning included."""
        c = self.cond
        cond = Conditioning(c.cross_attn_cond[idx], c.cross_attn_mask[idx], c.global_cond[idx])
        return DistillBatch(self.x0[idx], self.noise[idx], self.t[idx], cond,
                            self.guidance[idx], self.slot[idx])

    @property
    def xt(self) -> torch.Tensor:
        t = self.t[:, None, None]
        return (1 - t) * self.x0 + t * self.noise


def draw_batch(
    model: SA3Model,
    data: LatentSet,
    batch: int,
    gen: torch.Generator,
    sampler_times: Sequence[float],
    schedule_time_prob: float,
    guidance_range: tuple[float, float] | None,
    guidance_scale: float,
    shard: Shard = Shard(),
    device: torch.device | str = "cpu",
) -> DistillBatch:
    """Latents and captions at random; times either one of ``sampler_times`` (the times the
    distilled model will be run at, t = 0 excluded) or logit-normal (SD3's training density,
    drawn by diffusers' ``compute_density_for_timestep_sampling``);
    scales uniform over ``guidance_range`` (else ``guidance_scale``)."""
    idx = torch.randint(0, len(data.latents), (batch,), generator=gen)
    times = torch.tensor([float(t) for t in sampler_times if t > 0])
    slot = torch.randint(0, len(times), (batch,), generator=gen)
    free = compute_density_for_timestep_sampling("logit_normal", batch, logit_mean=0.0,
                                                 logit_std=1.0, generator=gen).clamp(0.02, 1.0)
    on_schedule = torch.rand(batch, generator=gen) < schedule_time_prob
    t = torch.where(on_schedule, times[slot], free)
    slot = torch.where(on_schedule, slot, -1)
    noise = torch.randn((batch, *data.latents.shape[1:]), generator=gen)
    if guidance_range is None:
        w = torch.full((batch,), guidance_scale)
    else:
        lo, hi = guidance_range
        w = lo + (hi - lo) * torch.rand(batch, generator=gen)
    idx, t, slot, noise, w = (shard.take(v) for v in (idx, t, slot, noise, w))
    k = data.caption_index[idx]
    text_id = model.config.conditioning.text[0].id
    inputs = {text_id: (data.hidden[k].to(device), data.mask[k].to(device))}
    inputs.update({c.id: [data.seconds] * len(idx) for c in model.config.conditioning.numbers})
    with torch.no_grad():
        cond = model.condition(inputs)
    return DistillBatch(data.latents[idx].to(device), noise.to(device), t.to(device), cond,
                        w.to(device), slot.to(device))
