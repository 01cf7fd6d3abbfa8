"""The ``audiofast`` command: a thin shell over library calls."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from audiofast.asr.writers import FORMATS, WRITERS, write_transcript


def _add_transcribe(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("transcribe", help="transcribe audio files (any format ffmpeg reads)")
    p.add_argument("files", nargs="+", type=Path, metavar="FILE")
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
    p.add_argument("--no-timestamps", action="store_true", help="decode without timestamps")
    p.add_argument("--initial-prompt", default=None)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: for files over a minute)")
    p.set_defaults(run=_run_transcribe)


def _run_transcribe(args: argparse.Namespace) -> int:
    from audiofast.asr.ct2_runtime import CT2Whisper
    from audiofast.asr.options import DecodingOptions
    from audiofast.audio import AudioError

    if args.format == "all" and args.output_dir is None:
        raise SystemExit("audiofast: error: --format all needs --output-dir")
    formats = list(FORMATS) if args.format == "all" else [args.format or "txt"]
    options = DecodingOptions(
        language=args.language, task=args.task, beam_size=args.beam_size,
        without_timestamps=args.no_timestamps, initial_prompt=args.initial_prompt,
    )
    model = CT2Whisper(args.model, threads=args.threads, compute_type=args.compute_type)
    failures = 0
    for path in args.files:
        try:
            result = model.transcribe(path, options, progress=args.progress)
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


def _add_models(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list packaged models; --prepare assembles them")
    p.add_argument("--prepare", action="store_true",
                   help="assemble and verify every installed packaged model in the cache")
    p.set_defaults(run=_run_models)


def _run_models(args: argparse.Namespace) -> int:
    from audiofast.models import DEFAULT_MODEL, PACKAGED_MODELS, packaged_model_dir
    from audiofast.models.packaged import PackageMissingError

    for name in PACKAGED_MODELS:
        default = " (default)" if name == DEFAULT_MODEL else ""
        try:
            where = packaged_model_dir(name) if args.prepare else "installed"
        except PackageMissingError as err:
            where = f"not installed: {err}"
        print(f"{name}{default}\t{where}")
    return 0


def _add_samples(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("samples", help="print paths of the packaged real-speech clips")
    p.add_argument("names", nargs="*", help="clip names (default: all), e.g. two_cities")
    p.set_defaults(run=_run_samples)


def _run_samples(args: argparse.Namespace) -> int:
    from audiofast.eval.datasets import real_speech_clips

    clips = {clip.name: clip for clip in real_speech_clips()}
    unknown = [n for n in args.names if n not in clips]
    if unknown:
        raise SystemExit(f"audiofast: error: no sample {unknown[0]!r}; have {', '.join(clips)}")
    for name in args.names or clips:
        print(clips[name].audio)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="audiofast", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_transcribe(sub)
    _add_models(sub)
    _add_samples(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from audiofast.models import ModelNotFoundError

    try:
        return args.run(args)
    except (ModelNotFoundError, FileNotFoundError, RuntimeError) as err:
        print(f"audiofast: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
