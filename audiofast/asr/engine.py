"""The Whisper decoder the drafts are verified on: one interface, two backends.

CTranslate2 has no call that returns per-position logits for a given token sequence; this
engine does (``forward(tokens, start)`` gives logits for every fed position in one pass),
with a preallocated self-attention KV cache and cross-attention K/V computed once per window.

- ``int8`` (default): the fused C++ decoder (fused_decoder.py), every row quantized and
  attended alone, so k rows at once equal k single rows bit for bit. Needs the kernels
  (kernels/); where they cannot be built, the ``ct2`` engine decodes instead.
- ``int4``, ``int4-head8``, ``int8-head4``: the same decoder with int4 weights (groups of 64
  inputs, int4_pack.py) in every linear, in the layers only, or in the output head only;
  ``-kv8`` after any of them: cross-attention K/V in int8 (one scale per frame and head)
  instead of fp16 (docs/int4.md).
- ``fp32``: the eager reference decoder (reference_decoder.py), the numerics oracle.

Tokens in and logits out are numpy arrays whichever backend runs; torch is imported only for
the reference decoder and for packing (the fused decoder's transcriptions never import it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from audiofast.asr.decoder_weights import DecoderWeights
    from audiofast.asr.fused_decoder import SequenceState
    from audiofast.asr.vocab_diet import DietVocab

Precision = str  # one of PRECISIONS
# The fused decoder's precisions: weight bits of the layers' linears and of the output head.
FUSED_BITS = {"int8": (8, 8), "int4": (4, 4), "int4-head8": (4, 8), "int8-head4": (8, 4)}
KV8 = "-kv8"  # suffix: cross-attention K/V in int8 instead of fp16
PRECISIONS = (*FUSED_BITS, *(p + KV8 for p in FUSED_BITS), "fp32")


def weight_bits(precision: str) -> tuple[int, int] | None:
    """(layers, head) weight bits of a fused precision; None for the fp32 reference."""
    return FUSED_BITS.get(precision.removesuffix(KV8))
MODEL_SETTINGS = "audiofast.json"  # in a model folder: the precision it was trained for (QAD)


def model_precision(model_dir: Path) -> Precision:
    """The decoder precision a model folder asks for (a QAD export's), else int8."""
    settings = Path(model_dir) / MODEL_SETTINGS
    if not settings.is_file():
        return "int8"
    precision = json.loads(settings.read_text()).get("precision", "int8")
    if precision not in PRECISIONS:
        raise ValueError(f"{settings}: unknown precision {precision!r}")
    return precision


class KernelsUnavailable(RuntimeError):
    """The fused decoder cannot run here (no compiler, or a CPU without AVX2)."""


def fused_backend(tensors: dict[str, np.ndarray], kv_bits: int = 16):
    """A :class:`~audiofast.asr.fused_decoder.FusedDecoder`, or one line saying why not."""
    from audiofast.asr import kernels
    from audiofast.asr.fused_decoder import FusedDecoder

    if kernels.backend() != "avx2":
        raise KernelsUnavailable("the int8 decoder needs audiofast's C++ kernels, which are not "
                                 "available here (see the warning above); use --engine ct2 "
                                 "or --precision fp32")
    return FusedDecoder(tensors, kv_bits)


class WhisperDecoderEngine:
    """Whisper's text decoder with a static KV cache, for one audio window at a time."""

    def __init__(self, model: DecoderWeights | Any | dict[str, np.ndarray],
                 precision: Precision = "int8", vocab: DietVocab | None = None,
                 head_ids: torch.Tensor | None = None):
        """``model``: the decoder's weights, a Hugging Face Whisper to take them from, or
        (int8) the fused decoder's packed arrays (packed_cache.py); ``head_ids``: a
        drafter's cut head - logits only for these ids, in their order."""
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, "
                             f"not {precision!r}")
        self.precision = precision
        self.vocab = vocab  # a vocab-diet model: ids in and logits out use the full vocabulary
        if not isinstance(model, dict) and hasattr(model, "state_dict"):  # a torch module
            from audiofast.asr.decoder_weights import DecoderWeights

            model = DecoderWeights.from_hf(model)
        bits = weight_bits(precision)
        if bits is not None:
            from audiofast.asr.fused_decoder import RESCORE_TOP, pack_decoder

            tensors = model if isinstance(model, dict) else pack_decoder(model, head_ids, bits)
            kv_bits = 8 if precision.endswith(KV8) else 16
            self.backend = fused_backend(tensors, kv_bits)
            # Which arithmetic runs: the judge's transcript cache keys on it.
            self.numerics = (f"{precision.removesuffix(KV8)}-fused-a8-per-row-rescore"
                             f"{RESCORE_TOP}-kv{kv_bits}-kvproj8-avx2"
                             + ("-g64" if 4 in bits else ""))
        else:
            from audiofast.asr.reference_decoder import ReferenceBackend

            if isinstance(model, dict):
                raise TypeError("packed quantized tensors cannot run in fp32")
            self.backend = ReferenceBackend(model, head_ids)
            self.numerics = "fp32-cross-bmm"
        self.n_heads, self.n_ctx = self.backend.n_heads, self.backend.n_ctx
        self.d_model = self.backend.d_model
        self._audio: np.ndarray | None = None
        self._cross: tuple = ()

    @property
    def embed(self) -> np.ndarray | torch.Tensor:
        """The token embedding matrix (numpy for int8, torch for the fp32 reference)."""
        return self.backend.embed

    @property
    def lm_head(self):
        """The output projection alone (a callable; the diet sweep times it)."""
        return self.backend.lm_head

    def known_prefix(self, tokens: list[int]) -> int:
        """How many leading ``tokens`` this decoder can take (all, unless a vocab diet dropped
        one: a draft is cut there, since the diet model could never emit it)."""
        if self.vocab is None:
            return len(tokens)
        return next((i for i, t in enumerate(tokens) if t not in self.vocab.kept_set),
                    len(tokens))

    def set_audio(self, encoder_out: np.ndarray) -> None:
        """Project the window's encoder output to cross-attention K/V, once per window."""
        if encoder_out is self._audio:  # language detection already projected this window
            return
        self._audio = encoder_out
        self._cross = self.backend.project_audio(encoder_out)

    def __call__(self, tokens: Sequence[int] | np.ndarray, start: int, rowwise: bool = False,
                 last: int = 0) -> np.ndarray:
        """Logits (n, vocab) for ``tokens`` placed at positions start .. start + n - 1
        (``last`` > 0: only for the last ``last`` of them).

        ``rowwise`` (draft verification): every row computed exactly as when fed alone. The
        fused decoder always does so; the reference attends row by row for it.

        Cache entries past ``start + n`` may hold stale keys from rejected drafts; they are
        never read, because attention only looks at positions < start + n.
        """
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = tokens.shape[0]
        end = start + n
        if end > self.n_ctx:
            raise ValueError(f"sequence of {end} tokens exceeds the decoder context {self.n_ctx}")
        logits = self.backend(self._to_model_ids(tokens), start, min(last, n), self._cross,
                              rowwise=rowwise)
        return self._to_full_logits(logits)

    @property
    def last_hidden(self) -> np.ndarray | list[np.ndarray] | None:
        """The final-norm hidden states behind the last call's logit rows (one array; after
        :meth:`forward_batch`, one per sequence): a block drafter's input. None where the
        backend does not give them (the fp32 reference)."""
        return getattr(self.backend, "hidden", None)

    @property
    def can_fork(self) -> bool:
        """Whether :meth:`fork` works: several sequences decoded side by side (fused int8)."""
        return self.precision == "int8"

    def fork(self, copies: int, length: int) -> None:
        """Start ``copies`` sequences from the first ``length`` cached positions (a prompt
        read once), for :meth:`forward_forked`: best_of samples then share every weight read."""
        self.backend.fork(copies, length)

    def forward_forked(self, tokens: Sequence[int] | np.ndarray, position: int) -> np.ndarray:
        """Logits (copies, vocab): token i appended to forked sequence i at ``position``."""
        if position >= self.n_ctx:
            raise ValueError(f"position {position} exceeds the decoder context {self.n_ctx}")
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        return self._to_full_logits(
            self.backend.forked(self._to_model_ids(tokens), position, self._cross))

    @property
    def can_batch(self) -> bool:
        """Whether :meth:`forward_batch` works: sequences of different windows in one call
        (the fused decoder)."""
        return hasattr(self.backend, "batch")

    def sequence(self, encoder_out: np.ndarray) -> SequenceState:
        """A sequence of its own over this window (its cache, its cross-attention K/V), for
        :meth:`forward_batch`; the engine's own window is left as it is."""
        return self.backend.sequence(self.backend.project_audio(encoder_out))

    def forward_batch(self, calls: Sequence[tuple[SequenceState, Sequence[int], int, int]]
                      ) -> list[np.ndarray]:
        """Each call (sequence, tokens, start, last) as :meth:`__call__` would give it for
        that sequence alone - bit for bit - but all in one pass over the weights."""
        fed = []
        for state, tokens, start, last in calls:
            tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
            if start + tokens.shape[0] > self.n_ctx:
                raise ValueError(f"sequence of {start + tokens.shape[0]} tokens exceeds the "
                                 f"decoder context {self.n_ctx}")
            fed.append((state, self._to_model_ids(tokens), start, min(last, tokens.shape[0])))
        return [self._to_full_logits(rows) for rows in self.backend.batch(fed)]

    def _to_model_ids(self, tokens: np.ndarray) -> np.ndarray:
        if self.vocab is None:
            return tokens
        tokens = self.vocab.to_diet[tokens]
        if (tokens < 0).any():
            raise KeyError("a token outside the diet vocabulary reached the decoder")
        return tokens

    def _to_full_logits(self, logits: np.ndarray) -> np.ndarray:
        if self.vocab is None:
            return logits
        full = np.full((logits.shape[0], self.vocab.full_size), -np.inf, dtype=np.float32)
        full[:, self.vocab.kept_ids] = logits
        return full
