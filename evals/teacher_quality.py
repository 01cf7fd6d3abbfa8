"""Measured quality of the proving-ground teacher: pitch, category and FAD per sampler setting.

    python evals/teacher_quality.py --model evals/teacher --out evals/benchmarks/teacher_quality

Captions come from a held-out synthetic set (a seed training never used); FAD compares against
another held-out set of real synthetic clips. Ceilings are measured the same way on real clips
and on autoencoder reconstructions, so a teacher number reads against what is reachable.
Writes ``<out>.json`` and ``<out>.png`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from audiofast.diffusion.generate import generate, load_for_generation
from audiofast.diffusion.quality import build_judge
from audiofast.diffusion.teacher import CLIP_SECONDS, SynthSet

SETTINGS = [  # (label, sampler, steps, cfg)
    ("pingpong 8, cfg 1", "pingpong", 8, 1.0),
    ("pingpong 8, cfg 3", "pingpong", 8, 3.0),
    ("pingpong 8, cfg 5", "pingpong", 8, 5.0),
    ("euler 50, cfg 1", "euler", 50, 1.0),
    ("euler 50, cfg 5", "euler", 50, 5.0),
]


def evaluate(model_dir: str, clips: int, seed: int, judge_clips: int = 1500,
             judge_steps: int = 300) -> dict:
    torch.set_num_threads(2)
    captions = SynthSet.build(clips, seed=seed + 1000)  # held out: training used seeds 0-101
    reference = SynthSet.build(clips, seed=seed + 2000)
    judge = build_judge(reference, judge_clips, judge_steps)
    rows = [{"setting": "real clips (ceiling)", **judge.score(captions.audio, captions.meta)}]
    model = load_for_generation(model_dir)
    with torch.inference_mode():
        pretransform = model.autoencoder
        recon = torch.cat([pretransform.decode(pretransform.encode(captions.audio[i : i + 32]))
                           for i in range(0, clips, 32)])[..., : captions.audio.shape[-1]]
    rows.append({"setting": "pretransform round trip", **judge.score(recon, captions.meta)})
    for label, sampler, steps, cfg in SETTINGS:
        start = time.perf_counter()
        audio = torch.cat([
            generate(model, captions.captions[i : i + 32], CLIP_SECONDS, steps=steps,
                     cfg_scale=cfg, sampler=sampler, seed=seed + i, progress=False)
            for i in range(0, clips, 32)
        ])
        seconds = time.perf_counter() - start
        rows.append({"setting": label, "sampler": sampler, "steps": steps, "cfg": cfg,
                     "generate_s_per_clip": seconds / clips, **judge.score(audio, captions.meta)})
        print(rows[-1], flush=True)
    return {"model": str(model_dir), "clips": clips, "seed": seed, "rows": rows}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    labels = [r["setting"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, key, title in zip(
        axes, ["pitch_accuracy", "category_accuracy", "fad"],
        ["pitch accuracy (notes, within 0.5 semitone)", "category accuracy",
         "FAD (lower is better)"],
        strict=True,
    ):
        ax.barh(labels, [r[key] for r in rows], color=["grey", "grey"] + ["C0"] * (len(rows) - 2))
        ax.set_title(title, fontsize=9)
        ax.invert_yaxis()
    for ax in axes[1:]:
        ax.set_yticklabels([])
    fig.suptitle(f"proving-ground teacher, {result['clips']} held-out captions")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="evals/teacher")
    parser.add_argument("--clips", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--judge-clips", type=int, default=1500, help="classifier training set")
    parser.add_argument("--judge-steps", type=int, default=300, help="classifier training steps")
    parser.add_argument("--out", default="evals/benchmarks/teacher_quality")
    args = parser.parse_args()
    result = evaluate(args.model, args.clips, args.seed, args.judge_clips, args.judge_steps)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    plot(result, out.with_suffix(".png"))
    print("\n| setting | pitch acc | within 1 st | median err (st) | category acc | FAD "
          "| s/clip |")
    print("|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        print(f"| {r['setting']} | {r['pitch_accuracy']:.2f} | "
              f"{r['pitch_within_1_semitone']:.2f} | "
              f"{r['pitch_median_error_semitones']:.2f} | {r['category_accuracy']:.2f} | "
              f"{r['fad']:.1f} | {r.get('generate_s_per_clip', float('nan')):.2f} |")


if __name__ == "__main__":
    main()
