"""``audiofast serve``: live transcription over WebSocket (the ``websockets`` library).

One model serves every session. Sessions only buffer audio and run VAD; a single
scheduler task collects every session with a decode due (waiting ``batch_window_s`` for
more to join, as WhisperLive's batch window does), decodes them as one batch in a worker
thread, and routes each session's events to that session's own outbox, which a per-session
task drains, so a slow reader delays nobody else. The same port serves the web page.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import http
import ipaddress
import itertools
import json
import logging
import threading
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from audiofast.asr.ct2_runtime import CT2Whisper
from audiofast.stream.decoder import StreamDecoder
from audiofast.stream.protocol import (
    END_OF_AUDIO,
    AudioDecoder,
    ProtocolError,
    StartConfig,
    WhisperLiveView,
    error_event,
    parse_json,
    parse_start,
)
from audiofast.stream.session import Overloaded, StreamOptions, StreamSession
from audiofast.stream.vad import SpeechDetector, VadOptions

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


def check_bind(host: str, token: str | None) -> None:
    """Refuse to expose an unauthenticated server beyond this machine."""
    if token:
        return
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ValueError(f"refusing to listen on {host} without --token (no token: loopback only)")


class LiveSession:
    """One connection: its stream policy, audio format, and outbox."""

    ids = itertools.count(1)

    def __init__(self, ws: ServerConnection, config: StartConfig, stream: StreamSession,
                 max_outbox: int):
        self.id = next(self.ids)
        self.ws = ws
        self.config = config
        self.stream = stream
        self.audio = AudioDecoder(config)
        self.lock = threading.Lock()  # VAD runs in a worker thread, decoding in another
        self.outbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(max_outbox)
        self.done = asyncio.Event()
        self.view = WhisperLiveView(config.uid or "") if config.dialect == "whisperlive" else None
        self.failed: str | None = None

    def emit(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            try:
                self.outbox.put_nowait(event)
            except asyncio.QueueFull:
                self.failed = "slow_reader"
                return

    def wire(self, event: dict[str, Any]) -> str | None:
        message = self.view.translate(event) if self.view else event
        return json.dumps(message) if message is not None else None


class TranscriptionServer:
    def __init__(self, runtime: CT2Whisper, options: ServerOptions = ServerOptions(),
                 pad_s: float = 10.0):
        check_bind(options.host, options.token)
        self.runtime = runtime
        self.options = options
        self.decoder = StreamDecoder(runtime, pad_s=pad_s)
        self.sessions: dict[int, LiveSession] = {}
        self._opening = 0
        self._wake = asyncio.Event()
        self.stats = {"batches": 0, "decoded": 0, "max_batch": 0}

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> Server:
        self._scheduler = asyncio.create_task(self._schedule())
        return await serve(
            self._handle, self.options.host, self.options.port,
            process_request=self._process_request, max_size=self.options.max_frame_bytes,
            max_queue=32, compression=None,
        )

    async def serve_forever(self) -> None:
        server = await self.start()
        log.info("listening on ws://%s:%d", self.options.host, self.options.port)
        await server.serve_forever()

    # -- HTTP side: the web page and authentication ------------------------------------
    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if self.options.token and not self._authorized(request):
            return connection.respond(http.HTTPStatus.UNAUTHORIZED, "missing or bad token\n")
        if request.headers.get("Upgrade", "").lower() == "websocket":
            if path not in ("/", "/asr"):
                return connection.respond(http.HTTPStatus.NOT_FOUND, "no such endpoint\n")
            return None
        if path in ("/", "/index.html"):
            page = resources.files("audiofast.stream").joinpath("web/index.html").read_bytes()
            headers = Headers([("Content-Type", "text/html; charset=utf-8"),
                               ("Content-Length", str(len(page))),
                               ("Cache-Control", "no-store")])
            return Response(200, "OK", headers, page)
        if path == "/health":
            return connection.respond(http.HTTPStatus.OK, json.dumps(self.health()) + "\n")
        return connection.respond(http.HTTPStatus.NOT_FOUND, "not found\n")

    def _authorized(self, request: Request) -> bool:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not given:  # browsers cannot set headers on a WebSocket: allow ?token=
            given = parse_qs(urlsplit(request.path).query).get("token", [""])[0]
        return hmac.compare_digest(given.encode(), (self.options.token or "").encode())

    def health(self) -> dict[str, Any]:
        return {"sessions": len(self.sessions), "max_sessions": self.options.max_sessions,
                **self.stats}

    # -- one connection ----------------------------------------------------------------
    async def _handle(self, ws: ServerConnection) -> None:
        opts = self.options
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
        self.sessions[session.id] = session
        sender = asyncio.create_task(self._send_loop(session))
        try:
            session.emit([{"type": "ready", "session": session.id, "sample_rate": 16000,
                           "model": self.runtime.resolved.spec}])
            await self._receive_loop(session)
        finally:
            self.sessions.pop(session.id, None)
            with contextlib.suppress(asyncio.QueueFull):
                session.outbox.put_nowait(None)  # the sender stops after what is queued
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(sender, 5)
            sender.cancel()
            await ws.close()

    async def _open(self, ws: ServerConnection) -> LiveSession | None:
        try:
            first = await asyncio.wait_for(ws.recv(), self.options.start_timeout_s)
            config = parse_start(first, set(self.runtime.tokenizer.languages))
        except TimeoutError:
            await self._refuse(ws, "timeout", "no start message", 1008)
            return None
        except ProtocolError as e:
            await self._refuse(ws, e.code, str(e), 1008)
            return None
        except ConnectionClosed:
            return None
        detector = await asyncio.to_thread(SpeechDetector, self.options.vad)
        stream = StreamSession(self.runtime.tokenizer, self._stream_options(config), detector)
        return LiveSession(ws, config, stream, self.options.max_outbox)

    def _stream_options(self, config: StartConfig) -> StreamOptions:
        base = self.options.stream
        return StreamOptions(**{**base.__dict__, "language": config.language,
                                "task": config.task})

    async def _receive_loop(self, session: LiveSession) -> None:
        ws = session.ws
        while session.failed is None:
            try:
                message = await asyncio.wait_for(ws.recv(), self.options.idle_timeout_s)
            except TimeoutError:
                session.emit([error_event("idle_timeout", f"no message for "
                                          f"{self.options.idle_timeout_s:g} s; closing")])
                return
            except ConnectionClosed:
                return  # abrupt disconnect: drop the session, nobody else is affected
            try:
                if await self._on_message(session, message):
                    await session.done.wait()
                    session.emit([{"type": "closed", "reason": "end of audio"}])
                    return
            except ProtocolError as e:
                session.emit([error_event(e.code, str(e))])
            except Overloaded as e:
                session.emit([error_event("overloaded", f"{e}; closing")])
                return
        session.emit([error_event(session.failed, "client does not read its events; closing")])

    async def _on_message(self, session: LiveSession, message: str | bytes) -> bool:
        """Handle one message; True once the client said the audio is over."""
        ending = message == END_OF_AUDIO and session.config.dialect == "whisperlive"
        if isinstance(message, bytes) and not ending:
            if session.stream.ending:
                raise ProtocolError("after_end", "audio after the end message; ignored")
            audio = session.audio(message)
            await asyncio.to_thread(self._feed, session, audio)
            self._wake.set()
            return False
        if not ending:
            msg = parse_json(message)
            kind = msg.get("type")
            if kind != "end":
                raise ProtocolError("bad_message", f"unknown message type {str(kind)[:30]!r} "
                                    "(expected binary audio or {\"type\": \"end\"})")
        tail = session.audio(b"", last=True)
        await asyncio.to_thread(self._feed, session, tail, True)
        self._wake.set()
        return True

    @staticmethod
    def _feed(session: LiveSession, audio: Any, end: bool = False) -> None:
        with session.lock:
            if len(audio):
                session.stream.feed(audio)
            if end:
                session.stream.end_of_audio()

    async def _send_loop(self, session: LiveSession) -> None:
        while (event := await session.outbox.get()) is not None:
            text = session.wire(event)
            if text is None:
                continue
            try:
                await session.ws.send(text)
            except ConnectionClosed:
                return

    @staticmethod
    async def _refuse(ws: ServerConnection, code: str, message: str, close_code: int) -> None:
        with contextlib.suppress(ConnectionClosed):
            await ws.send(json.dumps(error_event(code, message)))
            await ws.close(close_code, code)

    # -- the decode scheduler ----------------------------------------------------------
    async def _schedule(self) -> None:
        rotation = 0
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(self.options.batch_window_s)
            live = list(self.sessions.values())
            rotation += 1
            live = live[rotation % len(live):] + live[:rotation % len(live)] if live else live
            batch = []
            for session in live:
                if len(batch) == self.options.max_batch:
                    self._wake.set()  # the rest go next round
                    break
                with session.lock:
                    request = session.stream.next_request()
                if request is not None:
                    batch.append((session, request))
            for session in live:
                if session.stream.finished:
                    session.done.set()
            if not batch:
                continue
            try:
                hyps = await asyncio.to_thread(self.decoder.decode, [r for _, r in batch])
            except Exception as e:  # a decode failure must not take the server down
                log.exception("decode failed")
                for session, _ in batch:
                    session.failed = "internal"
                    session.emit([error_event("internal", f"decoding failed: {e}")])
                continue
            self.stats["batches"] += 1
            self.stats["decoded"] += len(batch)
            self.stats["max_batch"] = max(self.stats["max_batch"], len(batch))
            for (session, _), hyp in zip(batch, hyps, strict=True):
                with session.lock:
                    session.emit(session.stream.apply(hyp))
                    if session.stream.finished:
                        session.done.set()
            self._wake.set()  # results may make more decodes due


class ServerThread:
    """Run a server on its own event loop in a background thread (tests, notebooks, apps
    that embed it): ``with ServerThread(runtime, options) as url: ...``."""

    def __init__(self, runtime: CT2Whisper, options: ServerOptions = ServerOptions(port=0),
                 pad_s: float = 10.0):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server = TranscriptionServer(runtime, options, pad_s)

    def __enter__(self) -> str:
        self.thread.start()
        self._ws = asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result()
        port = self._ws.sockets[0].getsockname()[1]
        self.http_url = f"http://{self.server.options.host}:{port}/"
        return f"ws://{self.server.options.host}:{port}/asr"

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
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
