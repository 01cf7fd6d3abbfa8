"""Which live settings stream as well as offline transcription, and at what decode cost?

    python evals/stream_quality.py --model whisper-base \
        --configs pad=10 pad=10,early=0 pad=6 --dialogues 4 \
        --out evals/benchmarks/2026-12-02-epyc-avx512-stream-quality

Each configuration replays every recording through the live policy (stream/replay.py: no
network, no clock, every due decode run at once) and reports, per clip, the WER of the
session's finals beside the offline transcript's (the same model, default options), and the
decode work per second of audio (encoder, decoder and alignment seconds) with the number of
windows and 30 s loop retries. Clips: the four real recordings, plus ``--dialogues`` TTS
"dialogues" built from held-out domain sentences: short lines in alternating voices (flite,
espeak-ng, piper) with 0.6-1.4 s pauses, the short-utterance case; ``--long-lines`` adds
dialogues whose lines are three sentences each, the long-buffer case.

Word timing: on clips of at most 30 s, the reference text is force-aligned to the whole clip
(CTranslate2's ``align`` on one 30 s window, the same DTW as ``--word-timestamps``); each
streamed final word matched to a reference word (same normalised spelling, in order) counts
as on time when its start and its end are both within 0.2 s of the aligned word's.

A configuration is comma-separated ``key=value``: ``pad`` (seconds of silence appended to a
buffer), ``probe`` (... to a buffer searched for an utterance's first words), ``retry`` (on a
loop: ``full`` re-decodes at 30 s without the prompt; ``prompt`` first at the same window
without the prompt), and the StreamOptions ``chunk`` (min_chunk_s), ``first``
(first_chunk_s), ``trim`` (trim_after_s), ``margin`` (commit_margin_s), ``early``
(early_close, 0/1), ``context`` (context_tokens), ``lead`` (lead_in_s), ``hold``
(first_commit_s).

``--latency MIN,MAX`` replays each clip ``--seeds`` times with every hypothesis applied a
random MIN-MAX s late (stream/replay.py), as on a loaded server: the WER and work reported
are the seeds' means (each seed's WER is in the JSON). Whisper's text depends on where the
buffers it is given end, so a setting that wins only without delays wins by luck.

Words on time are also given for the real recordings alone (those of at most 30 s). The
alignment of a whole clip gives a pause to the word before it (trimmed past twice the median
word at a sentence's edge), as live finals do with the silence VAD heard after a line, and
starts a clip's first word at 0 s in any leading silence.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
from pathlib import Path

import numpy as np

from audiofast.asr.runtime import load_model
from audiofast.asr.word_timing import force_align
from audiofast.audio import SAMPLE_RATE, load_audio
from audiofast.eval.datasets import domain_corpus, real_speech_clips
from audiofast.eval.tts import synthesize
from audiofast.eval.wer import wer, word_pairs
from audiofast.stream.decoder import StreamDecoder
from audiofast.stream.replay import replay
from audiofast.stream.session import StreamOptions

VOICES = ("flite:slt", "espeak-ng:en-us", "piper:joe", "flite:kal")
OPTION_KEYS = {"chunk": ("min_chunk_s", float), "first": ("first_chunk_s", float),
               "trim": ("trim_after_s", float), "margin": ("commit_margin_s", float),
               "early": ("early_close", lambda v: v not in ("0", "false")),
               "context": ("context_tokens", int), "lead": ("lead_in_s", float),
               "hold": ("first_commit_s", float), "minp": ("commit_min_prob", float)}


def parse_config(spec: str) -> tuple[dict, dict]:
    """``pad=6,chunk=0.5`` -> (StreamDecoder kwargs, StreamOptions kwargs)."""
    decoder, options = {"pad_s": 10.0}, {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        if key == "pad":
            decoder["pad_s"] = float(value)
        elif key == "probe":
            decoder["probe_pad_s"] = float(value)
        elif key == "retry":
            decoder["loop_retry"] = value
        elif key in OPTION_KEYS:
            name, cast = OPTION_KEYS[key]
            options[name] = cast(value)
        else:
            raise SystemExit(f"unknown setting {key!r} in {spec!r}")
    return decoder, options


def latency_range(text: str) -> tuple[float, float]:
    """``0.05,0.9`` -> (0.05, 0.9)."""
    low, _, high = text.partition(",")
    try:
        return float(low), float(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX seconds, not {text!r}") from None


def dialogues(count: int, lines: int = 8, seed: int = 0, sentences: int = 1,
              words: tuple[int, int] = (4, 9), name: str = "dialogue") -> list[dict]:
    """Held-out sentences in turns of two voices, with pauses between the turns: by default
    short lines (one sentence of 4-9 words); ``sentences`` > 1 joins that many per line with
    0.1-0.3 s between them (the long-buffer case)."""
    rng = random.Random(seed)
    pool = [s for s in domain_corpus()[-2000:] if words[0] <= len(s.split()) <= words[1]]
    clips = []
    for k in range(count):
        voices = rng.sample(VOICES, 2)
        parts, spoken = [np.zeros(int(0.5 * SAMPLE_RATE), np.float32)], []
        turns = [[text] for text in rng.sample(pool, lines)] if sentences == 1 \
            else [rng.sample(pool, sentences) for _ in range(lines)]
        for i, turn in enumerate(turns):
            for j, text in enumerate(turn):
                if j:
                    parts.append(np.zeros(int(rng.uniform(0.1, 0.3) * SAMPLE_RATE),
                                          np.float32))
                parts.append(load_audio(synthesize(text, voices[i % 2])))
                spoken.append(text)
            parts.append(np.zeros(int(rng.uniform(0.6, 1.4) * SAMPLE_RATE), np.float32))
        clips.append({"name": f"{name}-{k}", "audio": np.concatenate(parts),
                      "reference": " ".join(spoken)})
    return clips


def timing_agreement(finals: list[dict], reference: list) -> tuple[int, int, int, int]:
    """Streamed words matched to a reference word, and of them: start and end within 0.2 s,
    start within, end within."""
    streamed = [w for e in finals for w in e["words"]]
    pairs = [(streamed[i], reference[j]) for i, j in word_pairs(
        [w["w"] for w in streamed], [w.word for w in reference])]
    starts = [abs(s["start"] - r.start) <= 0.2 for s, r in pairs]
    ends = [abs(s["end"] - r.end) <= 0.2 for s, r in pairs]
    both = sum(a and b for a, b in zip(starts, ends, strict=True))
    return len(pairs), both, sum(starts), sum(ends)


def clip_row(clip: dict, runs: list[tuple]) -> dict:
    """One clip's results over its replays (one per latency seed): WER and work are means,
    ``wers`` each seed's."""
    seconds = len(clip["audio"]) / SAMPLE_RATE
    wers = [wer(clip["reference"], run.text) for run, _ in runs]
    timing = np.sum([timing_agreement(run.finals, clip["aligned"]) if "aligned" in clip
                     else (0, 0, 0, 0) for run, _ in runs], axis=0) / len(runs)
    mean = {key: float(np.mean([stats[key] for _, stats in runs]))
            for key in ("encoder_s", "decoder_s", "align_s", "windows", "full_window")}
    return {"clip": clip["name"], "wer": float(np.mean(wers)), "wers": wers,
            "timed_words": timing[0], "on_time": timing[1], "start_on_time": timing[2],
            "end_on_time": timing[3], "offline_wer": clip["offline"],
            "work_per_s": (mean["encoder_s"] + mean["decoder_s"] + mean["align_s"]) / seconds,
            "encoder_per_s": mean["encoder_s"] / seconds, "windows": mean["windows"],
            "full_window": mean["full_window"],
            "decodes": float(np.mean([run.decodes for run, _ in runs])),
            "ready": float(np.mean([run.ready for run, _ in runs])), "text": runs[0][0].text,
            "texts": [run.text for run, _ in runs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="whisper-base")
    parser.add_argument("--configs", nargs="+", default=["pad=10"])
    parser.add_argument("--dialogues", type=int, default=4)
    parser.add_argument("--long-lines", type=int, default=0,
                        help="dialogues whose lines are three sentences (6-10 s buffers)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--encoder", default="auto", help="as transcribe's --encoder")
    parser.add_argument("--latency", type=latency_range, default=None, metavar="MIN,MAX",
                        help="apply each hypothesis MIN-MAX s late (a loaded server)")
    parser.add_argument("--seeds", type=int, default=4, help="replays per clip with --latency")
    parser.add_argument("--clips", nargs="+", default=None, metavar="NAME",
                        help="replay only these clips (e.g. endgame_nagg_nell dialogue-2)")
    parser.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    args = parser.parse_args()
    runtime = load_model(args.model, threads=args.threads, encoder=args.encoder)
    clips = [{"name": c.name, "audio": load_audio(c.audio), "reference": c.reference,
              "real": True}
             for c in real_speech_clips()] + dialogues(args.dialogues) \
        + dialogues(args.long_lines, lines=4, seed=1, sentences=3, words=(6, 12), name="long")
    if args.clips:
        unknown = set(args.clips) - {c["name"] for c in clips}
        if unknown:
            raise SystemExit(f"unknown clips {sorted(unknown)}: not among "
                             f"{[c['name'] for c in clips]}")
        clips = [c for c in clips if c["name"] in args.clips]
    ct2 = getattr(runtime, "ct2", runtime)  # auto: its CTranslate2 model
    for clip in clips:
        clip["offline"] = wer(clip["reference"], runtime.transcribe(clip["audio"]).text)
        if len(clip["audio"]) <= 30 * SAMPLE_RATE:
            clip["aligned"] = force_align(ct2, clip["audio"], clip["reference"])
    results = []
    for spec in args.configs:
        decoder_kwargs, option_kwargs = parse_config(spec)
        rows = []
        for clip in clips:
            runs = []
            for seed in range(args.seeds if args.latency else 1):
                decoder = StreamDecoder(runtime, **decoder_kwargs)
                run = replay(decoder, clip["audio"], StreamOptions(**option_kwargs),
                             latency=args.latency, seed=seed)
                runs.append((run, dict(decoder.stats)))
            rows.append(clip_row(clip, runs))
        gaps = [r["wer"] - r["offline_wer"] for r in rows]
        real = [r for r, clip in zip(rows, clips, strict=True) if clip.get("real")]
        tts = [r for r, clip in zip(rows, clips, strict=True) if not clip.get("real")]
        result = {"config": spec, "rows": rows,
                  "wer_real": float(np.mean([r["wer"] for r in real] or [np.nan])),
                  "wer_dialogue": float(np.mean([r["wer"] for r in tts] or [np.nan])),
                  "gap_max": max(gaps), "work_per_s": float(np.mean([r["work_per_s"]
                                                                     for r in rows])),
                  "full_window": sum(r["full_window"] for r in rows),
                  **{key: sum(r[key] for r in rows) / max(1, sum(r["timed_words"] for r in rows))
                     for key in ("on_time", "start_on_time", "end_on_time")},
                  "on_time_real": sum(r["on_time"] for r in real)
                  / max(1, sum(r["timed_words"] for r in real))}
        results.append(result)
        print(f"{spec}: WER real {result['wer_real']:.3f} dialogue {result['wer_dialogue']:.3f}"
              f" worst gap {result['gap_max']:+.3f}; work {result['work_per_s']:.2f} s per s,"
              f" {result['full_window']} loop retries; words on time {result['on_time']:.1%} "
              f"(starts {result['start_on_time']:.1%}, ends {result['end_on_time']:.1%}; "
              f"real recordings {result['on_time_real']:.1%})",
              flush=True)
    table = ["WER per clip; work = decode seconds per second of audio; on time = streamed "
             "words within 0.2 s of the forced alignment (clips <= 30 s)", "",
             "| config | " + " | ".join(c["name"] for c in clips)
             + " | work s/s | 30 s retries | words on time |",
             "|---" * (len(clips) + 4) + "|",
             "| offline | " + " | ".join(f"{c['offline']:.3f}" for c in clips) + " | | | |"]
    for r in results:
        table.append(f"| {r['config']} | " + " | ".join(f"{x['wer']:.3f}" for x in r["rows"])
                     + f" | {r['work_per_s']:.2f} | {r['full_window']} | {r['on_time']:.1%} |")
    print("\n".join(table))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"machine": platform.processor() or platform.machine(), "model": args.model,
                  "encoder": args.encoder, "results": results}
        args.out.with_suffix(".json").write_text(json.dumps(record, indent=1))
        args.out.with_suffix(".md").write_text("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
