"""Guidance distillation (CFG folding): one DiT pass per step does what CFG does with two.

Following Meng et al., "On Distillation of Guided Diffusion Models" (CVPR 2023, stage one), a
student warm-started from the teacher learns to output, in one conditional pass, the teacher's
*guided* prediction - here the exact combination the sampler applies, CFG on x0 predictions with
upstream's APG projection (:func:`audiofast.diffusion.sampling.guided_denoiser`), so sampling the
student at a scale w is sampling the guided teacher at w at half the DiT passes.

Two forms: a fixed scale (the student's tensors are the teacher's layout, so upstream code can
load it) or a range of scales through a zero-initialized guidance-scale embedding added to the
DiT's global conditioning (:class:`audiofast.diffusion.dit.DiT`, ``guidance=``): at step 0 the
student is exactly the teacher's conditional branch, and ``audiofast generate --cfg W`` on it
runs one pass per step at any W in the range.

The loss compares velocities, ``v = (x_t - x0) / t``: the DiT's own output space, the same
weighting over times as the teacher's flow-matching training.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from audiofast.diffusion.distill_batch import DistillBatch

# (x_t [B,C,T], t [B], batch) -> x0 prediction [B,C,T]
X0Fn = Callable[[torch.Tensor, torch.Tensor, DistillBatch], torch.Tensor]


def velocity_mse(x0_pred: torch.Tensor, x0_target: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Mean squared error of the velocities two x0 predictions at the same ``x_t`` imply."""
    return ((x0_pred - x0_target) / t[:, None, None]).pow(2).mean()


def prediction_loss(student: X0Fn, teacher: X0Fn, batch: DistillBatch) -> torch.Tensor:
    """The student's x0 against the teacher's (here the guided teacher at the batch's scales;
    QAD uses it too, the float parent against its fake-quantized copy), as velocities."""
    xt = batch.xt
    with torch.no_grad():
        target = teacher(xt, batch.t, batch)
    return velocity_mse(student(xt, batch.t, batch), target, batch.t)
