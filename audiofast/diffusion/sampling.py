"""Flow-matching samplers for Stable Audio 3, in the style of k-diffusion's ``sampling.py``.

Flow matching mixes data and noise linearly, ``x_t = (1 - t) x0 + t eps`` (t = 1 is pure noise),
and the DiT predicts the velocity ``v = eps - x0``, so ``x0_hat = x - t v``. Every sampler here is
a pure function of a *denoiser* ``denoise(x, t) -> x0_hat`` that the caller builds: conditioning,
padding masks and classifier-free guidance live in that closure (:func:`guided_denoiser`), so the
samplers stay a few lines each and can be reused for distillation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from tqdm import trange

from audiofast.diffusion.checkpoint import Conditioning
from audiofast.diffusion.config import ScheduleShift

Denoiser = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x [B,C,T], t [B]) -> x0_hat
Callback = Callable[[dict], None]
Generators = torch.Generator | Sequence[torch.Generator] | None


# -- schedules ----------------------------------------------------------------------------------


def _logsnr_shift(
    t: torch.Tensor,
    seq_len: int | None,
    anchor_length: float = 2000,
    anchor_logsnr: float = -6.2,
    rate: float = 1.0,
    logsnr_end: float = 2.0,
) -> torch.Tensor:
    """Uniform steps in log-SNR from ``logsnr_end`` down to a start that drops by ``rate`` per
    doubling of length. SA3's default (rate 0) is ``sigmoid(8.2 t - 2)``."""
    start = anchor_logsnr
    if rate:
        start -= rate * math.log2(_need_length(seq_len, "logsnr") / anchor_length)
    out = torch.sigmoid(-(logsnr_end - t * (logsnr_end - start)))
    return torch.where(t <= 0, 0.0, torch.where(t >= 1, 1.0, out))  # exact endpoints


def _full_shift(
    t: torch.Tensor,
    seq_len: int | None,
    base_shift: float = 0.5,
    max_shift: float = 1.15,
    max_length: float = 4096,
    min_length: float = 256,
    use_sine: bool = False,
) -> torch.Tensor:
    """``t / (t + e^mu (1 - t))`` with ``-mu`` growing linearly in length: longer clips spend
    more steps at high noise. Written as upstream writes it (exact 0 and 1 at the ends)."""
    length = min(max(_need_length(seq_len, "full"), min_length), max_length)
    frac = (length - min_length) / (max_length - min_length)
    mu = -(base_shift + (max_shift - base_shift) * frac)
    out = 1 - math.exp(mu) / (math.exp(mu) + (1 / (1 - t) - 1))
    return torch.sin(out * math.pi / 2) if use_sine else out


def _flux_shift(
    t: torch.Tensor,
    seq_len: int | None,
    min_length: float = 256,
    max_length: float = 4096,
    alpha_min: float = 1.0,
    alpha_max: float = 1.0,
) -> torch.Tensor:
    """SD3/Flux ``alpha t / (1 + (alpha - 1) t)``, alpha log-linear in log-length."""
    log_a0, log_a1 = math.log(max(alpha_min, 1e-8)), math.log(max(alpha_max, 1e-8))
    log_min, log_max = math.log(min_length), math.log(max_length)
    log_max += 1e-8 if log_max == log_min else 0.0
    length = min(max(_need_length(seq_len, "flux"), min_length), max_length)
    frac = (math.log(length) - log_min) / (log_max - log_min)
    alpha = math.exp(log_a0 + frac * (log_a1 - log_a0))
    return alpha * t / (1 + (alpha - 1) * t)


def _need_length(seq_len: int | None, kind: str) -> int:
    if seq_len is None:
        raise ValueError(f"the {kind!r} schedule shift depends on length: pass seq_len")
    return max(int(seq_len), 1)


_SHIFTS = {"logsnr": _logsnr_shift, "full": _full_shift, "flux": _flux_shift}


def schedule(
    steps: int, shift: ScheduleShift | None = None, seq_len: int | None = None
) -> torch.Tensor:
    """Times ``[steps + 1]`` from 1 to 0: ``linspace(1, 0)`` warped by ``shift`` (a checkpoint's
    ``cfg.diffusion.sampling_shift``). ``seq_len`` is the content length in latents, which
    length-dependent shifts need. The first time is forced back to exactly 1, as upstream does,
    so it matches the pure-noise start."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    ts = torch.linspace(1, 0, steps + 1)
    if shift is not None and shift.kind != "none":
        ts = _SHIFTS[shift.kind](ts, seq_len, **shift.params)
    ts[0] = 1.0
    return ts


# -- samplers -----------------------------------------------------------------------------------


def randn_like(x: torch.Tensor, generator: Generators = None) -> torch.Tensor:
    """Gaussian noise shaped like ``x``. A list of generators gives each batch item its own
    stream, so an item's noise never depends on what else is in the batch."""
    if generator is None or isinstance(generator, torch.Generator):
        device = x.device if generator is None else generator.device
        noise = torch.randn(x.shape, generator=generator, device=device)
    else:
        if len(generator) != x.shape[0]:
            raise ValueError(f"{len(generator)} generators for a batch of {x.shape[0]}")
        noise = torch.stack(
            [torch.randn(x.shape[1:], generator=g, device=g.device) for g in generator]
        )
    return noise.to(x.device, x.dtype)


def _times(ts: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if ts.dim() != 1 or ts.numel() < 2:
        raise ValueError("ts must be a 1-D schedule of at least two times")
    return ts.to(x.device, x.dtype)


def sample_euler(
    denoise: Denoiser,
    x: torch.Tensor,
    ts: torch.Tensor,
    callback: Callback | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """Euler on the flow ODE: ``v = (x - x0_hat) / t``, ``x += (t_next - t) v``. Deterministic
    given the start noise; the sampler for non-distilled (``rectified_flow``) checkpoints."""
    ts = _times(ts, x)
    for i in trange(len(ts) - 1, disable=not progress, desc="euler"):
        t, t_next = ts[i], ts[i + 1]
        denoised = denoise(x, t.expand(x.shape[0]))
        if callback is not None:
            callback({"i": i, "t": t, "x": x, "denoised": denoised})
        x = x + (t_next - t) * (x - denoised) / t
    return x


def sample_pingpong(
    denoise: Denoiser,
    x: torch.Tensor,
    ts: torch.Tensor,
    generator: Generators = None,
    callback: Callback | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """Ping-pong (SA3's default for distilled ``rf_denoiser`` checkpoints): jump to ``x0_hat``,
    then re-noise it to ``t_next`` with fresh noise, ``x = (1 - t_next) x0_hat + t_next eps``.
    A step to t = 0 returns ``x0_hat`` itself (no noise drawn)."""
    ts = _times(ts, x)
    for i in trange(len(ts) - 1, disable=not progress, desc="pingpong"):
        t, t_next = ts[i], ts[i + 1]
        denoised = denoise(x, t.expand(x.shape[0]))
        if callback is not None:
            callback({"i": i, "t": t, "x": x, "denoised": denoised})
        if float(t_next) == 0.0:
            x = denoised
        else:
            x = (1 - t_next) * denoised + t_next * randn_like(x, generator)
    return x


SAMPLERS = {"euler": sample_euler, "pingpong": sample_pingpong}


# -- guidance -----------------------------------------------------------------------------------


def apg_project(
    delta: torch.Tensor, ref: torch.Tensor, padding_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split ``delta [B, C, T]`` into parts parallel and orthogonal to ``ref``, per item over
    (C, T), in float32. With ``padding_mask [B, T]`` only valid positions count and the
    orthogonal part is zero on padding. APG keeps the orthogonal part: the parallel part mostly
    scales the prediction up (over-saturation) rather than steering it."""
    dtype = delta.dtype
    delta, ref = delta.float(), ref.float()
    mask = None if padding_mask is None else padding_mask[:, None, :].float()
    if mask is not None:
        ref = ref * mask
    unit = ref / ref.norm(dim=(1, 2), keepdim=True).clamp_min(1e-12 if mask is None else 1e-8)
    parallel = (delta * unit).sum(dim=(1, 2), keepdim=True) * unit
    orthogonal = delta - parallel if mask is None else (delta - parallel) * mask
    return parallel.to(dtype), orthogonal.to(dtype)


def unconditional(cond: Conditioning) -> Conditioning:
    """Upstream's null condition for CFG: the whole cross-attention input (text and seconds
    tokens) zeroed, global conditioning (the seconds embedding) kept."""
    return replace(cond, cross_attn_cond=torch.zeros_like(cond.cross_attn_cond))


def guided_denoiser(
    dit: Callable[..., torch.Tensor],
    cond: Conditioning,
    uncond: Conditioning | None = None,
    cfg_scale: float | torch.Tensor = 1.0,
    apg_scale: float = 1.0,
    padding_mask: torch.Tensor | None = None,
    local_cond: torch.Tensor | None = None,
) -> Denoiser:
    """``denoise(x, t) -> x0_hat`` from a velocity network ``dit(x, t, cross_attn_cond,
    global_cond, local_cond, padding_mask)``.

    At ``cfg_scale == 1`` only the conditional pass runs (what distilled checkpoints use).
    Otherwise conditional and unconditional (default :func:`unconditional`) run as one doubled
    batch and guidance acts on the x0 predictions, ``x0_c + (cfg_scale - 1) * delta``, where
    ``delta = x0_c - x0_u`` has its component parallel to ``x0_c`` removed in proportion to
    ``apg_scale`` (1: full APG, upstream's default; 0: plain CFG). ``cfg_scale`` may be a
    ``[B]`` tensor, one scale per item (guidance distillation trains over a range of scales).
    """

    def x0_from_v(x: torch.Tensor, t: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return x - t[:, None, None] * v.to(x.dtype)

    if not torch.is_tensor(cfg_scale) and cfg_scale == 1.0:

        def denoise(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            v = dit(x, t, cond.cross_attn_cond, cond.global_cond, local_cond, padding_mask)
            return x0_from_v(x, t, v)

        return denoise

    uncond = unconditional(cond) if uncond is None else uncond
    cross = torch.cat((cond.cross_attn_cond, uncond.cross_attn_cond))
    glob = torch.cat((cond.global_cond, uncond.global_cond))
    local = None if local_cond is None else torch.cat((local_cond, local_cond))
    mask = None if padding_mask is None else torch.cat((padding_mask, padding_mask))

    def guided(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        x2, t2 = torch.cat((x, x)), torch.cat((t, t))
        x0_cond, x0_uncond = x0_from_v(x2, t2, dit(x2, t2, cross, glob, local, mask)).chunk(2)
        delta = x0_cond - x0_uncond
        if apg_scale != 0.0:
            _, orthogonal = apg_project(delta, x0_cond, padding_mask)
            delta = apg_scale * orthogonal + (1 - apg_scale) * delta
        scale = cfg_scale[:, None, None] if torch.is_tensor(cfg_scale) else cfg_scale
        return x0_cond + (scale - 1) * delta

    return guided
