"""The adversarial half of DMD step distillation: a relativistic, per-patch discriminator head
on the fake-score critic's mid-layer features, with a prompt-contrastive term and
noise-perturbation gradient penalties (after stable-audio-tools' ARC post-training and
DMD2's classifier branch).

- **Features, not a second network**: the discriminator is the critic DiT up to
  ``feature_layer`` (content tokens only) plus a small head, so it sees noisy latents at the
  critic's own times and costs half a pass (the later blocks do not run).
- **Per patch**: the head is two 1-D convolutions over latent frames and scores every frame,
  so a clip that is right in one second and wrong in the next is told where.
- **Relativistic**: a real clip and a generated clip of the *same prompt*, noised to the
  same time with the same noise, are scored against each other,
  ``softplus(D(fake) - D(real))`` for the critic and the reverse for the generator.
- **Contrastive**: the same real clip under another item's prompt (the batch rolled by one)
  must score lower than under its own, so the head cannot ignore the prompt.
- **Noise-perturbation R1/R2**: instead of a double-backward gradient penalty, the head's
  output must not move when its input is perturbed by ``sigma`` Gaussian noise, on real (R1)
  and generated (R2) inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from audiofast.diffusion.checkpoint import Conditioning


class PatchHead(nn.Module):
    """``[B, T, dim]`` critic features -> ``[B, T]`` per-frame logits."""

    def __init__(self, dim: int, hidden: int | None = None):
        super().__init__()
        hidden = hidden or dim
        self.net = nn.Sequential(nn.Conv1d(dim, hidden, 3, padding=1), nn.SiLU(),
                                 nn.Conv1d(hidden, 1, 1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features.transpose(1, 2).float())[:, 0]


def roll_prompts(cond: Conditioning) -> Conditioning:
    """Each item conditioned on the next item's prompt (global conditioning kept)."""
    return Conditioning(cond.cross_attn_cond.roll(1, 0), cond.cross_attn_mask.roll(1, 0),
                        cond.global_cond)


def discriminate(dit: nn.Module, head: PatchHead, layer: int, x0: torch.Tensor,
                 noise: torch.Tensor, t: torch.Tensor, cond: Conditioning) -> torch.Tensor:
    """Per-frame logits of clean latents ``x0`` noised to ``t`` with ``noise``."""
    xt = (1 - t[:, None, None]) * x0 + t[:, None, None] * noise
    features = dit(xt, t, cond.cross_attn_cond, cond.global_cond, features_at=layer)
    return head(features)


def relativistic(better: torch.Tensor, worse: torch.Tensor) -> torch.Tensor:
    """The loss for ``better`` to score above ``worse`` (paired per frame)."""
    return F.softplus(worse - better).mean()


def critic_adversarial_loss(dit: nn.Module, head: PatchHead, layer: int, real: torch.Tensor,
                            fake: torch.Tensor, noise: torch.Tensor, t: torch.Tensor,
                            cond: Conditioning, contrastive_weight: float, r1_weight: float,
                            r1_sigma: float, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """The critic's adversarial terms on a batch of real latents and detached generated
    latents of the same prompts."""
    d_real = discriminate(dit, head, layer, real, noise, t, cond)
    d_fake = discriminate(dit, head, layer, fake, noise, t, cond)
    terms = {"gan": relativistic(d_real, d_fake)}
    if contrastive_weight:
        d_wrong = discriminate(dit, head, layer, real, noise, t, roll_prompts(cond))
        terms["contrastive"] = contrastive_weight * relativistic(d_real, d_wrong)
    if r1_weight:
        pert = r1_sigma * torch.randn(real.shape, generator=gen).to(real)
        d_real_p = discriminate(dit, head, layer, real + pert, noise, t, cond)
        d_fake_p = discriminate(dit, head, layer, fake + pert, noise, t, cond)
        terms["r1"] = r1_weight * ((d_real_p - d_real).pow(2).mean()
                                   + (d_fake_p - d_fake).pow(2).mean()) / r1_sigma**2
    return terms


def generator_adversarial_loss(dit: nn.Module, head: PatchHead, layer: int, real: torch.Tensor,
                               fake: torch.Tensor, noise: torch.Tensor, t: torch.Tensor,
                               cond: Conditioning) -> torch.Tensor:
    """The generator's side: its latents (with grad) should score above the real ones."""
    with torch.no_grad():
        d_real = discriminate(dit, head, layer, real, noise, t, cond)
    return relativistic(discriminate(dit, head, layer, fake, noise, t, cond), d_real)
