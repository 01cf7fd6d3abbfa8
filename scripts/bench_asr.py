"""Scoreboard: audiofast vs faster-whisper on the same weights, threads and audio.

Runs are interleaved (the engine order flips every run) so drift in machine load hits both
alike; each cell reports the median (and min) of several runs. Prints a table, writes JSON
and a PNG plot.

    python scripts/bench_asr.py --models whisper-base --runs 3 --language en \
        [--fast fp32 int8+ngram int8+model+pad10 --draft-model DIR --diet-model DIR]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from audiofast.asr.options import TranscribeOptions
from audiofast.asr.runtime import load_model
from audiofast.eval.datasets import EvalClip, real_speech_clips
from audiofast.eval.roundtrip import ENCODERS, parse_asr_spec
from audiofast.eval.wer import wer

# audio path -> text, generated tokens, and whatever timings the engine reports
Engine = Callable[[Path], dict]


def audiofast_engine(model: str, threads: int, beam_size: int, fast: str | None = None,
                     window_pad: float | None = None, language: str | None = None,
                     draft_model: Path | None = None, diet_model: Path | None = None,
                     ct2: str | None = None, qad_model: Path | None = None,
                     block_model: Path | None = None) -> Engine:
    """The CTranslate2 runtime (``ct2``: encoder and option overrides as the judge spells
    them, e.g. ``ov+pad5+batch8+chunk25``), or with ``fast`` the owned engine: ``PRECISION``
    (``own``: the model folder's own) then any of ``+ngram`` / ``+model`` / ``+block``
    (drafter; ``+norefine``: the block drafter's first pass only, ``+minpP``: its guesses
    drafted only while their probability is >= P), ``+diet``
    / ``+qad`` (the vocab-diet / QAD export instead of the model), ``+padN`` (short windows
    encoded as audio + N s), ``+batchN+chunkS`` (chunks of at most S s decoded N side by
    side, batched.py), ``+ov`` / ``+auto`` (encoder)."""
    if fast:
        precision, *parts = fast.split("+")
        drafter = next((p for p in parts if p in ("ngram", "model", "block")), "none")
        pads = [float(p[3:]) for p in parts if p.startswith("pad")]
        window_pad = pads[0] if pads else window_pad
        batching = {key: cast(p[len(name):]) for p in parts
                    for name, key, cast in [("batch", "batch_size", int),
                                            ("chunk", "chunk_length", float)]
                    if p.startswith(name)}
        encoder = next((ENCODERS[p] for p in parts if p in ENCODERS), "ct2")
        source = (str(diet_model) if "diet" in parts else str(qad_model) if "qad" in parts
                  else model)
        runtime = load_model(source, "fast", threads=threads,
                             precision=None if precision == "own" else precision, drafter=drafter,
                             draft_model=block_model if drafter == "block" else draft_model,
                             encoder=encoder)
        runtime.block_refine = "norefine" not in parts
        runtime.block_min_prob = next((float(p[4:]) for p in parts if p.startswith("minp")), 0.0)
    else:
        spec = parse_asr_spec(f"{model}+{ct2}" if ct2 else model)
        runtime = load_model(model, "ct2", threads=threads, encoder=spec.encoder)
    options = TranscribeOptions(beam_size=beam_size, window_pad=window_pad, language=language)
    if fast:
        options = replace(options, **batching)
    if ct2:
        options = replace(options, **spec.options)

    def run(path: Path) -> dict:
        before = dict(getattr(runtime, "stats", {}))
        result = runtime.transcribe(path, options, progress=False)
        stats = result.stats
        out = {"text": result.text, "tokens": sum(len(s.tokens) for s in result.segments),
               "encoder_s": stats["encoder_s"],
               "decoder_ms_per_token": 1000 * stats["decoder_s"] / max(1, stats["tokens"])}
        if fast:
            calls = runtime.stats["engine_calls"] - before.get("engine_calls", 0)
            out["tokens_per_call"] = stats["tokens"] / max(1, calls)
        return out

    return run


def faster_whisper_engine(model: str, threads: int, beam_size: int,
                          language: str | None = None, batch_size: int = 0) -> Engine:
    """faster-whisper's ``transcribe``, or with ``batch_size`` its BatchedInferencePipeline
    (silero VAD chunks, no timestamps, decoded ``batch_size`` at a time)."""
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    from audiofast.models import resolve_model

    fw = WhisperModel(str(resolve_model(model).ct2_dir), device="cpu", compute_type="int8",
                      cpu_threads=threads)

    batched = BatchedInferencePipeline(fw) if batch_size else None

    def run(path: Path) -> dict:
        if batched is not None:
            segments, _ = batched.transcribe(str(path), beam_size=beam_size, language=language,
                                             batch_size=batch_size)
        else:
            segments, _ = fw.transcribe(str(path), beam_size=beam_size, language=language)
        segments = list(segments)  # the generator does the work
        return {"text": "".join(s.text for s in segments).strip(),
                "tokens": sum(len(s.tokens) for s in segments)}

    return run


def bench(engines: dict[str, Engine], clips: list[EvalClip], runs: int) -> list[dict]:
    rows = {(e, c.name): {"walls": []} for e in engines for c in clips}
    shortest = min(clips, key=lambda c: c.audio.stat().st_size)
    for engine in engines.values():  # warm-up: first-call allocations and caches
        engine(shortest.audio)
    for run in range(runs):
        order = list(engines) if run % 2 == 0 else list(reversed(engines))
        for clip in clips:
            for name in order:
                start = time.perf_counter()
                out = engines[name](clip.audio)
                row = rows[(name, clip.name)]
                row["walls"].append(time.perf_counter() - start)
                for key in ("encoder_s", "decoder_ms_per_token", "tokens_per_call"):
                    if key in out:
                        row.setdefault(key, []).append(out[key])
                row.update(text=out["text"], tokens=out["tokens"],
                           wer=wer(clip.reference, out["text"]))
        print(f"run {run + 1}/{runs} done", flush=True)

    from audiofast.audio import load_audio

    durations = {c.name: len(load_audio(c.audio)) / 16000 for c in clips}
    results = []
    for (engine, clip), row in rows.items():
        wall = statistics.median(row["walls"])
        results.append({
            "engine": engine, "clip": clip, "audio_s": round(durations[clip], 2),
            "wall_s": round(wall, 3), "wall_min_s": round(min(row["walls"]), 3),
            "rtf": round(wall / durations[clip], 4), "tokens": row["tokens"],
            "tokens_per_s": round(row["tokens"] / wall, 1), "wer": round(row["wer"], 4),
            "walls": [round(w, 3) for w in row["walls"]], "text": row["text"],
            **{key: round(statistics.median(row[key]), 3)
               for key in ("encoder_s", "decoder_ms_per_token", "tokens_per_call") if key in row},
        })
    return results


def print_table(results: list[dict]) -> None:
    head = f"{'engine':<42}{'clip':<20}{'audio s':>8}{'wall s':>8}{'min s':>8}{'RTF':>8}"
    print(head + f"{'tok/s':>8}{'WER %':>8}{'enc s':>8}{'ms/tok':>8}{'tok/call':>9}")
    for r in results:
        extra = "".join(f"{r[k]:>{w}.2f}" if k in r else f"{'-':>{w}}"
                        for k, w in (("encoder_s", 8), ("decoder_ms_per_token", 8),
                                     ("tokens_per_call", 9)))
        print(f"{r['engine']:<42}{r['clip']:<20}{r['audio_s']:>8.1f}{r['wall_s']:>8.2f}"
              f"{r['wall_min_s']:>8.2f}{r['rtf']:>8.3f}{r['tokens_per_s']:>8.1f}"
              f"{100 * r['wer']:>8.1f}{extra}")


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = list(dict.fromkeys(r["engine"] for r in results))
    clips = list(dict.fromkeys(r["clip"] for r in results))
    width = 0.8 / len(engines)
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, engine in enumerate(engines):
        walls = [next(r["wall_s"] for r in results if r["engine"] == engine and r["clip"] == c)
                 for c in clips]
        ax.bar([x + i * width for x in range(len(clips))], walls, width, label=engine)
    ax.set_xticks([x + width * (len(engines) - 1) / 2 for x in range(len(clips))], clips)
    ax.set_ylabel("wall time, s (median)")
    ax.set_title("Transcription wall time per clip (lower is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def long_clip(clips: list[EvalClip], repeats: int, folder: Path) -> EvalClip:
    """A multi-minute stand-in recording (none ships offline): the real clips end to end,
    1 s apart, ``repeats`` times; its reference is theirs joined."""
    import wave

    import numpy as np

    from audiofast.audio import load_audio

    gap = np.zeros(16000, dtype=np.float32)
    audio = np.concatenate([part for _ in range(repeats) for c in clips
                            for part in (load_audio(c.audio), gap)])
    path = folder / f"long-x{repeats}.wav"
    folder.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes((np.clip(audio, -1, 1) * 32767).astype(np.int16).tobytes())
    reference = " ".join(c.reference for _ in range(repeats) for c in clips)
    return EvalClip(path.stem, path, reference, "real")


FW_SCRIPT = """import sys
from faster_whisper import WhisperModel
model = WhisperModel(sys.argv[1], device="cpu", compute_type="int8", cpu_threads=int(sys.argv[3]))
segments, _ = model.transcribe(sys.argv[2], beam_size=1, language="en")
print("".join(s.text for s in segments).strip())
"""


def cold_process(model: str, clips: list[EvalClip], runs: int, threads: int,
                 baseline: Path | None = None) -> list[dict]:
    """Whole processes as a user starts them from the shell (``audiofast transcribe``, also
    with ``--engine ct2``, vs a five-line faster-whisper script, all greedy, ``--language
    en``), alternated, each run under ``/usr/bin/time``: wall seconds (median) and peak
    resident memory (max). ``baseline``: another checkout's CLI as one more row."""
    import subprocess
    import sys

    from audiofast.models import resolve_model

    audiofast_cli = str(Path(sys.executable).with_name("audiofast"))
    args = lambda clip: ["transcribe", str(clip.audio), "--model", model,  # noqa: E731
                         "--language", "en", "--threads", str(threads)]
    commands = {
        "audiofast (cold process)": lambda clip: [audiofast_cli, *args(clip)],
        "audiofast --engine ct2 (cold process)": lambda clip: [
            audiofast_cli, *args(clip), "--engine", "ct2"],
        "faster-whisper (cold process)": lambda clip: [
            sys.executable, "-c", FW_SCRIPT, str(resolve_model(model).ct2_dir), str(clip.audio),
            str(threads)],
    }
    if baseline is not None:
        code = (f"import sys; sys.path.insert(0, {str(baseline)!r}); "
                "from audiofast.cli import entry; entry()")
        commands[f"audiofast at {baseline.name} (cold process)"] = lambda clip: [
            sys.executable, "-c", code, *args(clip)]
    rows = []
    for clip in clips:
        walls: dict[str, list[float]] = {name: [] for name in commands}
        peaks: dict[str, list[int]] = {name: [] for name in commands}
        texts: dict[str, str] = {}
        for _ in range(runs):
            for name, command in commands.items():
                run = subprocess.run(["/usr/bin/time", "-f", "%e %M", *command(clip)],
                                     capture_output=True, text=True, check=True)
                wall, peak_kb = run.stderr.strip().splitlines()[-1].split()
                walls[name].append(float(wall))
                peaks[name].append(int(peak_kb))
                texts[name] = run.stdout.strip()
        for name in commands:
            rows.append({"engine": f"{name}/{model}", "clip": clip.name,
                         "seconds": statistics.median(walls[name]), "walls": walls[name],
                         "peak_rss_mb": max(peaks[name]) / 1024,
                         "wer": wer(clip.reference, texts[name])})
    print("| process | clip | wall s (median) | peak RSS MB | WER |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['engine']} | {r['clip']} | {r['seconds']:.2f} | {r['peak_rss_mb']:.0f} | "
              f"{100 * r['wer']:.1f}% |")
    return rows


def plot_cold(rows: list[dict], path: Path) -> None:
    """Wall seconds and peak RSS per process and clip, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clips = list(dict.fromkeys(r["clip"] for r in rows))
    names = list(dict.fromkeys(r["engine"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        mine = [next(r for r in rows if r["engine"] == name and r["clip"] == c) for c in clips]
        xs = [i + k * width for i in range(len(clips))]
        axes[0].bar(xs, [r["seconds"] for r in mine], width,
                    label=name.split("/")[0].replace(" (cold process)", ""))
        axes[1].bar(xs, [r["peak_rss_mb"] for r in mine], width)
    for ax, title in zip(axes, ("wall s (median)", "peak RSS MB"), strict=True):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(clips))], clips)
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    fig.suptitle("cold process: audiofast transcribe vs faster-whisper")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["whisper-base"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument("--clips", nargs="*", default=None, help="clip names (default: all)")
    parser.add_argument("--fast", nargs="*", default=[],
                        help="owned-engine rows, e.g. fp32 int8+ngram int8+model+diet+pad10")
    parser.add_argument("--draft-model", type=Path, default=None,
                        help="draft decoder for +model rows (audiofast distill --stage drafter)")
    parser.add_argument("--block-model", type=Path, default=None,
                        help="block drafter for +block rows (audiofast distill --stage drafter "
                        "--kind block)")
    parser.add_argument("--diet-model", type=Path, default=None,
                        help="vocab-diet export for +diet rows (audiofast distill --stage vocab)")
    parser.add_argument("--qad-model", type=Path, default=None,
                        help="int4 QAD export for +qad rows (audiofast distill --stage qad "
                        "--lane asr), e.g. --fast own+qad+pad2")
    parser.add_argument("--language", default=None, help="given to every engine (default: detect)")
    parser.add_argument("--window-pad", nargs="*", type=float, default=[],
                        help="extra audiofast-ct2 rows encoding short windows as audio + PAD s")
    parser.add_argument("--ct2", nargs="*", default=[],
                        help="extra audiofast-ct2 rows with option overrides, e.g. "
                        "pad5+batch8+chunk25 (batched chunks)")
    parser.add_argument("--fw-batch", type=int, default=0,
                        help="add a faster-whisper BatchedInferencePipeline row, batch size N")
    parser.add_argument("--long", type=int, default=0, metavar="N",
                        help="only a long stand-in clip: the real clips end to end, N times")
    parser.add_argument("--cold", type=int, default=0, metavar="RUNS",
                        help="only whole-process rows: audiofast transcribe vs faster-whisper "
                        "from the shell, RUNS each, alternated (wall time and peak RSS)")
    parser.add_argument("--cold-baseline", type=Path, default=None, metavar="CHECKOUT",
                        help="with --cold: one more row running the CLI of this checkout")
    parser.add_argument("--out", type=Path, default=Path("results/bench_asr.json"))
    args = parser.parse_args()

    clips = [c for c in real_speech_clips() if not args.clips or c.name in args.clips]
    if args.long:
        from audiofast.cache import cache_dir

        clips = [long_clip(clips, args.long, cache_dir() / "bench")]
    results = []
    if args.cold:
        for model in args.models:
            results += cold_process(model, clips, args.cold, args.threads, args.cold_baseline)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        import subprocess

        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        args.out.write_text(json.dumps({"meta": {"cold_runs": args.cold, "threads":
                                                 args.threads, "commit": commit},
                                        "results": results}, indent=2))
        plot_cold(results, args.out.with_suffix(".png"))
        print(f"wrote {args.out} and its .png")
        return
    for model in args.models:
        engines = {
            f"faster-whisper/{model}": faster_whisper_engine(model, args.threads, args.beam_size,
                                                             args.language),
            f"audiofast-ct2/{model}": audiofast_engine(model, args.threads, args.beam_size,
                                                       language=args.language),
            **{f"audiofast-fast-{f}/{model}": audiofast_engine(
                model, args.threads, args.beam_size, f, language=args.language,
                draft_model=args.draft_model, diet_model=args.diet_model,
                block_model=args.block_model,
                qad_model=args.qad_model)
               for f in args.fast},
            **{f"audiofast-ct2-pad{p:g}/{model}": audiofast_engine(
                model, args.threads, args.beam_size, window_pad=p, language=args.language)
               for p in args.window_pad},
            **{f"audiofast-ct2-{spec}/{model}": audiofast_engine(
                model, args.threads, args.beam_size, language=args.language, ct2=spec)
               for spec in args.ct2},
        }
        if args.fw_batch:
            engines[f"faster-whisper-batch{args.fw_batch}/{model}"] = faster_whisper_engine(
                model, args.threads, args.beam_size, args.language, args.fw_batch)
        results += bench(engines, clips, args.runs)
    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
            "beam_size": args.beam_size, "runs": args.runs, "statistic": "median",
            "language": args.language, "window_pad": args.window_pad, "ct2": args.ct2,
            "fw_batch": args.fw_batch, "long": args.long}
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
