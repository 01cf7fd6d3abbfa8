"""The Whisper decoder as our own PyTorch module: the engine drafts are verified on.

CTranslate2 has no call that returns per-position logits for a given token sequence; this
engine does (``forward(tokens, start)`` gives logits for every fed position in one pass),
with a preallocated self-attention KV cache and cross-attention K/V computed once per window.

Weights can be fp32, bf16, or int8 (per output channel). int8 runs as one fused C++ op per
call where the kernels are built (:mod:`audiofast.asr.fused_decoder`: every row quantized and
attended alone, so k rows at once equal k single rows bit for bit). Elsewhere, and for
fp32/bf16, a TorchScript step runs: int8 there is fbgemm's dynamic quantization, which picks
one activation scale per call, so a verified row can round differently from the same row
fed alone; ``invariant=True`` gives each row its own range
(:mod:`audiofast.asr.invariant_int8`) and ``rowwise`` calls run attention row by row. In int8
the window's cross-attention K/V are stored in fp16: they are the largest read of a token.
"""

import copy
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from audiofast.asr import kernels
from audiofast.asr.fused_decoder import FusedDecoder
from audiofast.asr.invariant_int8 import make_invariant, quantize_per_channel
from audiofast.asr.vocab_diet import DietVocab
from audiofast.models.ct2_reader import read_ct2_model
from audiofast.models.ct2_whisper_weights import whisper_state_dict

Precision = Literal["fp32", "bf16", "int8"]

# An int8 output head's logits are exact again for its top candidates: the word choice is
# made among them, and the head was the layer whose rounding moved greedy output most.
RESCORE_TOP = 16


@dataclass
class DecoderWeights:
    """Whisper's decoder tensors under Hugging Face's names, minus the ``model.decoder.``
    prefix (``head`` is the output projection), and its head count."""

    state: dict[str, torch.Tensor]
    head: torch.Tensor
    n_heads: int

    @classmethod
    def from_hf(cls, model) -> "DecoderWeights":
        """From a ``WhisperForConditionalGeneration`` (a drafter, a vocab-diet checkpoint)."""
        prefix = "model.decoder."
        state = {k[len(prefix):]: v.detach() for k, v in model.state_dict().items()
                 if k.startswith(prefix)}
        return cls(state, model.proj_out.weight.detach(), model.config.decoder_attention_heads)

    @classmethod
    def from_ct2(cls, ct2_dir: str | Path) -> "DecoderWeights":
        """Straight from a CTranslate2 folder: no transformers import, no encoder tensors."""
        ct2 = read_ct2_model(Path(ct2_dir) / "model.bin")
        prefix = "model.decoder."
        state = {k[len(prefix):]: v for k, v in whisper_state_dict(ct2, encoder=False).items()}
        return cls(state, state["embed_tokens.weight"], ct2.scalar("decoder/num_heads"))

    def linear(self, *names: str) -> nn.Linear:
        """One Linear computing the named projections of the same input, stacked (a missing
        bias - Whisper's K projections - is zero)."""
        weight = torch.cat([self.state[f"{n}.weight"] for n in names])
        bias = torch.cat([self.state.get(f"{n}.bias", torch.zeros(self.state[f"{n}.weight"]
                                                                  .shape[0])) for n in names])
        return _linear(weight, bias)

    def layer_norm(self, name: str) -> nn.LayerNorm:
        norm = nn.LayerNorm(self.state[f"{name}.weight"].shape[0])
        norm.weight.data.copy_(self.state[f"{name}.weight"])
        norm.bias.data.copy_(self.state[f"{name}.bias"])
        return norm


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """A Linear holding these tensors, not copies: every caller passes fresh ones (built 1 x 1
    and resized: a full-size one spends ~1 s of start-up drawing random weights that are then
    overwritten)."""
    layer = nn.Linear(1, 1, bias=bias is not None)
    layer.out_features, layer.in_features = weight.shape
    layer.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias, requires_grad=False)
    return layer


class DecoderLayer(nn.Module):
    def __init__(self, weights: DecoderWeights, i: int):
        super().__init__()
        sa, ca = f"layers.{i}.self_attn", f"layers.{i}.encoder_attn"
        self.self_ln = weights.layer_norm(f"layers.{i}.self_attn_layer_norm")
        self.qkv = weights.linear(f"{sa}.q_proj", f"{sa}.k_proj", f"{sa}.v_proj")
        self.self_out = weights.linear(f"{sa}.out_proj")
        self.cross_ln = weights.layer_norm(f"layers.{i}.encoder_attn_layer_norm")
        self.cross_q = weights.linear(f"{ca}.q_proj")
        self.cross_kv = weights.linear(f"{ca}.k_proj", f"{ca}.v_proj")
        self.cross_out = weights.linear(f"{ca}.out_proj")
        self.ffn_ln = weights.layer_norm(f"layers.{i}.final_layer_norm")
        self.fc1 = weights.linear(f"layers.{i}.fc1")
        self.fc2 = weights.linear(f"layers.{i}.fc2")


class DecoderStep(nn.Module):
    """The decoder's arithmetic for one call, written so TorchScript can compile it: scripted,
    a step runs ~40 % faster than in eager Python on this CPU (the Python between ~300 small
    ops was a third of a token), with bit-identical logits."""

    cross_k: list[torch.Tensor]
    cross_v: list[torch.Tensor]

    def __init__(self, weights: DecoderWeights, head_ids: torch.Tensor | None, rescore: int = 0):
        """``rescore`` > 0: after an int8 head, that many top logits are recomputed exactly
        from an fp32 copy of the head (see forward)."""
        super().__init__()
        embed, positions = weights.state["embed_tokens.weight"], weights.state[
            "embed_positions.weight"]
        self.n_heads: int = weights.n_heads
        head_dim = embed.shape[1] // self.n_heads
        self.scale: float = head_dim ** -0.5
        self.embed = nn.Embedding.from_pretrained(embed.clone())
        self.register_buffer("positions", positions.clone())
        n_layers = 1 + max(int(k.split(".")[1]) for k in weights.state if k.startswith("layers."))
        self.layers = nn.ModuleList(DecoderLayer(weights, i) for i in range(n_layers))
        self.final_ln = weights.layer_norm("layer_norm")
        head = (weights.head if head_ids is None else weights.head[head_ids]).clone()
        self.lm_head = _linear(head, None)
        self.rescore: int = rescore
        self.register_buffer("exact_head", head if rescore else torch.empty(0, head.shape[1]))
        shape = (n_layers, 1, self.n_heads, positions.shape[0], head_dim)
        self.register_buffer("k_cache", torch.zeros(shape))
        self.register_buffer("v_cache", torch.zeros(shape))
        self.cross_k = []
        self.cross_v = []

    def sharing_copy(self) -> "DecoderStep":
        """Another step over the same tensors, modules and KV cache, whose submodules can then
        be swapped without touching this one's (shallow module tables all the way down)."""
        other = copy.copy(self)
        other._modules = dict(self._modules)
        layers = []
        for layer in self.layers:
            shell = copy.copy(layer)
            shell._modules = dict(layer._modules)
            layers.append(shell)
        other.layers = nn.ModuleList(layers)
        return other

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(n, d) -> (1, heads, n, head_dim)."""
        return x.view(1, x.shape[0], self.n_heads, -1).transpose(1, 2)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None, start: int, rowwise: bool) -> torch.Tensor:
        """Attention; ``rowwise``: one query row at a time, each exactly as if fed alone (row r
        sees keys up to ``start + r`` when ``start >= 0``, every key otherwise)."""
        if not rowwise:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        rows = []
        for r in range(q.shape[2]):
            keys = k.shape[2] if start < 0 else start + r + 1
            rows.append(F.scaled_dot_product_attention(
                q[:, :, r : r + 1], k[:, :, :keys], v[:, :, :keys]))
        return torch.cat(rows, dim=2)

    def _cross_attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      rowwise: bool) -> torch.Tensor:
        """Attention over the window's frames: q (heads, n, head_dim), pre-scaled; keys and
        values (heads, frames, head_dim). fp16 keys and values (int8 engines): one row at a
        time through the fused kernel (kernels/), which widens each frame as it reads it;
        a multi-row prompt read widens them once and multiplies. A row's result never
        depends on the rows beside it here, as ``rowwise`` requires."""
        if keys.dtype == torch.float16 and (rowwise or q.shape[1] == 1):
            return torch.stack([torch.ops.audiofast.cross_attention(q[:, r], keys, values)
                                for r in range(q.shape[1])], dim=1)
        keys, values = keys.to(q.dtype), values.to(q.dtype)
        if not rowwise:
            return torch.bmm(torch.bmm(q, keys.transpose(1, 2)).softmax(-1), values)
        rows = [torch.bmm(torch.bmm(q[:, r : r + 1], keys.transpose(1, 2)).softmax(-1), values)
                for r in range(q.shape[1])]
        return torch.cat(rows, dim=1)

    def forward(self, tokens: torch.Tensor, start: int, rowwise: bool, last: int) -> torch.Tensor:
        n = tokens.shape[0]
        end = start + n
        x = self.embed(tokens).to(self.positions.dtype) + self.positions[start:end]
        causal: torch.Tensor | None = None
        if n > 1 and not rowwise:  # query i (position start + i) sees keys 0 .. start + i
            causal = torch.ones(n, end, dtype=torch.bool).tril(diagonal=start)
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv(layer.self_ln(x)).chunk(3, dim=-1)
            self.k_cache[i, :, :, start:end] = self._heads(k)
            self.v_cache[i, :, :, start:end] = self._heads(v)
            attn = self._attend(self._heads(q), self.k_cache[i, :, :, :end],
                                self.v_cache[i, :, :, :end], causal, start, rowwise)
            x = x + layer.self_out(attn.transpose(1, 2).reshape(n, -1))
            q = self._heads(layer.cross_q(layer.cross_ln(x)))[0] * self.scale
            attn = self._cross_attend(q, self.cross_k[i], self.cross_v[i], rowwise)
            x = x + layer.cross_out(attn.transpose(0, 1).reshape(n, -1))
            x = x + layer.fc2(F.gelu(layer.fc1(layer.ffn_ln(x))))
        if last > 0:  # logits of the last rows only (a prompt needs 1-3 of its ~100 rows)
            x = x[n - last :]
        x = self.final_ln(x)
        logits = self.lm_head(x).float()
        if self.rescore > 0:  # the int8 head's top candidates again, exactly: ties decide words
            top = logits.topk(self.rescore, dim=-1).indices
            # (multiply + sum over the model width: every row reduced alike, whatever n is)
            exact = (self.exact_head[top] * x.float().unsqueeze(1)).sum(-1)
            logits = logits.scatter(1, top, exact)
        return logits


class WhisperDecoderEngine(nn.Module):
    """Whisper's text decoder with a static KV cache, for one audio window at a time."""

    def __init__(self, model: DecoderWeights | nn.Module, precision: Precision = "int8",
                 vocab: DietVocab | None = None, invariant: bool = False,
                 head_ids: torch.Tensor | None = None, fused: bool = True):
        """``model``: the decoder's weights, or a Hugging Face Whisper to take them from;
        ``head_ids``: a drafter's cut head - logits only for these ids, in their order;
        ``fused=False``: int8 on the TorchScript step even where the C++ op could run."""
        super().__init__()
        weights = model if isinstance(model, DecoderWeights) else DecoderWeights.from_hf(model)
        self.vocab = vocab  # a vocab-diet model: ids in and logits out use the full vocabulary
        self.n_heads = weights.n_heads
        self.n_ctx, self.d_model = weights.state["embed_positions.weight"].shape
        self.precision = precision
        rescore = RESCORE_TOP if precision == "int8" else 0
        self.step = DecoderStep(weights, head_ids, rescore)
        self.dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        # Cross-attention K/V are read whole on every token (36 MB at 1500 frames in fp32, more
        # than L3): int8 keeps them in fp16 (~1e-4 relative rounding, below int8's elsewhere),
        # widened in registers by the C++ kernels (with .to() first it saved nothing).
        fp16_kv = precision == "int8" and self.d_model // self.n_heads == 64
        self.kv_dtype = torch.float16 if fp16_kv else self.dtype
        kernel = kernels.backend()  # the scripted step names the op: registered before scripting
        self._audio: torch.Tensor | None = None
        self._cross: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
        self.eval()
        # int8 with the C++ kernels: every layer in one op (fused_decoder.py), each row alone
        # by construction, so ``invariant`` needs no separate arithmetic there.
        self._fused = FusedDecoder(self.step) if fused and fp16_kv and kernel == "avx2" else None
        if self._fused is None:
            _cast(self.step, precision)
        # Which arithmetic runs: the judge's transcript cache keys on it. ("cross-bmm": cross-
        # attention by two matmuls since the C++ kernels came; SDPA before.)
        if self._fused is not None:
            self.numerics = f"int8-fused-a8-per-row-rescore{rescore}-kv16-kvproj8-avx2"
            self._run = self._prefill = None
            return
        self.numerics = f"{precision}-cross-bmm" if precision != "int8" else \
            f"int8-{'per-row' if invariant else 'per-channel-per-row-prompt'}-rescore{rescore}"
        if fp16_kv:
            self.numerics += f"-kv16-{kernel}"
        prefill = None
        if precision == "int8":  # per-row activation ranges (invariant_int8)
            if not invariant:
                # Plain int8 still reads multi-row prompts (up to ~100 tokens of previous text)
                # with per-row ranges: fbgemm's one scale for all rows was the coarsest
                # rounding of the step (a word lost on a real clip, measured). Same weights,
                # norms and KV cache as the step; it runs eager (once per window, on many
                # rows: scripting it cost ~1 s of start-up and saved ~3 ms a window).
                prefill = self.step.sharing_copy()
            make_invariant(prefill if prefill is not None else self.step)
        # TorchScript is deprecated in favour of torch.compile, but here torch.compile was
        # slower (it copied the mutated KV cache on every call) and took 40 s to compile.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            self._run = torch.jit.script(self.step)
        self._prefill = prefill

    @property
    def embed(self) -> nn.Embedding:
        return self.step.embed

    @property
    def lm_head(self) -> nn.Module:
        return self.step.lm_head if self._fused is None else self._fused.lm_head

    def known_prefix(self, tokens: list[int]) -> int:
        """How many leading ``tokens`` this decoder can take (all, unless a vocab diet dropped
        one: a draft is cut there, since the diet model could never emit it)."""
        if self.vocab is None:
            return len(tokens)
        return next((i for i, t in enumerate(tokens) if t not in self.vocab.kept_set),
                    len(tokens))

    @torch.inference_mode()
    def set_audio(self, encoder_out: torch.Tensor) -> None:
        """Project the window's encoder output to cross-attention K/V, once per window."""
        if encoder_out is self._audio:  # language detection already projected this window
            return
        self._audio = encoder_out
        enc = encoder_out.reshape(-1, self.d_model).to(self.dtype)
        cross_k, cross_v = [], []
        for i, layer in enumerate(self.step.layers):
            project = layer.cross_kv if self._fused is None else self._fused.cross_kv[i]
            k, v = project(enc).chunk(2, dim=-1)
            cross_k.append(self.step._heads(k)[0].to(self.kv_dtype).contiguous())
            cross_v.append(self.step._heads(v)[0].to(self.kv_dtype).contiguous())
        self._cross = (cross_k, cross_v)
        if self._run is not None:
            self._run.cross_k, self._run.cross_v = cross_k, cross_v
        if self._prefill is not None:
            self._prefill.cross_k, self._prefill.cross_v = cross_k, cross_v

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start: int, rowwise: bool = False,
                last: int = 0) -> torch.Tensor:
        """Logits (n, vocab) for ``tokens`` placed at positions start .. start + n - 1
        (``last`` > 0: only for the last ``last`` of them).

        ``rowwise`` (draft verification): attention runs one row at a time, since CPU
        attention kernels round differently for 1 and k query rows; with the int8 linears'
        per-row ranges every row is then computed exactly as when it is fed alone.

        Cache entries past ``start + n`` may hold stale keys from rejected drafts; they are
        never read, because attention only looks at positions < start + n.
        """
        n = tokens.shape[0]
        end = start + n
        if end > self.n_ctx:
            raise ValueError(f"sequence of {end} tokens exceeds the decoder context {self.n_ctx}")
        tokens = self._to_model_ids(tokens)
        if self._fused is not None:
            logits = self._fused(tokens, start, min(last, n), *self._cross)
        else:
            run = self._prefill if n > 1 and not rowwise and self._prefill is not None \
                else self._run
            logits = run(tokens, start, rowwise and n > 1, min(last, n))
        return self._to_full_logits(logits)

    @property
    def can_fork(self) -> bool:
        """Whether :meth:`fork` works: several sequences decoded side by side (fused int8)."""
        return self._fused is not None

    def fork(self, copies: int, length: int) -> None:
        """Start ``copies`` sequences from the first ``length`` cached positions (a prompt
        read once), for :meth:`forward_forked`: best_of samples then share every weight read."""
        self._fused.fork(copies, length)

    @torch.inference_mode()
    def forward_forked(self, tokens: torch.Tensor, position: int) -> torch.Tensor:
        """Logits (copies, vocab): token i appended to forked sequence i at ``position``."""
        if position >= self.n_ctx:
            raise ValueError(f"position {position} exceeds the decoder context {self.n_ctx}")
        return self._to_full_logits(
            self._fused.forked(self._to_model_ids(tokens), position, *self._cross))

    def _to_model_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.vocab is None:
            return tokens
        tokens = self.vocab.to_diet[tokens]
        if bool((tokens < 0).any()):
            raise KeyError("a token outside the diet vocabulary reached the decoder")
        return tokens

    def _to_full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        if self.vocab is None:
            return logits
        full = logits.new_full((logits.shape[0], self.vocab.full_size), -torch.inf)
        full[:, self.vocab.kept_tensor] = logits
        return full


def _cast(step: DecoderStep, precision: Precision) -> None:
    if precision == "bf16":
        step.to(torch.bfloat16)
    elif precision == "int8":
        # cross_kv stays fp32: it runs once per window over every encoder frame, and one
        # activation scale for all 1500 frames quantized quiet frames coarsely.
        for name, module in list(step.named_modules()):
            if isinstance(module, nn.Linear) and not name.endswith("cross_kv"):
                parent, _, attr = name.rpartition(".")
                setattr(step.get_submodule(parent) if parent else step, attr,
                        quantize_per_channel(module))
    elif precision != "fp32":
        raise ValueError(f"precision must be fp32, bf16 or int8, not {precision!r}")
