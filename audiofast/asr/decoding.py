"""One decoding loop for the owned engine: Whisper's logit rules, then greedy with optional
drafts verified in one pass (gpt-fast style), or temperature sampling for fallback.

Greedy verification is lossless: a drafted token is kept only if it is exactly what greedy
decoding would have picked at that position under the same rules, so the output equals plain
greedy token for token; drafts only change how many engine calls it takes. That needs the
verify call to compute each row exactly as a one-row call would (``rowwise``: per-row int8
ranges, attention row by row), not merely close: near-ties (timestamps 20 ms apart) flip on
last-bit differences.

Logits are numpy float32 rows; the reductions below are written out as torch computes them in
float32 (max-shifted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from audiofast.asr.engine import WhisperDecoderEngine
from audiofast.asr.tokenizer import WhisperTokenizer

if TYPE_CHECKING:
    from collections.abc import Sequence

    from audiofast.asr.fused_decoder import SequenceState


def logsumexp(x: np.ndarray) -> float:
    top = x.max()
    if top == -np.inf:
        return float(top)
    return float(top + np.log(np.exp(x - top).sum(dtype=np.float32)))


def log_softmax(x: np.ndarray) -> np.ndarray:
    return x - np.float32(logsumexp(x))


@dataclass
class LogitRules:
    """Whisper's constraints on the next token given the tokens generated so far."""

    tokenizer: WhisperTokenizer
    suppress: list[int]  # never generated
    suppress_at_begin: list[int]  # not as the first token (blank, end-of-text)
    timestamps: bool
    max_initial_timestamp_index: int = 50

    def __post_init__(self) -> None:  # index arrays built once, not on every token
        self._suppress = np.asarray(self.suppress, dtype=np.int64)
        self._suppress_at_begin = np.asarray(self.suppress_at_begin, dtype=np.int64)

    def apply(self, logits: np.ndarray, generated: list[int]) -> np.ndarray:
        logits = np.array(logits, dtype=np.float32)  # a copy
        ts = self.tokenizer.timestamp_begin
        logits[self._suppress] = -np.inf
        if not generated:
            logits[self._suppress_at_begin] = -np.inf
        if not self.timestamps:
            logits[ts:] = -np.inf
            return logits
        logits[self.tokenizer.no_timestamps] = -np.inf  # as openai-whisper's ApplyTimestampRules
        last_is_ts = bool(generated) and generated[-1] >= ts
        penultimate_is_ts = len(generated) < 2 or generated[-2] >= ts
        if last_is_ts:
            if penultimate_is_ts:  # a pair just closed: text must follow
                logits[ts:] = -np.inf
            else:  # a segment just ended: another timestamp or the end
                logits[: self.tokenizer.eot] = -np.inf
        stamps = [t for t in generated if t >= ts]
        if stamps:  # never go back in time; a new segment must have non-zero length
            floor = stamps[-1] if last_is_ts and not penultimate_is_ts else stamps[-1] + 1
            logits[ts:floor] = -np.inf
        if not generated:  # begin with a timestamp, and not too late
            logits[:ts] = -np.inf
            logits[ts + self.max_initial_timestamp_index + 1 :] = -np.inf
        # Timestamps together outweigh any text token (compared in logits: the log-softmax
        # normaliser would subtract the same constant from both sides).
        if logsumexp(logits[ts:]) > logits[:ts].max():
            logits[:ts] = -np.inf
        return logits


class Drafter(Protocol):
    def propose(self, context: list[int]) -> list[int]: ...

    def feedback(self, drafted: int, accepted: int) -> None: ...


class HiddenStateDrafter(Drafter, Protocol):
    """A drafter that reads the target's hidden state (the block drafter): ``observe`` gets
    the row that chose the context's last token, just before ``propose``."""

    def observe(self, hidden: np.ndarray) -> None: ...


@dataclass
class DecodeOutput:
    tokens: list[int]
    sum_logprob: float
    no_speech_prob: float
    engine_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_per_call: list[int] = field(default_factory=list)


def _read_prompt(engine: WhisperDecoderEngine, prompt: list[int], tok: WhisperTokenizer,
                 max_new_tokens: int, forced: list[int] = ()) -> tuple[DecodeOutput,
                                                                        np.ndarray, int]:
    """Feed the prompt and the ``forced`` output prefix in one call: the output so far (with
    the no-speech probability read at the start-of-transcript position), the next-token
    logits, and the output length limit."""
    sot = prompt.index(tok.sot)
    fed = prompt + list(forced)
    logits = engine(fed, 0, last=len(fed) - sot)
    no_speech = float(np.exp(log_softmax(logits[0])[tok.no_speech]))
    return (DecodeOutput(list(forced), 0.0, no_speech, engine_calls=1), logits[-1],
            _output_limit(engine, fed, forced, max_new_tokens))


def _output_limit(engine: WhisperDecoderEngine, fed: list[int], forced: Sequence[int],
                  max_new_tokens: int) -> int:
    """How long the output may grow: ``max_new_tokens`` past the forced prefix, inside the
    decoder's context after the ``fed`` prompt and prefix."""
    return len(forced) + min(max_new_tokens, engine.n_ctx - len(fed) - 1)


class GreedySearch:
    """One greedy decode as the engine calls it needs, so that one loop can run it alone
    (:func:`greedy_decode`) and another can run many side by side in shared calls
    (:func:`greedy_decode_batch`) with the same arithmetic.

    ``call`` is the next call to make, (tokens, start, last), None once done; ``advance``
    takes its logits. The first call reads the prompt and the ``forced`` output prefix;
    every later one feeds the token just chosen and the drafter's guesses after it, each
    kept only where greedy picks it."""

    def __init__(self, engine: WhisperDecoderEngine, prompt: list[int], rules: LogitRules,
                 max_new_tokens: int, drafter: Drafter | None = None, forced: list[int] = ()):
        self.rules, self.drafter, self.prompt = rules, drafter, prompt
        self._known_prefix = engine.known_prefix
        sot = prompt.index(rules.tokenizer.sot)
        fed = prompt + list(forced)
        self.call: tuple[list[int], int, int] | None = (fed, 0, len(fed) - sot)
        self.out = DecodeOutput(list(forced), 0.0, float("nan"))
        self.limit = _output_limit(engine, fed, forced, max_new_tokens)
        self.position = len(fed)
        self._draft: list[int] = []

    def advance(self, rows: np.ndarray, hidden: np.ndarray | None = None) -> None:
        """Take the call's logit ``rows`` (and, for a drafter that reads them, the rows'
        ``hidden`` states)."""
        out, tok = self.out, self.rules.tokenizer
        if out.engine_calls == 0:  # the prompt: no-speech is read at the start of transcript
            out.no_speech_prob = float(np.exp(log_softmax(rows[0])[tok.no_speech]))
            chosen_by = len(rows) - 1
        else:
            accepted = 0
            for j, guess in enumerate(self._draft):  # rows[j] predicts what follows draft[j-1]
                logprobs = log_softmax(self.rules.apply(rows[j], out.tokens))
                if int(logprobs.argmax()) != guess:
                    break
                out.tokens.append(guess)
                out.sum_logprob += float(logprobs[guess])
                accepted += 1
            if self.drafter:
                self.drafter.feedback(len(self._draft), accepted)
                out.drafted += len(self._draft)
                out.accepted += accepted
                out.accepted_per_call.append(accepted + 1)
            self.position += 1 + accepted
            chosen_by = accepted
        out.engine_calls += 1
        logprobs = log_softmax(self.rules.apply(rows[chosen_by], out.tokens))
        token = int(logprobs.argmax())
        out.sum_logprob += float(logprobs[token])
        if token == tok.eot or len(out.tokens) >= self.limit:
            self.call = None
            return
        out.tokens.append(token)
        if hasattr(self.drafter, "observe"):  # a HiddenStateDrafter
            self.drafter.observe(None if hidden is None else hidden[chosen_by])
        draft = self.drafter.propose(self.prompt + out.tokens) if self.drafter else []
        self._draft = draft[: min(max(0, self.limit - len(out.tokens)),
                                  self._known_prefix(draft))]
        self.call = ([token, *self._draft], self.position, 0)


def greedy_decode(
    engine: WhisperDecoderEngine, prompt: list[int], rules: LogitRules, max_new_tokens: int,
    drafter: Drafter | None = None, forced: list[int] = (),
) -> DecodeOutput:
    """Greedy decoding; with a drafter, each engine call verifies the drafted continuation.
    ``forced``: output tokens already decided (a live stream's committed segments), read with
    the prompt and seen by the logit rules as output; they start ``tokens`` and are not
    scored."""
    search = GreedySearch(engine, prompt, rules, max_new_tokens, drafter, forced)
    prompt_call = True
    while search.call is not None:
        tokens, start, last = search.call
        # Drafted rows are verified exactly as single steps (rowwise); the prompt needs not.
        rows = engine(tokens, start, rowwise=not prompt_call, last=last)
        search.advance(rows, engine.last_hidden)
        prompt_call = False
    return search.out


def greedy_decode_batch(engine: WhisperDecoderEngine,
                        searches: list[tuple[SequenceState, GreedySearch]]) -> list[DecodeOutput]:
    """Several greedy decodes, each over its own window (``engine.sequence``), side by side:
    every round is one engine call for all unfinished ones, reading the weights once. Each
    output equals :func:`greedy_decode` of that window alone, token for token (every row of
    a fused call is computed as if alone)."""
    active = list(searches)
    while active:
        logits = engine.forward_batch([(state, *search.call) for state, search in active])
        hidden = engine.last_hidden or [None] * len(active)
        for (_, search), rows, states in zip(active, logits, hidden, strict=True):
            search.advance(rows, states)
        active = [(state, search) for state, search in active if search.call is not None]
    return [search.out for _, search in searches]


def _draw(rules: LogitRules, logits: np.ndarray, out: DecodeOutput, temperature: float,
          generator: np.random.Generator, limit: int) -> int | None:
    """One sampled token appended to ``out`` (its log-prob counted); None when the sample
    ends here (end-of-text, or the token budget is spent)."""
    filtered = rules.apply(logits, out.tokens)
    probs = np.exp(log_softmax(filtered / np.float32(temperature)).astype(np.float64))
    token = int(generator.choice(len(probs), p=probs / probs.sum()))
    out.sum_logprob += float(log_softmax(filtered)[token])
    if token == rules.tokenizer.eot or len(out.tokens) >= limit:
        return None
    out.tokens.append(token)
    out.engine_calls += 1
    return token


def sample_decode(
    engine: WhisperDecoderEngine, prompt: list[int], rules: LogitRules, max_new_tokens: int,
    temperature: float, generator: np.random.Generator,
) -> DecodeOutput:
    """One sample at ``temperature`` (the fallback when greedy output looks wrong)."""
    out, last, limit = _read_prompt(engine, prompt, rules.tokenizer, max_new_tokens)
    position = len(prompt)
    while True:
        token = _draw(rules, last, out, temperature, generator, limit)
        if token is None:
            break
        last = engine([token], position)[0]
        position += 1
    return out


def sample_decode_forked(
    engine: WhisperDecoderEngine, prompt: list[int], rules: LogitRules, max_new_tokens: int,
    temperature: float, generator: np.random.Generator, samples: int,
) -> list[DecodeOutput]:
    """``samples`` samples at ``temperature`` side by side (the fused decoder's forked
    caches): the prompt is read once and each step is one engine call for all of them, so
    they share every weight read. Each sample draws from its own history, as
    :func:`sample_decode` does; finished ones feed end-of-text until all are done."""
    eot = rules.tokenizer.eot
    first, last, limit = _read_prompt(engine, prompt, rules.tokenizer, max_new_tokens)
    engine.fork(samples, len(prompt))
    outs = [DecodeOutput([], 0.0, first.no_speech_prob, engine_calls=1) for _ in range(samples)]
    lasts = [last] * samples
    done = [False] * samples
    position = len(prompt)
    while True:
        tokens = []
        for i, out in enumerate(outs):
            token = None if done[i] else _draw(rules, lasts[i], out, temperature, generator, limit)
            done[i] = token is None
            tokens.append(eot if token is None else token)
        if all(done):
            return outs
        rows = engine.forward_forked(tokens, position)
        lasts = list(rows)
        position += 1
