"""The int8 decoder as one C++ call (``kernels.decoder_forward``): the default.

A step of Whisper's decoder is ~300 small ops; in eager PyTorch the time between them and in
dynamic int8 linears reading weights at a third of the memory bandwidth was most of a token.
The fused call runs every layer in C++ (kernels/decoder_step.cpp) over int8 weights
(int8_pack.py; or int4 in groups of 64, int4_pack.py and docs/int4.md), a float KV cache and
fp16 cross-attention K/V, and quantizes each row with its own range and sums products exactly
in int32, so a row's logits never depend on the rows beside it: plain greedy and draft
verification share one arithmetic, and drafting is lossless.

A quantized head's logits are recomputed exactly (fp32) for its top ``RESCORE_TOP`` candidates:
the word choice is made among them, and the head was the layer whose rounding moved greedy
output most. Everything here is numpy: the packed arrays are memory-mapped from the start-up
cache (packed_cache.py) and a transcription on this decoder never imports torch (packing
them, once per model, does).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from audiofast.asr import kernels

if TYPE_CHECKING:
    import torch

    from audiofast.asr.decoder_weights import DecoderWeights

RESCORE_TOP = 16
HEAD_DIM = 64  # the C++ attention is written for Whisper's 64-wide heads
# The parts of one decoder layer in the order the fused call reads them (decoder_step.cpp);
# norms are (weight, bias), linears int8_pack's four arrays. cross_kv runs once per window.
LAYER_PARTS = ("self_ln", "qkv", "self_out", "cross_ln", "cross_q", "cross_out", "ffn_ln",
               "fc1", "fc2")
NORMS = ("self_ln", "cross_ln", "ffn_ln")


def pack_decoder(weights: DecoderWeights, head_ids: torch.Tensor | None = None,
                 bits: tuple[int, int] = (8, 8)) -> dict[str, np.ndarray]:
    """Every array the fused call reads, by name: float embeddings, norms and the exact head;
    quantized linears, ``bits`` = (layers, head) weight bits, 8 or 4 (``head_ids``: a
    drafter's cut head, logits only for these ids)."""
    from audiofast.asr.decoder_weights import layer_part
    from audiofast.asr.int4_pack import int4_linear_tensors
    from audiofast.asr.int8_pack import int8_linear_tensors

    if not set(bits) <= {4, 8}:
        raise ValueError(f"weight bits must be 8 or 4, not {bits}")
    layer_linear, head_linear = (int8_linear_tensors if b == 8 else int4_linear_tensors
                                 for b in bits)

    if weights.d_model // weights.n_heads != HEAD_DIM:
        raise ValueError(f"the fused int8 decoder needs {HEAD_DIM}-wide attention heads, not "
                         f"{weights.d_model // weights.n_heads}; use precision fp32 or the "
                         "ct2 engine")
    head = weights.head if head_ids is None else weights.head[head_ids].contiguous()
    out = {"embed": weights.state["embed_tokens.weight"],
           "positions": weights.state["embed_positions.weight"], "exact_head": head}
    out["final_ln.0"], out["final_ln.1"] = weights.norm("layer_norm")
    for k, t in enumerate(head_linear(head, None)):
        out[f"lm_head.{k}"] = t
    for i in range(weights.n_layers):
        for part in [*LAYER_PARTS, "cross_kv"]:
            w, b = layer_part(weights, i, part)
            # cross_kv runs once per window: int8 whatever the layers' bits
            linear = int8_linear_tensors if part == "cross_kv" else layer_linear
            tensors = [w, b] if part in NORMS else linear(w, b)
            for k, t in enumerate(tensors):
                out[f"layers.{i}.{part}.{k}"] = t
    arrays = {name: np.ascontiguousarray(t.detach().numpy()) for name, t in out.items()}
    arrays["n_heads"] = np.array(weights.n_heads, dtype=np.int64)
    return arrays


class PackedLinear:
    """One packed int8 or int4 linear on the kernel (cross-attention K/V, the head alone)."""

    def __init__(self, arrays: list[np.ndarray]):
        self.arrays = arrays
        self.out_features = arrays[3].size

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return kernels.quant_linear(x.reshape(-1, x.shape[-1]), self.arrays)


@dataclass
class SequenceState:
    """One sequence decoded beside others in a batched call: its own self-attention cache
    and its own window's cross-attention K/V (``FusedDecoder.project_audio``'s tuple)."""

    k_cache: np.ndarray
    v_cache: np.ndarray
    cross: tuple
    c_cache: tuple[Any, Any]  # the caches as the kernel borrows them


class FusedDecoder:
    """The fused call's inputs (packed arrays, KV cache) and its calls."""

    def __init__(self, tensors: dict[str, np.ndarray], kv_bits: int = 16):
        if kv_bits not in (8, 16):
            raise ValueError(f"cross-attention K/V bits must be 16 or 8, not {kv_bits}")
        self.kv_bits = kv_bits
        self._tensors = tensors
        self.n_heads = int(tensors["n_heads"])
        self.n_ctx, self.d_model = tensors["positions"].shape
        self.n_layers = 1 + max(int(k.split(".")[1]) for k in tensors if k.startswith("layers."))
        self.embed = tensors["embed"]
        self.lm_head = PackedLinear([tensors[f"lm_head.{k}"] for k in range(4)])
        params = [tensors["embed"], tensors["positions"], tensors["final_ln.0"],
                  tensors["final_ln.1"], *self.lm_head.arrays, tensors["exact_head"]]
        for i in range(self.n_layers):
            for part in LAYER_PARTS:
                count = 2 if part in NORMS else 4
                params += [tensors[f"layers.{i}.{part}.{k}"] for k in range(count)]
        self.params = kernels.as_arrays(params)  # built once; the arrays live in _tensors
        # The once-per-window K/V projection of the encoder output, each frame its own range.
        self.cross_kv = [PackedLinear([tensors[f"layers.{i}.cross_kv.{k}"] for k in range(4)])
                         for i in range(self.n_layers)]
        shape = (self.n_layers, 1, self.n_heads, self.n_ctx, HEAD_DIM)
        self.k_cache = np.zeros(shape, np.float32)
        self.v_cache = np.zeros(shape, np.float32)
        self.forked_k = self.forked_v = np.zeros(0, np.float32)  # fork()'s, kept between windows
        # The last call's logit rows as the head read them (final-norm hidden states): the
        # block drafter's input. One array, or one per sequence after a batch. Per thread:
        # the live server decodes in two threads at once (a file beside live batches, what
        # users wait on beside an update), and each reads the hidden states of its own call.
        self._last = threading.local()

    @property
    def hidden(self) -> np.ndarray | list[np.ndarray] | None:
        return getattr(self._last, "hidden", None)

    @hidden.setter
    def hidden(self, value: np.ndarray | list[np.ndarray] | None) -> None:
        self._last.hidden = value

    def tensors(self) -> dict[str, np.ndarray]:
        return self._tensors

    def project_audio(self, encoder_out: np.ndarray) -> tuple:
        """Cross-attention K and V per layer, (heads, frames, 64), once per window: read whole
        on every token (36 MB at 1500 frames in fp32, more than L3), so stored in fp16 (~1e-4
        relative rounding, below int8's elsewhere) or with ``kv_bits=8`` in int8 with one
        symmetric scale per frame and head, and widened in registers. Returns (the arrays,
        their C arrays for the kernel: keys, values, and for int8 their scales)."""
        enc = np.asarray(encoder_out, dtype=np.float32).reshape(-1, self.d_model)
        arrays: dict[str, list[np.ndarray]] = {"k": [], "v": [], "k_scale": [], "v_scale": []}
        # In C: numpy's float16 conversion was ~10 % of a live update, its int8 rounding half
        # of a window's projection.
        names = ("k", "v") if self.kv_bits == 16 else ("k", "v", "k_scale", "v_scale")
        split = kernels.split_heads_f16 if self.kv_bits == 16 else kernels.split_heads_i8
        for project in self.cross_kv:
            for name, x in zip(names, split(project(enc), self.n_heads), strict=True):
                arrays[name].append(x)
        # The C arrays hold pointers: the numpy arrays are returned with them and kept alive
        # together (WhisperDecoderEngine keeps the tuple for the window).
        scales = None
        if self.kv_bits == 8:
            scales = (kernels.as_arrays(arrays["k_scale"]), kernels.as_arrays(arrays["v_scale"]))
        return arrays, kernels.as_arrays(arrays["k"]), kernels.as_arrays(arrays["v"]), scales

    def __call__(self, tokens: np.ndarray, start: int, last: int, cross: tuple,
                 rowwise: bool = False) -> np.ndarray:
        """Logits of ``tokens`` at ``start``; every row is computed as if fed alone, so
        ``rowwise`` (draft verification) needs nothing extra here."""
        rows = min(last, len(tokens)) if last > 0 else len(tokens)
        self.hidden = np.empty((rows, self.d_model), np.float32)
        return kernels.decoder_forward(tokens, start, last, self.params, self.k_cache,
                                       self.v_cache, cross[1], cross[2], RESCORE_TOP,
                                       self.lm_head.out_features, cross[3], self.hidden)

    def fork(self, copies: int, length: int) -> None:
        """Caches for ``copies`` sequences, each starting with the main cache's first
        ``length`` positions."""
        shape = list(self.k_cache.shape)
        shape[1] = copies
        if list(self.forked_k.shape) != shape:
            self.forked_k, self.forked_v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        self.forked_k[:, :, :, :length] = self.k_cache[:, :, :, :length]
        self.forked_v[:, :, :, :length] = self.v_cache[:, :, :, :length]

    def forked(self, tokens: np.ndarray, position: int, cross: tuple) -> np.ndarray:
        """One token per forked sequence, all at ``position``: a row per sequence."""
        return kernels.decoder_forward(tokens, position, 0, self.params, self.forked_k,
                                       self.forked_v, cross[1], cross[2], RESCORE_TOP,
                                       self.lm_head.out_features, cross[3])

    def sequence(self, cross: tuple) -> SequenceState:
        """A new sequence over the window ``cross`` with a cache of its own (uninitialised:
        attention reads only the positions a call has written)."""
        shape = (self.n_layers, 1, self.n_heads, self.n_ctx, HEAD_DIM)
        k, v = np.empty(shape, np.float32), np.empty(shape, np.float32)
        return SequenceState(k, v, cross, (kernels.as_array(k), kernels.as_array(v)))

    def batch(self, calls: list[tuple[SequenceState, np.ndarray, int, int]]) -> list[np.ndarray]:
        """One call for several sequences, each (state, tokens, start, last): each one's logit
        rows, equal bit for bit to calling it alone; the weights are read once for all."""
        states = [state for state, *_ in calls]
        rows = [min(last, len(tokens)) if last > 0 else len(tokens)
                for _, tokens, _, last in calls]
        hidden = np.empty((sum(rows), self.d_model), np.float32)
        logits = kernels.decoder_forward_batch(
            [tokens for _, tokens, _, _ in calls], [start for *_, start, _ in calls],
            [last for *_, last in calls], self.params, [s.c_cache for s in states],
            [s.cross for s in states], RESCORE_TOP, self.lm_head.out_features, hidden)
        self.hidden = np.split(hidden, np.cumsum(rows)[:-1])
        return logits
