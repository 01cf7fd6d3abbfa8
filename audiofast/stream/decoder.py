"""Batched decoding of live audio buffers on CTranslate2.

Three things make streaming affordable on a small CPU:

- **No 30 s padding.** A buffer of d seconds is encoded as d + ``pad_s`` seconds of input
  (silence appended), not 30 s: the encoder cost falls with the frames. Whisper was trained
  on 30 s windows and sometimes loops on short ones, so a hypothesis whose text compresses
  like a loop is decoded again at full 30 s (Whisper's own compression-ratio test).
- **Committed segments are forced, not re-decoded.** Whole Whisper segments (text and
  closing timestamp) that LocalAgreement committed go in as a forced prefix, read in one
  pass instead of one step per token. (Forcing a prefix that ends mid-segment made Whisper
  repeat itself; ending on a closing timestamp is a state it was trained in.)
- **Sessions are batched** when their windows fall in the same 2 s bucket: the encoder
  costs the same batched or not (it is linear in frames), and padding a short buffer to a
  long batch mate's window changed its transcript.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import ctranslate2
import numpy as np
import torch

from audiofast.asr.ct2_runtime import CT2Whisper
from audiofast.asr.features import FRAMES_PER_SECOND, N_FRAMES, log_mel_spectrogram
from audiofast.asr.longform import compression_ratio
from audiofast.audio import SAMPLE_RATE

MAX_TOKENS_PER_SECOND = 8  # fast speech is ~4-5 tokens/s; more means a loop
BUCKET_S = 2  # encoder windows come in steps of this many seconds


@dataclass
class DecodeRequest:
    audio: np.ndarray  # 16 kHz mono float32: the utterance buffer from its start
    context: list[int]  # text tokens of earlier utterances, for <|startofprev|>
    language: str | None = "en"
    task: str = "transcribe"
    prefix: list[int] = field(default_factory=list)  # complete committed segments, forced


@dataclass
class Hypothesis:
    tokens: list[int]  # prefix + new tokens, timestamps relative to the buffer start, no EOT
    no_speech_prob: float
    avg_logprob: float
    full_window: bool  # True when the loop guard re-decoded it at 30 s


class StreamDecoder:
    """Decodes a batch of :class:`DecodeRequest` with timestamps on one CT2 Whisper model."""

    def __init__(self, runtime: CT2Whisper, pad_s: float = 10.0):
        self.runtime = runtime
        self.tokenizer = runtime.tokenizer
        self.pad_s = pad_s
        self.suppress = self.tokenizer.suppressed_tokens((-1,), runtime.default_suppress_ids)

    def window_frames(self, request: DecodeRequest) -> int:
        """Encoder frames for a buffer: its length plus ``pad_s``, rounded up to a bucket."""
        seconds = len(request.audio) / SAMPLE_RATE + self.pad_s
        return min(N_FRAMES, math.ceil(seconds / BUCKET_S) * BUCKET_S * FRAMES_PER_SECOND)

    def decode(self, requests: list[DecodeRequest]) -> list[Hypothesis]:
        """Requests are batched within window buckets only, so what a session hears never
        depends on which other sessions happen to be decoded with it."""
        buckets: dict[int, list[int]] = {}
        for i, request in enumerate(requests):
            buckets.setdefault(self.window_frames(request), []).append(i)
        hyps: list[Hypothesis] = [None] * len(requests)  # type: ignore[list-item]
        for frames, members in buckets.items():
            for i, hyp in zip(members, self._decode([requests[i] for i in members], frames),
                              strict=True):
                hyps[i] = hyp
        for i, (request, hyp) in enumerate(zip(requests, hyps, strict=True)):
            if self.window_frames(request) < N_FRAMES and self._looks_looped(request, hyp):
                # Whisper's own fallback also drops the prompt: loops often copy it.
                retry = DecodeRequest(request.audio, [], request.language, request.task,
                                      request.prefix)
                hyps[i] = self._decode([retry], N_FRAMES)[0]
                hyps[i].full_window = True
        return hyps

    def _looks_looped(self, request: DecodeRequest, hyp: Hypothesis) -> bool:
        limit = MAX_TOKENS_PER_SECOND * len(request.audio) / SAMPLE_RATE + 10
        text = self.tokenizer.decode(hyp.tokens)
        return len(hyp.tokens) > limit or compression_ratio(text) > 2.4

    def _decode(self, requests: list[DecodeRequest], frames: int) -> list[Hypothesis]:
        tok = self.tokenizer
        samples = frames * SAMPLE_RATE // FRAMES_PER_SECOND
        mels = []
        for r in requests:
            audio = r.audio[:samples]
            mel = log_mel_spectrogram(audio, self.runtime.n_mels, padding=samples - len(audio))
            mels.append(mel[:, :frames])
        features = torch.stack(mels).contiguous().numpy()
        encoded = self.runtime.model.encode(ctranslate2.StorageView.from_array(features))
        languages = [r.language for r in requests]
        if tok.multilingual and None in languages:  # auto: detect from this encoder output
            detected = self.runtime.model.detect_language(encoded)
            languages = [lang or best[0][0][2:-2] for lang, best in zip(languages, detected,
                                                                         strict=True)]
        prompts = [tok.prompt(r.context, lang, r.task, timestamps=True) + r.prefix
                   for r, lang in zip(requests, languages, strict=True)]
        budget = max(MAX_TOKENS_PER_SECOND * len(r.audio) / SAMPLE_RATE for r in requests) + 12
        # CT2 wants <|startoftranscript|> at one position per batch: group by prompt length.
        results: list = [None] * len(requests)
        groups: dict[int, list[int]] = {}
        for i, prompt in enumerate(prompts):
            groups.setdefault(len(prompt), []).append(i)
        for length, members in groups.items():
            part = encoded if len(groups) == 1 else ctranslate2.StorageView.from_array(
                np.asarray(encoded)[members])
            outputs = self.runtime.model.generate(
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
        return hyps
