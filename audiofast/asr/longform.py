"""Whisper's long-form loop: 30 s windows, seeking by the last predicted timestamp.

The loop is independent of the runtime: anything with ``encode`` / ``decode`` (a
:class:`WindowDecoder`) plugs in, so the CTranslate2 baseline and faster engines share it.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
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
from audiofast.asr.hallucination import find_hallucination
from audiofast.asr.options import DecodingOptions, TranscribeOptions
from audiofast.asr.tokenizer import TIME_PER_TIMESTAMP, WhisperTokenizer
from audiofast.asr.types import Segment, Transcription
from audiofast.asr.word_timing import (
    keep_within_segment,
    median_word_s,
    trim_pauses,
    words_from_alignment,
)
from audiofast.audio import SAMPLE_RATE

FRAMES_PER_TIMESTAMP = round(TIME_PER_TIMESTAMP * FRAMES_PER_SECOND)  # 2 mel frames
MAX_TOKENS_PER_SECOND = 8  # fast speech is ~4-5 tokens/s; more means a loop or invented text


@dataclass
class WindowResult:
    tokens: list[int]  # generated tokens, prompt excluded, no end-of-text
    avg_logprob: float
    no_speech_prob: float
    temperature: float = 0.0
    compression_ratio: float = 0.0


class WindowDecoder(Protocol):
    tokenizer: WhisperTokenizer
    n_mels: int

    def encode(self, mel_window: np.ndarray) -> Any: ...

    def detect_language(self, encoded: Any) -> tuple[str, float]: ...

    def decode(
        self, encoded: Any, prompt: list[int], options: DecodingOptions, temperature: float
    ) -> WindowResult: ...

    def align(self, encoded: Any, sot_sequence: list[int], texts: list[list[int]],
              num_frames: list[int]) -> list: ...


def compression_ratio(text: str) -> float:
    """Bytes over zlib-compressed bytes: high for the loops Whisper falls into."""
    raw = text.encode("utf-8")
    return len(raw) / len(zlib.compress(raw)) if raw else 0.0


def passes_checks(result: WindowResult, options: TranscribeOptions) -> bool:
    """Whisper's fallback test: the text is neither repetitive nor unsure, or it is silence."""
    too_repetitive = (
        options.compression_ratio_threshold is not None
        and result.compression_ratio > options.compression_ratio_threshold
    )
    too_unsure = (
        options.log_prob_threshold is not None and result.avg_logprob < options.log_prob_threshold
    )
    is_silence = (
        options.no_speech_threshold is not None
        and result.no_speech_prob > options.no_speech_threshold
        and too_unsure
    )
    return is_silence or not (too_repetitive or too_unsure)


def fits_window(result: WindowResult, window_frames: int) -> bool:
    """Whether the window's audio could hold this many tokens. A window holding a fraction of
    a second (a chunk's tail) came back as a whole invented sentence that passed Whisper's
    checks (two_cities, batched: log-prob -0.87), on a shortened and on a standard window
    alike; such a window is decoded again on a standard one, and dropped if it still fails."""
    seconds = window_frames / FRAMES_PER_SECOND
    return len(result.tokens) <= MAX_TOKENS_PER_SECOND * seconds + 10


def decode_with_fallback(
    runtime: WindowDecoder, encoded: Any, prompt: list[int], options: TranscribeOptions,
    temperatures: tuple[float, ...] | None = None,
) -> WindowResult:
    """Decode at temperature 0; retry hotter while the output looks repetitive or unsure. If
    every temperature fails, keep the attempt with the best average log-prob among those that
    are not repetitive (as faster-whisper does; the last, hottest sample is usually the
    worst), marked with the last temperature so the next window's prompt starts afresh.
    ``temperatures``: a prefix of ``options.temperatures`` to stop after."""
    attempts: list[WindowResult] = []
    for temperature in temperatures or options.temperatures:
        result = runtime.decode(encoded, prompt, options, temperature)
        result.temperature = temperature
        result.compression_ratio = compression_ratio(runtime.tokenizer.decode(result.tokens))
        if passes_checks(result, options):
            return result
        attempts.append(result)
    assert attempts, "options.temperatures must not be empty"
    threshold = options.compression_ratio_threshold
    fluent = [a for a in attempts if threshold is None or a.compression_ratio <= threshold]
    best = max(fluent or attempts, key=lambda a: a.avg_logprob)
    best.temperature = attempts[-1].temperature
    return best


def split_segments(
    tokens: list[int], tokenizer: WhisperTokenizer, time_offset: float, window_frames: int
) -> tuple[list[tuple[float, float, list[int]]], int]:
    """Cut a window's tokens at timestamp pairs; return (start, end, tokens) and frames consumed."""
    ts = tokenizer.timestamp_begin
    ends_with_single_timestamp = len(tokens) >= 2 and tokens[-2] < ts <= tokens[-1]
    boundaries = [i for i in range(1, len(tokens)) if tokens[i] >= ts and tokens[i - 1] >= ts]
    if not boundaries:
        timestamps = [t for t in tokens if t >= ts]
        duration = window_frames / FRAMES_PER_SECOND
        if timestamps and timestamps[-1] != ts:
            duration = (timestamps[-1] - ts) * TIME_PER_TIMESTAMP
        return [(time_offset, time_offset + duration, tokens)], window_frames

    if ends_with_single_timestamp:
        boundaries.append(len(tokens))
    pieces, last = [], 0
    for cut in boundaries:
        piece = tokens[last:cut]
        start = time_offset + (piece[0] - ts) * TIME_PER_TIMESTAMP
        end = time_offset + (piece[-1] - ts) * TIME_PER_TIMESTAMP
        pieces.append((start, end, piece))
        last = cut
    if ends_with_single_timestamp:
        return pieces, window_frames
    consumed = (tokens[last - 1] - ts) * FRAMES_PER_TIMESTAMP
    return pieces, consumed if consumed > 0 else window_frames


def encoder_frames(window_frames: int, pad: float | None, bucket_s: float = 2.0) -> int:
    """Mel frames to encode for a window of ``window_frames`` content frames: 30 s, or with
    ``pad`` the content plus ``pad`` seconds rounded up to ``bucket_s`` (few distinct shapes)."""
    if pad is None:
        return N_FRAMES
    seconds = window_frames / FRAMES_PER_SECOND + pad
    return min(N_FRAMES, math.ceil(seconds / bucket_s) * round(bucket_s * FRAMES_PER_SECOND))


def accept_window(
    result: WindowResult, tok: WhisperTokenizer, seek: int, window_frames: int, duration: float,
    options: TranscribeOptions, history: list[int], segments: list[Segment],
) -> int:
    """Append a decoded window's segments (and their tokens to ``history``, the next window's
    prompt); return the mel frames it consumed (a cut-off tail is decoded again)."""
    is_silence = (
        options.no_speech_threshold is not None
        and result.no_speech_prob > options.no_speech_threshold
        and not (
            options.log_prob_threshold is not None
            and result.avg_logprob > options.log_prob_threshold
        )
    )
    if is_silence or not fits_window(result, window_frames):  # silence, or invented text
        return window_frames
    pieces, consumed = split_segments(result.tokens, tok, seek / FRAMES_PER_SECOND, window_frames)
    for start, end, piece in pieces:
        text = tok.decode(piece)
        history += piece  # only what was consumed
        if not text.strip() or end <= start or start >= duration:
            continue  # empty, zero-length, or timestamped past the end of the audio
        segments.append(
            Segment(
                id=len(segments), seek=seek, start=round(start, 3),
                end=round(min(end, duration), 3), text=text, tokens=piece,
                avg_logprob=result.avg_logprob, compression_ratio=result.compression_ratio,
                no_speech_prob=result.no_speech_prob, temperature=result.temperature,
            )
        )
    if result.temperature > 0.5:  # a hot (unsure) window is a poor prompt for the next one
        history.clear()
    return consumed


def time_words(runtime: WindowDecoder, encoded: Any, segments: list[Segment],
               window_frames: int, seek: int, sot_sequence: list[int]) -> None:
    """Set ``words`` on a window's new segments (word_timing.py)."""
    joined = [t for s in segments for t in s.tokens if t < runtime.tokenizer.eot]
    if not joined:
        return
    alignment = runtime.align(encoded, sot_sequence, [joined], [window_frames])[0]
    per_segment = words_from_alignment(alignment, runtime.tokenizer,
                                       [s.tokens for s in segments], seek / FRAMES_PER_SECOND)
    window_end = (seek + window_frames) / FRAMES_PER_SECOND  # the path may run into padding
    timed = trim_pauses([replace(w, start=min(w.start, window_end), end=min(w.end, window_end))
                         for words in per_segment for w in words])
    median_s = median_word_s(timed)
    for segment, words in zip(segments, per_segment, strict=True):
        mine, timed = timed[: len(words)], timed[len(words):]
        segment.words = keep_within_segment(mine, segment.start, segment.end, median_s)
        if words:  # the words' times are finer than the timestamp tokens'
            segment.start, segment.end = segment.words[0].start, segment.words[-1].end


def given_language(tok: WhisperTokenizer, options: TranscribeOptions) -> str | None:
    """The language to decode in before any detection: the one asked for, "en" on an
    English-only model (which refuses any other), None to detect."""
    if tok.multilingual:
        return options.language
    if options.language not in (None, "en"):
        raise ValueError(f"this model is English-only; cannot transcribe {options.language!r}")
    return "en"


def transcribe_audio(
    runtime: WindowDecoder,
    audio: np.ndarray,
    options: TranscribeOptions = TranscribeOptions(),
    progress: bool | None = None,
    on_segment: Callable[[Segment], None] | None = None,
) -> Transcription:
    """Transcribe 16 kHz mono audio of any length. ``on_segment`` is called with each segment
    as soon as its window is decoded (and checked: a skipped hallucination never reaches it),
    for callers that stream results while the rest of the file decodes."""
    tok = runtime.tokenizer
    duration = len(audio) / SAMPLE_RATE
    mel = log_mel_spectrogram(audio, runtime.n_mels, padding=N_SAMPLES)
    content_frames = mel.shape[-1] - N_FRAMES
    stats = {"encoder_s": 0.0, "decoder_s": 0.0, "windows": 0, "tokens": 0}

    language, language_prob = given_language(tok, options), 1.0

    history = tok.encode(" " + options.initial_prompt.strip()) if options.initial_prompt else []
    segments: list[Segment] = []
    seek = 0
    show_progress = progress if progress is not None else duration >= 60
    bar = tqdm(total=round(duration, 2), unit="s", desc="transcribing", disable=not show_progress)
    while seek < content_frames:
        window_frames = min(N_FRAMES, content_frames - seek)
        # Only a file's first window is ever shortened: the last window of a long one,
        # prompted by the text before it, can end early on a short encode (two_cities, tiny.en
        # beam 5, lost its last clause; docs/transcribe.md).
        input_frames = encoder_frames(window_frames, options.window_pad if seek == 0 else None)
        if language is None:  # language detection on a shortened window guessed Welsh for
            input_frames = N_FRAMES  # 4 s of English: detect on a standard 30 s window
        while True:
            # Whisper pads a short window in mel space (zeros), not with silent audio.
            window = pad_or_trim(mel[:, seek : seek + window_frames], input_frames)
            t0 = time.perf_counter()
            encoded = runtime.encode(window)
            stats["encoder_s"] += time.perf_counter() - t0
            if language is None:
                language, language_prob = runtime.detect_language(encoded)

            t0 = time.perf_counter()
            prompt = tok.prompt(
                history if options.condition_on_previous_text else [],
                language, options.task, timestamps=not options.without_timestamps,
            )
            # A shortened window gets one (greedy) try: if it fails its checks (Whisper saw 30 s
            # in training and sometimes loops on less), the window is decoded again the
            # standard way, fallback temperatures included. Sampling the short window first
            # (as this loop did) never changed the outcome - any fallback on it sent the
            # window to 30 s anyway - and cost 5 s on one window of the long bench file.
            short = input_frames != N_FRAMES
            result = decode_with_fallback(runtime, encoded, prompt, options,
                                          options.temperatures[:1] if short else None)
            stats["decoder_s"] += time.perf_counter() - t0
            if not short or (passes_checks(result, options)
                             and fits_window(result, window_frames)):
                break
            input_frames = N_FRAMES
            stats["full_window_retries"] = stats.get("full_window_retries", 0) + 1
        stats["windows"] += 1
        stats["tokens"] += len(result.tokens) + 1  # + end-of-text

        first_new, history_length = len(segments), len(history)
        consumed = accept_window(result, tok, seek, window_frames, duration, options,
                                 history, segments)
        threshold = options.hallucination_silence_threshold
        if (options.word_timestamps or threshold is not None) and len(segments) > first_new:
            t0 = time.perf_counter()
            time_words(runtime, encoded, segments[first_new:], window_frames, seek,
                       tok.sot_sequence(language, options.task, timestamps=True))
            stats["align_s"] = stats.get("align_s", 0.0) + time.perf_counter() - t0
            # The timestamp tokens can end seconds before the words they close: the next
            # window starts after the last timed word, so no word is heard twice (not at it,
            # as openai-whisper does: that re-heard the tail of a final "No." as another).
            consumed = max(consumed, round(segments[-1].end * FRAMES_PER_SECOND) - seek)
        if threshold is not None and len(segments) > first_new:
            start = seek / FRAMES_PER_SECOND
            skip = find_hallucination(segments[first_new:], start,
                                      start + window_frames / FRAMES_PER_SECOND, threshold,
                                      segments[first_new - 1].end if first_new else 0.0,
                                      duration)
            if skip is not None:  # drop the suspect and what followed; decode on from skip
                del segments[first_new + skip.keep:]
                del history[history_length:]
                history += [t for s in segments[first_new:] for t in s.tokens]
                consumed = max(1, round(skip.resume * FRAMES_PER_SECOND) - seek)
                stats["hallucinations_skipped"] = stats.get("hallucinations_skipped", 0) + 1
        if on_segment is not None:
            for segment in segments[first_new:]:
                on_segment(segment)
        seek += consumed
        bar.update(round(min(seek, content_frames) / FRAMES_PER_SECOND - bar.n, 2))
    bar.close()
    return Transcription(segments, language or "en", language_prob, duration, stats)
