"""SAME autoencoder (SAME-S and SAME-L): stereo 44.1 kHz audio <-> 256-channel latents.

Audio is cut into 256-sample patches (2 x 256 = 512 channels). A *resampling block* then
trades length for learned tokens: the encoder appends one learned token to every 16 patches
and keeps only that token's output (16x down); the decoder appends 16 learned tokens to every
latent and keeps theirs (16x up). The transformer blocks in between (DyT norms, differential
attention, RoPE, GLU feed-forward) attend either within fixed chunks, with the second half of
the blocks shifted by half a chunk so information crosses chunk borders (SAME-S), or within a
sliding window (SAME-L). A per-channel affine "soft-norm" bottleneck sits at the latents.

Only inference is built here (no training-time statistics updates).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from audiofast.diffusion.attention import Attention
from audiofast.diffusion.config import AutoencoderConfig, SAMEConfig
from audiofast.diffusion.layers import DynamicTanh, FeedForward, RMSNorm, RotaryEmbedding, WNConv1d


class SAMEBlock(nn.Module):
    """Pre-norm transformer block: ``x += attn(norm(x)); x += ff(norm(x))``, RoPE per block."""

    def __init__(self, dim: int, cfg: SAMEConfig, sinusoidal: bool):
        super().__init__()
        head_dim = min(cfg.dim_heads, dim)
        norm = (lambda: DynamicTanh(dim)) if cfg.dyt else (lambda: RMSNorm(dim, eps=1e-3))
        self.pre_norm = norm()
        self.self_attn = Attention(
            dim,
            head_dim,
            differential=cfg.differential,
            qk_norm="dyt" if cfg.dyt else "rms",
            qk_norm_eps=1e-3,
        )
        self.ff_norm = norm()
        self.ff = FeedForward(dim, cfg.ff_mult, bias=True, sinusoidal=sinusoidal)
        self.rope = RotaryEmbedding(head_dim // 2)

    def forward(self, x: torch.Tensor, window: tuple[int, int] | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.pre_norm(x), rope=self.rope(x.shape[1]), window=window)
        return x + self.ff(self.ff_norm(x))


def _pad_to_multiple(x: torch.Tensor, multiple: int, dim: int) -> torch.Tensor:
    extra = -x.shape[dim] % multiple
    if not extra:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat((x, x.new_zeros(shape)), dim=dim)


class ResamplingBlock(nn.Module):
    """One SAME stage: 1x1 (or 3-tap) mapping conv plus token-resampling transformer."""

    def __init__(
        self,
        in_ch: int,
        out_ch: int,
        stride: int,
        depth: int,
        cfg: SAMEConfig,
        decoder: bool,
        sinusoidal_blocks: int = 0,
    ):
        super().__init__()
        dim = in_ch if decoder else out_ch
        self.decoder, self.stride, self.depth = decoder, stride, depth
        self.in_seg, self.out_seg = (1, stride) if decoder else (stride, 1)
        self.chunk_size, self.midpoint_shift = cfg.chunk_size, cfg.chunk_midpoint_shift
        self.window = (
            None
            if cfg.sliding_window is None
            else tuple(w * (stride + 1) for w in cfg.sliding_window)
        )
        self.mask_noise = cfg.mask_noise
        kernel = 3 if cfg.conv_mapping else 1
        self.mapping = (
            WNConv1d(in_ch, out_ch, kernel, bias=cfg.mapping_bias)
            if in_ch != out_ch
            else nn.Identity()
        )
        tokens = 1 if cfg.variable_stride else self.out_seg
        self.new_tokens = nn.Parameter(1e-5 * torch.randn(1, tokens, dim))
        self.transformers = nn.ModuleList(
            SAMEBlock(dim, cfg, sinusoidal=(depth - i) < sinusoidal_blocks) for i in range(depth)
        )

    def _attend(self, x: torch.Tensor) -> torch.Tensor:
        """Run the blocks over ``x [B, L, D]`` with chunked or sliding-window attention."""
        if self.window is not None:
            for block in self.transformers:
                x = block(x, self.window)
            return x
        b, _, d = x.shape
        chunk = self.chunk_size + self.chunk_size // self.stride  # stride + 1 tokens per group
        split = self.depth // 2 if self.midpoint_shift else self.depth
        x = x.reshape(-1, chunk, d)
        for block in self.transformers[:split]:
            x = block(x)
        x = x.reshape(b, -1, d)
        if split == self.depth:
            return x
        shift = chunk // 2  # pad both ends with copies so the shifted chunks tile exactly
        x = torch.cat((x[:, :shift], x, x[:, -shift:]), dim=1).reshape(-1, chunk, d)
        for block in self.transformers[split:]:
            x = block(x)
        return x.reshape(b, -1, d)[:, shift:-shift]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, in_ch, L] -> [B, out_ch, L * out_seg / in_seg]`` (after padding L)."""
        if not self.decoder:
            if self.depth:
                x = _pad_to_multiple(
                    x, self.chunk_size if self.window is None else self.stride, dim=-1
                )
            x = self.mapping(x)
        if self.depth:
            b, d = x.shape[0], x.shape[1]
            x = x.transpose(1, 2)
            if self.decoder:
                x = _pad_to_multiple(
                    x, self.chunk_size // self.stride if self.window is None else 1, dim=1
                )
            x = x.reshape(-1, self.in_seg, d)
            new = self.new_tokens.expand(
                x.shape[0], self.out_seg if self.new_tokens.shape[1] == 1 else -1, -1
            )
            if self.mask_noise > 0:  # upstream adds this at inference too
                new = new + torch.randn_like(new) * self.mask_noise
            x = torch.cat((x, new), dim=1).reshape(b, -1, d)
            x = self._attend(x)
            x = x.reshape(-1, self.in_seg + self.out_seg, d)[:, -self.out_seg :]
            x = x.reshape(b, -1, d).transpose(1, 2)
        return self.mapping(x) if self.decoder else x


class SAMEEncoder(nn.Module):
    def __init__(self, cfg: SAMEConfig):
        super().__init__()
        w, n = cfg.widths, len(cfg.strides)
        blocks = [
            ResamplingBlock(
                w[i], w[i + 1], cfg.strides[i], cfg.transformer_depths[i], cfg, decoder=False
            )
            for i in range(n)
        ]
        # Identities sit where upstream has parameter-free transposes, keeping its indices.
        self.layers = nn.ModuleList(
            blocks + [nn.Identity(), nn.Linear(w[-1], cfg.latent_dim), nn.Identity()]
        )
        self.stages = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers[: self.stages]:
            x = block(x)
        return self.layers[self.stages + 1](x.transpose(1, 2)).transpose(1, 2)


class SAMEDecoder(nn.Module):
    def __init__(self, cfg: SAMEConfig):
        super().__init__()
        w, n = cfg.widths, len(cfg.strides)
        blocks = [
            ResamplingBlock(
                w[i],
                w[i - 1],
                cfg.strides[i - 1],
                cfg.transformer_depths[i - 1],
                cfg,
                decoder=True,
                sinusoidal_blocks=cfg.sinusoidal_blocks[i - 1],
            )
            for i in range(n, 0, -1)
        ]
        self.layers = nn.ModuleList(
            [nn.Identity(), nn.Linear(cfg.latent_dim, w[-1]), nn.Identity()] + blocks
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers[1](x.transpose(1, 2)).transpose(1, 2)
        for block in self.layers[3:]:
            x = block(x)
        return x


class SoftNormBottleneck(nn.Module):
    """Per-channel affine map into latent space (then divided by a learned global std)."""

    def __init__(
        self,
        dim: int,
        noise_augment_dim: int = 0,
        noise_regularize: bool = False,
        auto_scale: bool = False,
    ):
        super().__init__()
        self.scaling_factor = nn.Parameter(torch.ones(1, dim, 1))
        self.bias = nn.Parameter(torch.zeros(1, dim, 1))
        self.noise_scaling_factor = nn.Parameter(torch.ones(1, noise_augment_dim, 1))
        self.noise_regularize = noise_regularize
        if auto_scale:
            self.running_std = nn.Parameter(torch.ones(1), requires_grad=False)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        x = x * self.scaling_factor + self.bias
        return x / self.running_std if hasattr(self, "running_std") else x

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        scaled = hasattr(self, "running_std")
        if scaled:
            x = x * self.running_std
        if self.noise_regularize:  # upstream dithers latents at inference (1e-3 of their std)
            scale = self.running_std if scaled else x.std(dim=-1, keepdim=True)
            x = x + torch.randn_like(x) * scale * (5e-2 if self.training else 1e-3)
        if self.noise_scaling_factor.shape[1]:
            noise = torch.randn(
                x.shape[0],
                self.noise_scaling_factor.shape[1],
                x.shape[-1],
                device=x.device,
                dtype=x.dtype,
            )
            x = torch.cat((x, self.noise_scaling_factor * noise), dim=1)
        return x


class AudioAutoencoder(nn.Module):
    """``encode(audio [B, C, T]) -> latents [B, 256, T / 4096]`` and ``decode`` back."""

    def __init__(self, cfg: AutoencoderConfig):
        super().__init__()
        self.config = cfg
        self.bottleneck = SoftNormBottleneck(
            cfg.bottleneck_dim, cfg.noise_augment_dim, cfg.noise_regularize, cfg.auto_scale
        )
        self.encoder = SAMEEncoder(cfg.encoder)
        self.decoder = SAMEDecoder(cfg.decoder)

    @property
    def downsampling_ratio(self) -> int:
        return self.config.downsampling_ratio

    def patch(self, audio: torch.Tensor) -> torch.Tensor:
        """``[B, C, T] -> [B, C * p, T / p]`` (zero-padded to whole patches)."""
        p = self.config.patch_size
        audio = F.pad(audio, (0, -audio.shape[-1] % p))
        b, c, t = audio.shape
        return audio.reshape(b, c, t // p, p).transpose(2, 3).reshape(b, c * p, t // p)

    def unpatch(self, x: torch.Tensor) -> torch.Tensor:
        p = self.config.patch_size
        b, cp, n = x.shape
        return x.reshape(b, cp // p, p, n).transpose(2, 3).reshape(b, cp // p, n * p)

    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        dtype = next(self.parameters()).dtype
        return self.bottleneck.encode(self.encoder(self.patch(audio.to(dtype))))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        dtype = next(self.parameters()).dtype
        audio = self.unpatch(self.decoder(self.bottleneck.decode(latents.to(dtype))))
        return torch.tanh(audio) if self.config.soft_clip else audio
