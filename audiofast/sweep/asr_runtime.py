"""Timing an ASR configuration as ``audiofast transcribe`` would run it: the model built from
the same options (drafter tuning included), PyTorch's threads set per configuration (one
process times several), one untimed warm-up on the shortest clip, then the median of the
timed runs over the real clips with the model loaded (audio decoded beforehand)."""

from __future__ import annotations

import gc
import statistics
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from audiofast.sweep.asr_lane import ASRConfig

_TORCH_THREADS: list[int] = []


def set_threads(c: ASRConfig) -> None:
    """PyTorch's threads for ``c`` (0: the process's own default), before loading or timing:
    one process times several configurations."""
    import torch

    if not _TORCH_THREADS:
        _TORCH_THREADS.append(torch.get_num_threads())
    torch.set_num_threads(c.threads or _TORCH_THREADS[0])


def build_runtime(c: ASRConfig):
    """The model as ``audiofast transcribe`` builds it for these options."""
    from audiofast.asr.runtime import load_model

    set_threads(c)
    if c.engine == "fast":
        runtime = load_model(c.model, "fast", threads=c.threads, precision=c.precision,
                             drafter=c.drafter, draft_model=c.draft_model, encoder=c.encoder)
        tune_drafter(runtime, c.draft_len, c.ngram_order)
        return runtime
    return load_model(c.model, "ct2", threads=c.threads, compute_type=c.compute_type,
                      encoder=c.encoder)


def tune_drafter(runtime, draft_len: int | None = None, ngram_order: int | None = None) -> None:
    """Cap the drafts of ``runtime``'s drafter at ``draft_len`` tokens and its n-gram lookups
    at ``ngram_order`` (lossless either way: drafts are verified)."""
    if draft_len is None and ngram_order is None:
        return
    make = runtime.make_drafter

    def tuned():
        drafter = make()
        if drafter is not None and draft_len is not None:
            drafter.max_draft = draft_len
            drafter.draft_len = min(drafter.draft_len, draft_len)
        if drafter is not None and ngram_order is not None and hasattr(drafter, "max_ngram"):
            drafter.max_ngram = max(ngram_order, drafter.min_ngram)
        return drafter

    runtime.make_drafter = tuned


def decoding_options(c: ASRConfig):
    from audiofast.asr.options import TranscribeOptions

    return TranscribeOptions(beam_size=c.beam_size, window_pad=c.window_pad)


def speed_clips(settings: dict) -> list[tuple[str, Any, str]]:
    """(name, audio, reference) of the timed real clips."""
    from audiofast.audio import load_audio
    from audiofast.eval.datasets import real_speech_clips

    wanted = settings["speed"]["clips"]
    return [(c.name, load_audio(c.audio), c.reference) for c in real_speech_clips()
            if wanted is None or c.name in wanted]


def timed_run(runtime, c: ASRConfig, clips) -> tuple[float, dict[str, str]]:
    options = decoding_options(c)
    start = time.perf_counter()
    texts = {name: runtime.transcribe(audio, options, progress=False).text
             for name, audio, _ in clips}
    return time.perf_counter() - start, texts


def measure_speed(c: ASRConfig, clips, runs: int, warmup: bool = True) -> dict:
    runtime = build_runtime(c)
    if warmup:
        shortest = min(clips, key=lambda clip: len(clip[1]))
        timed_run(runtime, c, [shortest])
    times, texts = [], {}
    for _ in range(runs):
        seconds, texts = timed_run(runtime, c, clips)
        times.append(seconds)
    del runtime
    gc.collect()
    return {"seconds": statistics.median(times), "runs": times, "texts": texts}
