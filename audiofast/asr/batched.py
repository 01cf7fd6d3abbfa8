"""Batched long-form transcription: cut the file into independent chunks, decode them together.

Whisper's own loop (longform.py) is sequential: window k+1 starts where window k's last
complete segment ended and is prompted with its text, so every decoder step reads the whole
decoder for one token of one window. Here the audio is cut up front at quiet frames into
chunks of at most ``chunk_length`` seconds, and each chunk runs Whisper's loop of its own
(seek, previous-text prompt, a cut-off tail decoded again) in lock step with the others:
``batch_size`` windows share each encoder call and each decoder step (a step is memory-bound:
one row or eight read the same weights). A window is encoded as its audio + ``window_pad``
seconds; one whose greedy decode fails Whisper's checks is decoded again alone on a standard
30 s window with temperature fallback, as longform.py does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm

from audiofast.asr.features import (
    FRAMES_PER_SECOND,
    N_FRAMES,
    N_SAMPLES,
    log_mel_spectrogram,
    pad_or_trim,
)
from audiofast.asr.longform import (
    WindowDecoder,
    WindowResult,
    accept_window,
    compression_ratio,
    decode_with_fallback,
    encoder_frames,
    fits_window,
    given_language,
    passes_checks,
)
from audiofast.asr.options import DecodingOptions, TranscribeOptions
from audiofast.asr.tokenizer import PROMPT_HISTORY_TOKENS
from audiofast.asr.types import Segment, Transcription
from audiofast.audio import SAMPLE_RATE

CUT_SEARCH_S = 5.0  # a cut lands on the quietest frame of a chunk's last 5 s
LOUDNESS_SMOOTHING = 15  # frames (150 ms): a cut needs a pause, not one quiet frame


class BatchDecoder(WindowDecoder, Protocol):
    def encode_batch(self, mel_windows: np.ndarray) -> Any: ...

    def decode_batch(
        self, encoded: Any, prompts: list[list[int]], options: DecodingOptions
    ) -> list[WindowResult]: ...


def chunk_bounds(mel: np.ndarray, max_frames: int,
                 search_frames: int = round(CUT_SEARCH_S * FRAMES_PER_SECOND),
                 ) -> list[tuple[int, int]]:
    """Cut ``mel`` (n_mels, frames) into [start, end) spans of at most ``max_frames``, each cut
    at the quietest (smoothed mean log-mel) frame of the span's last ``search_frames``."""
    total = mel.shape[-1]
    if total <= max_frames:
        return [(0, total)]
    half = LOUDNESS_SMOOTHING // 2  # a centred moving average, zeros beyond the ends
    loudness = np.convolve(mel.mean(0), np.full(LOUDNESS_SMOOTHING, 1 / LOUDNESS_SMOOTHING),
                           mode="full")[half : half + total]
    bounds, start = [], 0
    while total - start > max_frames:
        low = start + max(1, max_frames - search_frames)
        cut = low + int(loudness[low : start + max_frames].argmin())
        bounds.append((start, cut))
        start = cut
    bounds.append((start, total))
    return bounds


@dataclass(eq=False)  # chunks are compared by identity
class Chunk:
    """One span of the file with its own Whisper loop state."""

    start: int  # mel frames
    end: int
    history: list[int]  # prompt tokens: the chunk's own text
    seek: int = field(init=False)  # next mel frame to decode

    def __post_init__(self) -> None:
        self.seek = self.start


def transcribe_batched(
    runtime: BatchDecoder,
    audio: np.ndarray,
    options: TranscribeOptions,
    progress: bool | None = None,
) -> Transcription:
    """Transcribe 16 kHz mono audio as chunks decoded side by side, ``batch_size`` at a time."""
    if not 0 < options.chunk_length <= 30:
        raise ValueError(f"chunk_length must be in (0, 30] seconds, not {options.chunk_length}")
    if options.batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {options.batch_size}")
    if options.word_timestamps or options.hallucination_silence_threshold is not None:
        raise ValueError("word timestamps (and the hallucination threshold) need Whisper's "
                         "sequential loop: use batch size 0")
    tok = runtime.tokenizer
    duration = len(audio) / SAMPLE_RATE
    mel = log_mel_spectrogram(audio, runtime.n_mels, padding=N_SAMPLES)  # as longform.py
    content_frames = mel.shape[-1] - N_FRAMES
    stats = {"encoder_s": 0.0, "decoder_s": 0.0, "windows": 0, "tokens": 0,
             "full_window_retries": 0}
    language, language_prob = given_language(tok, options), 1.0
    if language is None:  # detected on a standard 30 s window (short ones mislead it)
        t0 = time.perf_counter()
        language, language_prob = runtime.detect_language(runtime.encode(pad_or_trim(mel)))
        stats["encoder_s"] += time.perf_counter() - t0

    initial = tok.encode(" " + options.initial_prompt.strip()) if options.initial_prompt else []
    chunks = [Chunk(start, end, list(initial))
              for start, end in chunk_bounds(mel[:, :content_frames],
                                             round(options.chunk_length * FRAMES_PER_SECOND))]
    stats["chunks"] = len(chunks)
    segments: list[Segment] = []
    show_progress = progress if progress is not None else duration >= 60
    bar = tqdm(total=round(duration, 2), unit="s", desc="transcribing", disable=not show_progress)
    while active := [c for c in chunks if c.seek < c.end]:
        batch = active[: options.batch_size]
        # CTranslate2 batches need start-of-transcript at one position in every prompt: chunks
        # with previous text share the length of the shortest (its most recent tokens), and
        # chunks without any are decoded in a batch of their own.
        with_text = [c for c in batch if c.history] if options.condition_on_previous_text else []
        keep = min([len(c.history) for c in with_text] + [PROMPT_HISTORY_TOKENS])
        for group, history in (([c for c in batch if c not in with_text], 0), (with_text, keep)):
            if group:
                prompts = [tok.prompt(c.history[len(c.history) - history:] if history else [],
                                      language, options.task,
                                      timestamps=not options.without_timestamps) for c in group]
                decode_group(runtime, mel, group, prompts, options, duration, segments, stats)
        done = sum(min(c.seek, c.end) - c.start for c in chunks) / FRAMES_PER_SECOND
        bar.update(round(done - bar.n, 2))
    bar.close()
    segments.sort(key=lambda s: s.start)
    for i, segment in enumerate(segments):
        segment.id = i
    return Transcription(segments, language or "en", language_prob, duration, stats)


def decode_group(runtime: BatchDecoder, mel: np.ndarray, group: list[Chunk],
                 prompts: list[list[int]], options: TranscribeOptions, duration: float,
                 segments: list[Segment], stats: dict) -> None:
    """One window of every chunk in ``group``: one encoder call, one generate call, then each
    chunk's segments, history and seek, as in Whisper's loop."""
    tok = runtime.tokenizer
    spans = [(c.seek, min(c.end, c.seek + N_FRAMES)) for c in group]
    frames = encoder_frames(max(end - start for start, end in spans), options.window_pad)
    t0 = time.perf_counter()
    encoded = runtime.encode_batch(
        np.stack([pad_or_trim(mel[:, start:end], frames) for start, end in spans]))
    t1 = time.perf_counter()
    results = runtime.decode_batch(encoded, prompts, options)
    stats["encoder_s"] += t1 - t0
    stats["decoder_s"] += time.perf_counter() - t1
    for chunk, (start, end), prompt, result in zip(group, spans, prompts, results, strict=True):
        result.compression_ratio = compression_ratio(tok.decode(result.tokens))
        # Whisper saw 30 s windows in training and sometimes loops on less: a window that
        # fails is decoded again alone, the standard way, with temperature fallback (unless
        # that would repeat this very decode: a 30 s window and one temperature).
        retry_differs = frames < N_FRAMES or len(options.temperatures) > 1
        if retry_differs and not (passes_checks(result, options)
                                  and fits_window(result, end - start)):
            stats["full_window_retries"] += 1
            t0 = time.perf_counter()
            full = runtime.encode(pad_or_trim(mel[:, start:end]))
            t1 = time.perf_counter()
            result = decode_with_fallback(runtime, full, prompt, options)
            stats["encoder_s"] += t1 - t0
            stats["decoder_s"] += time.perf_counter() - t1
        stats["windows"] += 1
        stats["tokens"] += len(result.tokens) + 1
        chunk.seek += accept_window(result, tok, start, end - start, duration, options,
                                    chunk.history, segments)
