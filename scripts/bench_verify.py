"""What a draft verify call costs: the fused decoder called with k rows vs a 1-row step.

Speculative decoding pays only if verifying k drafted tokens in one call costs little more
than one step. Each row here is one token of one sequence (quantized and attended alone, so
the rows' logits equal k single steps bit for bit); the call is timed at several encoder
window lengths (cross-attention K/V grow with the frames) on real encoder output.

    python scripts/bench_verify.py --model whisper-base --rows 1 2 4 8 --frames 500 1000 1500
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from audiofast.asr.features import log_mel_spectrogram, pad_or_trim
from audiofast.asr.runtime import load_model
from audiofast.audio import load_audio
from audiofast.eval.datasets import real_speech_clips


def time_calls(engine, calls: dict[int, np.ndarray], start: int, repeats: int
               ) -> dict[int, float]:
    """Median seconds per call for each row count, the counts interleaved in every repeat
    (so drift in machine load hits all alike), after one warm-up each."""
    times: dict[int, list[float]] = {rows: [] for rows in calls}
    for repeat in range(repeats + 1):
        for rows, tokens in calls.items():
            t0 = time.perf_counter()
            engine(tokens, start, rowwise=True)
            if repeat:
                times[rows].append(time.perf_counter() - t0)
    return {rows: statistics.median(ts) for rows, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="whisper-base")
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--frames", nargs="+", type=int, default=[500, 1000, 1500])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("results/bench_verify.json"))
    args = parser.parse_args()
    runtime = load_model(args.model, "fast", threads=args.threads)
    engine, tok = runtime.engine, runtime.tokenizer
    clip = next(c for c in real_speech_clips() if c.name == "two_cities")
    mel = log_mel_spectrogram(load_audio(clip.audio), runtime.n_mels)
    prompt = tok.prompt([], "en", "transcribe", timestamps=True)
    text = tok.encode(" It was the best of times, it was the worst of times, it was the age")
    results = []
    print(f"{'frames':>6} {'rows':>4} {'ms/call':>8} {'x 1-row':>8} {'ms/row':>7}")
    for frames in args.frames:
        engine.set_audio(runtime.encode(pad_or_trim(mel, frames)))
        engine(prompt, 0)  # the cache holds a prompt, as in decoding
        medians = time_calls(engine, {rows: np.array(text[:rows]) for rows in args.rows},
                             len(prompt), args.repeats)
        one = medians[args.rows[0]]
        for rows, seconds in medians.items():
            results.append({"frames": frames, "rows": rows, "ms": 1000 * seconds,
                            "ratio": seconds / one})
            print(f"{frames:6d} {rows:4d} {1000 * seconds:8.2f} {seconds / one:8.2f} "
                  f"{1000 * seconds / rows:7.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": args.model, "threads": args.threads,
                                    "machine": platform.processor() or platform.machine(),
                                    "results": results}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
