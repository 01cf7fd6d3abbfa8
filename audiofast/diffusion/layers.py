"""Small building blocks shared by the SA3 DiT and the SAME autoencoder.

Parameter names (``gamma``, ``ff.0.proj``, ``weight_g``/``weight_v``, ``inv_freq``) follow the
upstream checkpoints so a ``state_dict`` loads without renaming.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """RMS norm with a ``gamma`` weight; ``force_fp32`` computes it in float32 (the DiT does)."""

    def __init__(self, dim: int, eps: float = 1e-5, force_fp32: bool = False):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.force_fp32 = force_fp32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.force_fp32:
            return F.rms_norm(x, x.shape[-1:], weight=self.gamma, eps=self.eps)
        out = F.rms_norm(x.float(), x.shape[-1:], weight=self.gamma.float(), eps=self.eps)
        return out.to(x.dtype)


class DynamicTanh(nn.Module):
    """DyT: ``gamma * tanh(alpha * x) + beta``, the SAME autoencoder's normalization-free norm."""

    def __init__(self, dim: int, init_alpha: float = 4.0):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), init_alpha))
        self.gamma = nn.Parameter(torch.ones(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gamma * torch.tanh(self.alpha * x) + self.beta


class RotaryEmbedding(nn.Module):
    """Rotary angles for ``dim`` rotated channels (fewer than the head dim: partial RoPE).

    ``inv_freq`` is a persistent buffer because upstream checkpoints carry it.
    """

    def __init__(self, dim: int, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq)

    def forward(self, seq_len: int) -> torch.Tensor:
        """Angles ``[seq_len, dim]`` (float32), each frequency used for both halves."""
        t = torch.arange(seq_len, device=self.inv_freq.device, dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq.float())
        return torch.cat((freqs, freqs), dim=-1)


def apply_rotary(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``freqs.shape[-1]`` channels of ``x`` (float32 math, half-split pairs)."""
    rot = freqs.shape[-1]
    xf = x.float()
    x_rot, x_pass = xf[..., :rot], xf[..., rot:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    rotated = x_rot * freqs.cos() + torch.cat((-x2, x1), dim=-1) * freqs.sin()
    return torch.cat((rotated.to(x.dtype), x_pass.to(x.dtype)), dim=-1)


class GLU(nn.Module):
    """Gated linear unit: ``a * act(b)`` from one projection (SiLU, or ``sin(pi x)``)."""

    def __init__(self, dim_in: int, dim_out: int, sinusoidal: bool = False, bias: bool = True):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out * 2, bias=bias)
        self.sinusoidal = sinusoidal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, gate = self.proj(x).chunk(2, dim=-1)
        act = torch.sin(3.14159265359 * gate) if self.sinusoidal else F.silu(gate)
        return x * act


class FeedForward(nn.Module):
    """GLU feed-forward. ``ff`` is a Sequential with identity placeholders at 1 and 3 only so
    the two projections keep their upstream names ``ff.0.proj`` and ``ff.2``."""

    def __init__(self, dim: int, mult: float, bias: bool = True, sinusoidal: bool = False):
        super().__init__()
        inner = int(dim * mult)
        out = nn.Linear(inner, dim, bias=bias)
        nn.init.zeros_(out.weight)
        if bias:
            nn.init.zeros_(out.bias)
        self.ff = nn.Sequential(
            GLU(dim, inner, sinusoidal, bias), nn.Identity(), out, nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


class WNConv1d(nn.Conv1d):
    """Weight-normalized Conv1d stored as ``weight_g``/``weight_v`` like the checkpoints.

    (``torch.nn.utils.parametrizations.weight_norm`` would name them ``parametrizations.*``.)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, bias: bool = True):
        super().__init__(in_channels, out_channels, kernel_size, padding="same", bias=bias)
        weight = self.weight.detach()
        del self.weight
        self.weight_v = nn.Parameter(weight.clone())
        self.weight_g = nn.Parameter(torch.linalg.vector_norm(weight, dim=(1, 2), keepdim=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = torch.linalg.vector_norm(self.weight_v, dim=(1, 2), keepdim=True)
        weight = self.weight_v * (self.weight_g / norm)
        return self._conv_forward(x, weight, self.bias)


class ExpoFourierFeatures(nn.Module):
    """Cos/sin of ``t`` at ``dim / 2`` frequencies spaced geometrically in [0.5, 1e4] (float32).

    SA3 embeds both the diffusion time and ``seconds_total`` this way; it has no parameters.
    """

    def __init__(self, dim: int, min_freq: float = 0.5, max_freq: float = 10000.0):
        super().__init__()
        self.dim, self.min_freq, self.max_freq = dim, min_freq, max_freq

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        dtype, t = t.dtype, t.float()
        if t.dim() == 1:
            t = t.unsqueeze(-1)
        ramp = torch.linspace(0, 1, self.dim // 2, device=t.device, dtype=torch.float32)
        log_min, log_max = math.log(self.min_freq), math.log(self.max_freq)
        freqs = torch.exp(ramp * (log_max - log_min) + log_min)
        args = t * freqs * 2 * math.pi
        return torch.cat((torch.cos(args), torch.sin(args)), dim=-1).to(dtype)


class RandomFourierFeatures(nn.Module):
    """Upstream's "learned" timestep features: fixed random frequencies in a ``weight`` buffer."""

    def __init__(self, in_features: int, out_features: int, std: float = 16.0):
        super().__init__()
        self.register_buffer("weight", torch.randn(out_features // 2, in_features) * std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = 2 * math.pi * x @ self.weight.T
        return torch.cat((f.cos(), f.sin()), dim=-1)
