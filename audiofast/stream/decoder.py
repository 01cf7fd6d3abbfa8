"""Batched decoding of live audio buffers (CTranslate2's encoder, the fused decoder).

What makes streaming affordable on a small CPU:

- **No 30 s padding.** A buffer of d seconds is encoded as d + ``pad_s`` seconds of input
  (silence appended), not 30 s: the encoder cost falls with the frames. A hypothesis whose
  text compresses like a loop (Whisper's own compression-ratio test) or is too long for its
  audio is decoded again without the prompt on the same window - short buffers loop mostly by
  copying the earlier text the prompt holds - and only if that loops too at the full 30 s.
  Decodes that only look for an utterance's first words (``probe``) get ``probe_pad_s``
  (4 s): their text is a partial until a full-pad decode agrees, and the first partial comes
  sooner on a window half as long. The pad is for short buffers (shorter pads lost words of
  1-2 s lines): a buffer past ``PADDED_BUFFER_S`` gets the window such a buffer gets, or its
  own length + ``MIN_PAD_S`` (8 % less encoder work replayed, the same text).
- **Committed segments are forced, not re-decoded.** Whole Whisper segments (text and
  closing timestamp) that LocalAgreement committed go in as a forced prefix, read in one
  pass instead of one step per token. (Forcing a prefix that ends mid-segment made Whisper
  repeat itself; ending on a closing timestamp is a state it was trained in.)
- **Encoder calls are batched** when sessions' windows fall in the same 2 s bucket: the
  encoder costs the same batched or not (it is linear in frames), and padding a short buffer
  to a long batch mate's window changed its transcript.
- **The fused int8 decoder** (the offline default) decodes every due session's window in
  one batch where its kernels are built: each call feeds every unfinished session's rows,
  each over its own cache and window, so the weights are read once per step for all of them
  (each row still computed alone: a session's text never depends on its batch mates). Each
  session's previous hypothesis (its uncommitted tokens) is the draft (drafters/
  hypothesis.py), verified losslessly, so the text is plain greedy's in fewer decoder calls.
  CTranslate2's ``generate`` decodes where the kernels cannot run.

Every hypothesis's text tokens are then timed by cross-attention alignment (word_timing.py),
for the session's commit margin and the words of its ``final`` events.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import ctranslate2
import numpy as np

from audiofast.asr.ct2_runtime import CT2Whisper
from audiofast.asr.decoding import GreedySearch, LogitRules, greedy_decode_batch
from audiofast.asr.drafters.hypothesis import HypothesisDrafter
from audiofast.asr.features import FRAMES_PER_SECOND, N_FRAMES, log_mel_spectrogram
from audiofast.asr.longform import MAX_TOKENS_PER_SECOND, compression_ratio
from audiofast.asr.options import TranscribeOptions
from audiofast.asr.word_timing import token_times
from audiofast.audio import SAMPLE_RATE
from audiofast.stream.agreement import repeated_run

BUCKET_S = 2  # encoder windows come in steps of this many seconds
# Longer buffers are padded only up to the window a buffer this long gets (pad_s + 4 s: 14 s
# at the default 10), and by at least MIN_PAD_S. Replayed over the four recordings, four TTS
# dialogues of 1-3 s lines and four of 6-10 s lines (a two_cities-like case): the same WER on
# 10 of 12 clips, +-0.8 points on two, 8 % fewer encoded window-seconds (a 12 s cap: 17 %,
# but +1.6 to +3.7 points on three clips).
PADDED_BUFFER_S = 4.0
MIN_PAD_S = 2.0
MAX_REPEATS = 4  # a phrase said this many times back to back is a loop (real speech: "no, no, no")


@dataclass
class Hypothesis:
    tokens: list[int]  # prefix + new tokens, timestamps relative to the buffer start, no EOT
    no_speech_prob: float
    avg_logprob: float
    full_window: bool  # True when the loop guard re-decoded it at 30 s
    # With word timing: each text token's start (seconds from the buffer start) and then the
    # end of the last, and each text token's probability, from cross-attention alignment.
    text_times: list[float] | None = None
    text_probs: list[float] | None = None
    looped: bool = False  # it repeats itself, and its request asked for no 30 s retry


@dataclass
class DecodeRequest:
    audio: np.ndarray  # 16 kHz mono float32: the utterance buffer from its start
    context: list[int]  # text tokens of earlier utterances, for <|startofprev|>
    language: str | None = "en"
    task: str = "transcribe"
    prefix: list[int] = field(default_factory=list)  # complete committed segments, forced
    draft: list[int] = field(default_factory=list)  # the last hypothesis after the prefix
    # Decoded already (the session's closing decode, done when the silence began): returned
    # as it is.
    ready: Hypothesis | None = None
    # Someone waits on it: an utterance's first words, or its close (the scheduler decodes
    # these ahead of the updates of utterances already under way).
    urgent: bool = False
    # Looking for an utterance's first words: decoded with ``probe_pad_s`` of silence. Its
    # text is only a partial; nothing is committed until a full-pad decode agrees with it.
    probe: bool = False
    # An urgent request's user has waited this long (stream seconds since the speech began
    # for first words, since it ended for a close): the scheduler serves the nearest deadline
    # first.
    waited_s: float = 0.0
    # A hypothesis that repeats itself is decoded again without the prompt, and if that loops
    # too, at 30 s; False: then it is returned marked ``looped`` (a line behind a lead-in is
    # decoded alone instead, on its own short window).
    full_window_retry: bool = True


class StreamDecoder:
    """Decodes a batch of :class:`DecodeRequest` with timestamps.

    ``runtime``: what :func:`audiofast.load_model` returns. A CTranslate2 model decodes on
    CTranslate2; the fast and auto runtimes decode on the owned decoder (auto: where the
    kernels are built). ``draft``: verify the previous hypothesis as a draft (fast only)."""

    def __init__(self, runtime, pad_s: float = 10.0, draft: bool = True,
                 word_timing: bool = True, loop_retry: str = "prompt",
                 probe_pad_s: float = 4.0):
        if hasattr(runtime, "runtime_for"):  # auto: the decoder greedy decoding runs on
            runtime = runtime.runtime_for(TranscribeOptions())
        self.fast = runtime if hasattr(runtime, "engine") else None  # None: CTranslate2
        self.ct2: CT2Whisper = runtime.ct2 if self.fast is not None else runtime
        self.engine = "ct2" if self.fast is None else "fast"
        self.tokenizer = self.ct2.tokenizer
        self.spec = self.ct2.resolved.spec
        self.pad_s = pad_s
        self.probe_pad_s = min(probe_pad_s, pad_s)
        self.draft = draft and self.fast is not None
        self.word_timing = word_timing
        if loop_retry not in ("prompt", "full"):
            raise ValueError(f"loop_retry is 'prompt' or 'full', not {loop_retry!r}")
        self.loop_retry = loop_retry
        self.suppress = self.tokenizer.suppressed_tokens((-1,), self.ct2.default_suppress_ids)
        # Where decode time goes, and (owned decoder) tokens per decoder call: the drafts'
        # effect. CTranslate2's generate makes one call per step: its calls are its tokens.
        self.stats = {"encoder_s": 0.0, "decoder_s": 0.0, "align_s": 0.0, "windows": 0,
                      "tokens": 0, "decoder_calls": 0, "drafted": 0, "accepted": 0,
                      "batched_calls": 0, "prompt_retry": 0, "full_window": 0}

    def window_frames(self, request: DecodeRequest) -> int:
        """Encoder frames for a buffer: its length plus ``pad_s`` (``probe_pad_s`` for a probe),
        but past ``PADDED_BUFFER_S`` only up to that buffer's window (at least ``MIN_PAD_S``),
        rounded up to a bucket."""
        length = len(request.audio) / SAMPLE_RATE
        if request.probe:
            seconds = length + self.probe_pad_s
        else:
            seconds = min(length + self.pad_s,
                          max(length + MIN_PAD_S, PADDED_BUFFER_S + self.pad_s))
        return min(N_FRAMES, math.ceil(seconds / BUCKET_S) * BUCKET_S * FRAMES_PER_SECOND)

    def encode(self, request: DecodeRequest) -> np.ndarray:
        """One request's encoder output (1, frames, width), for :meth:`decode`'s ``encoded``:
        the server encodes a round's windows one call at a time (the encoder costs the same
        batched or not), so what users wait on can be decoded between two of them."""
        t0 = time.perf_counter()
        out = np.asarray(self._encode([request], self.window_frames(request)))
        self.stats["encoder_s"] += time.perf_counter() - t0
        return out

    def decode(self, requests: list[DecodeRequest],
               encoded: list[np.ndarray | None] | None = None) -> list[Hypothesis]:
        """Encoder calls are batched within window buckets only, so what a session hears never
        depends on which other sessions happen to be decoded with it. ``encoded``: each
        request's :meth:`encode` output (None for a ready one), computed before."""
        hyps: list[Hypothesis] = [r.ready for r in requests]  # type: ignore[misc]
        pending = [i for i, request in enumerate(requests) if request.ready is None]
        decoded = self._decode([requests[i] for i in pending],
                               [self.window_frames(requests[i]) for i in pending],
                               None if encoded is None else [encoded[i] for i in pending])
        for i, hyp in zip(pending, decoded, strict=True):
            hyps[i] = self._unloop(requests[i], hyp) \
                if self.window_frames(requests[i]) < N_FRAMES else hyp
        return hyps

    def _unloop(self, request: DecodeRequest, hyp: Hypothesis) -> Hypothesis:
        """A hypothesis that repeats itself is decoded again without the prompt (loops on
        short buffers mostly copy the earlier text it holds), first on the same window
        (``loop_retry="prompt"``), then at 30 s, as Whisper's own fallback does - unless the
        request asks for no 30 s retry: then it comes back marked ``looped``."""
        if not self._looks_looped(request, hyp):
            return hyp
        retry = DecodeRequest(request.audio, [], request.language, request.task,
                              request.prefix)
        if self.loop_retry == "prompt" and request.context:
            hyp = self._decode([retry], [self.window_frames(request)])[0]
            self.stats["prompt_retry"] += 1
            if not self._looks_looped(request, hyp):
                return hyp
        if not request.full_window_retry:
            hyp.looped = True
            return hyp
        hyp = self._decode([retry], [N_FRAMES])[0]
        hyp.full_window = True
        self.stats["full_window"] += 1
        return hyp

    def _looks_looped(self, request: DecodeRequest, hyp: Hypothesis) -> bool:
        limit = MAX_TOKENS_PER_SECOND * len(request.audio) / SAMPLE_RATE + 10
        text = self.tokenizer.decode(hyp.tokens)
        return (len(hyp.tokens) > limit or compression_ratio(text) > 2.4
                or repeated_run(text) >= MAX_REPEATS)

    def _decode(self, requests: list[DecodeRequest], frames: list[int],
                outputs: list[np.ndarray] | None = None) -> list[Hypothesis]:
        """``requests[i]`` on a window of ``frames[i]``: one encoder call per window length
        (unless ``outputs`` holds them already), then the decoder (the fused one: every window
        in one batch), then word timing."""
        buckets: dict[int, list[int]] = {}
        for i, f in enumerate(frames):
            buckets.setdefault(f, []).append(i)
        t0 = time.perf_counter()
        encoded = {f: self._encode([requests[i] for i in members], f) if outputs is None
                   else ctranslate2.StorageView.from_array(
                       np.ascontiguousarray(np.concatenate([outputs[i] for i in members])))
                   for f, members in buckets.items()}
        languages = self._languages(requests, buckets, encoded)
        t1 = time.perf_counter()
        self.stats["encoder_s"] += t1 - t0
        self.stats["windows"] += len(requests)
        hyps: list[Hypothesis] = [None] * len(requests)  # type: ignore[list-item]
        if self.fast is not None:
            windows: list[np.ndarray] = [None] * len(requests)  # type: ignore[list-item]
            for f, members in buckets.items():
                array = np.asarray(encoded[f])
                for row, i in enumerate(members):
                    windows[i] = array[row : row + 1]
            hyps = self._decode_fused(requests, windows, languages)
        else:
            for f, members in buckets.items():
                for i, hyp in zip(members, self._generate_ct2(
                        [requests[i] for i in members], encoded[f],
                        [languages[i] for i in members]), strict=True):
                    hyps[i] = hyp
        t2 = time.perf_counter()
        self.stats["decoder_s"] += t2 - t1
        if self.word_timing:
            for f, members in buckets.items():
                self._align([requests[i] for i in members], [hyps[i] for i in members],
                            encoded[f], f)
            self.stats["align_s"] += time.perf_counter() - t2
        return hyps

    def _encode(self, requests: list[DecodeRequest], frames: int) -> ctranslate2.StorageView:
        samples = frames * SAMPLE_RATE // FRAMES_PER_SECOND
        mels = []
        for r in requests:
            audio = r.audio[:samples]
            mel = log_mel_spectrogram(audio, self.ct2.n_mels, padding=samples - len(audio))
            mels.append(mel[:, :frames])
        # The runtime's encoder (serve --encoder: CTranslate2's, or the fused one where it
        # is chosen), as transcribe's.
        return self.ct2.encode_batch(np.stack(mels))

    def _languages(self, requests: list[DecodeRequest], buckets: dict[int, list[int]],
                   encoded: dict[int, ctranslate2.StorageView]) -> list[str | None]:
        """Each request's language; "auto" (None) on a multilingual model is detected from
        its encoder output."""
        languages = [r.language for r in requests]
        if not self.tokenizer.multilingual or None not in languages:
            return languages
        for f, members in buckets.items():
            for i, best in zip(members, self.ct2.model.detect_language(encoded[f]), strict=True):
                languages[i] = languages[i] or best[0][0][2:-2]
        return languages

    def _align(self, requests: list[DecodeRequest], hyps: list[Hypothesis],
               encoded: ctranslate2.StorageView, frames: int) -> None:
        """Time every hypothesis's text tokens by cross-attention alignment (CTranslate2's
        ``align``: DTW over the alignment heads), one call per language in the batch."""
        tok = self.tokenizer
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, (request, hyp) in enumerate(zip(requests, hyps, strict=True)):
            if any(t < tok.eot for t in hyp.tokens):
                sot = tok.sot_sequence(request.language, request.task, timestamps=True)
                groups.setdefault(tuple(sot), []).append(i)
        for sot, members in groups.items():
            part = _rows(encoded, members, len(requests))
            texts = [[t for t in hyps[i].tokens if t < tok.eot] for i in members]
            num_frames = [min(frames, len(requests[i].audio) * FRAMES_PER_SECOND // SAMPLE_RATE)
                          for i in members]
            results = self.ct2.align(part, list(sot), texts, num_frames)
            for i, text, result in zip(members, texts, results, strict=True):
                times = token_times(result).tolist()
                if times:  # one start per text token, then the end of the last
                    hyps[i].text_times = (times + times[-1:] * len(text))[: len(text) + 1]
                    hyps[i].text_probs = list(result.text_token_probs)[: len(text)]

    def _generate_ct2(self, requests: list[DecodeRequest], encoded: ctranslate2.StorageView,
                      languages: list[str | None]) -> list[Hypothesis]:
        tok = self.tokenizer
        prompts = [tok.prompt(r.context, lang, r.task, timestamps=True) + r.prefix
                   for r, lang in zip(requests, languages, strict=True)]
        budget = max(MAX_TOKENS_PER_SECOND * len(r.audio) / SAMPLE_RATE for r in requests) + 12
        # CT2 wants <|startoftranscript|> at one position per batch: group by prompt length.
        results: list = [None] * len(requests)
        groups: dict[int, list[int]] = {}
        for i, prompt in enumerate(prompts):
            groups.setdefault(len(prompt), []).append(i)
        for length, members in groups.items():
            part = _rows(encoded, members, len(requests))
            outputs = self.ct2.model.generate(
                part, [prompts[i] for i in members], beam_size=1,
                max_length=length + int(budget), return_scores=True, return_no_speech_prob=True,
                suppress_blank=False, suppress_tokens=self.suppress,
                max_initial_timestamp_index=50,
            )
            for i, output in zip(members, outputs, strict=True):
                results[i] = output
        hyps = []
        for request, result in zip(requests, results, strict=True):
            # CT2 returns the prompt tokens after the start-of-transcript sequence, i.e. the
            # forced prefix, followed by the new tokens (measured: ctranslate2 4.x). Prepending
            # the prefix "when missing" would double it whenever a continuation repeats it, and
            # would hide a changed CT2 contract: check it instead.
            tokens = list(result.sequences_ids[0])
            if tokens[: len(request.prefix)] != request.prefix:
                raise RuntimeError("CTranslate2 output does not start with the forced prefix")
            hyps.append(Hypothesis(tokens, result.no_speech_prob, result.scores[0], False))
            new = len(tokens) - len(request.prefix) + 1  # the end-of-text token counts
            self.stats["tokens"] += new
            self.stats["decoder_calls"] += new
        return hyps

    def _decode_fused(self, requests: list[DecodeRequest], windows: list[np.ndarray],
                      languages: list[str | None]) -> list[Hypothesis]:
        """Every window on the owned decoder in one batch (each engine call reads the weights
        once for all of them), each with its forced prefix read with the prompt and its
        previous hypothesis verified as the draft."""
        tok, engine = self.tokenizer, self.fast.engine
        rules = LogitRules(tok, suppress=self.suppress, suppress_at_begin=[], timestamps=True,
                           max_initial_timestamp_index=50)
        searches = []
        for request, window, language in zip(requests, windows, languages, strict=True):
            prompt = tok.prompt(request.context, language, request.task, timestamps=True)
            drafter = HypothesisDrafter(len(prompt), request.prefix + request.draft) \
                if self.draft and request.draft else None
            budget = int(MAX_TOKENS_PER_SECOND * len(request.audio) / SAMPLE_RATE) + 12
            searches.append((engine.sequence(window), GreedySearch(
                engine, prompt, rules, budget, drafter, forced=request.prefix)))
        outs = greedy_decode_batch(engine, searches)
        hyps = []
        for request, out in zip(requests, outs, strict=True):
            new = len(out.tokens) - len(request.prefix)
            self.stats["decoder_calls"] += out.engine_calls
            self.stats["tokens"] += new + 1  # the end-of-text token is decoded too
            self.stats["drafted"] += out.drafted
            self.stats["accepted"] += out.accepted
            hyps.append(Hypothesis(out.tokens, out.no_speech_prob,
                                   out.sum_logprob / (new + 1), False))
        # Calls that served several windows at once count once here.
        self.stats["batched_calls"] += max((out.engine_calls for out in outs), default=0)
        return hyps


def _rows(encoded: ctranslate2.StorageView, members: list[int], total: int
          ) -> ctranslate2.StorageView:
    """The batch rows ``members`` of encoder output (all ``total`` rows: as it is)."""
    if len(members) == total:
        return encoded
    return ctranslate2.StorageView.from_array(np.asarray(encoded)[members])
