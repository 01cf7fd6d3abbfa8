"""Synthetic SA3 checkpoints for tests: real key names and layout, random weights.

No SA3 weights can be downloaded here, so loaders and samplers are exercised on files written
from a config: the tiny one below (seconds to build) or a real-size upstream config.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from audiofast.diffusion.checkpoint import CONFIG_NAME, WEIGHTS_NAME, build_model


def tiny_config(differential: bool = False, sliding_window: bool = False) -> dict[str, Any]:
    """An upstream-format ``model_config.json`` with SA3's structure at toy sizes.

    DiT: width 64, 2 blocks of 2 heads (head dim 32: RoPE needs 32 channels), 4 memory
    tokens, 8 latent channels. Autoencoder: stereo audio, patch 4, one 4x stage of width 32,
    so 16 samples per latent; chunked attention with midpoint shift (SAME-S style) or a
    sliding window (SAME-L style). Conditioners are the real ones (T5Gemma's 768 width).
    """
    same = {
        "channels": 8,
        "c_mults": [4],
        "strides": [4],
        "latent_dim": 8,
        "transformer_depths": [2],
        "differential": True,
        "dim_heads": 16,
        "variable_stride": True,
    }
    if sliding_window:
        same["sliding_window"] = [1, 1]
    else:
        same.update({"dyt": True, "chunk_size": 8, "chunk_midpoint_shift": True})
    return {
        "model_type": "diffusion_cond_inpaint",
        "sample_rate": 44100,
        "sample_size": 16 * 64,
        "audio_channels": 2,
        "model": {
            "io_channels": 8,
            "pretransform": {
                "type": "autoencoder",
                "config": {
                    "encoder": {"type": "same", "config": {**same, "in_channels": 8}},
                    "decoder": {
                        "type": "same",
                        "config": {
                            **same,
                            "out_channels": 8,
                            "conv_mapping": not sliding_window,
                            "sinusoidal_blocks": [1 if sliding_window else 0],
                        },
                    },
                    "bottleneck": {"type": "softnorm", "config": {"dim": 8, "auto_scale": True}},
                    "pretransform": {"type": "patched", "config": {"channels": 2, "patch_size": 4}},
                    "latent_dim": 8,
                    "downsampling_ratio": 16,
                    "io_channels": 2,
                },
            },
            "conditioning": {
                "cond_dim": 768,
                "configs": [
                    {
                        "id": "prompt",
                        "type": "t5gemma",
                        "config": {"max_length": 8, "padding_mode": "learned"},
                    },
                    {
                        "id": "seconds_total",
                        "type": "number",
                        "config": {"min_val": 0, "max_val": 384, "fourier_features_type": "expo"},
                    },
                ],
            },
            "diffusion": {
                "type": "dit",
                "diffusion_objective": "rf_denoiser",
                "cross_attention_cond_ids": ["prompt", "seconds_total"],
                "global_cond_ids": ["seconds_total"],
                "local_add_cond_ids": ["inpaint_mask", "inpaint_masked_input"],
                "config": {
                    "io_channels": 8,
                    "embed_dim": 64,
                    "depth": 2,
                    "num_heads": 2,
                    "cond_token_dim": 768,
                    "global_cond_dim": 768,
                    "local_add_cond_dim": 9,
                    "global_cond_type": "adaLN",
                    "timestep_features_type": "expo",
                    "num_memory_tokens": 4,
                    "norm_type": "rms_norm",
                    "norm_kwargs": {"force_fp32": True},
                    "attn_kwargs": {"qk_norm": "rms", "differential": differential},
                    "ff_kwargs": {"mult": 2},
                },
            },
        },
    }


def randomize_(model: torch.nn.Module, seed: int = 0, std: float = 0.02) -> None:
    """Give every zero-initialized weight small random values so that all paths matter
    (a fresh model zeroes its output projections, which would hide wiring mistakes)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point() and tensor.numel() and not tensor.any():
                tensor.copy_(torch.randn(tensor.shape, generator=gen) * std)


def write_synthetic_checkpoint(
    directory: str | Path,
    config: dict[str, Any] | None = None,
    seed: int = 0,
    drop: tuple[str, ...] = (),
    reshape: dict[str, tuple[int, ...]] | None = None,
) -> Path:
    """Write ``model_config.json`` + ``model.safetensors`` with the config's exact layout.

    ``drop`` leaves keys out and ``reshape`` stores keys with other shapes, to test the
    load report. Returns the directory.
    """
    config = copy.deepcopy(config or tiny_config())
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = build_model(config)
    randomize_(model, seed)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items() if k not in drop}
    for key, shape in (reshape or {}).items():
        tensors[key] = torch.zeros(shape)
    save_file(tensors, str(directory / WEIGHTS_NAME))
    (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2), encoding="utf-8")
    return directory


def tiny_text_encoder():
    """A random one-layer T5Gemma encoder (768 wide, as SA3's conditioner expects) and a word
    tokenizer: what a synthetic checkpoint bundles where the real T5Gemma cannot be loaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, T5GemmaConfig, T5GemmaEncoderModel

    words = ["<pad>", "<unk>", "soft", "loud", "piano", "drums", "rain", "wind", "a", "of"]
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>")
    enc = dict(vocab_size=len(vocab), hidden_size=768, intermediate_size=32, num_hidden_layers=1,
               num_attention_heads=2, num_key_value_heads=1, head_dim=16,
               query_pre_attn_scalar=16, sliding_window=16, pad_token_id=0)
    torch.manual_seed(0)
    config = T5GemmaConfig(encoder=enc, decoder=enc, vocab_size=len(vocab))
    config.is_encoder_decoder = False
    return T5GemmaEncoderModel(config), tokenizer


def write_checkpoint_with_text_encoder(directory: str | Path,
                                       config: dict[str, Any] | None = None,
                                       seed: int = 0) -> Path:
    """:func:`write_synthetic_checkpoint` plus a tiny T5Gemma in the ``t5gemma`` subfolder the
    config names, so the checkpoint loads and generates with no download."""
    config = copy.deepcopy(config or tiny_config())
    for entry in config["model"]["conditioning"]["configs"]:
        if entry["type"] == "t5gemma":
            entry.setdefault("config", {})["subfolder"] = "t5gemma"
    directory = write_synthetic_checkpoint(directory, config, seed)
    encoder, tokenizer = tiny_text_encoder()
    encoder.save_pretrained(directory / "t5gemma")
    tokenizer.save_pretrained(directory / "t5gemma")
    return directory
