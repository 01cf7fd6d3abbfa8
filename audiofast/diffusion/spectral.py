"""A fixed spectrogram pretransform: audio <-> standardized log-magnitude STFT frames.

The proving-ground teacher's latent space. A SAME autoencoder trained from scratch on 2 CPU
cores did not leave the output-zero fixed point in the time the whole recipe has (normalized
reconstruction error still 0.98 after 40 full-batch steps overfitting a single batch), so the
teacher uses a transform that needs no training: ``log(|STFT| + floor)``, standardized per
frequency bin with statistics measured on the training clips, decoded by Griffin-Lim phase
reconstruction. It is invertible up to phase, its round-trip quality is measured beside the
teacher's (``evals/teacher_quality.py``), and it keeps the teacher's quality a property of the
DiT alone, which is what distillation changes.

In a checkpoint it is ``model.pretransform`` with ``"type": "spectrogram"``; its only tensors
are the per-bin ``mean`` and ``std`` buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from audiofast.diffusion.config_schema import Section


@dataclass(frozen=True)
class SpectrogramConfig:
    n_fft: int
    hop_length: int
    floor: float  # added to magnitudes before the log: sets the modelled dynamic range
    griffin_lim_iters: int
    audio_channels: int = 1

    @property
    def latent_dim(self) -> int:
        return self.n_fft // 2 + 1

    @property
    def downsampling_ratio(self) -> int:
        return self.hop_length

    @classmethod
    def from_dict(cls, data: dict, where: str = "model.pretransform.config") -> SpectrogramConfig:
        c = Section(data, where)
        n_fft, hop = int(c.get("n_fft", 1024)), int(c.get("hop_length", 256))
        if n_fft <= 0 or hop <= 0 or hop > n_fft:
            raise c.fail("needs 0 < hop_length <= n_fft")
        latent = int(c.get("latent_dim", n_fft // 2 + 1))
        if latent != n_fft // 2 + 1:
            raise c.fail(f"has latent_dim {latent}; a {n_fft}-point STFT has {n_fft // 2 + 1} bins")
        return cls(
            n_fft=n_fft,
            hop_length=hop,
            floor=float(c.get("floor", 1e-3)),
            griffin_lim_iters=int(c.get("griffin_lim_iters", 64)),
            audio_channels=int(c.get("io_channels", 1)),
        )


class SpectrogramPretransform(nn.Module):
    """``encode(audio [B, 1, T]) -> [B, bins, T / hop]``; ``decode`` inverts by Griffin-Lim."""

    def __init__(self, cfg: SpectrogramConfig):
        super().__init__()
        import torchaudio

        if cfg.audio_channels != 1:
            raise ValueError("the spectrogram pretransform is mono")
        self.config = cfg
        self.register_buffer("mean", torch.zeros(cfg.latent_dim))
        self.register_buffer("std", torch.ones(cfg.latent_dim))
        self.register_buffer("window", torch.hann_window(cfg.n_fft), persistent=False)
        self.griffin_lim = torchaudio.transforms.GriffinLim(
            n_fft=cfg.n_fft, n_iter=cfg.griffin_lim_iters, hop_length=cfg.hop_length, power=1.0,
            rand_init=False,  # zero initial phase: decoding is deterministic
        )

    @property
    def downsampling_ratio(self) -> int:
        return self.config.hop_length

    def log_magnitude(self, audio: torch.Tensor) -> torch.Tensor:
        """``[B, 1, T]`` -> ``[B, bins, T // hop]`` (the centred STFT's extra last frame dropped,
        so ``T`` samples give exactly ``T / hop`` latents)."""
        audio = audio.reshape(audio.shape[0], -1).float()
        spec = torch.stft(audio, self.config.n_fft, self.config.hop_length, window=self.window,
                          return_complex=True)
        frames = audio.shape[-1] // self.config.hop_length
        return torch.log(spec.abs()[..., :frames] + self.config.floor)

    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        return (self.log_magnitude(audio) - self.mean[:, None]) / self.std[:, None]

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        log_mag = latents.float() * self.std[:, None] + self.mean[:, None]
        magnitude = (log_mag.exp() - self.config.floor).clamp_min(0.0)
        magnitude = torch.cat((magnitude, magnitude[..., -1:]), dim=-1)  # the dropped frame
        audio = self.griffin_lim(magnitude)
        return audio[..., : latents.shape[-1] * self.config.hop_length][:, None]

    @torch.no_grad()
    def calibrate(self, audio: torch.Tensor, batch: int = 64) -> None:
        """Set ``mean``/``std`` per bin from clips ``[N, 1, T]`` (std floored at 0.05 so a bin
        that is almost always at the floor does not turn tiny deviations into huge latents)."""
        logs = torch.cat([self.log_magnitude(audio[i : i + batch]) for i in range(0, len(audio),
                                                                                   batch)])
        self.mean.copy_(logs.mean(dim=(0, 2)))
        self.std.copy_(logs.std(dim=(0, 2)).clamp_min(0.05))
