"""``audiofast serve``: live transcription over WebSocket (the ``websockets`` library).

One model serves every session. Sessions only buffer audio and run VAD; a single
scheduler task collects every session with a decode due (waiting ``batch_window_s`` for
more to join, as WhisperLive's batch window does), decodes them as one batch in a worker
thread, and routes each session's events to that session's own outbox, which a per-session
task drains, so a slow reader delays nobody else (see ``scheduler.py``). The same port serves
the web page.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import http
import json
import logging
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from audiofast.stream.access import check_bind, origin_allowed
from audiofast.stream.decoder import StreamDecoder
from audiofast.stream.protocol import (
    END_OF_AUDIO,
    ProtocolError,
    StartConfig,
    error_event,
    parse_json,
    parse_start,
)
from audiofast.stream.scheduler import FAILURES, DecodeScheduler, LiveSession
from audiofast.stream.session import Overloaded, StreamOptions, StreamSession
from audiofast.stream.vad import SpeechDetector, VadOptions

__all__ = ["ServerOptions", "ServerThread", "TranscriptionServer", "check_bind"]
log = logging.getLogger("audiofast.serve")


@dataclass(frozen=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 8765
    max_sessions: int = 8
    token: str | None = None  # bearer token; without one only loopback hosts are allowed
    max_frame_bytes: int = 256 * 1024  # ~1.4 s of 48 kHz stereo float32
    idle_timeout_s: float = 30.0  # no message for this long closes the session
    start_timeout_s: float = 10.0  # the start message must come this soon
    max_outbox: int = 256  # events queued for a reader that does not read
    batch_window_s: float = 0.02
    max_batch: int = 8
    stream: StreamOptions = field(default_factory=StreamOptions)
    vad: VadOptions = field(default_factory=VadOptions)
    allow_origins: tuple[str, ...] = ()  # browser origins besides our own page ("*": any)
    # Kernel send buffer per connection. Autotuned, it grows to megabytes and a reader that
    # stops reading would take hours of events to fill it before ``max_outbox`` could trip.
    send_buffer_bytes: int = 64 * 1024
    # OpenAI's audio API (openai_api.py) on this port; None: off; 0: any free port.
    http_port: int | None = None
    # HAProxy's agent check (haproxy_agent.py) on this port; None: off; 0: any free port.
    agent_port: int | None = None
    max_upload_bytes: int = 100 * 2**20
    max_upload_s: float = 3600.0


class TranscriptionServer:
    def __init__(self, runtime, options: ServerOptions = ServerOptions(), pad_s: float = 10.0,
                 draft: bool = True, probe_pad_s: float = 4.0):
        """``runtime``: what :func:`audiofast.load_model` returns; ``pad_s`` and
        ``probe_pad_s``: the silence encoded after a buffer, for updates and for decodes
        looking for an utterance's first words (see StreamDecoder)."""
        check_bind(options.host, options.token)
        self.runtime = runtime
        self.options = options
        self.sessions: dict[int, LiveSession] = {}
        decoder = StreamDecoder(runtime, pad_s, draft, probe_pad_s=probe_pad_s)
        self.scheduler = DecodeScheduler(decoder, self.sessions,
                                         options.batch_window_s, options.max_batch)
        self.stats = self.scheduler.stats
        # HTTP files (openai_api.py) decode one at a time: they use the runtime's own window
        # and cache. Live batches do not wait for them: each live window has a cache and
        # cross-attention K/V of its own (StreamDecoder), so a file and the live sessions
        # decode side by side, their kernel calls interleaved.
        self.file_lock = asyncio.Lock()
        self.failures: Counter[str] = Counter()  # sessions ended by each FAILURES code
        self._opening = 0

    @property
    def decoder(self) -> StreamDecoder:
        return self.scheduler.decoder

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> Server:
        self.scheduler.start()
        if self.options.http_port is not None:
            await self._start_http()
        if self.options.agent_port is not None:
            from audiofast.stream.haproxy_agent import start_agent

            self.agent = await start_agent(self, self.options.host, self.options.agent_port)
            self.agent_port = self.agent.sockets[0].getsockname()[1]
        return await serve(
            self._handle, self.options.host, self.options.port,
            process_request=self._process_request, max_size=self.options.max_frame_bytes,
            max_queue=32, compression=None,
        )

    async def _start_http(self) -> None:
        """OpenAI's audio API (openai_api.py) on its own port, in this event loop."""
        import uvicorn

        from audiofast.stream.openai_api import create_app

        config = uvicorn.Config(create_app(self), host=self.options.host,
                                port=self.options.http_port, log_level="warning",
                                lifespan="off")
        self.http = uvicorn.Server(config)
        self._http_task = asyncio.create_task(self.http.serve())
        while not self.http.started:
            if self._http_task.done():  # the port is taken, say: report it, do not hang
                self._http_task.result()
                raise OSError(f"the HTTP API could not start on port {self.options.http_port}")
            await asyncio.sleep(0.01)
        self.http_port = self.http.servers[0].sockets[0].getsockname()[1]

    async def serve_forever(self) -> None:
        server = await self.start()
        log.info("listening on ws://%s:%d", self.options.host, self.options.port)
        try:
            await server.serve_forever()
        finally:
            self.scheduler.stopping = True

    # -- HTTP side: the web page, authentication, health --------------------------------
    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
        if upgrade and not origin_allowed(request.headers, self.options.allow_origins,
                                          self.options.token):
            return connection.respond(http.HTTPStatus.FORBIDDEN, "origin not allowed\n")
        if self.options.token and not self._authorized(request):
            return connection.respond(http.HTTPStatus.UNAUTHORIZED, "missing or bad token\n")
        if upgrade:
            if path not in ("/", "/asr"):
                return connection.respond(http.HTTPStatus.NOT_FOUND, "no such endpoint\n")
            return None
        if path in ("/", "/index.html"):
            page = resources.files("audiofast.stream").joinpath("web/index.html").read_bytes()
            headers = Headers([("Content-Type", "text/html; charset=utf-8"),
                               ("Content-Length", str(len(page))),
                               ("Cache-Control", "no-store")])
            return Response(200, "OK", headers, page)
        if path == "/metrics":
            headers = Headers([("Content-Type", "text/plain; version=0.0.4; charset=utf-8")])
            body = self.metrics().encode()
            headers["Content-Length"] = str(len(body))
            return Response(200, "OK", headers, body)
        if path == "/health":
            health = self.health()
            status = http.HTTPStatus.OK if health["ok"] else http.HTTPStatus.SERVICE_UNAVAILABLE
            return connection.respond(status, json.dumps(health) + "\n")
        return connection.respond(http.HTTPStatus.NOT_FOUND, "not found\n")

    def _authorized(self, request: Request) -> bool:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not given:  # browsers cannot set headers on a WebSocket: allow ?token=
            given = parse_qs(urlsplit(request.path).query).get("token", [""])[0]
        return hmac.compare_digest(given.encode(), (self.options.token or "").encode())

    def health(self) -> dict[str, Any]:
        running = self.scheduler.running
        return {"ok": running, "scheduler": "running" if running else "stopped",
                "sessions": len(self.sessions), "max_sessions": self.options.max_sessions,
                **self.stats, "failures": dict(self.failures), "engine": self.decoder.engine,
                "decoder": dict(self.decoder.stats)}

    def load(self) -> tuple[int, int, bool]:
        """(sessions open or opening, max sessions, scheduler running): the agent check's."""
        return (len(self.sessions) + self._opening, self.options.max_sessions,
                self.scheduler.running)

    def metrics(self) -> str:
        """Prometheus' text format: what a load balancer or dashboard needs of this replica
        (sessions against capacity, audio waiting to be decoded, decode work so far)."""
        pending = sum(s.stream.pending_seconds() for s in list(self.sessions.values())
                      if s.stream is not None)
        decoder = self.decoder.stats
        rows = [
            ("sessions", "gauge", "open live sessions", len(self.sessions)),
            ("max_sessions", "gauge", "sessions this replica takes", self.options.max_sessions),
            ("pending_audio_seconds", "gauge", "audio received and not yet decoded", pending),
            ("decode_batches_total", "counter", "decode batches run", self.stats["batches"]),
            ("decodes_total", "counter", "session decodes run", self.stats["decoded"]),
            ("decode_seconds_total", "counter", "encoder + decoder seconds",
             decoder["encoder_s"] + decoder["decoder_s"]),
            ("http_requests_total", "counter", "files decoded over HTTP",
             self.stats["http_requests"]),
            ("session_failures_total", "counter", "sessions ended by an error",
             sum(self.failures.values())),
            ("up", "gauge", "1 while the decode scheduler runs", int(self.scheduler.running)),
        ]
        lines = []
        for name, kind, help_text, value in rows:
            lines += [f"# HELP audiofast_{name} {help_text}", f"# TYPE audiofast_{name} {kind}",
                      f"audiofast_{name} {float(value):g}"]
        return "\n".join(lines) + "\n"

    # -- one connection ----------------------------------------------------------------
    async def _handle(self, ws: ServerConnection) -> None:
        opts = self.options
        if not self.scheduler.running:
            await self._refuse(ws, "unavailable", FAILURES["unavailable"][0], 1011)
            return
        if len(self.sessions) + self._opening >= opts.max_sessions:
            await self._refuse(ws, "busy", f"server busy: {opts.max_sessions} sessions "
                               "already open; try again later", 1013)
            return
        self._opening += 1  # hold the slot while the start message arrives
        try:
            session = await self._open(ws)
        finally:
            self._opening -= 1
        if session is None:
            return
        self._limit_send_buffer(ws)
        self.sessions[session.id] = session
        if not self.scheduler.running:  # it ended while this client was starting
            session.fail("unavailable")
        sender = asyncio.create_task(self._send_loop(session))
        receiver = asyncio.create_task(self._receive_loop(session))
        try:
            session.emit([{"type": "ready", "session": session.id, "sample_rate": 16000,
                           "model": self.decoder.spec}])
            await session.over.wait()
        finally:
            self.sessions.pop(session.id, None)  # the slot is free from here on
            receiver.cancel()
            if session.failed != "slow_reader":
                with contextlib.suppress(asyncio.QueueFull):
                    session.outbox.put_nowait(None)  # the sender stops after what is queued
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(sender, 5)
            sender.cancel()
            await ws.close(session.close_code, session.failed or "")

    async def _open(self, ws: ServerConnection) -> LiveSession | None:
        try:
            first = await asyncio.wait_for(ws.recv(), self.options.start_timeout_s)
            config = parse_start(first, set(self.decoder.tokenizer.languages))
        except TimeoutError:
            await self._refuse(ws, "timeout", "no start message", 1008)
            return None
        except ProtocolError as e:
            await self._refuse(ws, e.code, str(e), 1008)
            return None
        except ConnectionClosed:
            return None
        detector = await asyncio.to_thread(SpeechDetector, self.options.vad)
        stream = StreamSession(self.decoder.tokenizer, self._stream_options(config), detector)
        return LiveSession(ws, config, stream, self.options.max_outbox, self.failures)

    def _stream_options(self, config: StartConfig) -> StreamOptions:
        base = self.options.stream
        return StreamOptions(**{**base.__dict__, "language": config.language,
                                "task": config.task})

    def _limit_send_buffer(self, ws: ServerConnection) -> None:
        sock = ws.transport.get_extra_info("socket")
        if sock is not None and self.options.send_buffer_bytes:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF,
                                self.options.send_buffer_bytes)

    async def _receive_loop(self, session: LiveSession) -> None:
        """Read until the session ends; its handler cancels this once ``over`` is set."""
        try:
            await self._receive(session)
        except ConnectionClosed:
            pass  # abrupt disconnect: drop the session, nobody else is affected
        except Exception:
            log.exception("session %d: handling a message failed", session.id)
            session.fail("internal")
        finally:
            session.over.set()

    async def _receive(self, session: LiveSession) -> None:
        idle = self.options.idle_timeout_s
        while True:
            try:  # after the end message the client waits for us: no idle limit
                message = await asyncio.wait_for(session.ws.recv(),
                                                 None if session.stream.ending else idle)
            except TimeoutError:
                session.fail("idle_timeout", f"no message for {idle:g} s; closing")
                return
            try:
                await self._on_message(session, message)
            except ProtocolError as e:
                session.emit([error_event(e.code, str(e))])
            except Overloaded as e:
                session.fail("overloaded", f"{e}; closing")
                return

    async def _on_message(self, session: LiveSession, message: str | bytes) -> None:
        if session.stream.ending:
            raise ProtocolError("after_end", "message after the end message; ignored")
        ending = message == END_OF_AUDIO and session.config.dialect == "whisperlive"
        if isinstance(message, bytes) and not ending:
            await self._feed(session, session.audio(message))
            return
        if not ending:
            kind = parse_json(message).get("type")
            if kind != "end":
                raise ProtocolError("bad_message", f"unknown message type {str(kind)[:30]!r} "
                                    "(expected binary audio or {\"type\": \"end\"})")
        await self._feed(session, session.audio(b"", last=True), end=True)

    async def _feed(self, session: LiveSession, audio: Any, end: bool = False) -> None:
        """VAD in a worker thread, holding the session's lock so the scheduler leaves this
        stream alone meanwhile; then a close decoded ahead goes out at once."""
        async with session.lock:
            await asyncio.to_thread(self._feed_sync, session.stream, audio, end)
            if not session.over.is_set():
                self.scheduler.close_ahead(session)
        self.scheduler.wake.set()

    @staticmethod
    def _feed_sync(stream: StreamSession, audio: Any, end: bool) -> None:
        if len(audio):
            stream.feed(audio)
        if end:
            stream.end_of_audio()

    async def _send_loop(self, session: LiveSession) -> None:
        while (event := await session.outbox.get()) is not None:
            for text in session.wire(event):
                try:
                    await session.ws.send(text)
                except ConnectionClosed:
                    return

    @staticmethod
    async def _refuse(ws: ServerConnection, code: str, message: str, close_code: int) -> None:
        with contextlib.suppress(ConnectionClosed):
            await ws.send(json.dumps(error_event(code, message)))
            await ws.close(close_code, code)

class ServerThread:
    """Run a server on its own event loop in a background thread (tests, notebooks, apps
    that embed it): ``with ServerThread(runtime, options) as url: ...``."""

    def __init__(self, runtime, options: ServerOptions = ServerOptions(port=0),
                 pad_s: float = 10.0, draft: bool = True, probe_pad_s: float = 4.0):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server = TranscriptionServer(runtime, options, pad_s, draft, probe_pad_s)

    def __enter__(self) -> str:
        self.thread.start()
        self._ws = asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result()
        port = self._ws.sockets[0].getsockname()[1]
        self.http_url = f"http://{self.server.options.host}:{port}/"
        if self.server.options.http_port is not None:
            self.api_url = f"http://{self.server.options.host}:{self.server.http_port}/v1"
        return f"ws://{self.server.options.host}:{port}/asr"

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            self.server.scheduler.stopping = True
            if self.server.options.http_port is not None:
                self.server.http.should_exit = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.server._http_task, 10)
            if self.server.options.agent_port is not None:
                self.server.agent.close()
            self._ws.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ws.wait_closed(), 10)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
