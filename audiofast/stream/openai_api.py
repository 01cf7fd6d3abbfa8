"""OpenAI's audio API on ``audiofast serve --http-port``: existing clients and SDKs unchanged.

``POST /v1/audio/transcriptions`` and ``/v1/audio/translations`` take OpenAI's multipart form
(``file``, ``model``, ``language``, ``prompt``, ``response_format`` = json | text | srt | vtt |
verbose_json, ``temperature``, ``timestamp_granularities[]``, ``stream``); ``GET /v1/models``
lists what this server transcribes with. Files are decoded by the live server's own model, one
at a time (``server.file_lock``: they share the runtime's own window and cache); live batches
do not wait for a file (each live window decodes over a cache and K/V of its own), so both
go on side by side. ``stream=true`` answers Server-Sent
Events, a ``transcript.text.delta`` per segment as soon as its window is decoded (the runtime's
``on_segment``), then ``transcript.text.done``. Every failure is OpenAI's error JSON with a
one-line message; one that happens after a stream started is an ``error`` event.

A port of its own because the WebSocket library answers only handshakes: its HTTP parser
refuses any request with a body. Same process, model, token and loopback rule.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import FastAPI, Form, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from audiofast.asr.options import TranscribeOptions
from audiofast.asr.types import Segment, Transcription
from audiofast.asr.writers import to_srt, to_vtt
from audiofast.audio import SAMPLE_RATE, AudioError, load_audio

if TYPE_CHECKING:
    from audiofast.stream.server import TranscriptionServer

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
ALIASES = ("whisper-1",)  # what OpenAI's examples send: served by the loaded model


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.kind,
                                       "param": self.param, "code": None}}, self.status)


def create_app(server: TranscriptionServer) -> FastAPI:
    """The HTTP API over ``server``'s model and file lock."""
    app = FastAPI(title="audiofast", docs_url=None, redoc_url=None, openapi_url=None)
    options = server.options
    model_name = server.decoder.spec  # the loaded model, as /v1/models lists it

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def bad_form(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = str(first.get("loc", ["", "?"])[-1])
        return APIError(400, f"{param}: {first.get('msg', 'invalid request')}", param).response()

    @app.middleware("http")
    async def authenticate(request: Request, call_next):
        if options.token:
            given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), options.token.encode()):
                return APIError(401, "missing or bad API key (Authorization: Bearer ...)",
                                kind="authentication_error").response()
        return await call_next(request)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "audiofast"}
            for name in (model_name, *ALIASES)]}

    async def handle(task: str, file: UploadFile, model: str, language: str | None,
                     prompt: str | None, response_format: str, temperature: float,
                     granularities: list[str] | None, stream: bool):
        if model not in (model_name, *ALIASES):
            raise APIError(400, f"model {model!r} is not served here (this server runs "
                           f"{model_name!r}; 'whisper-1' means it too)", "model")
        if response_format not in FORMATS:
            raise APIError(400, f"response_format must be one of {', '.join(FORMATS)}, not "
                           f"{response_format!r}", "response_format")
        if not 0.0 <= temperature <= 1.0:
            raise APIError(400, f"temperature must be in [0, 1], not {temperature}",
                           "temperature")
        payload = await file.read(options.max_upload_bytes + 1)
        if len(payload) > options.max_upload_bytes:
            raise APIError(413, f"file is larger than this server's limit of "
                           f"{options.max_upload_bytes // 2**20} MB", "file")
        try:
            audio = await asyncio.to_thread(load_audio, payload)
        except AudioError as err:
            raise APIError(400, str(err).replace("<bytes>", file.filename or "file"),
                           "file") from None
        seconds = len(audio) / SAMPLE_RATE
        if seconds > options.max_upload_s:
            raise APIError(400, f"audio is {seconds:.0f} s long; this server takes at most "
                           f"{options.max_upload_s:.0f} s", "file")
        words = "word" in (granularities or [])
        decoding = TranscribeOptions(
            language=language or None, task=task, initial_prompt=prompt or None,
            word_timestamps=words,
            temperatures=(temperature,) if temperature > 0 else TranscribeOptions.temperatures)
        if stream:
            tok = server.decoder.tokenizer
            if not tok.multilingual and (language or "en") != "en":
                raise APIError(400, f"this model is English-only; cannot transcribe "
                               f"{language!r}", "language")
            return _stream(server, audio, decoding)
        t0 = time.perf_counter()
        try:
            async with server.file_lock:
                result = await asyncio.to_thread(server.runtime.transcribe, audio, decoding,
                                                 False)
        except ValueError as err:  # e.g. another language on an English-only model
            raise APIError(400, str(err).splitlines()[0]) from None
        server.stats["http_requests"] += 1
        server.stats["http_decode_s"] += time.perf_counter() - t0
        return _respond(result, response_format, task, words)

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(
        file: UploadFile, model: Annotated[str, Form()],
        language: Annotated[str | None, Form()] = None,
        prompt: Annotated[str | None, Form()] = None,
        response_format: Annotated[str, Form()] = "json",
        temperature: Annotated[float, Form()] = 0.0,
        timestamp_granularities: Annotated[list[str] | None,
                                           Form(alias="timestamp_granularities[]")] = None,
        stream: Annotated[bool, Form()] = False,
    ):
        return await handle("transcribe", file, model, language, prompt, response_format,
                            temperature, timestamp_granularities, stream)

    @app.post("/v1/audio/translations")
    async def translations(
        file: UploadFile, model: Annotated[str, Form()],
        prompt: Annotated[str | None, Form()] = None,
        response_format: Annotated[str, Form()] = "json",
        temperature: Annotated[float, Form()] = 0.0,
    ):
        return await handle("translate", file, model, None, prompt, response_format,
                            temperature, None, False)

    from audiofast.stream.openai_realtime import add_realtime

    add_realtime(app, server)
    return app


def _respond(result: Transcription, response_format: str, task: str, words: bool):
    if response_format == "text":
        return PlainTextResponse(result.text + "\n")
    if response_format == "srt":
        return PlainTextResponse(to_srt(result))
    if response_format == "vtt":
        return PlainTextResponse(to_vtt(result), media_type="text/vtt")
    if response_format == "json":
        return {"text": result.text}
    body: dict[str, Any] = {
        "task": task, "language": result.language, "duration": round(result.duration, 3),
        "text": result.text,
        "segments": [{"id": s.id, "seek": s.seek, "start": s.start, "end": s.end,
                      "text": s.text, "tokens": s.tokens, "temperature": s.temperature,
                      "avg_logprob": s.avg_logprob, "compression_ratio": s.compression_ratio,
                      "no_speech_prob": s.no_speech_prob} for s in result.segments]}
    if words:
        body["words"] = [{"word": w.word.strip(), "start": w.start, "end": w.end}
                         for s in result.segments for w in s.words or []]
    return body


def _event(event: dict[str, Any]) -> str:
    return f"data: {json.dumps(event)}\n\n"


def _stream(server: TranscriptionServer, audio, options: TranscribeOptions) -> StreamingResponse:
    """OpenAI's transcription stream: a delta per segment while the file decodes, then the
    whole text. The decode is a task of its own (under the file lock, in a worker thread),
    so it ends and frees the engine whether or not the client stays to read."""
    loop = asyncio.get_running_loop()
    segments: asyncio.Queue[Segment | None] = asyncio.Queue()

    def each(segment: Segment) -> None:
        loop.call_soon_threadsafe(segments.put_nowait, segment)

    async def decode() -> Transcription:
        async with server.file_lock:
            t0 = time.perf_counter()
            result = await asyncio.to_thread(server.runtime.transcribe, audio, options, False,
                                             False, each)
            server.stats["http_requests"] += 1
            server.stats["http_decode_s"] += time.perf_counter() - t0
            return result

    job = asyncio.create_task(decode())
    _running.add(job)  # the loop keeps only weak references to tasks
    job.add_done_callback(_running.discard)
    job.add_done_callback(lambda _: segments.put_nowait(None))

    async def events():
        while (segment := await segments.get()) is not None:
            yield _event({"type": "transcript.text.delta", "delta": segment.text})
        try:
            result = job.result()
        except Exception as err:  # e.g. a language the model cannot do
            yield _event({"type": "error", "error": {
                "message": str(err).splitlines()[0] or type(err).__name__,
                "type": "invalid_request_error"}})
            return
        yield _event({"type": "transcript.text.done", "text": result.text})

    return StreamingResponse(events(), media_type="text/event-stream")


_running: set[asyncio.Task] = set()
