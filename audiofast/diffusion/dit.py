"""The Stable Audio 3 diffusion transformer (DiT), key-compatible with upstream checkpoints.

Per block (adaLN-modulated, pre-norm RMS):

    x += sigmoid(1 - gate_sa) * self_attn(rms(x) * (1 + scale_sa) + shift_sa)   # RoPE on 32 ch
    x += cross_attn(rms(x), context)                                           # unmodulated
    x += local_mlp(local_cond)                                                 # inpainting input
    x += sigmoid(1 - gate_ff) * swiglu(rms(x) * (1 + scale_ff) + shift_ff)

The six modulation vectors are a learned per-block bias plus one shared projection of the
global embedding (timestep features + the ``seconds_total`` embedding). 64 learned memory
tokens are prepended to the sequence; the network's input and output projections are wrapped
in zero-initialized 1x1 convolutions used as residuals.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from audiofast.diffusion.attention import Attention
from audiofast.diffusion.config import DiTConfig
from audiofast.diffusion.layers import (
    ExpoFourierFeatures,
    FeedForward,
    RandomFourierFeatures,
    RMSNorm,
    RotaryEmbedding,
)


def _mlp(dim_in: int, dim: int, dim_out: int | None = None, bias: bool = True) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(dim_in, dim, bias=bias), nn.SiLU(), nn.Linear(dim, dim_out or dim, bias=bias)
    )


class DiTBlock(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        dim = cfg.embed_dim
        self.to_scale_shift_gate = nn.Parameter(torch.randn(6 * dim) / dim**0.5)
        attn = dict(head_dim=cfg.head_dim, differential=cfg.differential, qk_norm=cfg.qk_norm)
        self.pre_norm = RMSNorm(dim, force_fp32=cfg.norm_force_fp32)
        self.self_attn = Attention(dim, **attn)
        self.cross_attend_norm = RMSNorm(dim, force_fp32=cfg.norm_force_fp32)
        self.cross_attn = Attention(dim, context_dim=dim, **attn)
        self.ff_norm = RMSNorm(dim, force_fp32=cfg.norm_force_fp32)
        self.ff = FeedForward(dim, cfg.ff_mult, bias=cfg.ff_bias)
        if cfg.local_add_cond_dim is not None:
            self.to_local_embed = _mlp(cfg.local_add_cond_dim, dim)
            nn.init.zeros_(self.to_local_embed[2].weight)
            nn.init.zeros_(self.to_local_embed[2].bias)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        modulation: torch.Tensor,
        rope: torch.Tensor,
        local_cond: torch.Tensor | None,
        padding_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        scale_sa, shift_sa, gate_sa, scale_ff, shift_ff, gate_ff = (
            (self.to_scale_shift_gate + modulation).unsqueeze(1).chunk(6, dim=-1)
        )
        h = self.pre_norm(x) * (1 + scale_sa) + shift_sa
        h = self.self_attn(h, rope=rope, padding_mask=padding_mask)
        x = h * torch.sigmoid(1 - gate_sa) + x
        x = x + self.cross_attn(self.cross_attend_norm(x), context=context)
        if local_cond is not None and hasattr(self, "to_local_embed"):
            local = self.to_local_embed(local_cond)
            x = x + F.pad(local, (0, 0, x.shape[1] - local.shape[1], 0))  # none on memory tokens
        h = self.ff(self.ff_norm(x) * (1 + scale_ff) + shift_ff)
        return h * torch.sigmoid(1 - gate_ff) + x


class Transformer(nn.Module):
    """Token-level body: in/out projections, memory tokens, RoPE, adaLN embedder, blocks."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        dim = cfg.embed_dim
        self.num_memory_tokens = cfg.num_memory_tokens
        self.layers = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.depth))
        self.project_in = nn.Linear(cfg.io_channels, dim, bias=False)
        self.project_out = nn.Linear(dim, cfg.io_channels, bias=False)
        self.rotary_pos_emb = RotaryEmbedding(max(cfg.head_dim // 2, 32))
        if cfg.num_memory_tokens:
            self.memory_tokens = nn.Parameter(torch.randn(cfg.num_memory_tokens, dim))
        self.global_cond_embedder = _mlp(dim, dim, 6 * dim)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        global_embed: torch.Tensor,
        local_cond: torch.Tensor | None,
        padding_mask: torch.Tensor | None,
        features_at: int | None = None,
    ) -> torch.Tensor:
        """``x [B, T, io] -> [B, T, io]`` (channels last); with ``features_at=k`` the content
        tokens' states after block ``k`` instead, ``[B, T, dim]`` (later blocks do not run)."""
        x = self.project_in(x)
        if self.num_memory_tokens:
            x = torch.cat((self.memory_tokens.expand(x.shape[0], -1, -1), x), dim=1)
            if padding_mask is not None:
                valid = padding_mask.new_ones(x.shape[0], self.num_memory_tokens)
                padding_mask = torch.cat((valid, padding_mask), dim=1)
        rope = self.rotary_pos_emb(x.shape[1])
        modulation = self.global_cond_embedder(global_embed)
        for k, layer in enumerate(self.layers, start=1):
            x = layer(x, context, modulation, rope, local_cond, padding_mask)
            if k == features_at:
                return x[:, self.num_memory_tokens :]
        return self.project_out(x[:, self.num_memory_tokens :])


# Upstream's optional log-SNR timestep conditioning maps t into this fixed range.
_LOGSNR_MIN, _LOGSNR_MAX = -12.0, 5.0
GUIDANCE_NORM = 10.0  # guidance scales of 1-10 land in the Fourier features' first period


class DiT(nn.Module):
    """``DiT(x, t, cross_attn_cond, global_cond, local_cond, padding_mask) -> v``.

    Attribute names match upstream's ``DiffusionTransformer``, so under the ``model.model.``
    prefix its ``state_dict`` is the checkpoint's.
    """

    def __init__(self, cfg: DiTConfig, guidance_embed: bool = False):
        super().__init__()
        self.config = cfg
        dim, io = cfg.embed_dim, cfg.io_channels
        if cfg.timestep_features_type == "expo":
            self.timestep_features = ExpoFourierFeatures(cfg.timestep_features_dim)
        else:
            self.timestep_features = RandomFourierFeatures(1, cfg.timestep_features_dim)
        self.to_timestep_embed = _mlp(cfg.timestep_features_dim, dim)
        self.to_cond_embed = _mlp(cfg.cond_token_dim, dim, bias=False)
        self.to_global_embed = _mlp(cfg.global_cond_dim, dim, bias=False)
        self.transformer = Transformer(cfg)
        self.preprocess_conv = nn.Conv1d(io, io, 1, bias=False)
        self.postprocess_conv = nn.Conv1d(io, io, 1, bias=False)
        nn.init.zeros_(self.preprocess_conv.weight)
        nn.init.zeros_(self.postprocess_conv.weight)
        if guidance_embed:  # a CFG-folded student's scale input (diffusion/cfg_distill.py)
            self.to_guidance_embed = _mlp(cfg.timestep_features_dim, dim)
            nn.init.zeros_(self.to_guidance_embed[2].weight)  # starts as the teacher exactly
            nn.init.zeros_(self.to_guidance_embed[2].bias)

    def _time_input(self, t: torch.Tensor) -> torch.Tensor:
        if not self.config.timestep_features_logsnr:
            return t
        t = t.float().clamp(1e-7, 1 - 1e-7)
        logsnr = torch.log((1 - t) / t).clamp(_LOGSNR_MIN, _LOGSNR_MAX)
        return (_LOGSNR_MAX - logsnr) / (_LOGSNR_MAX - _LOGSNR_MIN)

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        cross_attn_cond: torch.Tensor,
        global_cond: torch.Tensor,
        local_cond: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        guidance: float | torch.Tensor | None = None,
        features_at: int | None = None,
    ) -> torch.Tensor:
        """Predict the flow velocity ``v = noise - x0`` for latents ``x`` at time ``t``.

        x: ``[B, io, T]`` noisy latents. t: ``[B]`` times in [0, 1] (1 = pure noise).
        cross_attn_cond: ``[B, S, cond_token_dim]`` context tokens (SA3: 256 text + 1 seconds).
        global_cond: ``[B, global_cond_dim]`` (SA3: the ``seconds_total`` embedding).
        local_cond: ``[B, local_add_cond_dim, T]`` (SA3: inpaint mask then masked latents).
            None means zeros, which is what upstream feeds for plain text-to-audio; the MLP's
            biases make zeros differ from leaving it out.
        padding_mask: ``[B, T]`` True where latents are real (valid-length generation).
        guidance: the guidance scale of a CFG-folded student with a scale embedding (a float or
            ``[B]``); it enters the global embedding as ``w / 10`` through Fourier features.
        features_at: return block ``k``'s content-token states ``[B, T, dim]`` instead of
            ``v`` (an adversarial head's input, :mod:`audiofast.diffusion.adversarial`).
        """
        dtype = self.to_timestep_embed[0].weight.dtype  # io layers may hold int8 weights
        x = x.to(dtype)
        cross_attn_cond, global_cond = cross_attn_cond.to(dtype), global_cond.to(dtype)
        if local_cond is None and self.config.local_add_cond_dim is not None:
            local_cond = x.new_zeros(x.shape[0], self.config.local_add_cond_dim, x.shape[2])
        context = self.to_cond_embed(cross_attn_cond)
        time = self._time_input(t.float()).to(dtype)
        global_embed = self.to_global_embed(global_cond) + self.to_timestep_embed(
            self.timestep_features(time[:, None])
        )
        if hasattr(self, "to_guidance_embed"):
            if guidance is None:
                raise ValueError("this DiT has a guidance-scale embedding: pass guidance")
            w = torch.as_tensor(guidance, dtype=torch.float32, device=x.device).expand(x.shape[0])
            features = self.timestep_features(w[:, None] / GUIDANCE_NORM).to(dtype)
            global_embed = global_embed + self.to_guidance_embed(features)
        x = self.preprocess_conv(x) + x
        local = None if local_cond is None else local_cond.to(dtype).transpose(1, 2)
        mask = None if padding_mask is None else padding_mask.bool()
        out = self.transformer(x.transpose(1, 2), context, global_embed, local, mask, features_at)
        if features_at is not None:
            return out
        out = out.transpose(1, 2)
        return self.postprocess_conv(out) + out
