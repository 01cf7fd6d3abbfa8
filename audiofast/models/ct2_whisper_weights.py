"""CTranslate2 Whisper weights under Hugging Face's names, without importing transformers.

CTranslate2 fuses projections that transformers keeps apart (self-attention Q/K/V in one
matrix, cross-attention K/V in another) and stores a zero bias for K, which Whisper does not
have. The mapping below undoes that; everything else is a rename. The owned decoder reads
only the decoder half (``whisper_state_dict(ct2, encoder=False)``): transformers' import alone
took ~3 s of the fast engine's start-up.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from audiofast.models.ct2_reader import CT2FormatError, CT2Model


def _linear(ct2: CT2Model, src: str, dst: str, out: dict[str, np.ndarray]) -> None:
    out[f"{dst}.weight"] = ct2.float_weight(f"{src}/weight")
    if f"{src}/bias" in ct2:
        out[f"{dst}.bias"] = ct2[f"{src}/bias"].astype(np.float32)


def _norm(ct2: CT2Model, src: str, dst: str, out: dict[str, np.ndarray]) -> None:
    out[f"{dst}.weight"] = ct2[f"{src}/gamma"].astype(np.float32)
    out[f"{dst}.bias"] = ct2[f"{src}/beta"].astype(np.float32)


def _split(ct2: CT2Model, src: str, dsts: list[str | None], out: dict[str, np.ndarray]) -> None:
    """Split a fused projection along its output rows; ``k_proj`` gets no bias."""
    weights = np.split(ct2.float_weight(f"{src}/weight"), len(dsts))
    biases = np.split(ct2[f"{src}/bias"].astype(np.float32), len(dsts))
    for dst, weight, bias in zip(dsts, weights, biases, strict=True):
        out[f"{dst}.weight"] = weight
        if dst.endswith("k_proj"):
            if np.abs(bias).max() > 0:
                raise CT2FormatError(f"{src}: non-zero key bias, not a Whisper checkpoint")
        else:
            out[f"{dst}.bias"] = bias


def layer_count(ct2: CT2Model, stack: str) -> int:
    return len({m.group(1) for n in ct2.variables if (m := re.match(rf"{stack}/layer_(\d+)/", n))})


def whisper_state_dict(ct2: CT2Model, encoder: bool = True) -> dict[str, torch.Tensor]:
    """``WhisperForConditionalGeneration``'s state dict (the tied head excepted)."""
    sd: dict[str, np.ndarray] = {}
    if encoder:
        _encoder_state(ct2, sd)

    sd["model.decoder.embed_tokens.weight"] = ct2.float_weight("decoder/embeddings/weight")
    sd["model.decoder.embed_positions.weight"] = ct2["decoder/position_encodings/encodings"]
    for i in range(layer_count(ct2, "decoder")):
        src, dst = f"decoder/layer_{i}", f"model.decoder.layers.{i}"
        _self_attention_and_ffn(ct2, src, dst, sd)
        _linear(ct2, f"{src}/attention/linear_0", f"{dst}.encoder_attn.q_proj", sd)
        _split(ct2, f"{src}/attention/linear_1",
               [f"{dst}.encoder_attn.k_proj", f"{dst}.encoder_attn.v_proj"], sd)
        _linear(ct2, f"{src}/attention/linear_2", f"{dst}.encoder_attn.out_proj", sd)
        _norm(ct2, f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm", sd)
    _norm(ct2, "decoder/layer_norm", "model.decoder.layer_norm", sd)
    # float32 files come memory-mapped read-only: those arrays are copied (torch writes)
    return {k: torch.from_numpy(np.require(v, np.float32, ["C_CONTIGUOUS", "WRITEABLE"]))
            for k, v in sd.items()}


def _encoder_state(ct2: CT2Model, sd: dict[str, np.ndarray]) -> None:
    for conv in ("conv1", "conv2"):
        _linear(ct2, f"encoder/{conv}", f"model.encoder.{conv}", sd)
    sd["model.encoder.embed_positions.weight"] = ct2["encoder/position_encodings/encodings"]
    for i in range(layer_count(ct2, "encoder")):
        _self_attention_and_ffn(ct2, f"encoder/layer_{i}", f"model.encoder.layers.{i}", sd)
    _norm(ct2, "encoder/layer_norm", "model.encoder.layer_norm", sd)


def _self_attention_and_ffn(ct2: CT2Model, src: str, dst: str, sd: dict[str, np.ndarray]) -> None:
    """What encoder and decoder layers share: self-attention and the feed-forward block."""
    _split(ct2, f"{src}/self_attention/linear_0", [f"{dst}.self_attn.{p}_proj" for p in "qkv"], sd)
    _linear(ct2, f"{src}/self_attention/linear_1", f"{dst}.self_attn.out_proj", sd)
    _norm(ct2, f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm", sd)
    _linear(ct2, f"{src}/ffn/linear_0", f"{dst}.fc1", sd)
    _linear(ct2, f"{src}/ffn/linear_1", f"{dst}.fc2", sd)
    _norm(ct2, f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm", sd)


def encoder_state(ct2: CT2Model) -> dict[str, np.ndarray]:
    """The encoder's float arrays under Hugging Face's names (the int8 encoder packs them)."""
    sd: dict[str, np.ndarray] = {}
    _encoder_state(ct2, sd)
    return sd
