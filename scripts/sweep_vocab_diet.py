"""Vocab-diet Pareto sweep: WER vs decoder ms/token for several kept-token counts.

For each model and ``--keep N``: select the tokens from the domain corpus, slice, recover by
distillation (``--steps``; 0 = sliced only) and export (``audiofast distill --stage vocab``),
then on the int8 owned decoder measure WER (held-out domain sentences spoken by flite + the
real recordings) and the decoding step time, beside the full model, all in one run.

    python scripts/sweep_vocab_diet.py --models whisper-tiny.en whisper-base \\
        --keep 4000 8000 16000 32000 --steps 60 --workdir runs/vocab_diet
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from audiofast.asr.fast_runtime import FastWhisper
from audiofast.asr.features import N_FRAMES, log_mel_spectrogram, pad_or_trim
from audiofast.asr.options import TranscribeOptions
from audiofast.audio import load_audio
from audiofast.distill.asr import (
    VocabDietRecipe,
    distill_vocab,
    group_sentences,
    speak,
    split_corpus,
)
from audiofast.eval.datasets import domain_corpus, real_speech_clips
from audiofast.eval.wer import wer


def eval_set(held_sentences: int) -> list[tuple[str, np.ndarray, str]]:
    """(name, audio, reference): held-out domain clips (flite voices) and the real clips."""
    _, held = split_corpus(domain_corpus())
    voices = ("flite:slt", "flite:kal", "flite:awb", "flite:rms")
    clips = [(f"domain{i}", speak(group, voices[i % 4]), " ".join(group))
             for i, group in enumerate(group_sentences(held[:held_sentences]))]
    return clips + [(c.name, load_audio(c.audio), c.reference) for c in real_speech_clips()]


def step_ms(runtime: FastWhisper, audio: np.ndarray, reps: int = 40) -> float:
    """Median over 3 runs of the mean time of one decoding step (positions 8 .. 8 + reps)."""
    mel = pad_or_trim(log_mel_spectrogram(audio, runtime.n_mels), N_FRAMES)
    engine = runtime.engine
    engine.set_audio(runtime.encode(mel))
    prompt = runtime.tokenizer.sot_sequence("en", "transcribe", timestamps=True)
    engine(prompt, 0)
    token = [runtime.tokenizer.encode(" the")[0]]
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        for i in range(reps):
            engine(token, len(prompt) + i)
        times.append((time.perf_counter() - t0) / reps * 1000)
    return float(np.median(times))


def retime(rows: list[dict], workdir: Path, audio: np.ndarray, threads: int,
           rounds: int = 5) -> None:
    """Step times again, all models loaded at once and measured in turn, ``rounds`` times,
    keeping the minimum: rows trained minutes apart otherwise see different machine load."""
    runtimes = [FastWhisper(_model_path(r, workdir), threads=threads, precision="int8")
                for r in rows]
    best = [float("inf")] * len(rows)
    for _ in range(rounds):
        for i, runtime in enumerate(runtimes):
            best[i] = min(best[i], step_ms(runtime, audio))
    for row, ms, runtime in zip(rows, best, runtimes, strict=True):
        row["ms_per_token"] = ms
        row["head_ms"] = head_ms(runtime)


def head_ms(runtime: FastWhisper, reps: int = 200) -> float:
    """The output head alone (what the diet shrinks): min over 5 rounds of ``reps`` calls."""
    head = runtime.engine.lm_head
    x = np.random.default_rng(0).standard_normal((1, runtime.engine.d_model), np.float32)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            head(x)
        times.append((time.perf_counter() - t0) / reps * 1000)
    return min(times)


def _model_path(row: dict, workdir: Path) -> str:
    if row["keep"] is None:
        return row["model"]
    corpus = f"-{row['corpus']}" if row.get("corpus") not in (None, "flite") else ""
    kd = "-keptkd" if row.get("kd") == "kept" else ""
    return str(workdir / f"{row['model']}-diet{row['keep']}-s{row['steps']}{corpus}{kd}")


def evaluate(model: str, clips, threads: int) -> dict:
    runtime = FastWhisper(model, threads=threads, precision="int8")
    options = TranscribeOptions(language="en")
    refs, hyps, domain_refs, domain_hyps = [], [], [], []
    for name, audio, reference in clips:
        text = runtime.transcribe(audio, options, progress=False).text
        refs.append(reference)
        hyps.append(text)
        if name.startswith("domain"):
            domain_refs.append(reference)
            domain_hyps.append(text)
    real = [(r, h) for (n, _, _), r, h in zip(clips, refs, hyps, strict=True)
            if not n.startswith("domain")]
    return {"wer": wer(refs, hyps), "wer_domain": wer(domain_refs, domain_hyps),
            "wer_real": wer([r for r, _ in real], [h for _, h in real]),
            "ms_per_token": step_ms(runtime, clips[0][1]),
            "vocab": runtime.engine.embed.shape[0]}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("ms_per_token", "decoder step, ms (int8 owned engine, 2 threads)")]
    if all("head_ms" in r for r in rows):
        panels.append(("head_ms", "output head alone, ms"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels, strict=True):
        for model in sorted({r["model"] for r in rows}):
            for sliced, marker in ((True, "x"), (False, "o")):
                pts = sorted((r for r in rows if r["model"] == model
                              and (r["steps"] == 0) == sliced), key=lambda r: r[key])
                if not pts:
                    continue
                name = "sliced only" if sliced else "recovered / full"
                ax.plot([r[key] for r in pts], [100 * r["wer"] for r in pts], marker=marker,
                        label=f"{model} ({name})")
                for r in pts:
                    ax.annotate(f"{r['vocab'] // 1000}k", (r[key], 100 * r["wer"]),
                                fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel(label)
        ax.set_ylabel("WER % (held-out domain + real clips)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Vocab diet: speed vs quality")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["whisper-tiny.en", "whisper-base"])
    parser.add_argument("--keep", nargs="+", type=int, default=[4000, 8000, 16000, 32000])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--sliced-only", action="store_true", help="also rows without recovery")
    parser.add_argument("--corpus", choices=["flite", "varied"], default="flite",
                        help="the recovery clips (distill --stage vocab --corpus)")
    parser.add_argument("--sentences", type=int, default=None,
                        help="domain sentences spoken for recovery (default: the recipe's)")
    parser.add_argument("--kd-kept-only", action="store_true",
                        help="the KL to the teacher only at tokens the diet kept (kd_loss)")
    parser.add_argument("--no-full", action="store_true",
                        help="skip the full model's row (already in --out from an earlier run)")
    parser.add_argument("--held-sentences", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("runs/vocab_diet"))
    parser.add_argument("--out", type=Path, default=Path("evals/benchmarks/vocab_diet"))
    parser.add_argument("--retime", action="store_true",
                        help="only re-measure ms/token of the rows in --out's JSON, interleaved")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clips = eval_set(args.held_sentences)
    rows = []
    if args.retime:
        rows = json.loads(args.out.with_suffix(".json").read_text())["results"]
        for model in args.models:
            retime([r for r in rows if r["model"] == model], args.workdir, clips[0][1],
                   args.threads)
    for model in [] if args.retime else args.models:
        if not args.no_full:
            rows.append({"model": model, "keep": None, "steps": None}
                        | evaluate(model, clips, args.threads))
            print(rows[-1])
        for keep in args.keep:
            for steps in ([0, args.steps] if args.sliced_only else [args.steps]):
                sentences = {"train_sentences": args.sentences} if args.sentences else {}
                recipe = VocabDietRecipe(keep=keep, steps=steps, corpus=args.corpus,
                                         kd_kept_only=args.kd_kept_only, **sentences)
                row = {"model": model, "keep": keep, "steps": steps,
                       "corpus": args.corpus if steps else None,
                       "kd": ("kept" if args.kd_kept_only else "all") if steps else None,
                       "train_sentences": recipe.train_sentences if steps else None}
                out = Path(_model_path(row, args.workdir))
                if not (out / "model.bin").is_file():
                    distill_vocab(model, recipe, args.workdir, out, threads=args.threads)
                rows.append(row | evaluate(str(out), clips, args.threads))
                print(rows[-1])
    print(f"\n{'model':16} {'vocab':>6} {'steps':>5} {'ms/tok':>7} {'head ms':>8} {'WER%':>6} "
          f"{'domain':>7} {'real':>6}")
    for r in rows:
        print(f"{r['model']:16} {r['vocab']:6d} {'-' if r['steps'] is None else r['steps']:>5} "
              f"{r['ms_per_token']:7.2f} {r.get('head_ms', float('nan')):8.2f} "
              f"{100 * r['wer']:6.2f} {100 * r['wer_domain']:7.2f} "
              f"{100 * r['wer_real']:6.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.machine(), "threads": args.threads, "steps": args.steps,
            "held_sentences": args.held_sentences, "eval": "int8 owned decoder, greedy, en",
            "ms_per_token": "min over 5 interleaved rounds" if args.retime else "median of 3"}
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": rows},
                                                        indent=1))
    plot(rows, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
