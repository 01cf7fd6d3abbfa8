"""VAD filtering and hallucination skipping on a long file with gaps: faster-whisper vs
audiofast, VAD off/on, hallucination silence threshold off/on.

The file (no such recording ships offline, so it is assembled): the four real clips, with
gaps between them of silence, white noise at -30 dB, synthetic music (chords and drums from
the SA3 proving ground's synthesizer) and music under noise. Rows: wall time (median of
``--runs``, model loaded), WER against the clips' references joined, and *invented words*:
insertions, the words a model wrote that nobody said (Whisper's hallucinations on gaps).

    python scripts/bench_vad.py [--model whisper-base] [--runs 3] [--threshold 2]

Writes a markdown table and JSON beside ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import jiwer

import audiofast  # noqa: F401  (before torch: sets GOMP_SPINCOUNT)
from audiofast.audio import SAMPLE_RATE
from audiofast.eval.gappy import gappy_file
from audiofast.eval.wer import normalize


def scores(reference: str, text: str) -> dict:
    out = jiwer.process_words(normalize(reference), normalize(text) or "<empty>")
    return {"wer": out.wer, "invented": out.insertions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="whisper-base")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--threshold", type=float, default=2.0,
                        help="hallucination silence threshold for its rows (seconds)")
    parser.add_argument("--out", type=Path, default=Path("results/bench_vad.json"))
    args = parser.parse_args()

    from faster_whisper import WhisperModel

    from audiofast.asr.options import TranscribeOptions
    from audiofast.models import resolve_model

    audio, reference = gappy_file()
    fw = WhisperModel(str(resolve_model(args.model).ct2_dir), device="cpu",
                      compute_type="int8", cpu_threads=args.threads)
    ours = audiofast.load_model(args.model, threads=args.threads)
    options = TranscribeOptions(language="en", window_pad=None)  # 30 s windows, as faster-whisper

    def fw_run(vad: bool, threshold: float | None) -> str:
        segments, _ = fw.transcribe(audio, beam_size=1, language="en", vad_filter=vad,
                                    word_timestamps=threshold is not None,
                                    hallucination_silence_threshold=threshold)
        return "".join(s.text for s in segments)

    def ours_run(vad: bool, threshold: float | None) -> str:
        return ours.transcribe(audio, replace(options, hallucination_silence_threshold=threshold),
                               False, vad_filter=vad).text

    settings = [(False, None), (True, None), (False, args.threshold), (True, args.threshold)]
    rows = {}
    for engine, run in (("faster-whisper", fw_run), ("audiofast", ours_run)):
        for vad, threshold in settings:
            name = f"{engine}, VAD {'on' if vad else 'off'}, hallucination threshold " + \
                ("off" if threshold is None else f"{threshold:g} s")
            rows[name] = lambda run=run, vad=vad, threshold=threshold: run(vad, threshold)
    walls: dict[str, list[float]] = {name: [] for name in rows}
    texts: dict[str, str] = {}
    for name, run in rows.items():  # warm-up
        texts[name] = run()
    for _ in range(args.runs):
        for name, run in rows.items():  # alternated: both see the same machine load
            start = time.perf_counter()
            texts[name] = run()
            walls[name].append(time.perf_counter() - start)
    results = [{"row": name, "seconds": statistics.median(walls[name]), "runs": walls[name],
                **scores(reference, texts[name]), "text": texts[name]} for name in rows]
    lines = [f"File: {len(audio) / SAMPLE_RATE:.0f} s (the four real clips, 15 s gaps of "
             "silence / noise / music / music+noise, 10 s of music at the end); "
             f"{args.model}, greedy, --language en, {args.threads} threads, median of "
             f"{args.runs}.", "", "| run | wall s | WER | invented words |", "|---|---|---|---|"]
    lines += [f"| {r['row']} | {r['seconds']:.2f} | {100 * r['wer']:.1f}% | {r['invented']} |"
              for r in results]
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": args.model, "results": results}, indent=2))
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
