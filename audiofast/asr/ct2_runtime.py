"""The int8 CTranslate2 runtime: the baseline every faster engine is measured against."""

from __future__ import annotations

import json
from collections.abc import Callable

import ctranslate2
import numpy as np

from audiofast.asr.batched import transcribe_batched
from audiofast.asr.longform import WindowResult, transcribe_audio
from audiofast.asr.options import DecodingOptions, TranscribeOptions
from audiofast.asr.tokenizer import TIME_PER_TIMESTAMP, WhisperTokenizer
from audiofast.asr.types import Segment, Transcription
from audiofast.asr.vad_filter import VadFilterOptions, transcribe_speech, vad_options
from audiofast.asr.vocab_diet import VOCAB_MAP_FILE, DietVocab
from audiofast.asr.word_timing import MEDIAN_FILTER_WIDTH
from audiofast.audio import AudioSource, load_audio
from audiofast.models import resolve_model

# Where the fused encoder (fused_encoder.py) overtakes CTranslate2's with AVX-512 VNNI
# (scripts/bench_encoder.py, 2-core Xeon, whisper-base, median of 7, three runs): 3000 frames
# 1.18-1.40x; 500-2000 frames within +-15 % either way (CT2 is quick up to 2000 frames). On the
# AVX2 path it is 0.35-0.55x CT2, so "auto" uses it only where the CPU has VNNI.
FUSED_MIN_FRAMES = 2400
ENCODERS = ("auto", "ct2", "fused", "openvino")


def fused_encoder_pays() -> bool:
    """Whether "auto" encodes long windows on the fused encoder: our kernels are built here
    (asked as the decoder's auto asks: choosing never starts a build) and take the AVX-512
    VNNI path."""
    from audiofast.asr import kernels

    return kernels.is_built() and kernels.backend() != "none" and kernels.uses_vnni()


class CT2Whisper:
    """A Whisper model on CTranslate2 (the encoder optionally fused or on OpenVINO): one window
    at a time (longform.py) or chunks side by side (batched.py)."""

    def __init__(self, model: str | None = None, threads: int = 0, compute_type: str = "int8",
                 seed: int = 0, encoder: str = "auto", replicas: int = 1):
        """``encoder``: "auto" (default): the fused encoder for windows of ``FUSED_MIN_FRAMES``
        and more on a CPU with VNNI, CTranslate2's for the rest; "ct2"; "fused" (our int8
        kernels, every window: fused_encoder.py); "openvino" (fp32 on OpenVINO:
        ov_encoder.py). ``replicas``: copies of the model CTranslate2 runs calls from several
        threads on at once (the live server: what a user waits on beside an update)."""
        if encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {', '.join(ENCODERS)}, not {encoder!r}")
        self.own_min_frames = 0  # shorter windows go to CTranslate2's encoder
        if encoder == "auto":
            encoder = "fused" if fused_encoder_pays() else "ct2"
            self.own_min_frames = FUSED_MIN_FRAMES
        self.resolved = resolve_model(model)
        # Temperature fallback samples: seed CTranslate2's generator so runs are reproducible.
        ctranslate2.set_random_seed(seed)
        self.model = ctranslate2.models.Whisper(
            str(self.resolved.ct2_dir), device="cpu", compute_type=compute_type,
            intra_threads=threads, inter_threads=replicas,
        )
        # A vocab-diet export speaks diet ids; everything outside this class uses original ids.
        map_path = self.resolved.ct2_dir / VOCAB_MAP_FILE
        self.vocab = DietVocab.load(map_path, self.resolved.ct2_dir / "tokenizer.json") \
            if map_path.is_file() else None
        multilingual = self.model.is_multilingual if self.vocab is None \
            else self.vocab.full_size >= 51865  # CT2 judges by its own (diet) size
        self.tokenizer = WhisperTokenizer.from_dir(self.resolved.ct2_dir, multilingual)
        self.n_mels = self.model.n_mels
        config_path = self.resolved.ct2_dir / "config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.default_suppress_ids: list[int] = config.get("suppress_ids", [])
        if self.vocab is not None:
            self.default_suppress_ids = self.vocab.unmap_ids(self.default_suppress_ids)
        self.own_encoder = None  # an encoder other than CTranslate2's
        if encoder == "fused":
            from audiofast.asr.fused_encoder import FusedEncoder

            self.own_encoder = FusedEncoder(self.resolved.ct2_dir)
        elif encoder != "ct2":
            from audiofast.asr.ov_encoder import OpenVINOEncoder

            self.own_encoder = OpenVINOEncoder(self.resolved.ct2_dir, threads)

    def encode(self, mel_window: np.ndarray) -> ctranslate2.StorageView:
        """Encode a (n_mels, frames) window; frames is 3000 unless the caller trims padding."""
        return self.encode_batch(mel_window[None])

    def encode_batch(self, mel_windows: np.ndarray) -> ctranslate2.StorageView:
        """Encode (batch, n_mels, frames) windows of one length in one call."""
        mel_windows = np.ascontiguousarray(mel_windows, dtype=np.float32)
        if self.own_encoder is None or mel_windows.shape[-1] < self.own_min_frames:
            return self.model.encode(ctranslate2.StorageView.from_array(mel_windows))
        # generate() takes encoder output as well as features; the view borrows the array's
        # memory and holds a reference to it (no shared field: the live server encodes in two
        # threads at once).
        return ctranslate2.StorageView.from_array(self.own_encoder(mel_windows))

    def detect_language(self, encoded: ctranslate2.StorageView) -> tuple[str, float]:
        if self.vocab is None:
            token, prob = self.model.detect_language(encoded)[0][0]
            return token[2:-2], prob
        # CT2 judges a diet model English-only and its timestamp rules then leave no way to
        # read language logits; the fast engine (our decoder) detects languages of any model.
        raise ValueError("CTranslate2 cannot detect the language with a vocab-diet model: "
                         "pass --language, or use --engine fast")

    def align(self, encoded: ctranslate2.StorageView, sot_sequence: list[int],
              texts: list[list[int]], num_frames: list[int]) -> list:
        """CTranslate2's cross-attention alignment (DTW over the alignment heads) of each
        encoded window's text tokens, ``num_frames`` mel frames of content each: word
        timing's input (word_timing.py)."""
        if self.vocab is not None:
            sot_sequence = self.vocab.map_ids(sot_sequence)
            texts = [self.vocab.map_ids(self.vocab.encode(text)) for text in texts]
        return self.model.align(encoded, sot_sequence, texts, num_frames,
                                median_filter_width=MEDIAN_FILTER_WIDTH)

    def decode(
        self,
        encoded: ctranslate2.StorageView,
        prompt: list[int],
        options: DecodingOptions,
        temperature: float,
    ) -> WindowResult:
        return self.decode_batch(encoded, [prompt], options, temperature)[0]

    def decode_batch(
        self,
        encoded: ctranslate2.StorageView,
        prompts: list[list[int]],
        options: DecodingOptions,
        temperature: float = 0.0,
    ) -> list[WindowResult]:
        """Decode every encoded window with its prompt; one generate call shares the steps."""
        if temperature > 0:
            search = dict(beam_size=1, num_hypotheses=options.best_of, sampling_topk=0,
                          sampling_temperature=temperature)
        else:
            search = dict(beam_size=options.beam_size, patience=options.patience)
        suppress = self.tokenizer.suppressed_tokens(options.suppress_tokens,
                                                     self.default_suppress_ids)
        if self.vocab is not None:
            prompts = [self.vocab.map_ids(self.vocab.encode(prompt)) for prompt in prompts]
            suppress = self.vocab.map_kept(suppress)
        results = self.model.generate(
            encoded, prompts, length_penalty=options.length_penalty,
            # CTranslate2's Whisper stops after max_length // 2 new tokens (measured: 227 ->
            # 113, 240 -> 120), so len(prompt) + 224 cut dense windows at ~113 tokens;
            # faster-whisper passes 448 for Whisper's 224.
            max_length=2 * options.max_new_tokens,
            return_scores=True, return_no_speech_prob=True,
            suppress_blank=options.suppress_blank, suppress_tokens=suppress,
            max_initial_timestamp_index=round(options.max_initial_timestamp / TIME_PER_TIMESTAMP),
            **search,
        )
        windows = []
        for result in results:
            best = int(np.argmax(result.scores)) if temperature > 0 else 0
            tokens = result.sequences_ids[best]
            if self.vocab is not None:
                tokens = self.vocab.unmap_ids(tokens)
            # CT2 scores are sum(logprob) / len**length_penalty; Whisper averages over len + 1
            # (the end-of-text token counts).
            total = result.scores[best] * len(tokens) ** options.length_penalty
            windows.append(WindowResult(tokens, total / (len(tokens) + 1), result.no_speech_prob))
        return windows

    def transcribe(
        self,
        audio: AudioSource,
        options: TranscribeOptions = TranscribeOptions(),
        progress: bool | None = None,
        vad_filter: bool | VadFilterOptions = False,
        on_segment: Callable[[Segment], None] | None = None,
    ) -> Transcription:
        """``vad_filter``: decode only the speech silero VAD finds (vad_filter.py);
        ``on_segment``: called with each segment as its window is done (longform.py; batched
        chunks: all at the end)."""
        audio = load_audio(audio)
        if vad_filter:
            return transcribe_speech(
                lambda speech, each: self.transcribe(speech, options, progress, False, each),
                audio, vad_options(vad_filter), on_segment)
        if options.batch_size:
            result = transcribe_batched(self, audio, options, progress)
            for segment in result.segments if on_segment else []:
                on_segment(segment)
            return result
        return transcribe_audio(self, audio, options, progress, on_segment)
