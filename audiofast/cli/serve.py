"""``audiofast serve`` and ``audiofast stream``: live transcription."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path


def add_serve(sub: argparse._SubParsersAction) -> None:
    from audiofast.asr.engine import PRECISIONS

    p = sub.add_parser("serve", help="live transcription server (WebSocket + web page)")
    p.add_argument("--model", default=None, help="as for transcribe (default: whisper-base)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (not loopback: --token)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--http-port", type=int, default=None, metavar="PORT",
                   help="also serve OpenAI's audio API (/v1/audio/transcriptions, "
                   "/v1/audio/translations, /v1/models) on this port")
    p.add_argument("--max-sessions", type=int, default=8)
    p.add_argument("--agent-port", type=int, default=None, metavar="PORT",
                   help="answer HAProxy's agent check here: 'drain' while --max-sessions are "
                   "open, 'ready' otherwise (configs/haproxy/audiofast.cfg)")
    p.add_argument("--token", default=None, help="bearer token clients must present (shows "
                   "in ps: prefer --token-file or $AUDIOFAST_TOKEN)")
    p.add_argument("--token-file", default=None, help="read the bearer token from this file")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web origin (https://app.example) whose pages may connect, besides "
                        "this server's own page; repeat for more, '*' for any")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: all cores)")
    p.add_argument("--engine", choices=("auto", "fast", "ct2"), default="auto",
                   help="decoder: auto = the fused int8 decoder where its kernels are built, "
                        "else CTranslate2 (as transcribe)")
    p.add_argument("--precision", choices=[x for x in PRECISIONS if x != "fp32"], default=None,
                   help="the fused decoder's weights and K/V, as transcribe's (default: the "
                        "model's own, else int8); e.g. int8-head4-kv8, the gated int4 head")
    p.add_argument("--encoder", choices=("auto", "ct2", "fused", "openvino"), default="auto",
                   help="audio encoder, as transcribe's (auto: fused for buffers of 24 s and "
                        "more on a CPU with AVX-512 VNNI, else CTranslate2)")
    p.add_argument("--no-draft", action="store_true",
                   help="do not verify the previous hypothesis as a draft (fused decoder)")
    p.add_argument("--min-chunk", type=float, default=0.5,
                   help="seconds of new audio before a session is re-decoded")
    p.add_argument("--lead-in", type=float, default=None,
                   help="seconds of earlier speech a line's close is decoded with (0: each "
                   "line alone; default: StreamOptions.lead_in_s, 8)")
    p.add_argument("--pad", type=float, default=10.0,
                   help="seconds of silence appended when encoding a buffer (30: full window)")
    p.add_argument("--probe-pad", type=float, default=4.0,
                   help="the same while looking for an utterance's first words (their text is "
                   "a partial until a --pad decode agrees; at most --pad)")
    p.set_defaults(run=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from audiofast.asr.runtime import load_model
    from audiofast.stream.access import resolve_token
    from audiofast.stream.server import ServerOptions, TranscriptionServer, check_bind
    from audiofast.stream.session import StreamOptions

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        token = resolve_token(args.token, args.token_file)
        check_bind(args.host, token)
    except ValueError as e:
        raise SystemExit(f"audiofast: error: {e}") from None
    lead_in = {} if args.lead_in is None else {"lead_in_s": args.lead_in}
    options = ServerOptions(args.host, args.port, args.max_sessions, token,
                            stream=StreamOptions(min_chunk_s=args.min_chunk, **lead_in),
                            allow_origins=tuple(args.allow_origin), http_port=args.http_port,
                            agent_port=args.agent_port)
    if args.precision and args.engine == "ct2":
        raise SystemExit("audiofast: error: --precision sets the fused decoder's weights; "
                         "--engine ct2 decodes on CTranslate2")
    # Two CTranslate2 replicas: what a user waits on is encoded beside an update's window
    # (DecodeScheduler._beside_urgent), not after it.
    runtime = load_model(args.model, args.engine, threads=args.threads, encoder=args.encoder,
                         precision=args.precision, replicas=2)
    server = TranscriptionServer(runtime, options, args.pad, draft=not args.no_draft,
                                 probe_pad_s=args.probe_pad)
    print(f"audiofast: serving {server.decoder.spec} ({server.decoder.engine} decoder) on "
          f"http://{args.host}:{args.port}/ (WebSocket: ws://{args.host}:{args.port}/asr)"
          + (f"; OpenAI API: http://{args.host}:{args.http_port}/v1" if args.http_port else "")
          + (f"; HAProxy agent: {args.host}:{args.agent_port}" if args.agent_port else ""),
          file=sys.stderr, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(server.serve_forever())
    return 0


def add_stream(sub: argparse._SubParsersAction) -> None:
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
