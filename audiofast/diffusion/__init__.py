"""Stable Audio 3 models: DiT, SAME autoencoder and conditioners, loadable from checkpoints."""

from audiofast.diffusion.autoencoder import AudioAutoencoder
from audiofast.diffusion.checkpoint import (
    CheckpointError,
    Conditioning,
    LoadReport,
    SA3Model,
    attach_text_encoder,
    build_model,
    load_checkpoint,
    load_weights,
)
from audiofast.diffusion.conditioners import NumberConditioner, TextConditioner
from audiofast.diffusion.config import ConfigError, SA3Config
from audiofast.diffusion.dit import DiT

__all__ = [
    "AudioAutoencoder",
    "CheckpointError",
    "Conditioning",
    "ConfigError",
    "DiT",
    "LoadReport",
    "NumberConditioner",
    "SA3Config",
    "SA3Model",
    "TextConditioner",
    "attach_text_encoder",
    "build_model",
    "load_checkpoint",
    "load_weights",
]
