"""Step distillation for the pingpong sampler: a 4-step student from an 8-step parent.

**Method: progressive distillation** (Salimans & Ho, ICLR 2022) with deterministic two-step
targets, trained only at the student's own sampling times (the "steps-aware" choice of TDM).
For a student time ``s_i = T[k i]`` (``T`` the parent's schedule, ``k = from / to``) the target
is the x0 prediction the parent reaches after ``k`` DDIM steps from the same ``x_{s_i}``: each
step predicts x0, keeps the noise that prediction implies, ``eps = (x - (1 - t) x0) / t``, and
moves to the next time, ``x = (1 - t') x0 + t' eps``. The student's pingpong sampler then uses
its one x0 prediction per step and re-noises with fresh noise, as the parent's does.

The student's times need not be every ``k``-th parent time: given times (``--times``, e.g. a
sampling-time search's) make each step's target run the parent from ``s_i`` through every
parent time strictly between ``s_i`` and ``s_{i+1}`` (:func:`parent_paths`), so the student
learns the jump it will actually take.

Why this method among the alternatives, on this problem:

- *Regressing onto stochastic targets* (the parent's own pingpong steps, or data noised again)
  converges to a posterior mean: by the tower rule it is the one-step prediction again, and
  the blur that few steps cause stays. The DDIM sub-trajectory is a deterministic function of
  ``x_{s_i}``, so the student learns a map, not an average: the point of progressive
  distillation.
- *Consistency distillation* targets the probability-flow ODE's endpoint from every time; the
  teacher's 50-step Euler ODE samples are measurably worse than its 8-step pingpong samples
  (FAD 235 vs 120 on the proving ground), so the ODE endpoint is the wrong thing to copy. A
  progressive target stays one parent stride long and keeps the parent's sampler as the
  reference.
- *Distribution matching* (DMD/DMD2, adversarial post-training as in SA Open Small) reaches
  1-2 steps, but trains a fake-score critic (a second DiT) beside the student: more than 2x the
  compute of this stage for a 2x step cut that progressive distillation reaches with one
  frozen parent. It is the method for going below 4 steps (docs/diffusion.md).

Loss: x0 error weighted by max(SNR, 1) with SNR = ((1 - t) / t)^2 (Salimans & Ho's "truncated
SNR" weighting), so high-noise steps, where the student's prediction matters most for the
final sample, are not discounted.
"""

from __future__ import annotations

import torch

from audiofast.diffusion.cfg_distill import X0Fn
from audiofast.diffusion.distill_batch import DistillBatch


def halve_schedule(parent_times: torch.Tensor, steps: int) -> torch.Tensor:
    """The student's times: every ``k``-th parent time, ``k = parent steps / steps``."""
    parent_steps = len(parent_times) - 1
    if steps < 1 or parent_steps % steps:
        raise ValueError(f"cannot distill {parent_steps} steps into {steps}: not a divisor")
    return parent_times[:: parent_steps // steps].clone()


def parent_paths(parent_times: torch.Tensor, student_times: torch.Tensor) -> list[torch.Tensor]:
    """For each student step ``s_i -> s_{i+1}``, the times the parent is run at to make its
    target: ``s_i`` and every parent time strictly between the two. Even strides give ``k``
    parent times per step; times a search moved off the parent's grid (``--times``) give 1-4,
    and each step still ends at the parent's last prediction before ``s_{i+1}``."""
    paths = []
    for s, s_next in zip(student_times[:-1].tolist(), student_times[1:].tolist(), strict=True):
        inner = [float(t) for t in parent_times.tolist() if s_next < t < s]
        paths.append(torch.tensor([s, *inner]))
    return paths


@torch.no_grad()
def progressive_target(
    parent: X0Fn, batch: DistillBatch, paths: list[torch.Tensor]
) -> torch.Tensor:
    """The parent's x0 after DDIM steps along ``paths[slot]`` from each item's ``x_t`` (items
    grouped by slot, so each group runs its own path's length); free items (``slot < 0``) stay
    at their time, so their target is the parent's one-step prediction."""
    target = torch.empty_like(batch.x0)
    for slot in batch.slot.unique().tolist():
        idx = (batch.slot == slot).nonzero().squeeze(1)
        part = batch.take(idx)
        path = paths[slot].to(part.t) if slot >= 0 else part.t[:1]
        x, t = part.xt, part.t
        for j in range(len(path)):
            x0 = parent(x, t, part)
            if j == len(path) - 1:
                break
            t_next = path[j + 1].expand_as(t)
            eps = (x - (1 - t[:, None, None]) * x0) / t[:, None, None]
            x = (1 - t_next[:, None, None]) * x0 + t_next[:, None, None] * eps
            t = t_next
        target[idx] = x0
    return target


def truncated_snr_mse(x0_pred: torch.Tensor, target: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    snr = ((1 - t) / t).pow(2)
    weight = torch.maximum(snr, torch.ones_like(snr))[:, None, None]
    return (weight * (x0_pred - target).pow(2)).mean()


def step_distill_loss(
    student: X0Fn, parent: X0Fn, batch: DistillBatch, paths: list[torch.Tensor]
) -> torch.Tensor:
    target = progressive_target(parent, batch, paths)
    return truncated_snr_mse(student(batch.xt, batch.t, batch), target, batch.t)
