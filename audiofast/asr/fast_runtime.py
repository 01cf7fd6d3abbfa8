"""The fast path: CTranslate2's int8 encoder + our own decoder engine (+ optional drafter)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from audiofast.asr.batched import transcribe_batched
from audiofast.asr.ct2_runtime import CT2Whisper
from audiofast.asr.decoding import (
    DecodeOutput,
    Drafter,
    GreedySearch,
    LogitRules,
    greedy_decode,
    greedy_decode_batch,
    log_softmax,
    sample_decode,
    sample_decode_forked,
)
from audiofast.asr.drafters.ngram import NgramDrafter
from audiofast.asr.engine import (
    KV8,
    Precision,
    WhisperDecoderEngine,
    model_precision,
    weight_bits,
)
from audiofast.asr.longform import WindowResult, transcribe_audio
from audiofast.asr.options import DecodingOptions, TranscribeOptions
from audiofast.asr.tokenizer import TIME_PER_TIMESTAMP
from audiofast.asr.types import Segment, Transcription
from audiofast.asr.vad_filter import VadFilterOptions, transcribe_speech, vad_options
from audiofast.audio import AudioSource, load_audio


class FastWhisper:
    """Same interface as :class:`CT2Whisper`; decodes on :class:`WhisperDecoderEngine`."""

    def __init__(self, model: str | None = None, threads: int = 0,
                 precision: Precision | None = None, drafter: str = "none", seed: int = 0,
                 draft_model: str | Path | None = None, encoder: str = "auto",
                 ct2: CT2Whisper | None = None):
        """``precision``: int8 (or int4, int4-head8, int8-head4) decodes on the fused C++
        decoder (its packed weights cached on disk, packed_cache.py), fp32 on the eager
        reference decoder; None: the model's own (a QAD export's ``audiofast.json``), else
        int8. ``ct2``: an already loaded CTranslate2 model to encode with (``model`` and
        ``encoder`` are then its)."""
        self.ct2 = ct2 or CT2Whisper(model, threads=threads, encoder=encoder)
        self.tokenizer = self.ct2.tokenizer
        self.n_mels = self.ct2.n_mels
        precision = precision or model_precision(self.ct2.resolved.ct2_dir)
        self.engine = WhisperDecoderEngine(self._decoder_weights(precision), precision,
                                           self.ct2.vocab)
        if weight_bits(precision) is not None:  # threads 0: every core (the pool is shared)
            from audiofast.asr import kernels

            kernels.set_threads(threads)
        elif threads:
            import torch

            torch.set_num_threads(threads)
        self.drafter_name = drafter
        self.draft_model = draft_model
        self._model_drafter = None  # a ModelDrafter, loaded on first use (imports transformers)
        self._block_weights = None  # (folder, a block drafter's arrays), loaded on first use
        self.block_refine = True  # the block drafter's second (Markov) pass
        self.block_min_prob = 0.0  # ... and the confidence its drafted guesses need
        self.seed = seed
        self.generator = np.random.default_rng(seed)
        # engine_calls: per window; batched_calls: the calls batched chunks made for them all
        self.stats = {"engine_calls": 0, "drafted": 0, "accepted": 0, "tokens": 0,
                      "batched_calls": 0}

    def _decoder_weights(self, precision: Precision):
        """The decoder's float weights, or for the fused decoder its packed arrays (from the
        cache when this model was packed before: reading and packing the float weights - and
        importing torch - is then skipped)."""
        folder = self.ct2.resolved.ct2_dir

        def weights():
            from audiofast.asr.decoder_weights import DecoderWeights

            if self.ct2.vocab is None:
                return DecoderWeights.from_ct2(folder)
            from transformers import WhisperForConditionalGeneration  # a vocab-diet export

            return DecoderWeights.from_hf(
                WhisperForConditionalGeneration.from_pretrained(folder / "hf"))

        bits = weight_bits(precision)
        if bits is None:
            return weights()
        from audiofast.asr.fused_decoder import pack_decoder
        from audiofast.asr.packed_cache import load_or_pack

        return load_or_pack(folder / "model.bin", None,
                            lambda: pack_decoder(weights(), bits=bits),
                            precision.removesuffix(KV8))  # K/V bits are not in the pack

    def make_drafter(self) -> Drafter | None:
        if self.drafter_name == "none":
            return None
        if self.drafter_name == "ngram":
            return NgramDrafter(special_from=self.tokenizer.eot)
        if self.drafter_name == "model":
            if self.draft_model is None:
                raise ValueError("--drafter model needs --draft-model DIR "
                                 "(train one: audiofast distill --stage drafter)")
            if self._model_drafter is None:  # loaded once, its cache reset every window
                from audiofast.asr.drafters.model import ModelDrafter

                self._model_drafter = ModelDrafter(
                    self.draft_model, self.engine.precision, special_from=self.tokenizer.eot,
                    timestamps_from=self.tokenizer.timestamp_begin)
            return self._model_drafter
        if self.drafter_name == "block":
            return self._block_drafter()
        raise ValueError(f"unknown drafter {self.drafter_name!r}: none, ngram, model or block")

    def _block_drafter(self) -> Drafter:
        """A block drafter for one sequence (each window of a batch gets its own; the weights
        are loaded once)."""
        from audiofast.asr.drafters.block import BlockDrafter, BlockDraftWeights

        if self.draft_model is None:
            raise ValueError("--drafter block needs --draft-model DIR (train one: audiofast "
                             "distill --stage drafter --kind block)")
        if weight_bits(self.engine.precision) is None or self.ct2.vocab is not None:
            raise ValueError("--drafter block reads the fused decoder's hidden states: it "
                             "needs --precision int8 or int4 and a full-vocabulary model")
        if self._block_weights is None or self._block_weights[0] != self.draft_model:
            self._block_weights = (self.draft_model, BlockDraftWeights(self.draft_model))
        return BlockDrafter(self._block_weights[1], self.engine.embed, self.block_refine,
                            self.block_min_prob)

    def encode(self, mel_window: np.ndarray) -> np.ndarray:
        return np.array(self.ct2.encode(mel_window))

    def encode_batch(self, mel_windows: np.ndarray) -> np.ndarray:
        """(batch, n_mels, frames) windows of one length in one encoder call."""
        return np.array(self.ct2.encode_batch(mel_windows))

    def align(self, encoded: np.ndarray, sot_sequence: list[int], texts: list[list[int]],
              num_frames: list[int]) -> list:
        """Word timing's alignment, on CTranslate2 over this window's encoder output."""
        import ctranslate2

        view = ctranslate2.StorageView.from_array(np.ascontiguousarray(encoded))
        return self.ct2.align(view, sot_sequence, texts, num_frames)

    def detect_language(self, encoded: np.ndarray) -> tuple[str, float]:
        """The language token most likely after start-of-transcript (softmax over languages)."""
        tok = self.tokenizer
        codes = sorted(tok.languages)
        self.engine.set_audio(encoded)
        logits = self.engine([tok.sot], 0)[0]
        probs = np.exp(log_softmax(logits[[tok.language_token(code) for code in codes]]))
        best = int(probs.argmax())
        return codes[best], float(probs[best])

    def rules(self, options: DecodingOptions, prompt: list[int]) -> LogitRules:
        tok = self.tokenizer
        return LogitRules(
            tok,
            suppress=tok.suppressed_tokens(options.suppress_tokens, self.ct2.default_suppress_ids),
            suppress_at_begin=[tok.encode(" ")[0], tok.eot] if options.suppress_blank else [],
            timestamps=tok.no_timestamps not in prompt,
            max_initial_timestamp_index=round(options.max_initial_timestamp / TIME_PER_TIMESTAMP),
        )

    def decode(self, encoded: np.ndarray, prompt: list[int], options: DecodingOptions,
               temperature: float) -> WindowResult:
        if options.beam_size > 1 and temperature == 0:
            raise NotImplementedError("the fast engine is greedy; use --engine ct2 for beams")
        if self.ct2.vocab is not None:  # an initial prompt may hold tokens the diet dropped
            prompt = self.ct2.vocab.encode(prompt)
        self.engine.set_audio(encoded)
        rules = self.rules(options, prompt)
        if temperature == 0:
            drafter = self.make_drafter()
            if self.drafter_name == "model":  # the draft decoder reads this window too
                drafter.set_audio(encoded)
            out = greedy_decode(self.engine, prompt, rules, options.max_new_tokens, drafter)
        else:
            if self.engine.can_fork:  # best_of samples side by side, one call per step
                samples = sample_decode_forked(self.engine, prompt, rules,
                                               options.max_new_tokens, temperature,
                                               self.generator, options.best_of)
            else:
                samples = [sample_decode(self.engine, prompt, rules, options.max_new_tokens,
                                         temperature, self.generator)
                           for _ in range(options.best_of)]
            out = max(samples, key=lambda s: s.sum_logprob / (len(s.tokens) + 1))
        return self._result(out)

    def decode_batch(self, encoded: np.ndarray, prompts: list[list[int]],
                     options: DecodingOptions, temperature: float = 0.0) -> list[WindowResult]:
        """Greedy on the fused decoder: every window in one batch (each call feeds every
        unfinished window's rows and reads the weights once; each row is computed as if alone,
        so each window gets exactly what :meth:`decode` gives it). Otherwise (sampling, the
        model drafter, the fp32 reference) one window at a time."""
        if temperature > 0 or options.beam_size > 1 or not self.engine.can_batch \
                or self.drafter_name == "model":
            return [self.decode(encoded[i : i + 1], prompt, options, temperature)
                    for i, prompt in enumerate(prompts)]
        if self.ct2.vocab is not None:
            prompts = [self.ct2.vocab.encode(prompt) for prompt in prompts]
        searches = [(self.engine.sequence(encoded[i : i + 1]),
                     GreedySearch(self.engine, prompt, self.rules(options, prompt),
                                  options.max_new_tokens, self.make_drafter()))
                    for i, prompt in enumerate(prompts)]
        outs = greedy_decode_batch(self.engine, searches)
        self.stats["batched_calls"] += max((out.engine_calls for out in outs), default=0)
        return [self._result(out) for out in outs]

    def _result(self, out: DecodeOutput) -> WindowResult:
        for key in ("engine_calls", "drafted", "accepted"):
            self.stats[key] += getattr(out, key)
        self.stats["tokens"] += len(out.tokens) + 1
        return WindowResult(out.tokens, out.sum_logprob / (len(out.tokens) + 1), out.no_speech_prob)

    def transcribe(self, audio: AudioSource, options: TranscribeOptions = TranscribeOptions(),
                   progress: bool | None = None,
                   vad_filter: bool | VadFilterOptions = False,
                   on_segment: Callable[[Segment], None] | None = None) -> Transcription:
        """``vad_filter``: decode only the speech silero VAD finds (vad_filter.py);
        ``on_segment``: called with each segment as its window is done (longform.py)."""
        if vad_filter:
            return transcribe_speech(
                lambda speech, each: self.transcribe(speech, options, progress, False, each),
                load_audio(audio), vad_options(vad_filter), on_segment)
        self.generator = np.random.default_rng(self.seed)  # same audio, same samples, same text
        if options.batch_size:  # chunks side by side (batched.py), segments reported at the end
            result = transcribe_batched(self, load_audio(audio), options, progress)
            for segment in result.segments if on_segment else []:
                on_segment(segment)
            return result
        return transcribe_audio(self, load_audio(audio), options, progress, on_segment)
