"""WhisperLive's own client (``whisper-live-client``'s ``TranscriptionClient``) against a real
server on loopback: it plays a real recording to us and writes its SRT from what we send.
PortAudio is stubbed here only (no sound card: playback is a no-op, so the file streams as
fast as the client reads it)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from audiofast.eval.wer import wer
from audiofast.stream.server import ServerOptions, ServerThread

CLIENT_DIR = Path(sys.prefix) / "whisper-live-client"


class _Stream:
    def write(self, data: bytes) -> None: ...
    def read(self, frames: int, exception_on_overflow: bool = False) -> bytes:
        return b"\x00\x00" * frames
    def stop_stream(self) -> None: ...
    def close(self) -> None: ...


class _PyAudio:
    def open(self, **_kwargs) -> _Stream:
        return _Stream()
    def get_format_from_width(self, width: int) -> int:
        return width
    def terminate(self) -> None: ...


@pytest.fixture
def transcription_client(monkeypatch):
    stub = types.ModuleType("pyaudio")
    stub.paInt16, stub.PyAudio = 8, _PyAudio
    monkeypatch.setitem(sys.modules, "pyaudio", stub)
    # scripts/setup.sh installs the client in a folder of its own (its wheel ships a
    # top-level `tests` package too)
    monkeypatch.syspath_prepend(str(CLIENT_DIR))
    for name in [m for m in sys.modules if m.startswith("whisper_live")]:
        monkeypatch.delitem(sys.modules, name)
    from whisper_live.transcription_client import TranscriptionClient

    return TranscriptionClient


def srt_text(path) -> str:
    blocks = path.read_text().strip().split("\n\n")
    return " ".join(" ".join(b.splitlines()[2:]) for b in blocks)


@pytest.mark.parametrize("name", ["beckett", "endgame_nagg_nell"])
def test_whisperlive_client_writes_the_transcript(live, clips, tmp_path, name, monkeypatch,
                                                  transcription_client):
    """The client's SRT holds the recording's words (each completed segment once, in time
    order, the live tail last) within 5 points of the reference."""
    monkeypatch.chdir(tmp_path)  # the client writes its 16 kHz copy of the file here
    # The stubbed playback sends the file at once; the client then waits for 15 s without
    # new text before its END_OF_AUDIO, so its silence can outlast the default 30 s idle
    # limit while 28 s of audio decode on two cores (live, a client sends all along).
    with ServerThread(live, ServerOptions(port=0, idle_timeout_s=120.0)) as url:
        where = urlsplit(url)
        srt = tmp_path / "out.srt"
        client = transcription_client(where.hostname, where.port, lang="en", model="base",
                                      output_transcription_path=str(srt),
                                      log_transcription=False)
        client(str(clips[name].audio))
    assert client.client.server_backend == "faster_whisper" and not client.client.server_error
    text = srt_text(srt)
    assert wer(clips[name].reference, text) <= 0.05, text
    starts = [float(s["start"]) for s in client.client.transcript]
    assert starts == sorted(starts) and len(starts) >= 2
    assert re.match(r"1\n\d\d:\d\d:\d\d,\d\d\d --> ", srt.read_text())
