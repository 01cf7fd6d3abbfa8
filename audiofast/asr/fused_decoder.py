"""The int8 decoder as one C++ call (``torch.ops.audiofast.decoder_forward``): the default.

A step of Whisper's decoder is ~300 small ops; in eager PyTorch the time between them and in
dynamic int8 linears reading weights at a third of the memory bandwidth was most of a token.
The fused op runs every layer of a call in C++ (kernels/decoder_step.cpp) over int8 weights
(int8_pack.py), a float KV cache and fp16 cross-attention K/V, and quantizes each row with its
own range and sums products exactly in int32, so a row's logits never depend on the rows
beside it: plain greedy and draft verification share one arithmetic, and drafting is lossless.

An int8 head's logits are recomputed exactly (fp32) for its top ``RESCORE_TOP`` candidates:
the word choice is made among them, and the head was the layer whose rounding moved greedy
output most. The packed tensors are plain tensors (:meth:`FusedDecoder.tensors`), so the
start-up cache (packed_cache.py) can store and memory-map them.
"""

from __future__ import annotations

import torch

from audiofast.asr.decoder_weights import LAYER_PARTS, NORM_NAMES, DecoderWeights, layer_part
from audiofast.asr.int8_pack import Int8Linear, int8_linear_tensors

RESCORE_TOP = 16
HEAD_DIM = 64  # the C++ attention is written for Whisper's 64-wide heads


def pack_decoder(weights: DecoderWeights, head_ids: torch.Tensor | None = None
                 ) -> dict[str, torch.Tensor]:
    """Every tensor the fused op reads, by name: float embeddings, norms and the exact head;
    int8-packed linears (``head_ids``: a drafter's cut head, logits only for these ids)."""
    if weights.d_model // weights.n_heads != HEAD_DIM:
        raise ValueError(f"the fused int8 decoder needs {HEAD_DIM}-wide attention heads, not "
                         f"{weights.d_model // weights.n_heads}; use precision fp32 or the "
                         "ct2 engine")
    head = weights.head if head_ids is None else weights.head[head_ids].contiguous()
    out = {"embed": weights.state["embed_tokens.weight"],
           "positions": weights.state["embed_positions.weight"],
           "n_heads": torch.tensor(weights.n_heads), "exact_head": head}
    out["final_ln.0"], out["final_ln.1"] = weights.norm("layer_norm")
    for k, t in enumerate(int8_linear_tensors(head, None)):
        out[f"lm_head.{k}"] = t
    for i in range(weights.n_layers):
        for part in [*LAYER_PARTS, "cross_kv"]:
            w, b = layer_part(weights, i, part)
            tensors = [w, b] if part in NORM_NAMES else int8_linear_tensors(w, b)
            for k, t in enumerate(tensors):
                out[f"layers.{i}.{part}.{k}"] = t.contiguous()
    return out


class FusedDecoder:
    """The fused op's inputs (packed tensors, KV cache) and its calls."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self._tensors = tensors
        self.n_heads = int(tensors["n_heads"])
        self.n_ctx, self.d_model = tensors["positions"].shape
        self.n_layers = 1 + max(int(k.split(".")[1]) for k in tensors if k.startswith("layers."))
        self.embed = tensors["embed"]
        self.lm_head = Int8Linear([tensors[f"lm_head.{k}"] for k in range(4)])
        params = [tensors["embed"], tensors["positions"], tensors["final_ln.0"],
                  tensors["final_ln.1"], *self.lm_head.tensors, tensors["exact_head"]]
        for i in range(self.n_layers):
            for part in LAYER_PARTS:
                count = 2 if part in NORM_NAMES else 4
                params += [tensors[f"layers.{i}.{part}.{k}"] for k in range(count)]
        self.params = params
        # The once-per-window K/V projection of the encoder output, each frame its own range.
        self.cross_kv = [Int8Linear([tensors[f"layers.{i}.cross_kv.{k}"] for k in range(4)])
                         for i in range(self.n_layers)]
        shape = (self.n_layers, 1, self.n_heads, self.n_ctx, HEAD_DIM)
        self.k_cache, self.v_cache = torch.zeros(shape), torch.zeros(shape)
        self.forked_k = self.forked_v = torch.empty(0)  # fork()'s caches, kept between windows

    def tensors(self) -> dict[str, torch.Tensor]:
        return self._tensors

    def project_audio(self, encoder_out: torch.Tensor) -> tuple[list[torch.Tensor],
                                                                list[torch.Tensor]]:
        """Cross-attention K and V per layer, (heads, frames, 64) fp16, once per window: read
        whole on every token (36 MB at 1500 frames in fp32, more than L3), so stored in fp16
        (~1e-4 relative rounding, below int8's elsewhere) and widened in registers."""
        enc = encoder_out.reshape(-1, self.d_model).float()
        keys, values = [], []
        for project in self.cross_kv:
            k, v = project(enc).chunk(2, dim=-1)
            keys.append(self._heads(k).half().contiguous())
            values.append(self._heads(v).half().contiguous())
        return keys, values

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], self.n_heads, HEAD_DIM).transpose(0, 1)

    def __call__(self, tokens: torch.Tensor, start: int, last: int,
                 cross_k: list[torch.Tensor], cross_v: list[torch.Tensor],
                 rowwise: bool = False) -> torch.Tensor:
        """Logits of ``tokens`` at ``start``; every row is computed as if fed alone, so
        ``rowwise`` (draft verification) needs nothing extra here."""
        return torch.ops.audiofast.decoder_forward(
            tokens, start, last, self.params, self.k_cache, self.v_cache, cross_k, cross_v,
            RESCORE_TOP)

    def fork(self, copies: int, length: int) -> None:
        """Caches for ``copies`` sequences, each starting with the main cache's first
        ``length`` positions."""
        shape = list(self.k_cache.shape)
        shape[1] = copies
        if list(self.forked_k.shape) != shape:
            self.forked_k, self.forked_v = torch.zeros(shape), torch.zeros(shape)
        self.forked_k[:, :, :, :length] = self.k_cache[:, :, :, :length]
        self.forked_v[:, :, :, :length] = self.v_cache[:, :, :, :length]

    def forked(self, tokens: torch.Tensor, position: int, cross_k: list[torch.Tensor],
               cross_v: list[torch.Tensor]) -> torch.Tensor:
        """One token per forked sequence, all at ``position``: a row per sequence."""
        return torch.ops.audiofast.decoder_forward(
            tokens, position, 0, self.params, self.forked_k, self.forked_v, cross_k, cross_v,
            RESCORE_TOP)
