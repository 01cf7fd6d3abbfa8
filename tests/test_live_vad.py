"""The live server's VAD: silero's ONNX graph on onnxruntime, checked against the same
network's TorchScript form that the ``silero-vad`` package itself runs."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from audiofast.audio import load_audio
from audiofast.stream.silero_onnx import CHUNK, SileroStream
from audiofast.stream.vad import SpeechDetector


def torchscript_probabilities(audio: np.ndarray) -> list[float]:
    import torch

    from audiofast.asr.vad_filter import load_silero

    model = load_silero()
    chunks = torch.from_numpy(audio[: len(audio) // CHUNK * CHUNK].copy()).view(-1, CHUNK)
    with torch.inference_mode():
        return [float(model(chunk, 16000)) for chunk in chunks]


def test_onnx_stream_matches_silero_torchscript(clips):
    """Per-chunk probabilities of a real recording equal the TorchScript network's (state
    and the 64-sample context carried right), so utterance boundaries are the same."""
    audio = load_audio(clips["beckett"].audio)[: 16000 * 20]
    stream = SileroStream()
    onnx = [stream(chunk) for chunk in audio[: len(audio) // CHUNK * CHUNK].reshape(-1, CHUNK)]
    reference = torchscript_probabilities(audio)
    assert np.abs(np.array(onnx) - np.array(reference)).max() < 1e-4
    assert sum(p > 0.5 for p in onnx) > 100  # it heard speech: the check compared something

    def events(model) -> list[tuple[str, int]]:
        detector = SpeechDetector(model=model)
        found = [e for start in range(0, len(audio), 1600)
                 for e in detector.feed(audio[start:start + 1600])]
        return [(e.kind, e.sample) for e in found]

    probs = iter(reference)
    boundaries = events(SileroStream())
    assert boundaries == events(lambda chunk: next(probs))
    assert len(boundaries) >= 6


def test_streams_keep_their_own_state(clips):
    """Two streams on the one shared graph: interleaving them changes nothing."""
    audio = load_audio(clips["clone-test"].audio)[: 16000 * 3]
    chunks = audio[: len(audio) // CHUNK * CHUNK].reshape(-1, CHUNK)
    alone = SileroStream()
    expected = [alone(c) for c in chunks]
    a, b = SileroStream(), SileroStream()
    got = []
    for c in chunks:
        got.append(a(c))
        b(np.zeros(CHUNK, dtype=np.float32))
    assert got == expected


def test_wrong_chunk_size_is_refused():
    with pytest.raises(ValueError, match="chunks of 512"):
        SileroStream()(np.zeros(300, dtype=np.float32))


def test_live_vad_never_imports_torch(clips):
    """The server runs a detector per session: torch would cost ~400 MB and a second."""
    code = ("import sys; from audiofast.audio import load_audio; "
            "from audiofast.stream.vad import SpeechDetector; "
            f"a = load_audio({str(clips['clone-test'].audio)!r}); "
            "e = SpeechDetector().feed(a); assert e and e[0].kind == 'start', e; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_a_stream_ending_in_a_pause_ends_its_utterance_where_the_pause_began():
    """A stream that stops during a pause not yet long enough to end the utterance closes it
    where the silence began (the sample a closing decode done ahead used); one that stops
    mid-speech, at its last sample."""
    pause = iter(range(10**6))
    detector = SpeechDetector(model=lambda chunk: float(10 <= next(pause) < 40))
    assert [e.kind for e in detector.feed(np.zeros(CHUNK * 45, np.float32))] == ["start"]
    assert detector.pending_end == 40 * CHUNK  # 5 chunks (0.16 s) of silence: not an end yet
    assert [(e.kind, e.sample) for e in detector.flush()] == [("end", 40 * CHUNK)]
    speech = iter(range(10**6))
    detector = SpeechDetector(model=lambda chunk: float(next(speech) >= 10))
    detector.feed(np.zeros(CHUNK * 45 + 100, np.float32))
    assert [(e.kind, e.sample) for e in detector.flush()] == [("end", CHUNK * 45 + 100)]
