"""OpenAI's audio API on ``serve --http-port``, driven by the official ``openai`` client and
by curl against a real server on loopback (the fused decoder, as ``audiofast serve`` runs)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading

import openai
import pytest
from openai import OpenAI

from audiofast.audio import load_audio
from audiofast.eval.wer import wer
from audiofast.stream.client import stream_audio
from audiofast.stream.server import ServerOptions, ServerThread

TOKEN = "t0ken"


@pytest.fixture(scope="module")
def server(live):
    options = ServerOptions(port=0, http_port=0, token=TOKEN, max_upload_s=90.0)
    thread = ServerThread(live, options)
    with thread as ws_url:
        thread.ws_url = ws_url
        yield thread


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    return OpenAI(base_url=server.api_url, api_key=TOKEN, max_retries=0)


def test_every_real_clip_as_json(client, clips):
    for name in ("beckett", "clone-test", "endgame_nagg_nell"):
        with open(clips[name].audio, "rb") as f:
            text = client.audio.transcriptions.create(model="whisper-1", file=f).text
        assert wer(clips[name].reference, text) <= 0.05, (name, text)


def test_every_response_format(client, clips):
    clip = clips["beckett"]

    def ask(**kwargs):
        with open(clip.audio, "rb") as f:
            return client.audio.transcriptions.create(model="whisper-base", file=f, **kwargs)

    text = ask(response_format="text")
    assert isinstance(text, str) and wer(clip.reference, text) == 0.0
    srt, vtt = ask(response_format="srt"), ask(response_format="vtt")
    assert srt.startswith("1\n00:00:00,000 --> ") and "Fail better." in srt
    assert vtt.startswith("WEBVTT\n") and "Fail better." in vtt
    verbose = ask(response_format="verbose_json", timestamp_granularities=["word"])
    assert verbose.text == text.strip() and verbose.duration == pytest.approx(9.96, abs=0.05)
    assert verbose.segments and all(s.end > s.start for s in verbose.segments)
    assert {"avg_logprob", "no_speech_prob", "compression_ratio"} <= set(
        verbose.segments[0].model_dump())
    words = [w.word for w in verbose.words]
    assert " ".join(words) == verbose.text and words[0] == "Ever"
    assert all(a.start <= b.start for a, b in zip(verbose.words, verbose.words[1:], strict=False))


def test_streaming_answers_deltas_then_the_whole_text(client, clips):
    with open(clips["two_cities"].audio, "rb") as f:
        events = list(client.audio.transcriptions.create(model="whisper-1", file=f,
                                                         stream=True))
    assert [e.type for e in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1)
    assert events[-1].type == "transcript.text.done" and len(events) > 2
    assert "".join(e.delta for e in events[:-1]).strip() == events[-1].text
    assert wer(clips["two_cities"].reference, events[-1].text) <= 0.03


def test_segments_reach_the_caller_while_the_file_decodes(live, clips):
    """``on_segment`` (what the API streams from) hears each window's segments before the
    next window is decoded; with ``vad_filter`` on the original timeline, as the result."""
    from audiofast.asr.options import TranscribeOptions

    fast = live.runtime_for(TranscribeOptions())
    seen = []
    result = live.transcribe(clips["two_cities"].audio,
                             on_segment=lambda s: seen.append((s, fast.stats["engine_calls"])))
    assert [s for s, _ in seen] == result.segments
    calls = [c for _, c in seen]
    assert calls[0] < calls[-1] == fast.stats["engine_calls"]  # heard before the last window
    seen.clear()
    import numpy as np

    late = np.concatenate([np.zeros(3 * 16000, np.float32), load_audio(clips["beckett"].audio)])
    filtered = live.transcribe(late, vad_filter=True, on_segment=lambda s: seen.append((s, 0)))
    assert [s for s, _ in seen] == filtered.segments
    assert filtered.segments[0].start > 2.5  # on the file's timeline, not the cut one's


def test_a_client_leaving_a_stream_frees_the_engine(server, client, clips):
    """A streaming client that hangs up after the first delta: its decode finishes in the
    background under the file lock, and the next request is served."""
    with open(clips["two_cities"].audio, "rb") as f:
        events = client.audio.transcriptions.create(model="whisper-1", file=f, stream=True)
        first = next(iter(events))
        events.close()  # hang up mid-file
    assert first.type == "transcript.text.delta"
    with open(clips["beckett"].audio, "rb") as f:
        assert "Fail better" in client.audio.transcriptions.create(model="whisper-1",
                                                                   file=f).text


def test_models_and_translation_route(client, clips):
    assert [m.id for m in client.models.list()] == ["whisper-base", "whisper-1"]
    with open(clips["clone-test"].audio, "rb") as f:  # English speech: translation = text
        text = client.audio.translations.create(model="whisper-1", file=f).text
    assert wer(clips["clone-test"].reference, text) <= 0.1


def test_bad_requests_get_openais_error_shape_and_the_server_goes_on(server, client, clips,
                                                                    tmp_path):
    import numpy as np
    import soundfile

    long = tmp_path / "long.wav"  # 99 s: over this server's 90 s limit (a 2-hour file's fate)
    soundfile.write(long, np.concatenate([load_audio(clips[n].audio) for n in
                                          ("two_cities", "beckett", "two_cities")]), 16_000)
    beckett = ("beckett.wav", clips["beckett"].audio.read_bytes())
    cases = [
        (dict(file=("empty.wav", b"")), 400, "empty.wav: empty input"),
        (dict(file=("notes.txt", b"hello " * 200)), 400, "cannot decode audio"),
        (dict(file=("long.wav", long.read_bytes())), 400,
         "audio is 99 s long; this server takes at most 90 s"),
        (dict(file=beckett, response_format="xml"), 400, "response_format must be one of"),
        (dict(file=beckett, model="gpt-4o-transcribe"), 400, "is not served here"),
    ]
    for kwargs, status, message in cases:
        kwargs.setdefault("model", "whisper-1")
        with pytest.raises(openai.APIStatusError) as info:
            client.audio.transcriptions.create(**kwargs)
        error = info.value.body
        assert info.value.status_code == status and message in error["message"], error
        assert error["type"] == "invalid_request_error" and "\n" not in error["message"]
    stranger = OpenAI(base_url=server.api_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()
    with open(clips["beckett"].audio, "rb") as f:  # still serving
        assert "Fail better" in client.audio.transcriptions.create(model="whisper-1",
                                                                   file=f).text


def test_curl(server, clips):
    run = subprocess.run(
        ["curl", "-sS", "-H", f"Authorization: Bearer {TOKEN}",
         "-F", f"file=@{clips['beckett'].audio}", "-F", "model=whisper-1",
         f"{server.api_url}/audio/transcriptions"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["text"].endswith("Fail better.")


def test_live_sessions_do_not_wait_for_an_http_file(server, client, clips, tmp_path):
    """A live session started while an 88 s file decodes over HTTP gets its first words
    before the file is done (live windows decode over caches of their own, side by side
    with the file), and both end with their own text."""
    import time

    import numpy as np
    import soundfile

    names = ("two_cities", "endgame_nagg_nell", "beckett", "clone-test")
    long = tmp_path / "four.wav"
    soundfile.write(long, np.concatenate([load_audio(clips[n].audio) for n in names]), 16_000)
    done: dict[str, float | str] = {}

    def http() -> None:
        with open(long, "rb") as f:
            done["text"] = client.audio.transcriptions.create(model="whisper-1", file=f).text
        done["at"] = time.perf_counter()

    thread = threading.Thread(target=http)
    before = server.server.stats["http_requests"]
    thread.start()
    deadline = time.perf_counter() + 30
    while not server.server.file_lock.locked() and "at" not in done:
        assert time.perf_counter() < deadline, "the file never started decoding"
        time.sleep(0.01)
    first_words: list[float] = []

    def on_event(event: dict) -> None:
        if event.get("type") in ("partial", "final") and event.get("text", "").strip():
            first_words.append(time.perf_counter())

    audio = load_audio(clips["beckett"].audio)
    live = asyncio.run(stream_audio(server.ws_url, audio, speed=0, token=TOKEN,
                                    on_event=on_event))
    thread.join(300)
    assert not thread.is_alive()
    assert first_words and first_words[0] < done["at"]
    reference = " ".join(clips[n].reference for n in names)
    assert wer(reference, done["text"]) <= 0.05
    assert "better" in " ".join(e["text"] for e in live.finals)
    assert server.server.stats["http_requests"] == before + 1
