"""The faster-whisper drop-in, field by field: ``audiofast.compat.faster_whisper`` against the
real faster-whisper 1.2.1 on the same CTranslate2 weights, threads and recordings.

    python scripts/bench_compat.py --models tiny.en base --runs 3 --out evals/benchmarks/X

For each model and beam size: every record field's type (equal or not), the transcripts' WER,
segment and word counts, the largest word-time gap on words both time, the info fields, and
the wall time of ``list(transcribe(...))`` (median of ``--runs``, both loaded, alternated).
Prints a markdown table and writes it with a JSON beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import time
from pathlib import Path

import faster_whisper as theirs

import audiofast.compat.faster_whisper as ours
from audiofast.eval.datasets import real_speech_clips
from audiofast.eval.wer import normalize, wer, word_pairs
from audiofast.models.resolve import resolve_model

INFO_FIELDS = ("language", "language_probability", "duration", "duration_after_vad")


def kind(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float) or hasattr(value, "dtype"):
        return "number"
    if isinstance(value, list | tuple):
        return "list"
    return type(value).__name__


def timed(model, path: str, runs: int, **kwargs):
    walls, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        segments, info = model.transcribe(path, **kwargs)
        out = (list(segments), info)
        walls.append(time.perf_counter() - t0)
    return out, statistics.median(walls)


def compare(size: str, beam: int, runs: int, threads: int) -> dict:
    packaged = ours.model_spec(size)
    mine_model = ours.WhisperModel(size, cpu_threads=threads)
    real_model = theirs.WhisperModel(str(resolve_model(packaged).ct2_dir), device="cpu",
                                     compute_type="int8", cpu_threads=threads)
    clips = real_speech_clips()
    refs, mine_text, real_text = [], [], []
    type_mismatch: set[str] = set()
    info_equal = {f: True for f in INFO_FIELDS}
    gaps, counts = [], {"segments": [0, 0], "words": [0, 0]}
    walls = [0.0, 0.0]
    for clip in clips:
        kwargs = dict(beam_size=beam, word_timestamps=True, language=None)
        (mine, mine_info), mine_s = timed(mine_model, str(clip.audio), runs, **kwargs)
        (real, real_info), real_s = timed(real_model, str(clip.audio), runs, **kwargs)
        walls[0] += mine_s
        walls[1] += real_s
        refs.append(clip.reference)
        mine_text.append("".join(s.text for s in mine))
        real_text.append("".join(s.text for s in real))
        for a, b in zip(mine, real, strict=False):
            for field in dataclasses.fields(b):
                if kind(getattr(a, field.name)) != kind(getattr(b, field.name)):
                    type_mismatch.add(f"Segment.{field.name}")
            for wa, wb in zip(a.words or [], b.words or [], strict=False):
                for field in dataclasses.fields(wb):
                    if kind(getattr(wa, field.name)) != kind(getattr(wb, field.name)):
                        type_mismatch.add(f"Word.{field.name}")
        for field in INFO_FIELDS:
            a, b = getattr(mine_info, field), getattr(real_info, field)
            if not (a == b if isinstance(b, str) else abs(float(a) - float(b)) <= 1e-3):
                info_equal[field] = False
        mine_words = [w for s in mine for w in s.words]
        real_words = [w for s in real for w in s.words]
        counts["segments"][0] += len(mine)
        counts["segments"][1] += len(real)
        counts["words"][0] += len(mine_words)
        counts["words"][1] += len(real_words)
        for i, j in word_pairs([normalize(w.word) for w in mine_words],
                               [normalize(w.word) for w in real_words]):
            gaps.append(max(abs(mine_words[i].start - real_words[j].start),
                            abs(mine_words[i].end - real_words[j].end)))
    return {
        "model": size, "beam_size": beam, "clips": len(clips),
        "wer_audiofast": round(wer(refs, mine_text), 4),
        "wer_faster_whisper": round(wer(refs, real_text), 4),
        "segments": counts["segments"], "words": counts["words"],
        "words_within_50ms": round(sum(g <= 0.05 for g in gaps) / max(len(gaps), 1), 3),
        "word_gap_max_s": round(max(gaps, default=0.0), 3),
        "types_differ": sorted(type_mismatch), "info_equal": info_equal,
        "wall_s_audiofast": round(walls[0], 3), "wall_s_faster_whisper": round(walls[1], 3),
        "speedup": round(walls[1] / walls[0], 2),
    }


def table(rows: list[dict]) -> str:
    lines = ["| model | beam | WER audiofast / faster-whisper % | segments | words | words "
             "within 50 ms | max word gap s | field types differ | info fields equal | wall s "
             "audiofast / faster-whisper (speed-up) |", "|" + "---|" * 10]
    for r in rows:
        info = ", ".join(k for k, v in r["info_equal"].items() if v) or "-"
        lines.append(
            f"| {r['model']} | {r['beam_size']} | {100 * r['wer_audiofast']:.1f} / "
            f"{100 * r['wer_faster_whisper']:.1f} | {r['segments'][0]} / {r['segments'][1]} | "
            f"{r['words'][0]} / {r['words'][1]} | {100 * r['words_within_50ms']:.0f} % | "
            f"{r['word_gap_max_s']:.2f} | {', '.join(r['types_differ']) or 'none'} | {info} | "
            f"{r['wall_s_audiofast']:.2f} / {r['wall_s_faster_whisper']:.2f} "
            f"({r['speedup']:.2f}x) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny.en", "base"])
    parser.add_argument("--beams", nargs="+", type=int, default=[5, 1])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = [compare(m, b, args.runs, args.threads) for m in args.models for b in args.beams]
    text = table(rows)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(
            {"machine": platform.processor() or platform.machine(), "rows": rows}, indent=1))
        args.out.with_suffix(".md").write_text(
            f"# faster-whisper drop-in vs faster-whisper 1.2.1\n\n`python scripts/"
            f"bench_compat.py --models {' '.join(args.models)} --runs {args.runs}`, "
            f"{args.threads} threads, the four real recordings, word timestamps on.\n\n"
            f"{text}\n")


if __name__ == "__main__":
    main()
