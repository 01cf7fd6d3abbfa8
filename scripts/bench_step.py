"""What one decoder step costs per precision: the fused call alone, one token, one sequence.

``scripts/bench_asr.py``'s decoder ms/token is a whole transcription's decoder time per
token: each window's cross-attention K/V projection, the prompt, the logit rules and the
steps. This times the step alone (one row after a prompt, on a window of real encoder
output) for several decoders in one process, interleaved in a new order every repeat so
drift in machine load hits all alike; median of ``--repeats``. A decoder is a fused
precision of ``--model`` or ``PRECISION@FOLDER`` (a vocab-diet or QAD export).

    python scripts/bench_step.py --decoders int8 int8-head4-kv8 \
        int8-head4-kv8@runs/vocab_alpha/whisper-base-diet32000-s0 --frames 500 1500
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import numpy as np
from bench_verify import time_calls  # scripts/ is on the path when run as a script

from audiofast.asr.features import log_mel_spectrogram, pad_or_trim
from audiofast.asr.runtime import load_model
from audiofast.audio import load_audio
from audiofast.eval.datasets import real_speech_clips


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for frames in sorted({r["frames"] for r in results}):
        pts = [r for r in results if r["frames"] == frames]
        ax.barh([f"{r['decoder']} ({frames} fr)" for r in pts], [r["ms"] for r in pts])
    ax.set(xlabel="ms per step (median)", title="one decoder step, one token")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="whisper-base")
    parser.add_argument("--decoders", nargs="+", default=["int8", "int8-head4-kv8"],
                        help="PRECISION (of --model) or PRECISION@FOLDER")
    parser.add_argument("--frames", nargs="+", type=int, default=[500, 1500])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("results/bench_step.json"))
    args = parser.parse_args()
    audio = load_audio(next(iter(real_speech_clips())).audio)
    steps = {}
    for spec in args.decoders:
        precision, _, folder = spec.partition("@")
        runtime = load_model(folder or args.model, "fast", threads=args.threads,
                             precision=precision)
        engine, tok = runtime.engine, runtime.tokenizer
        prompt = tok.prompt([], "en", "transcribe", timestamps=True)
        fed = len(prompt)
        token = tok.encode(" It")[:1]
        mel = log_mel_spectrogram(audio, runtime.n_mels)
        for frames in args.frames:
            state = engine.sequence(np.asarray(runtime.encode(pad_or_trim(mel, frames))))
            engine.forward_batch([(state, prompt, 0, 1)])
            steps[(spec, frames)] = (lambda e=engine, s=state, n=fed, t=token:
                                     e.forward_batch([(s, t, n, 0)]))
    medians = time_calls(steps, args.repeats)  # interleaved, reshuffled every repeat
    results = []
    print(f"{'decoder':<60} {'frames':>6} {'ms/step':>8} {'vs first':>8}")
    for frames in args.frames:
        first = medians[(args.decoders[0], frames)]
        for spec in args.decoders:
            ms = 1000 * medians[(spec, frames)]
            results.append({"decoder": spec, "frames": frames, "ms": ms,
                            "speedup": 1000 * first / ms})
            print(f"{spec:<60} {frames:6d} {ms:8.2f} {1000 * first / ms:7.2f}x")
    record = {"model": args.model, "threads": args.threads, "repeats": args.repeats,
              "machine": platform.processor() or platform.machine(), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and its plot")


if __name__ == "__main__":
    main()
