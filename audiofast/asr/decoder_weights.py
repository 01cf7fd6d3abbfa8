"""Whisper's decoder tensors, read once from a CTranslate2 folder or a Hugging Face model.

Both decoder backends (:mod:`~audiofast.asr.fused_decoder`, :mod:`~audiofast.asr.reference_decoder`)
are built from a :class:`DecoderWeights`; neither keeps it afterwards, so the float tensors are
freed once the int8 backend has packed its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class DecoderWeights:
    """Whisper's decoder tensors under Hugging Face's names, minus the ``model.decoder.``
    prefix (``head`` is the output projection), and its head count."""

    state: dict[str, torch.Tensor]
    head: torch.Tensor
    n_heads: int

    @classmethod
    def from_hf(cls, model) -> DecoderWeights:
        """From a ``WhisperForConditionalGeneration`` (a drafter, a vocab-diet checkpoint)."""
        prefix = "model.decoder."
        state = {k[len(prefix):]: v.detach() for k, v in model.state_dict().items()
                 if k.startswith(prefix)}
        return cls(state, model.proj_out.weight.detach(), model.config.decoder_attention_heads)

    @classmethod
    def from_ct2(cls, ct2_dir: str | Path) -> DecoderWeights:
        """Straight from a CTranslate2 folder: no transformers import, no encoder tensors."""
        from audiofast.models.ct2_reader import read_ct2_model
        from audiofast.models.ct2_whisper_weights import whisper_state_dict

        ct2 = read_ct2_model(Path(ct2_dir) / "model.bin")
        prefix = "model.decoder."
        state = {k[len(prefix):]: v for k, v in whisper_state_dict(ct2, encoder=False).items()}
        return cls(state, state["embed_tokens.weight"], ct2.scalar("decoder/num_heads"))

    @property
    def n_layers(self) -> int:
        return 1 + max(int(k.split(".")[1]) for k in self.state if k.startswith("layers."))

    @property
    def d_model(self) -> int:
        return self.state["embed_tokens.weight"].shape[1]

    @property
    def n_ctx(self) -> int:
        return self.state["embed_positions.weight"].shape[0]

    def stacked(self, *names: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight, bias) of one linear computing the named projections of the same input,
        stacked (a missing bias - Whisper's K projections - is zero)."""
        weight = torch.cat([self.state[f"{n}.weight"] for n in names])
        bias = torch.cat([self.state.get(f"{n}.bias", torch.zeros(self.state[f"{n}.weight"]
                                                                  .shape[0])) for n in names])
        return weight, bias

    def norm(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight, bias) of a layer norm."""
        return self.state[f"{name}.weight"], self.state[f"{name}.bias"]


# The parts of one decoder layer (fused_decoder.LAYER_PARTS orders them): a layer norm (its
# Hugging Face name) or a linear (the projections stacked into it).
NORM_NAMES = {"self_ln": "self_attn_layer_norm", "cross_ln": "encoder_attn_layer_norm",
              "ffn_ln": "final_layer_norm"}
LINEAR_NAMES = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                "self_out": ("self_attn.out_proj",), "cross_q": ("encoder_attn.q_proj",),
                "cross_out": ("encoder_attn.out_proj",), "fc1": ("fc1",), "fc2": ("fc2",),
                "cross_kv": ("encoder_attn.k_proj", "encoder_attn.v_proj")}


def layer_part(weights: DecoderWeights, i: int, part: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of ``part`` of layer ``i`` (a norm's or a stacked linear's)."""
    if part in NORM_NAMES:
        return weights.norm(f"layers.{i}.{NORM_NAMES[part]}")
    return weights.stacked(*(f"layers.{i}.{n}" for n in LINEAR_NAMES[part]))
