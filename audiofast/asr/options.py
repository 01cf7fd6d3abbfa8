"""Options in two layers, as openai-whisper has them: how one 30-second window is decoded
(``DecodingOptions``: what the window decoders read) and how a file of any length is
transcribed (``TranscribeOptions``: the window loop's fallback, prompting, padding, chunking
and word timing, on top of the window's options). The defaults are what users of
openai-whisper / faster-whisper expect, plus two of ours (short windows padded by 2 s,
batched chunks of 25 s); the CLI's defaults are these."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodingOptions:
    """One window: the search and the logit rules."""

    language: str | None = None  # None: detect (multilingual models) or "en"
    task: str = "transcribe"
    beam_size: int = 1  # greedy by default: it is the speed lane's baseline
    best_of: int = 5  # samples drawn per window when decoding at temperature > 0
    patience: float = 1.0
    length_penalty: float = 1.0
    without_timestamps: bool = False
    max_initial_timestamp: float = 1.0  # seconds
    suppress_blank: bool = True
    suppress_tokens: tuple[int, ...] = (-1,)  # -1: the model's own list (config.json)
    max_new_tokens: int = 224  # Whisper's text context is 448 and the prompt takes up to half


@dataclass(frozen=True)
class TranscribeOptions(DecodingOptions):
    """A whole file: every window's options plus the loop around the windows."""

    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # fallback, in order
    compression_ratio_threshold: float | None = 2.4  # above: repetitive, retry hotter
    log_prob_threshold: float | None = -1.0  # below: unsure, retry hotter
    no_speech_threshold: float | None = 0.6  # above (and unsure): skip the window as silence
    condition_on_previous_text: bool = True
    initial_prompt: str | None = None
    word_timestamps: bool = False  # each segment's words timed by cross-attention (DTW)
    # Seconds: a segment whose timed words look unlike speech, next to a silence longer than
    # this, is taken for a hallucination and skipped (hallucination.py; times words).
    hallucination_silence_threshold: float | None = None
    # Seconds of silence after a file's audio when it is shorter than 30 s (the sequential
    # loop's first window; the batched loop's chunks): the encoder then runs on content + pad
    # instead of 30 s. None: always 30 s (openai-whisper's way). 2 s passed the judge's gate
    # (docs/transcribe.md).
    window_pad: float | None = 2.0
    # Independent chunks of at most chunk_length seconds, cut at quiet frames and decoded
    # batch_size at a time (batched.py); 0: Whisper's sequential loop (longform.py).
    batch_size: int = 0
    chunk_length: float = 25.0
