"""OpenAI's Realtime transcription sessions on ``serve --http-port``: ``/v1/realtime``.

What the ``openai`` SDK's ``client.realtime.connect(extra_query={"intent": "transcription"})``
and the services that copy it speak. The client configures the session with ``session.update``
(GA: ``session.type`` "transcription", ``audio.input.{format, transcription, turn_detection}``)
or the beta ``transcription_session.update`` (``input_audio_format``,
``input_audio_transcription``, ``turn_detection``), then streams ``input_audio_buffer.append``
(base64 PCM16 mono at 24 kHz) and may ``commit`` or ``clear`` the buffer.

With server VAD (the default) the audio is a live session like the WebSocket ones: the same
VAD, LocalAgreement policy and decode scheduler, batched with them. Each utterance is an item:
``input_audio_buffer.speech_started`` at its onset, ``speech_stopped`` + ``committed`` at its
end, then its text as ``conversation.item.input_audio_transcription.delta`` events (what was
committed live while it was spoken goes out at once, the rest as the close decodes) and
``...completed`` with the whole transcript. With ``turn_detection: null`` the client's
``commit`` ends an item, decoded as a file (the HTTP API's path), a delta per segment.

Anything it cannot honour (another audio format, semantic VAD, noise reduction, logprobs, a
model it does not serve) is an ``error`` event naming the parameter; the session stays open.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import json
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import WebSocket, WebSocketDisconnect

from audiofast.asr.options import TranscribeOptions
from audiofast.audio import SAMPLE_RATE
from audiofast.stream.protocol import ProtocolError
from audiofast.stream.realtime_config import (
    RealtimeConfig,
    RealtimeError,
    updated_config,
)
from audiofast.stream.realtime_session import Item, RealtimeSession
from audiofast.stream.scheduler import FAILURES
from audiofast.stream.session import Overloaded, StreamSession
from audiofast.stream.vad import SpeechDetector

if TYPE_CHECKING:
    from audiofast.stream.server import TranscriptionServer

log = logging.getLogger("audiofast.serve")
MIN_COMMIT_S = 0.1  # OpenAI refuses to commit less than 100 ms


def add_realtime(app, server: TranscriptionServer) -> None:
    """Mount ``/v1/realtime`` (WebSocket) on the HTTP API's app."""
    options = server.options

    @app.websocket("/v1/realtime")
    async def realtime(ws: WebSocket) -> None:
        await ws.accept()
        session = None
        try:
            refusal = _refusal(server, ws)
            if refusal is not None:
                await ws.send_text(json.dumps({"type": "error", "event_id": "event_0",
                                               "error": {"type": "invalid_request_error",
                                                         "code": refusal[0],
                                                         "message": refusal[1],
                                                         "param": None, "event_id": None}}))
                await ws.close(refusal[2])
                return
            beta = ws.query_params.get("intent") == "transcription" and \
                ws.headers.get("openai-beta", "").startswith("realtime=v1")
            config = RealtimeConfig(  # the VAD settings the live sessions were tuned on
                language=options.stream.language,
                model=ws.query_params.get("model") or "whisper-1",
                threshold=options.vad.threshold,
                prefix_padding_ms=round(options.stream.pre_roll_s * 1000),
                silence_duration_ms=round(options.vad.min_silence_s * 1000))
            session = RealtimeSession(ws, config, None, beta, options.max_outbox,
                                      server.failures)
            created = "transcription_session.created" if beta else "session.created"
            session.emit([session.event(created, session=config.describe(beta))])
            sender = asyncio.create_task(_send_loop(session))
            try:
                await _receive(server, session)
            except WebSocketDisconnect:
                return  # the client left: drop the session, nobody else is affected
            finally:
                server.sessions.pop(session.id, None)
                session.over.set()
                with contextlib.suppress(asyncio.QueueFull):
                    session.outbox.put_nowait(None)  # the sender stops after what is queued
                await asyncio.wait([sender], timeout=5)
                sender.cancel()
            with contextlib.suppress(RuntimeError):
                await ws.close(session.close_code)
        except WebSocketDisconnect:
            pass
        finally:
            if session is not None:
                server.sessions.pop(session.id, None)


def _refusal(server: TranscriptionServer, ws: WebSocket) -> tuple[str, str, int] | None:
    options = server.options
    if options.token:
        given = ws.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), options.token.encode()):
            return "authentication_error", "missing or bad API key (Authorization: Bearer " \
                "...)", 1008
    if not server.scheduler.running:
        return "unavailable", FAILURES["unavailable"][0], 1011
    if len(server.sessions) >= options.max_sessions:
        return "busy", f"server busy: {options.max_sessions} sessions already open; try " \
            "again later", 1013
    return None


async def _send_loop(session: RealtimeSession) -> None:
    while (event := await session.outbox.get()) is not None:
        try:
            await session.ws.send_text(json.dumps(event))
        except (WebSocketDisconnect, RuntimeError):
            return


async def _receive(server: TranscriptionServer, session: RealtimeSession) -> None:
    idle = server.options.idle_timeout_s
    while not session.over.is_set():
        try:
            message = await asyncio.wait_for(session.ws.receive_text(), idle)
        except TimeoutError:
            session.fail("idle_timeout", f"no message for {idle:g} s; closing")
            return
        except KeyError:  # a binary frame: receive_text found no text
            session.emit([session.error("invalid_event", "send JSON text events; audio goes "
                                        "base64 in input_audio_buffer.append")])
            continue
        client_event = None
        try:
            event = json.loads(message)
            if not isinstance(event, dict):
                raise RealtimeError("invalid_event", "an event must be a JSON object")
            client_event = event.get("event_id")
            await _on_event(server, session, event)
        except json.JSONDecodeError as e:
            session.emit([session.error("invalid_json", f"not JSON: {e.msg} at position "
                                        f"{e.pos}")])
        except RealtimeError as e:
            session.emit([session.error(e.code, str(e), e.param, client_event)])
        except ProtocolError as e:
            session.emit([session.error(e.code, str(e), None, client_event)])
        except Overloaded as e:
            session.fail("overloaded", f"{e}; closing")
            return


async def _on_event(server: TranscriptionServer, session: RealtimeSession,
                    event: dict[str, Any]) -> None:
    kind = event.get("type")
    if kind in ("session.update", "transcription_session.update"):
        beta = kind == "transcription_session.update" or session.beta
        if session.stream is not None or session.buffer:
            raise RealtimeError("session_locked", "update the session before the first "
                                "audio: this server fixes it then", "session")
        session.realtime = updated_config(session.realtime, event.get("session"), beta,
                                          set(server.decoder.tokenizer.languages),
                                          server.decoder.spec)
        session.beta = beta
        updated = "transcription_session.updated" if beta else "session.updated"
        session.emit([session.event(updated, session=session.realtime.describe(beta))])
    elif kind == "input_audio_buffer.append":
        audio = _decode_audio(session, event.get("audio"))
        if session.realtime.server_vad:
            if session.stream is None:
                _open_stream(server, session)
            await server._feed(session, audio)
            session.emit([])  # the VAD's onsets and ends
        else:
            session.buffer.append(audio)
    elif kind == "input_audio_buffer.commit":
        await _commit(server, session)
    elif kind == "input_audio_buffer.clear":
        if session.stream is not None:
            session.hidden.update(u.index for u in session.stream.utterances
                                  if u.end is None and not _committed(session, u.index))
        session.buffer.clear()
        session.emit([session.event("input_audio_buffer.cleared")])
    else:
        raise RealtimeError("invalid_event", f"unknown or unsupported event type "
                            f"{str(kind)[:40]!r} on a transcription session", "type")


def _committed(session: RealtimeSession, index: int) -> bool:
    item = session.items.get(index)
    return item is not None and item.committed


def _decode_audio(session: RealtimeSession, payload: Any) -> np.ndarray:
    if not isinstance(payload, str):
        raise RealtimeError("invalid_value", "audio must be a base64 string", "audio")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeError("invalid_value", "audio is not valid base64", "audio") from None
    if len(raw) % 2:
        raise RealtimeError("invalid_value", f"{len(raw)} bytes is not whole PCM16 samples",
                            "audio")
    return session.audio(raw)


def _open_stream(server: TranscriptionServer, session: RealtimeSession) -> None:
    """The live session the scheduler decodes, with the client's VAD settings."""
    config = session.realtime
    stream_options = replace(server.options.stream, language=config.language,
                             pre_roll_s=config.prefix_padding_ms / 1000)
    vad = server.options.vad
    vad = replace(vad, threshold=config.threshold, min_silence_s=config.silence_duration_ms / 1000,
                  neg_threshold=min(vad.neg_threshold, config.threshold - 0.05))
    session.stream = StreamSession(server.decoder.tokenizer, stream_options,
                                   SpeechDetector(vad))
    if config.prompt:
        tok = server.decoder.tokenizer
        session.stream.context = tok.encode(" " + config.prompt.strip())[
            -stream_options.context_tokens:]
    server.sessions[session.id] = session
    server.scheduler.wake.set()


async def _commit(server: TranscriptionServer, session: RealtimeSession) -> None:
    if session.realtime.server_vad:
        stream = session.stream
        utt = stream.utterances[-1] if stream is not None and stream.utterances else None
        if utt is None or utt.end is not None or utt.index in session.hidden:
            raise RealtimeError("input_audio_buffer_commit_empty", "nothing to commit: no "
                                "speech is open in the buffer")
        async with session.lock:
            utt.end = stream.received  # the client ends the turn: as if VAD had
        session.emit([])
        server.scheduler.wake.set()
        return
    audio = np.concatenate(session.buffer) if session.buffer else np.zeros(0, np.float32)
    if len(audio) < MIN_COMMIT_S * SAMPLE_RATE:
        raise RealtimeError("input_audio_buffer_commit_empty", f"buffer too small: "
                            f"{len(audio) / SAMPLE_RATE * 1000:.0f} ms of audio; commit at "
                            f"least {MIN_COMMIT_S * 1000:.0f} ms")
    session.buffer.clear()
    item = session.new_item(-len(session.items) - 1)  # manual turns: negative keys
    session.emit(session.commit(item))
    task = asyncio.create_task(_transcribe_turn(server, session, item, audio))
    _running.add(task)
    task.add_done_callback(_running.discard)


async def _transcribe_turn(server: TranscriptionServer, session: RealtimeSession, item: Item,
                           audio: np.ndarray) -> None:
    """A committed buffer, decoded as the HTTP API decodes a file; a delta per segment."""
    loop = asyncio.get_running_loop()
    config = session.realtime
    options = TranscribeOptions(language=config.language, initial_prompt=config.prompt or None)

    def each(segment) -> None:
        loop.call_soon_threadsafe(lambda: session.emit(session._text(item, segment.text.strip())))

    try:
        async with server.file_lock:
            await asyncio.to_thread(server.runtime.transcribe, audio, options, False, False,
                                    each)
    except Exception as err:  # e.g. another language on an English-only model
        log.warning("realtime session %d: transcription failed: %s", session.id, err)
        session.emit([session.event(
            "conversation.item.input_audio_transcription.failed", item_id=item.id,
            content_index=0, error={"type": "transcription_error", "code": "failed",
                                    "message": str(err).splitlines()[0] or type(err).__name__,
                                    "param": None})])
        return
    session.emit([session.complete(item, len(audio) / SAMPLE_RATE)])


_running: set[asyncio.Task] = set()
