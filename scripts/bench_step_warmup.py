"""How a decoder step's time recovers after the decoder stops for a while.

A transcription alternates: encode a window (tens to hundreds of ms), then decode its tokens
one step at a time. On a shared VM the steps right after such a pause ran 2-3x slower than at
steady state and took ~10 steps to recover, whatever the pause did - run the encoder, sweep
memory, spin in Python, or sleep. This times the fused decoder's 1-row step after each kind
of pause, interleaved with steady-state steps, so the warm-up cost per window is measured
rather than guessed.

    python scripts/bench_step_warmup.py --model whisper-base --frames 1500 --repeats 5
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

STEPS = 12


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for row in results:
        ax.plot(range(1, STEPS + 1), row["step_ms"], "o-", label=row["pause"])
    ax.set(xlabel="step after the pause", ylabel="ms per 1-row step (median)", ylim=(0, None))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="whisper-base")
    parser.add_argument("--frames", type=int, default=1500)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("results/bench_step_warmup.json"))
    args = parser.parse_args()
    runtime = load_model(args.model, "fast", threads=args.threads)
    engine, tok = runtime.engine, runtime.tokenizer
    clip = next(iter(real_speech_clips()))
    mel = pad_or_trim(log_mel_spectrogram(load_audio(clip.audio), runtime.n_mels), args.frames)
    state = engine.sequence(np.asarray(runtime.encode(mel)))
    prompt = tok.prompt([], "en", "transcribe", timestamps=True)
    engine.forward_batch([(state, prompt, 0, 1)])
    token = tok.encode(" It")[:1]
    memory = np.ones(64 << 20, np.float32)  # 256 MB, more than the L3

    def steps() -> list[float]:
        times = []
        for _ in range(STEPS):
            t0 = time.perf_counter()
            engine.forward_batch([(state, token, len(prompt), 0)])
            times.append(1000 * (time.perf_counter() - t0))
        return times

    def spin(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    pauses = {"none": lambda: None, "encoder": lambda: runtime.encode(mel),
              "sweep 256 MB": lambda: np.add(memory, 1, out=memory),
              "spin 50 ms": lambda: spin(0.05), "sleep 50 ms": lambda: time.sleep(0.05),
              "spin 5 ms": lambda: spin(0.005)}
    for _ in range(100):  # steady state first
        engine.forward_batch([(state, token, len(prompt), 0)])
    runs: dict[str, list[list[float]]] = {name: [] for name in pauses}
    for _ in range(args.repeats):
        for name, pause in pauses.items():
            steps()  # back to steady state
            pause()
            runs[name].append(steps())
    print(f"{'after':>13} " + " ".join(f"{i + 1:>5}" for i in range(STEPS)) + "  excess ms")
    results = []
    for name, series in runs.items():
        medians = [statistics.median(s[i] for s in series) for i in range(STEPS)]
        results.append({"pause": name, "step_ms": medians})
    steady = statistics.median(results[0]["step_ms"])
    for row in results:
        row["excess_ms"] = sum(t - steady for t in row["step_ms"])
        print(f"{row['pause']:>13} " + " ".join(f"{t:5.2f}" for t in row["step_ms"]) +
              f"  {row['excess_ms']:9.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": args.model, "frames": args.frames,
                                    "threads": args.threads, "repeats": args.repeats,
                                    "machine": platform.processor() or platform.machine(),
                                    "steady_ms": steady, "results": results}, indent=2))
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
