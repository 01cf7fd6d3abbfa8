"""``audiofast transcribe``: files -> text/subtitles, on CTranslate2 or the owned engine."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from audiofast.asr.engine import PRECISIONS
from audiofast.asr.options import TranscribeOptions
from audiofast.asr.writers import FORMATS, WRITERS, write_transcript

DEFAULTS = TranscribeOptions()  # the library's defaults are the CLI's


def add_transcribe(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("transcribe", help="transcribe audio files (any format ffmpeg reads)")
    p.add_argument("files", nargs="*", type=Path, metavar="FILE")
    p.add_argument("--model", default=None,
                   help="packaged name (whisper-base, whisper-tiny.en), CTranslate2 or Hugging "
                        "Face directory, or hub id (default: whisper-base)")
    p.add_argument("--format", choices=[*FORMATS, "all"], default=None,
                   help="output format (default: txt; 'all' needs --output-dir)")
    p.add_argument("--output-dir", type=Path, default=None,
                   help="write <stem>.<format> files here instead of printing")
    p.add_argument("--language", default=None, help="e.g. en, fr (default: detect)")
    p.add_argument("--task", choices=["transcribe", "translate"], default="transcribe")
    p.add_argument("--beam-size", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: all cores)")
    p.add_argument("--compute-type", default="int8", help="CTranslate2 compute type")
    p.add_argument("--encoder", choices=["auto", "ct2", "fused", "openvino"], default="auto",
                   help="audio encoder: auto (default: fused for windows of 24 s and more on "
                   "a CPU with AVX-512 VNNI, else CTranslate2), ct2 (CTranslate2 int8), fused "
                   "(audiofast's int8 kernels, attention in fp32), or openvino (fp32, exported "
                   "once into the cache)")
    p.add_argument("--engine", choices=["auto", "ct2", "fast"], default="auto",
                   help="decoder: audiofast's own int8 engine (fast: greedy, ~3x faster-whisper "
                   "with its C++ kernels) or CTranslate2 (ct2: beams, batched chunks, other "
                   "compute types); auto (default): fast where its kernels are built and the "
                   "options allow it, else ct2")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="the fast engine's decoder: int8 (the fused C++ decoder: per-channel "
                        "weights, each row's activations quantized alone, so drafting is "
                        "lossless); int4 / int4-head8 / int8-head4 (int4 weights in groups of "
                        "64 in every linear, the layers, or the head); or fp32 (the eager "
                        "reference decoder, slower)")
    p.add_argument("--drafter", choices=["none", "ngram", "model", "block"], default="none",
                   help="fast engine: drafted tokens verified by the model (lossless)")
    p.add_argument("--draft-model", type=Path, default=None,
                   help="--drafter model / block: a drafter from 'audiofast distill --stage "
                   "drafter [--kind block]'")
    p.add_argument("--no-timestamps", action="store_true", help="decode without timestamps")
    p.add_argument("--word-timestamps", action="store_true",
                   help="time every word from the model's cross-attention: words with "
                   "probabilities in json, one subtitle cue per word in srt/vtt")
    p.add_argument("--hallucination-silence-threshold", type=float, default=None,
                   metavar="SECONDS", help="skip a segment that looks hallucinated (unsure, "
                   "oddly timed words) next to a silence longer than SECONDS (times words)")
    p.add_argument("--initial-prompt", default=None)
    p.add_argument("--vad", action="store_true",
                   help="decode only the speech silero VAD finds (long silences, music and "
                        "noise are cut out; times stay on the file's timeline)")
    p.add_argument("--window-pad", type=_window_pad, default=DEFAULTS.window_pad,
                   metavar="SECONDS|off",
                   help="encode a window shorter than 30 s as its audio + SECONDS of silence "
                   "(default 2: passed the judge's gate vs 30 s windows, 0 failed; a window "
                   "whose greedy decode fails is redone at 30 s); off: always 30 s, as Whisper")
    p.add_argument("--batch-size", type=_count, default=0, metavar="N",
                   help="N > 0: cut the file at pauses into independent chunks and decode N "
                   "at a time (CTranslate2 engine); 0 (default): Whisper's sequential windows")
    p.add_argument("--chunk-length", type=_chunk_seconds, default=DEFAULTS.chunk_length,
                   metavar="SECONDS",
                   help="with --batch-size: longest chunk, at most 30 (default 25)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: for files over a minute)")
    p.add_argument("--preset", default=None, metavar="NAME",
                   help="a configuration chosen by 'audiofast sweep' (configs/presets/NAME.yaml "
                   "or a YAML path): sets the options left at their defaults")
    p.add_argument("--ray", type=Path, default=None, metavar="DIR|MANIFEST",
                   help="transcribe a corpus on a Ray cluster (the [ray] extra) into --output "
                   "(parquet): a directory of audio files or a manifest (one path per line); "
                   "resumable, a second run skips the files done")
    p.add_argument("--output", type=Path, default=None, metavar="FILE.parquet",
                   help="with --ray: the parquet file of transcripts")
    p.add_argument("--workers", type=_count, default=0, metavar="N",
                   help="with --ray: model replicas (Ray actors); 0 (default): the cluster's "
                   "CPUs / --threads")
    p.add_argument("--ray-address", default=None, metavar="ADDRESS",
                   help="with --ray: join this cluster (default: RAY_ADDRESS, else start one "
                   "here)")
    p.set_defaults(run=_run_transcribe, preset_defaults=_preset_defaults(p))


def _preset_defaults(p: argparse.ArgumentParser) -> dict:
    from audiofast.sweep.preset import TRANSCRIBE_KEYS

    return {dest: p.get_default(dest) for dest in TRANSCRIBE_KEYS.values() if dest}


def _count(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"want a whole number >= 0, not {value!r}")
    return int(value)


def _chunk_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want seconds, not {value!r}") from None
    if not 0 < seconds <= 30:
        raise argparse.ArgumentTypeError("must be in (0, 30] seconds (Whisper's window)")
    return seconds


def _window_pad(value: str) -> float | None:
    if value == "off":
        return None
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want seconds >= 0 or 'off', not {value!r}") from None
    if seconds < 0:
        raise argparse.ArgumentTypeError("must be >= 0 seconds (or 'off')")
    return seconds


def _run_transcribe(args: argparse.Namespace) -> int:
    from audiofast.asr.options import TranscribeOptions
    from audiofast.asr.runtime import load_model
    from audiofast.audio import AudioError

    tuning = {}
    if args.preset:
        from audiofast.sweep.preset import apply_cli_preset

        tuning = apply_cli_preset(args, "asr")
    if (args.ray is None) == (not args.files):
        raise SystemExit("audiofast: error: give audio FILEs or --ray DIR|MANIFEST (not both)")
    if args.format == "all" and args.output_dir is None:
        raise SystemExit("audiofast: error: --format all needs --output-dir")
    formats = list(FORMATS) if args.format == "all" else [args.format or "txt"]
    options = TranscribeOptions(
        language=args.language, task=args.task, beam_size=args.beam_size,
        without_timestamps=args.no_timestamps, initial_prompt=args.initial_prompt,
        window_pad=args.window_pad, batch_size=args.batch_size, chunk_length=args.chunk_length,
        word_timestamps=args.word_timestamps,
        hallucination_silence_threshold=args.hallucination_silence_threshold,
    )
    if args.ray is not None:
        return _run_corpus(args, options)
    model = load_model(args.model, args.engine, threads=args.threads,
                       compute_type=args.compute_type, precision=args.precision,
                       encoder=args.encoder, drafter=args.drafter, draft_model=args.draft_model)
    if hasattr(model, "make_drafter") and (tuning.get("draft_len") or tuning.get("ngram_order")):
        from audiofast.sweep.asr_runtime import tune_drafter

        tune_drafter(model, tuning.get("draft_len"), tuning.get("ngram_order"))
    failures = 0
    for path in args.files:
        try:
            result = model.transcribe(path, options, progress=args.progress,
                                      vad_filter=args.vad)
        except (AudioError, ValueError) as err:  # one bad file must not cost the others
            print(f"audiofast: error: {err}", file=sys.stderr)
            failures += 1
            continue
        if args.output_dir is None:
            sys.stdout.write(WRITERS[formats[0]](result))
        else:
            for fmt in formats:
                print(write_transcript(result, path, fmt, args.output_dir))
    return 1 if failures else 0


def _run_corpus(args: argparse.Namespace, options) -> int:
    if args.output is None:
        raise SystemExit("audiofast: error: --ray needs --output FILE.parquet")
    try:
        from audiofast.scale.ray_corpus import CorpusError, transcribe_corpus
    except ImportError as err:
        raise SystemExit(f"audiofast: error: --ray needs the [ray] extra ({err})") from None
    model_args = dict(model=args.model, engine=args.engine, compute_type=args.compute_type,
                      precision=args.precision, encoder=args.encoder, drafter=args.drafter,
                      draft_model=args.draft_model)
    try:
        summary = transcribe_corpus(
            args.ray, args.output, model_args=model_args, options=options, vad_filter=args.vad,
            workers=args.workers or None, threads_per_worker=args.threads or 1,
            address=args.ray_address, progress=args.progress is not False)
    except CorpusError as err:
        raise SystemExit(f"audiofast: error: {err}") from None
    for path, error in summary.failed:
        print(f"audiofast: error: {error if error.startswith(path) else f'{path}: {error}'}",
              file=sys.stderr)
    rate = (f", {summary.audio_seconds / summary.wall_seconds:.1f}x real time on "
            f"{summary.workers} worker(s)" if summary.wall_seconds else "")
    print(f"{summary.output}: {summary.files} files ({summary.transcribed} transcribed now, "
          f"{summary.audio_seconds:.0f} s of audio in {summary.wall_seconds:.1f} s{rate}; "
          f"{len(summary.failed)} failed)", file=sys.stderr)
    return 1 if summary.failed else 0
