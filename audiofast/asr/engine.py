"""The Whisper decoder as our own PyTorch module: the engine drafts are verified on.

CTranslate2 has no call that returns per-position logits for a given token sequence; this
engine does (``forward(tokens, start)`` gives logits for every fed position in one pass),
with a preallocated self-attention KV cache and cross-attention K/V computed once per window.

Weights can be fp32, bf16, or int8 (fbgemm dynamic quantization: int8 weights per output
channel, activations quantized on the fly). Measured on this AVX2 CPU, 2 threads: the 51865 x 512
output head takes 16.8 ms per token in fp32 and 1.4 ms in dynamic int8 (CTranslate2 int8:
~10.7 ms for the whole token). Plain dynamic int8 picks one activation scale per call, so
a verified row can round differently from the same row fed alone; ``invariant=True`` gives
each row its own range (:mod:`audiofast.asr.invariant_int8`) and ``rowwise`` calls run
attention row by row, so k rows at once equal k single rows bit for bit.
"""

import warnings
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from audiofast.asr.invariant_int8 import make_invariant
from audiofast.asr.vocab_diet import DietVocab

Precision = Literal["fp32", "bf16", "int8"]

# An int8 output head's logits are exact again for its top candidates: the word choice is
# made among them, and the head was the layer whose rounding moved greedy output most.
RESCORE_TOP = 16


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    layer.weight.data.copy_(weight)
    if bias is not None:
        layer.bias.data.copy_(bias)
    return layer


def _fuse(*linears: nn.Linear) -> nn.Linear:
    """One Linear computing several projections of the same input (zero bias where absent)."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    bias = torch.cat([
        lin.bias.detach() if lin.bias is not None else torch.zeros(lin.out_features)
        for lin in linears
    ])
    return _linear(weight, bias)


def _layer_norm(ln: nn.LayerNorm) -> nn.LayerNorm:
    out = nn.LayerNorm(ln.normalized_shape, eps=ln.eps)
    out.load_state_dict(ln.state_dict())
    return out


class DecoderLayer(nn.Module):
    def __init__(self, hf_layer):
        super().__init__()
        sa, ca = hf_layer.self_attn, hf_layer.encoder_attn
        self.self_ln = _layer_norm(hf_layer.self_attn_layer_norm)
        self.qkv = _fuse(sa.q_proj, sa.k_proj, sa.v_proj)
        self.self_out = _linear(sa.out_proj.weight.detach(), sa.out_proj.bias.detach())
        self.cross_ln = _layer_norm(hf_layer.encoder_attn_layer_norm)
        self.cross_q = _linear(ca.q_proj.weight.detach(), ca.q_proj.bias.detach())
        self.cross_kv = _fuse(ca.k_proj, ca.v_proj)
        self.cross_out = _linear(ca.out_proj.weight.detach(), ca.out_proj.bias.detach())
        self.ffn_ln = _layer_norm(hf_layer.final_layer_norm)
        self.fc1 = _linear(hf_layer.fc1.weight.detach(), hf_layer.fc1.bias.detach())
        self.fc2 = _linear(hf_layer.fc2.weight.detach(), hf_layer.fc2.bias.detach())


class DecoderStep(nn.Module):
    """The decoder's arithmetic for one call, written so TorchScript can compile it: scripted,
    a step runs ~40 % faster than in eager Python on this CPU (the Python between ~300 small
    ops was a third of a token), with bit-identical logits."""

    cross_k: list[torch.Tensor]
    cross_v: list[torch.Tensor]

    def __init__(self, hf_model, head_ids: torch.Tensor | None, rescore: int = 0):
        """``rescore`` > 0: after an int8 head, that many top logits are recomputed exactly
        from an fp32 copy of the head (see forward)."""
        super().__init__()
        decoder = hf_model.model.decoder
        cfg = hf_model.config
        self.n_heads: int = cfg.decoder_attention_heads
        self.embed = nn.Embedding.from_pretrained(decoder.embed_tokens.weight.detach().clone())
        self.register_buffer("positions", decoder.embed_positions.weight.detach().clone())
        self.layers = nn.ModuleList(DecoderLayer(layer) for layer in decoder.layers)
        self.final_ln = _layer_norm(decoder.layer_norm)
        head = hf_model.proj_out.weight.detach()
        head = (head if head_ids is None else head[head_ids]).clone()
        self.lm_head = _linear(head, None)
        self.rescore: int = rescore
        self.register_buffer("exact_head", head if rescore else torch.empty(0, head.shape[1]))
        shape = (len(self.layers), 1, self.n_heads, cfg.max_target_positions,
                 cfg.d_model // self.n_heads)
        self.register_buffer("k_cache", torch.zeros(shape))
        self.register_buffer("v_cache", torch.zeros(shape))
        self.cross_k = []
        self.cross_v = []

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
            q = self._heads(layer.cross_q(layer.cross_ln(x)))
            attn = self._attend(q, self.cross_k[i], self.cross_v[i], None, -1, rowwise)
            x = x + layer.cross_out(attn.transpose(1, 2).reshape(n, -1))
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

    def __init__(self, hf_model, precision: Precision = "int8", vocab: DietVocab | None = None,
                 invariant: bool = False, head_ids: torch.Tensor | None = None):
        """``head_ids``: a drafter's cut head - logits only for these ids, in their order."""
        super().__init__()
        self.vocab = vocab  # a vocab-diet model: ids in and logits out use the full vocabulary
        cfg = hf_model.config
        self.n_heads = cfg.decoder_attention_heads
        self.d_model = cfg.d_model
        self.n_ctx = cfg.max_target_positions
        self.precision = precision
        rescore = RESCORE_TOP if precision == "int8" else 0
        self.step = DecoderStep(hf_model, head_ids, rescore)
        _cast(self.step, precision)
        prefill = None
        if precision == "int8":  # per-row activation ranges (invariant_int8)
            if not invariant:
                # Plain int8 still reads multi-row prompts (up to ~100 tokens of previous text)
                # with per-row ranges: fbgemm's one scale for all rows was the coarsest
                # rounding of the step (a word lost on a real clip, measured).
                prefill = DecoderStep(hf_model, head_ids, rescore)
                _cast(prefill, precision)
                # One copy of the fp32 tensors and one KV cache, read and written by both.
                for name in ("positions", "exact_head", "k_cache", "v_cache"):
                    setattr(prefill, name, getattr(self.step, name))
                prefill.embed = self.step.embed
            make_invariant(prefill if prefill is not None else self.step)
        # Which arithmetic runs: the judge's transcript cache keys on it.
        self.numerics = precision if precision != "int8" else \
            f"int8-{'per-row' if invariant else 'per-channel-per-row-prompt'}-rescore{rescore}"
        self.dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self._audio: torch.Tensor | None = None
        self.eval()
        # TorchScript is deprecated in favour of torch.compile, but here torch.compile was
        # slower (it copied the mutated KV cache on every call) and took 40 s to compile.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            self._run = torch.jit.script(self.step)
            self._prefill = torch.jit.script(prefill.eval()) if prefill is not None else None

    @property
    def embed(self) -> nn.Embedding:
        return self.step.embed

    @property
    def lm_head(self) -> nn.Module:
        return self.step.lm_head

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
        for layer in self.step.layers:
            k, v = layer.cross_kv(enc).chunk(2, dim=-1)
            cross_k.append(self.step._heads(k).contiguous())
            cross_v.append(self.step._heads(v).contiguous())
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
        if self.vocab is not None:
            tokens = self.vocab.to_diet[tokens]
            if bool((tokens < 0).any()):
                raise KeyError("a token outside the diet vocabulary reached the decoder")
        run = self._prefill if n > 1 and not rowwise and self._prefill is not None else self._run
        logits = run(tokens, start, rowwise and n > 1, min(last, n))
        if self.vocab is None:
            return logits
        full = logits.new_full((logits.shape[0], self.vocab.full_size), -torch.inf)
        full[:, self.vocab.kept_tensor] = logits
        return full


def _cast(step: DecoderStep, precision: Precision) -> None:
    if precision == "bf16":
        step.to(torch.bfloat16)
    elif precision == "int8":
        with warnings.catch_warnings():  # torch.ao's eager API is deprecated, still fastest
            warnings.simplefilter("ignore")
            # One weight scale per output channel: with fbgemm's per-tensor default, plain
            # greedy added a hallucinated sentence to beckett.wav (WER 0 -> 16.7 %); per
            # channel costs nothing measurable and gave 0.8 / 0 / 0 / 0 % on the real clips.
            # cross_kv stays fp32: it runs once per window over every encoder frame, and one
            # activation scale for all 1500 frames quantized quiet frames coarsely.
            qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
            spec = {name: qconfig for name, module in step.named_modules()
                    if isinstance(module, nn.Linear) and not name.endswith("cross_kv")}
            torch.ao.quantization.quantize_dynamic(step, spec, inplace=True)
    elif precision != "fp32":
        raise ValueError(f"precision must be fp32, bf16 or int8, not {precision!r}")
