"""The ASR gate's noise floor: how far apart do candidates that compute the same thing land?

Rounding variants of one model (CTranslate2 int8 and fp32, the fused int8 engine, the fp32
eager reference) differ only in arithmetic, so any WER delta between them and the gate's
baseline is noise: which packs a rounding change happens to flip, under which draw of the
augmentation noise. This study measures that spread, for the full sentence set and for one
half (what a sweep selects on), over several seeds of the noise augmentation, and derives
the gate's limits from it (configs/gates.yaml says how).

    python evals/gate_floor.py [--seeds 4] [--threads 2]

Writes evals/gate_floor.json and prints the table pasted into evals/gate_floor.md.

``--candidates SPEC ...`` judges other specs beside the equivalents under the same draws,
e.g. whether a candidate that passed the gate at seed 0 stays inside the floor at others:

    python evals/gate_floor.py --first-seed 1 --seeds 2 --full-only \
        --candidates fast:runs/qad/gptq-int4-varied@int4-kv8 --out /tmp/floor.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from audiofast.eval.gate import gate_texts, load_config
from audiofast.eval.roundtrip import CachedASR, bootstrap_delta, build_eval_audio, score
from audiofast.sweep.split import split_texts

BASELINE = "whisper-base"  # the gate's baseline: CTranslate2 int8
EQUIVALENTS = {"ct2 fp32": "whisper-base@float32", "fused int8": "fast:whisper-base",
               "fp32 reference": "fast:whisper-base@fp32"}


def null_deltas(texts: list[str], voices: tuple[str, ...], augmentation: str, seed: int,
                threads: int, candidates: dict[str, str] = EQUIVALENTS) -> list[dict]:
    """Delta (and its paired-bootstrap 95% interval) of every candidate vs the baseline."""
    items = build_eval_audio(texts, voices, augmentation, anchors=False, seed=seed)
    base = score(CachedASR(BASELINE, threads), items, "baseline")
    rows = []
    for label, spec in candidates.items():
        cand = score(CachedASR(spec, threads), items, label)
        delta, lo, hi = bootstrap_delta(cand, base, seed=seed)
        rows.append({"candidate": label, "spec": spec, "seed": seed, "sentences": len(texts),
                     "delta": delta, "ci_low": lo, "ci_high": hi})
    return rows


def quantile(values: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(values), q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--full-only", action="store_true", help="not the sweep's half set")
    parser.add_argument("--candidates", nargs="*", default=[],
                        help="specs judged beside the equivalents")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("gate_floor.json"))
    args = parser.parse_args()
    cfg = load_config()["asr"]
    full = gate_texts(load_config())
    half, _ = split_texts(full, "even")
    voices = tuple(cfg["voices"])
    candidates = EQUIVALENTS | {spec: spec for spec in args.candidates}
    rows = []
    for seed in tqdm(range(args.first_seed, args.first_seed + args.seeds), desc="seeds"):
        for texts in (full,) if args.full_only else (full, half):
            rows += null_deltas(texts, voices, cfg["augmentation"], seed, args.threads,
                                candidates)
    summary = {}
    for n in (len(full),) if args.full_only else (len(full), len(half)):
        sub = [r for r in rows if r["sentences"] == n and r["spec"] in EQUIVALENTS.values()]
        deltas = [r["delta"] for r in sub]
        highs = [r["ci_high"] for r in sub]
        summary[n] = {"runs": len(sub), "delta_mean": float(np.mean(deltas)),
                      "delta_sd": float(np.std(deltas, ddof=1)), "delta_max": max(deltas),
                      "delta_q95": quantile(deltas, 0.95), "ci_high_max": max(highs),
                      "ci_high_q95": quantile(highs, 0.95)}
    args.out.write_text(json.dumps({"baseline": BASELINE, "augmentation": cfg["augmentation"],
                               "voices": list(voices), "rows": rows,
                               "summary": summary}, indent=2))
    print("| candidate | sentences | seed | delta (pts) | 95% CI (pts) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['candidate']} | {r['sentences']} | {r['seed']} | {100 * r['delta']:+.2f} | "
              f"[{100 * r['ci_low']:+.2f}, {100 * r['ci_high']:+.2f}] |")
    print("\n| sentences | runs | delta mean | delta sd | delta q95 | delta max | "
          "CI-high q95 | CI-high max |")
    print("|---|---|---|---|---|---|---|---|")
    for n, s in summary.items():
        print(f"| {n} | {s['runs']} | {100 * s['delta_mean']:+.2f} | {100 * s['delta_sd']:.2f} | "
              f"{100 * s['delta_q95']:+.2f} | {100 * s['delta_max']:+.2f} | "
              f"{100 * s['ci_high_q95']:+.2f} | {100 * s['ci_high_max']:+.2f} |")
    if args.full_only:
        return
    ratio = summary[len(half)]["delta_sd"] / max(summary[len(full)]["delta_sd"], 1e-9)
    print(f"\nsd(half) / sd(full) = {ratio:.2f} (sqrt of the size ratio: "
          f"{math.sqrt(len(full) / len(half)):.2f})")


if __name__ == "__main__":
    main()
