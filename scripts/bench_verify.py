"""What a decoder call costs with more rows: drafted tokens of one sequence, and sessions.

Speculative decoding pays only if verifying k drafted tokens in one call costs little more
than one step, and batching live sessions pays only if one call for S sessions costs less
than S calls. Each row here is one token of one sequence (quantized and attended alone, so
every row's logits equal a single step's bit for bit); each session has its own cache and
its own window of real encoder output (cross-attention K/V grow with the frames). Timed: the
fused call with S sessions x R rows, against a 1-session 1-row step and against the S
sessions called one after the other.

    python scripts/bench_verify.py --model whisper-base --sessions 1 2 4 8 --rows 1 2 4 8
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import random
import statistics
import time
from pathlib import Path

import numpy as np

from audiofast.asr.features import log_mel_spectrogram, pad_or_trim
from audiofast.asr.runtime import load_model
from audiofast.audio import load_audio
from audiofast.eval.datasets import real_speech_clips


def time_calls(calls: dict[tuple[int, int], callable], repeats: int
               ) -> dict[tuple[int, int], float]:
    """Median seconds per call of each shape, the shapes interleaved in every repeat (so
    drift in machine load hits all alike) in a new order each time (a call right after an
    8 x 8 one ran up to 2x slower here: no shape always follows the same one), after one
    warm-up each."""
    times: dict[tuple[int, int], list[float]] = {key: [] for key in calls}
    order = list(calls)
    for repeat in range(repeats + 1):
        random.Random(repeat).shuffle(order)
        for key in order:
            t0 = time.perf_counter()
            calls[key]()
            if repeat:
                times[key].append(time.perf_counter() - t0)
    return {key: statistics.median(ts) for key, ts in times.items()}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frames = sorted({r["frames"] for r in results})
    fig, axes = plt.subplots(1, len(frames), figsize=(4.2 * len(frames), 3.6), sharey=True)
    for ax, f in zip(np.atleast_1d(axes), frames, strict=True):
        for rows in sorted({r["rows"] for r in results}):
            pts = [r for r in results if r["frames"] == f and r["rows"] == rows]
            ax.plot([r["sessions"] for r in pts], [r["ratio"] for r in pts], "o-",
                    label=f"{rows} row(s)/session")
        ax.plot([1, max(r["sessions"] for r in results)],
                [1, max(r["sessions"] for r in results)], "k:", label="S separate steps")
        ax.set(title=f"{f} frames", xlabel="sessions in the call", xscale="log", yscale="log")
        ax.set_xticks(sorted({r["sessions"] for r in results}), minor=False)
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.get_xaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())
    np.atleast_1d(axes)[0].set_ylabel("call time / 1-row step")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="whisper-base")
    parser.add_argument("--precision", default=None, help="the fused decoder's (default int8)")
    parser.add_argument("--sessions", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--frames", nargs="+", type=int, default=[500, 1000, 1500])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--out", type=Path, default=Path("results/bench_verify.json"))
    args = parser.parse_args()
    runtime = load_model(args.model, "fast", threads=args.threads, precision=args.precision)
    engine, tok = runtime.engine, runtime.tokenizer
    clips = list(real_speech_clips())
    prompt = tok.prompt([], "en", "transcribe", timestamps=True)
    text = tok.encode(" It was the best of times, it was the worst of times, it was the age")
    results = []
    print(f"{'frames':>6} {'sessions':>8} {'rows':>4} {'ms/call':>8} {'x 1-row':>8} "
          f"{'x separate':>10} {'ms/row':>7}")
    for frames in args.frames:
        # Every session its own window (its own K/V in memory) and cache, holding a prompt.
        states = []
        for i in range(max(args.sessions)):
            mel = log_mel_spectrogram(load_audio(clips[i % len(clips)].audio), runtime.n_mels)
            state = engine.sequence(np.asarray(runtime.encode(pad_or_trim(mel, frames))))
            engine.forward_batch([(state, prompt, 0, 1)])
            states.append(state)
        calls = {(s, r): (lambda s=s, r=r, states=states: engine.forward_batch(
            [(state, text[:r], len(prompt), 0) for state in states[:s]]))
            for s, r in itertools.product(args.sessions, args.rows)}
        medians = time_calls(calls, args.repeats)
        one = medians[(1, 1)] if (1, 1) in medians else min(medians.values())
        for (s, r), seconds in medians.items():
            separate = s * medians.get((1, r), float("nan"))
            results.append({"frames": frames, "sessions": s, "rows": r, "ms": 1000 * seconds,
                            "ratio": seconds / one, "vs_separate": seconds / separate})
            print(f"{frames:6d} {s:8d} {r:4d} {1000 * seconds:8.2f} {seconds / one:8.2f} "
                  f"{seconds / separate:10.2f} {1000 * seconds / (s * r):7.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": args.model, "precision": engine.precision,
                                    "threads": args.threads,
                                    "machine": platform.processor() or platform.machine(),
                                    "results": results}, indent=2))
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
