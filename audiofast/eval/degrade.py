"""Deliberately damaged Whisper models: known-bad candidates that the judge must reject.

``fake_quant:BITS`` rounds every decoder Linear weight to BITS-bit symmetric per-row levels;
``head_noise:STD`` adds Gaussian noise (relative to the weight's std) to the output head
(tied to the token embeddings in Whisper, so both move). Each variant is written once as a
Hugging Face directory and converted to CTranslate2 by the usual model resolution.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from audiofast.cache import cache_dir
from audiofast.models import resolve_model
from audiofast.models.ct2_to_hf import whisper_from_ct2


def fake_quantize_(weight: torch.Tensor, bits: int) -> None:
    levels = 2 ** (bits - 1) - 1
    scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / levels
    weight.copy_(torch.round(weight / scale).clamp(-levels, levels) * scale)


def degraded_model(base: str, damage: str, seed: int = 0) -> Path:
    """Hugging Face directory of ``base`` with ``damage`` applied (cached)."""
    kind, _, arg = damage.partition(":")
    if kind not in ("fake_quant", "head_noise"):
        raise ValueError(f"unknown damage {damage!r}: fake_quant:BITS or head_noise:STD")
    out = cache_dir() / "degraded" / f"{base}-{kind}-{arg}-s{seed}"
    if (out / "model.safetensors").is_file():
        return out
    model, processor = whisper_from_ct2(resolve_model(base).ct2_dir)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if kind == "fake_quant":
            for module in model.model.decoder.modules():
                if isinstance(module, torch.nn.Linear):
                    fake_quantize_(module.weight, int(arg))
        else:
            head = model.proj_out.weight
            head.add_(torch.randn(head.shape, generator=generator) * head.std() * float(arg))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted run
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(tmp)
    processor.save_pretrained(tmp)
    tmp.rename(out)
    return out
