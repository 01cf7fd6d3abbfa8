"""The SA3 acceleration ladder measured on the proving ground: teacher -> cfg-folded -> 4-step
-> 4-step int8 (progressive and DMD), each row's speed and quality on the same held-out
captions and seeds.

    python evals/distill_quality.py --teacher evals/teacher --cfg runs/students/cfg5 \
        --steps runs/students/steps4 --int8 runs/students/int8 \
        --out evals/benchmarks/2026-12-01-epyc2-distill

Per row: DiT passes per clip, DiT seconds per clip (time inside the DiT's forward) and end to
end (text encoding + sampling + Griffin-Lim decoding), their ratios to the teacher's 8-step
pingpong at cfg 5, FAD and its ratio to that teacher (Whisper-base frames vs held-out real
clips) with a paired-bootstrap 95 % interval (:mod:`audiofast.eval.fad_interval`), pitch
accuracy and category accuracy (:mod:`audiofast.diffusion.quality`). Rows are generated in
batches of 32 on 2 threads, one after another in one process.
Writes ``<out>.json``, ``<out>.png`` and ``<out>.md``.
"""

from __future__ import annotations

import audiofast  # noqa: F401 - first: sets GOMP_SPINCOUNT before torch loads libgomp
import argparse
import json
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

from audiofast.diffusion.generate import generate, load_for_generation
from audiofast.diffusion.quality import build_judge, clip_frames
from audiofast.diffusion.teacher import CLIP_SECONDS, SynthSet
from audiofast.eval.fad_interval import ClipMoments, fad_ratio_interval

BASELINE = "teacher pingpong 8, cfg 5"


class DiTTimer:
    """Sums the wall time and batch rows of every DiT forward of a model."""

    def __init__(self, dit: torch.nn.Module):
        self.seconds, self.rows, self._start = 0.0, 0, 0.0
        dit.register_forward_pre_hook(self._pre)
        dit.register_forward_hook(self._post)

    def _pre(self, _module, args) -> None:
        self.rows += int(args[0].shape[0])
        self._start = time.perf_counter()

    def _post(self, *_) -> None:
        self.seconds += time.perf_counter() - self._start


def measure(label: str, model_dir: str, captions: SynthSet, judge, seed: int,
            sampler: str | None = None, steps: int | None = None, cfg: float | None = None,
            batch: int = 32) -> dict:
    model = load_for_generation(model_dir)
    timer = DiTTimer(model.dit)
    generate(model, captions.captions[:2], CLIP_SECONDS, steps=steps, cfg_scale=cfg,
             sampler=sampler, seed=seed, progress=False)  # warm-up (kernels, allocator)
    timer.seconds, timer.rows = 0.0, 0
    start = time.perf_counter()
    audio = torch.cat([
        generate(model, captions.captions[i : i + batch], CLIP_SECONDS, steps=steps,
                 cfg_scale=cfg, sampler=sampler, seed=seed + i, progress=False)
        for i in range(0, len(captions), batch)
    ])
    total = time.perf_counter() - start
    n = len(captions)
    row = {"setting": label, "model": model_dir, "sampler": sampler, "steps": steps, "cfg": cfg,
           "dit_passes_per_clip": timer.rows / n, "dit_s_per_clip": timer.seconds / n,
           "end_to_end_s_per_clip": total / n}
    frames = clip_frames(judge.embedder, audio)
    row |= judge.score(audio, captions.meta, frames=frames)
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return row, frames


def add_intervals(rows: list[dict], frames: list[list], judge, replicates: int) -> None:
    """Each row's FAD ratio to the baseline with its paired-bootstrap 95 % interval."""
    i = next(k for k, r in enumerate(rows) if r["setting"] == BASELINE)
    base, ref = ClipMoments.of(frames[i]), ClipMoments.of(judge.reference_frames)
    for r, f in zip(rows, frames, strict=True):
        interval = fad_ratio_interval(ClipMoments.of(f), base, ref, replicates=replicates)
        r["fad_ratio_low"], r["fad_ratio_high"] = interval.low, interval.high


def add_ratios(rows: list[dict]) -> None:
    base = next(r for r in rows if r["setting"] == BASELINE)
    for r in rows:
        r["dit_speedup"] = base["dit_s_per_clip"] / r["dit_s_per_clip"]
        r["end_to_end_speedup"] = base["end_to_end_s_per_clip"] / r["end_to_end_s_per_clip"]
        r["fad_ratio"] = r["fad"] / base["fad"]
        r["pitch_ratio"] = r["pitch_accuracy"] / max(base["pitch_accuracy"], 1e-9)
        r["category_ratio"] = r["category_accuracy"] / max(base["category_accuracy"], 1e-9)


def markdown(result: dict) -> str:
    lines = ["| model | DiT passes/clip | DiT s/clip | DiT speed-up | end-to-end s/clip | "
             "e2e speed-up | FAD | FAD ratio [95% CI] | pitch acc | pitch ratio | category acc |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(
            f"| {r['setting']} | {r['dit_passes_per_clip']:.0f} | {r['dit_s_per_clip']:.4f} | "
            f"{r['dit_speedup']:.2f}x | {r['end_to_end_s_per_clip']:.3f} | "
            f"{r['end_to_end_speedup']:.2f}x | {r['fad']:.1f} | {r['fad_ratio']:.2f} "
            f"[{r['fad_ratio_low']:.2f}, {r['fad_ratio_high']:.2f}] | "
            f"{r['pitch_accuracy']:.2f} | {r['pitch_ratio']:.2f} | {r['category_accuracy']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ax = axes[0]
    for r in rows:
        err = [[r["fad_ratio"] - r["fad_ratio_low"]], [r["fad_ratio_high"] - r["fad_ratio"]]]
        ax.errorbar(r["dit_s_per_clip"] * 1000, r["fad_ratio"], yerr=err, fmt="o", capsize=3)
        ax.annotate(r["setting"], (r["dit_s_per_clip"] * 1000, r["fad_ratio"]), fontsize=7)
    ax.axhline(1.1, color="grey", ls="--", lw=0.8)
    ax.axhline(1.2, color="grey", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("DiT ms per clip (log)")
    ax.set_ylabel("FAD / teacher pingpong-8 cfg-5 FAD (95% CI)")
    labels = [r["setting"] for r in rows]
    for ax, key, title in zip(axes[1:], ["pitch_accuracy", "category_accuracy"],
                              ["pitch accuracy", "category accuracy"], strict=True):
        ax.barh(labels, [r[key] for r in rows], color="C0")
        ax.set_title(title, fontsize=9)
        ax.invert_yaxis()
    axes[2].set_yticklabels([])
    fig.suptitle(f"SA3 proving ground: distillation ladder, {result['clips']} held-out captions")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--teacher", default="evals/teacher")
    parser.add_argument("--cfg", default=None, help="the cfg-folded student")
    parser.add_argument("--steps", default=None, help="the 4-step student")
    parser.add_argument("--int8", default=None, help="the 4-step int8 (QAD) student")
    parser.add_argument("--ptq", default=None, help="the 4-step student quantized without QAD")
    parser.add_argument("--dmd", default=None, help="the 4-step DMD student")
    parser.add_argument("--dmd-int8", default=None, help="the 4-step DMD student after QAD")
    parser.add_argument("--replicates", type=int, default=200,
                        help="bootstrap replicates of each FAD ratio's interval")
    parser.add_argument("--extra", nargs=2, action="append", default=[],
                        metavar=("LABEL", "DIR"), help="more students, sampled as they say "
                        "(DIR:euler samples one with Euler at its own times instead)")
    parser.add_argument("--clips", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-euler", action="store_true", help="skip the slow euler-50 row")
    parser.add_argument("--out", default="evals/benchmarks/distill_quality")
    args = parser.parse_args()
    torch.set_num_threads(2)
    captions = SynthSet.build(args.clips, seed=args.seed + 1000)
    judge = build_judge(SynthSet.build(args.clips, seed=args.seed + 2000))
    measured = []
    if not args.no_euler:
        measured.append(measure("teacher euler 50, cfg 5", args.teacher, captions, judge,
                                args.seed, "euler", 50, 5.0))
    measured.append(measure(BASELINE, args.teacher, captions, judge, args.seed, "pingpong", 8,
                            5.0))
    measured.append(measure("teacher pingpong 4, cfg 5", args.teacher, captions, judge,
                            args.seed, "pingpong", 4, 5.0))
    for label, path in [("cfg-folded, 8 steps", args.cfg),
                        ("4-step student (progressive)", args.steps),
                        ("4-step int8, no QAD (PTQ)", args.ptq),
                        ("4-step int8 student (QAD)", args.int8),
                        ("4-step student (DMD)", args.dmd),
                        ("4-step DMD int8 student (QAD)", args.dmd_int8), *args.extra]:
        if path:
            path, _, sampler = path.partition(":")
            if (Path(path) / "time_search.json").is_file():  # distill --stage times
                label = (label[:-1] + ", searched times)" if label.endswith(")")
                         else label + " (searched times)")
            measured.append(measure(label, path, captions, judge, args.seed, sampler or None))
    rows = [row for row, _ in measured]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    result = {"clips": args.clips, "seed": args.seed, "commit": commit,
              "machine": platform.processor() or platform.machine(),
              "threads": torch.get_num_threads(), "rows": rows}
    add_ratios(rows)
    add_intervals(rows, [f for _, f in measured], judge, args.replicates)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    plot(result, out.with_suffix(".png"))
    table = markdown(result)
    out.with_suffix(".md").write_text(
        f"# SA3 distillation ladder ({args.clips} held-out captions)\n\n"
        f"`python evals/distill_quality.py {shlex.join(sys.argv[1:])}` at commit "
        f"{commit}, 2 threads.\n\n{table}")
    print(table)


if __name__ == "__main__":
    main()
