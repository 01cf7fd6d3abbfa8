"""``audiofast eval roundtrip|fad`` and ``audiofast gate``: the judge."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_eval(sub: argparse._SubParsersAction) -> None:
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


def add_gate(sub: argparse._SubParsersAction) -> None:
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
