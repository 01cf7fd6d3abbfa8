"""OpenAI's Realtime transcription protocol on ``serve --http-port``, driven by the official
``openai`` SDK's realtime client (and a raw WebSocket for what the SDK cannot send) against a
real server on loopback: the real recordings at 24 kHz PCM16, server VAD and manual turns, both
session shapes, and a clear error event for every bad input, the session staying open."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
import soxr
from openai import AsyncOpenAI
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from audiofast.asr.options import TranscribeOptions
from audiofast.audio import load_audio
from audiofast.eval.wer import wer
from audiofast.stream.server import ServerOptions, ServerThread

TOKEN = "t0ken"
GA_SESSION = {"type": "transcription", "audio": {"input": {
    "format": {"type": "audio/pcm", "rate": 24000},
    "transcription": {"model": "whisper-1", "language": "en"},
    "turn_detection": {"type": "server_vad"}}}}
COMPLETED = "conversation.item.input_audio_transcription.completed"
DELTA = "conversation.item.input_audio_transcription.delta"


@pytest.fixture(scope="module")
def server(live):
    thread = ServerThread(live, ServerOptions(port=0, http_port=0, token=TOKEN))
    with thread:
        yield thread


def pcm24(audio: np.ndarray) -> bytes:
    """16 kHz float audio as OpenAI's input: PCM16 mono at 24 kHz."""
    resampled = soxr.resample(audio, 16000, 24000)
    return (np.clip(resampled, -1, 1) * 32767).astype("<i2").tobytes()


async def session_events(url: str, pcm: bytes, session: dict, commit: bool = False,
                         headers: dict | None = None, quiet_s: float = 3.0) -> list:
    """Connect with the SDK, configure, send ``pcm`` in 100 ms appends (then a commit), and
    return every event until each committed item has completed and ``quiet_s`` pass."""
    client = AsyncOpenAI(base_url=url, api_key=TOKEN, max_retries=0)
    events = []
    async with client.realtime.connect(extra_query={"intent": "transcription"},
                                       extra_headers=headers or {}) as conn:
        if "input_audio_format" in session:
            await conn.send({"type": "transcription_session.update", "session": session})
        else:
            await conn.session.update(session=session)
        step = 4800  # 100 ms of 24 kHz PCM16
        for i in range(0, len(pcm), step):
            await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i:i + step]).decode())
        if commit:
            await conn.input_audio_buffer.commit()
        while True:
            kinds = [e.type for e in events]
            settled = kinds.count("input_audio_buffer.committed") == kinds.count(COMPLETED) > 0
            try:
                events.append(await asyncio.wait_for(conn.recv(), quiet_s if settled else 60))
            except TimeoutError:
                assert settled, kinds
                return events


def items(events) -> dict[str, list]:
    """Each item's events, in the order they came."""
    out: dict[str, list] = {}
    for event in events:
        item = getattr(event, "item_id", None) or getattr(getattr(event, "item", None), "id",
                                                            None)
        if item is not None:
            out.setdefault(item, []).append(event)
    return out


def test_server_vad_transcripts_match_offline(server, live, clips):
    """Each clip (+ 2 s of silence so its last line closes) within 1 WER point of the
    offline transcript; each utterance an item whose events come in OpenAI's order and whose
    completed transcript is its deltas joined."""
    for name in ("beckett", "clone-test", "two_cities"):
        audio = load_audio(clips[name].audio)
        events = asyncio.run(session_events(
            server.api_url, pcm24(np.concatenate([audio, np.zeros(32000, np.float32)])),
            GA_SESSION))
        assert [e.type for e in events[:2]] == ["session.created", "session.updated"]
        assert events[1].session.audio.input.turn_detection.type == "server_vad"
        per_item = items(events)
        assert len(per_item) >= (1 if name == "clone-test" else 2)  # pauses: several turns
        for item_events in per_item.values():
            kinds = [e.type for e in item_events]
            assert kinds[:4] == ["input_audio_buffer.speech_started",
                                 "input_audio_buffer.speech_stopped",
                                 "input_audio_buffer.committed", "conversation.item.added"]
            assert kinds[-1] == COMPLETED and set(kinds[4:-1]) <= {DELTA}
            assert item_events[0].audio_start_ms < item_events[1].audio_end_ms
            deltas = "".join(e.delta for e in item_events if e.type == DELTA)
            assert item_events[-1].transcript == deltas  # no stray space at the start
        text = " ".join(e.transcript for e in events if e.type == COMPLETED)
        offline = live.transcribe(audio, TranscribeOptions(language="en")).text
        reference = clips[name].reference
        assert wer(reference, text) <= wer(reference, offline) + 0.01, (name, text)


def test_manual_turns_in_the_beta_shape_decode_like_a_file(server, live, clips):
    """``turn_detection: null``: the client's commit ends the item, decoded as a file; the
    beta session shape gets beta event names."""
    audio = load_audio(clips["clone-test"].audio)
    session = {"input_audio_format": "pcm16", "turn_detection": None,
               "input_audio_transcription": {"model": "whisper-1", "language": "en"}}
    events = asyncio.run(session_events(server.api_url, pcm24(audio), session, commit=True,
                                        headers={"OpenAI-Beta": "realtime=v1"}, quiet_s=1.0))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["transcription_session.created", "transcription_session.updated"]
    assert "input_audio_buffer.speech_started" not in kinds
    assert kinds[2:4] == ["input_audio_buffer.committed", "conversation.item.created"]
    offline = live.transcribe(audio, TranscribeOptions(language="en")).text.strip()
    assert [e.transcript for e in events if e.type == COMPLETED] == [offline]


async def raw_session(url: str, messages: list, token: str = TOKEN, wait_s: float = 1.0):
    """Send ``messages`` (dicts as JSON, bytes as binary frames, str as they are) on a raw
    WebSocket; return the events that came back."""
    ws_url = url.replace("http://", "ws://") + "/realtime?intent=transcription"
    out = []
    async with connect(ws_url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        for message in messages:
            await ws.send(json.dumps(message) if isinstance(message, dict) else message)
        try:
            while True:
                out.append(json.loads(await asyncio.wait_for(ws.recv(), wait_s)))
        except (TimeoutError, ConnectionClosed):
            return out


def update(**audio_input) -> dict:
    return {"type": "session.update", "session": {"type": "transcription",
                                                  "audio": {"input": audio_input}}}


def test_bad_input_gets_an_error_event_and_the_session_goes_on(server, clips):
    pcm = pcm24(load_audio(clips["clone-test"].audio))
    bad = [
        (update(format={"type": "audio/pcmu"}), "unsupported_format"),
        (update(format={"type": "audio/pcm", "rate": 16000}), "unsupported_format"),
        (update(turn_detection={"type": "semantic_vad"}), "unsupported"),
        (update(noise_reduction={"type": "near_field"}), "unsupported"),
        (update(transcription={"model": "nova-3"}), "invalid_model"),
        (update(transcription={"language": "xx"}), "invalid_language"),
        (update(turn_detection={"type": "server_vad", "threshold": 2}), "invalid_value"),
        ({"type": "session.update", "session": {"type": "realtime"}}, "unsupported"),
        ({"type": "input_audio_buffer.append", "audio": "@@not base64@@"}, "invalid_value"),
        ({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()},
         "invalid_value"),
        ({"type": "response.create"}, "invalid_event"),
        ("{not json", "invalid_json"),
        (b"\x00\x01", "invalid_event"),
        (update(turn_detection=None), None),  # fine: manual turns
        ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty"),
        ({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}, None),
        (update(turn_detection={"type": "server_vad"}), "session_locked"),
        ({"type": "input_audio_buffer.commit"}, None),
    ]
    events = asyncio.run(raw_session(server.api_url, [m for m, _ in bad], wait_s=20.0))
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert [e["code"] for e in errors] == [code for _, code in bad if code], errors
    assert all(e["message"] and "\n" not in e["message"] for e in errors)
    assert errors[0]["param"] == "session.audio.input.format"
    completed = [e for e in events if e["type"] == COMPLETED]
    assert len(completed) == 1 and wer(clips["clone-test"].reference,
                                       completed[0]["transcript"]) == 0.0


def test_a_bad_token_is_refused(server):
    events = asyncio.run(raw_session(server.api_url, [], token="wrong"))
    assert [e["error"]["code"] for e in events] == ["authentication_error"]
