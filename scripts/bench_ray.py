"""Corpus throughput on Ray Data at 1 and 2 workers, against one plain ``audiofast transcribe``
process on the same files, all timed as whole processes from the shell.

    python scripts/bench_ray.py --model whisper-base --copies 3 --runs 2 --out evals/benchmarks/X

The corpus is the real recordings, each copied ``--copies`` times (files, not a loop: each
copy is read, decoded and transcribed). Each Ray run writes a fresh parquet file. Reported:
whole-process wall (median of ``--runs``), files/s, audio seconds per wall second, and the
speed-up over the plain process on every core. Prints a markdown table; writes it with a JSON
beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from audiofast.audio import load_audio
from audiofast.eval.datasets import real_speech_clips


def corpus(folder: Path, copies: int) -> tuple[list[Path], float]:
    files, seconds = [], 0.0
    for clip in real_speech_clips():
        duration = len(load_audio(clip.audio)) / 16000
        for i in range(copies):
            target = folder / f"{clip.name}-{i}{clip.audio.suffix}"
            shutil.copy(clip.audio, target)
            files.append(target)
            seconds += duration
    return files, seconds


def whole_process(command: list[str]) -> float:
    start = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{run.stderr[-2000:]}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="whisper-base")
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    cli = [sys.executable, "-m", "audiofast.cli", "transcribe", "--model", args.model,
           "--no-progress"]
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "corpus"
        folder.mkdir()
        files, audio_s = corpus(folder, args.copies)
        setups = [(f"plain process, {n} thread(s)",
                   cli + [*map(str, files), "--threads", str(n), "--output-dir", f"{tmp}/txt"],
                   n) for n in sorted({1, cores})]
        for workers in args.workers:
            setups.append((f"Ray, {workers} worker(s) x 1 thread",
                           cli + ["--ray", str(folder), "--output", f"{tmp}/w{workers}.parquet",
                                  "--workers", str(workers), "--threads", "1"], workers))
        walls: dict[str, list[float]] = {name: [] for name, _, _ in setups}
        for _ in range(args.runs):  # alternated, so drift hits every setup alike
            for name, command, _ in setups:
                for leftover in Path(tmp).glob("w*.parquet*"):
                    shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
                walls[name].append(whole_process(command))
    plain = statistics.median(walls[f"plain process, {cores} thread(s)"])  # the fair baseline
    rows = []
    for name, _, threads in setups:
        wall = statistics.median(walls[name])
        rows.append({"setup": name, "threads": threads, "files": len(files),
                     "audio_s": round(audio_s, 1), "wall_s": round(wall, 2),
                     "walls": [round(w, 2) for w in walls[name]],
                     "files_per_s": round(len(files) / wall, 3),
                     "audio_s_per_wall_s": round(audio_s / wall, 2),
                     "vs_plain": round(plain / wall, 2)})
    lines = ["| setup | CPU threads | files | wall s (median) | files/s | audio s per wall s | "
             f"vs plain process, {cores} threads |", "|" + "---|" * 7]
    lines += [f"| {r['setup']} | {r['threads']} | {r['files']} | {r['wall_s']:.2f} | "
              f"{r['files_per_s']:.2f} | {r['audio_s_per_wall_s']:.1f} | {r['vs_plain']:.2f}x |"
              for r in rows]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(
            {"machine": platform.processor() or platform.machine(), "cores": cores,
             "model": args.model, "rows": rows}, indent=1))
        args.out.with_suffix(".md").write_text(
            f"# Corpus transcription on Ray Data\n\n`python scripts/bench_ray.py --model "
            f"{args.model} --copies {args.copies} --runs {args.runs}` on {cores} cores: the "
            f"real recordings x {args.copies} ({len(files)} files, {audio_s:.0f} s of audio), "
            "whole processes from the shell (Ray's start and each worker's model load "
            f"included).\n\n{text}\n")


if __name__ == "__main__":
    main()
