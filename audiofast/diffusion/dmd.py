"""Step distillation by distribution matching: ``audiofast distill --stage steps --method dmd``.

**Method: DMD2** (Yin et al., NeurIPS 2024) on the pingpong sampler, with ARC's adversarial
head (:mod:`audiofast.diffusion.adversarial`). Progressive distillation regresses the student
onto one target per input and lands on the teacher's own 4-step quality
(:mod:`audiofast.diffusion.step_distill`); DMD instead matches the *distribution* of the
student's clips to the guided teacher's, so the student may be better than the teacher at
the same step count.

One generator step:

1. **Backward simulation**: the student's own 4-step pingpong chain, run without grad from
   pure noise to a random step ``i`` of its schedule, gives the input ``x_{s_i}`` that the
   student meets at sampling time (not the forward-noised data the teacher trained on).
2. The student predicts ``x0_g`` from it (with grad), which is noised again to a random
   ``t`` in ``[t_min, t_max]``.
3. **Distribution matching**: the real score (the root teacher, guided as the student's
   folded guidance says, two passes) and the fake score (the critic: a copy of the folded
   parent, trained on the student's clips) each predict x0; the KL gradient is their difference,
   normalized per item by ``mean |x0_g - p_real|``. The loss
   ``0.5 |x0_g - sg(x0_g - grad)|^2`` has exactly that gradient.
4. **Adversarial**: the critic's head must score ``x0_g`` above a real clip of the same
   prompt (relativistic, per frame).

Before it, the critic takes ``critic_steps`` updates on fresh detached student clips:
flow-matching loss (it must stay the score of what the student makes now, DMD2's two
time-scale rule) plus the head's relativistic, contrastive and R1/R2 terms. Critic, head,
their optimizer and the update count ride in the training checkpoint (``companion``), so a
killed run resumes bit-equal.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from audiofast.diffusion.adversarial import (
    PatchHead,
    critic_adversarial_loss,
    generator_adversarial_loss,
)
from audiofast.diffusion.cfg_distill import X0Fn, velocity_mse
from audiofast.diffusion.checkpoint import Conditioning, SA3Model
from audiofast.diffusion.distill_batch import DistillBatch
from audiofast.diffusion.distill_config import DMDSpec
from audiofast.diffusion.sampling import guided_denoiser
from audiofast.training import GradientSync


class Critic:
    """The fake score and its adversarial head, with their own optimizer:
    :func:`audiofast.training.train`'s ``companion``.

    The fake score starts as a copy of the *parent*, the CFG-folded teacher, not the unguided
    one: it must be the score of what the generator makes, and at step 0 the generator is the
    parent. Started from the unguided teacher, its first gradients would be the guidance
    delta itself, pushing an already guided student to guide twice.
    """

    def __init__(self, parent: SA3Model, spec: DMDSpec, device: str = "cpu", seed: int = 0):
        self.dit = copy.deepcopy(parent.dit).to(device).requires_grad_(True).train()
        depth = parent.dit.config.depth
        self.layer = spec.feature_layer or max(1, depth // 2)
        if not 1 <= self.layer <= depth:
            raise ValueError(f"dmd.feature_layer={self.layer}: the critic has {depth} blocks")
        with torch.random.fork_rng(devices=[]):  # the same head in every process
            torch.manual_seed(seed)
            self.head = PatchHead(parent.dit.config.embed_dim).to(device)
        self.params = [*self.dit.parameters(), *self.head.parameters()]
        self.optimizer = torch.optim.AdamW(self.params, lr=spec.critic_lr, weight_decay=0.0)
        self.updates = 0

    def net(self, guidance: torch.Tensor):
        """The DiT as ``dit(x, t, cross, global, ...)``, at the batch's scales if it embeds one."""
        if hasattr(self.dit, "to_guidance_embed"):
            return partial(self.dit, guidance=guidance)
        return self.dit

    def x0(self, xt: torch.Tensor, t: torch.Tensor, batch: DistillBatch) -> torch.Tensor:
        return guided_denoiser(self.net(batch.guidance), batch.cond)(xt, t)

    def trainable(self, on: bool) -> None:
        for p in self.params:
            p.requires_grad_(on)

    def state_dict(self) -> dict[str, Any]:
        return {"dit": self.dit.state_dict(), "head": self.head.state_dict(),
                "optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dit.load_state_dict(state["dit"])
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])


def take(batch: DistillBatch, idx: torch.Tensor) -> DistillBatch:
    """The items ``idx`` of a batch."""
    c = batch.cond
    cond = Conditioning(c.cross_attn_cond[idx], c.cross_attn_mask[idx], c.global_cond[idx])
    return DistillBatch(batch.x0[idx], batch.noise[idx], batch.t[idx], cond, batch.guidance[idx],
                        batch.slot[idx])


@torch.no_grad()
def backward_simulate(student: X0Fn, batch: DistillBatch, times: torch.Tensor,
                      gen: torch.Generator) -> torch.Tensor:
    """Each item's input at its step ``slot`` of the student's pingpong chain ``times``,
    started from ``batch.noise`` at t = 1; only the items still on the way take a pass."""
    times = times.to(batch.x0)
    x = batch.noise.clone()
    for j in range(int(batch.slot.max().item()) if len(batch.slot) else 0):
        idx = (batch.slot > j).nonzero()[:, 0]
        x0 = student(x[idx], times[j].expand(len(idx)), take(batch, idx))
        eps = torch.randn(x0.shape, generator=gen).to(x0)
        x[idx] = (1 - times[j + 1]) * x0 + times[j + 1] * eps
    return x


def noise_to(x0: torch.Tensor, spec: DMDSpec, gen: torch.Generator):
    """``x0`` noised to times uniform in ``[t_min, t_max]``: ``(x_t, t, noise)``."""
    t = spec.t_min + (spec.t_max - spec.t_min) * torch.rand(len(x0), generator=gen)
    noise = torch.randn(x0.shape, generator=gen)
    t, noise = t.to(x0), noise.to(x0)
    return (1 - t[:, None, None]) * x0 + t[:, None, None] * noise, t, noise


def distribution_matching_loss(x0_g: torch.Tensor, p_real: torch.Tensor,
                               p_fake: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DMD's loss, whose gradient in ``x0_g`` is ``(p_fake - p_real)`` normalized per item;
    also the gradient's RMS (it falls as the two scores agree on the student's clips)."""
    dims = tuple(range(1, x0_g.dim()))
    scale = (x0_g - p_real).abs().mean(dim=dims, keepdim=True).clamp_min(1e-8)
    grad = torch.nan_to_num((p_fake - p_real) / scale.detach())
    loss = 0.5 * F.mse_loss(x0_g.float(), (x0_g - grad).detach().float())
    return loss, grad.pow(2).mean().sqrt()


def dmd_step(student: X0Fn, real: X0Fn, critic: Critic, draw, times: torch.Tensor,
             spec: DMDSpec, sync: GradientSync | None = None):
    """The stage's :data:`~audiofast.training.StepFn`: ``critic_steps`` critic updates, then
    the generator's loss. ``draw(gen)`` gives a batch at the student's own times."""

    def student_sample(batch: DistillBatch, gen: torch.Generator) -> torch.Tensor:
        return student(backward_simulate(student, batch, times, gen), batch.t, batch)

    def critic_update(gen: torch.Generator, apply: bool = True) -> dict[str, float]:
        batch = draw(gen)
        with torch.no_grad():
            fake = student_sample(batch, gen)
        xt, t, noise = noise_to(fake, spec, gen)
        denoise = velocity_mse(critic.x0(xt, t, batch), fake, t)
        adv = critic_adversarial_loss(critic.net(batch.guidance), critic.head, critic.layer,
                                      batch.x0, fake, noise, t, batch.cond,
                                      spec.contrastive_weight, spec.r1_weight, spec.r1_sigma, gen)
        logs = {"critic_denoise": denoise.item(), **{f"critic_{k}": v.item()
                                                      for k, v in adv.items()}}
        if not apply:
            return logs
        loss = denoise + spec.critic_gan_weight * sum(adv.values())
        critic.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if sync is not None:
            sync.average_gradients(critic.params)
        torch.nn.utils.clip_grad_norm_(critic.params, 1.0)
        critic.optimizer.step()
        critic.updates += 1
        return logs

    def step(_: int, gen: torch.Generator,
             update_critic: bool = True) -> tuple[torch.Tensor, dict[str, float]]:
        """``update_critic=False``: both losses on one batch each, nothing updated (a
        held-out measurement, under ``torch.no_grad``)."""
        critic.trainable(True)
        if update_critic:
            logs = [critic_update(gen) for _ in range(spec.critic_steps)]
        else:
            logs = [critic_update(gen, apply=False)]
        critic.trainable(False)  # the generator's grads flow through the critic, not into it
        batch = draw(gen)
        x0_g = student_sample(batch, gen)
        xt, t, noise = noise_to(x0_g, spec, gen)
        with torch.no_grad():
            p_real = real(xt.detach(), t, batch)
            p_fake = critic.x0(xt.detach(), t, batch)
            critic_fit = velocity_mse(p_fake, x0_g, t)  # the fake score on these very clips
        dmd, grad_rms = distribution_matching_loss(x0_g, p_real, p_fake)
        gan = generator_adversarial_loss(critic.net(batch.guidance), critic.head, critic.layer,
                                         batch.x0, x0_g, noise, t, batch.cond)
        extra = {k: round(sum(d[k] for d in logs) / len(logs), 6) for k in logs[0]}
        extra |= {"dmd": round(dmd.item(), 6), "dmd_grad_rms": round(grad_rms.item(), 6),
                  "generator_gan": round(gan.item(), 6), "critic_fit": round(critic_fit.item(), 6),
                  "critic_updates": critic.updates}
        return dmd + spec.gan_weight * gan, extra

    return step


def real_score(teacher: SA3Model, guidance, spec: DMDSpec) -> X0Fn:
    """The teacher guided at the student's folded scale: ``f(x_t, t, batch) -> x0``."""
    from audiofast.diffusion.generate import model_denoiser

    apg = guidance.apg_scale if spec.real_apg_scale is None else spec.real_apg_scale

    def x0(xt: torch.Tensor, t: torch.Tensor, batch: DistillBatch) -> torch.Tensor:
        return model_denoiser(teacher, batch.cond, batch.guidance, apg)(xt, t)

    return x0


def check_parent(parent: SA3Model, source: str) -> None:
    """DMD starts from a CFG-folded student: the generator takes one pass per step."""
    folded = parent.config.student.guidance if parent.config.student else None
    if folded is None:
        raise ValueError(f"{source}: --method dmd distills a CFG-folded parent; run "
                         "`audiofast distill --stage cfg` on it first")

