"""The ``audiofast`` command: a thin shell over library calls, one module per command
(transcribe, models/samples, eval/gate, serve/stream, generate, distill, sweep/pipeline)."""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from audiofast.cli import distill, evaluate, generate, models, serve, sweep, transcribe


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="audiofast", description="Make audio models fast without making them worse.")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an internal error (or AUDIOFAST_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (transcribe.add_transcribe, models.add_models, models.add_samples,
                evaluate.add_eval, evaluate.add_gate, serve.add_serve, serve.add_stream,
                generate.add_generate, distill.add_distill, sweep.add_sweep, sweep.add_pipeline):
        add(sub)
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

