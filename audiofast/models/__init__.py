"""Where models come from: packaged wheels, local directories, the hub; CT2 <-> HF."""

from audiofast.models.packaged import DEFAULT_MODEL, PACKAGED_MODELS, packaged_model_dir
from audiofast.models.resolve import ModelNotFoundError, ResolvedModel, resolve_model

__all__ = [
    "DEFAULT_MODEL",
    "PACKAGED_MODELS",
    "ModelNotFoundError",
    "ResolvedModel",
    "packaged_model_dir",
    "resolve_model",
]
