"""VAD filtering of long files: speech kept, gaps cut, times mapped back to the file."""

import numpy as np
import pytest

from audiofast.asr.vad_filter import TimeMap, speech_regions
from audiofast.audio import SAMPLE_RATE, load_audio
from audiofast.eval.wer import wer

RATE = SAMPLE_RATE


def test_time_map_moves_times_back_by_the_cut_silence():
    regions = [(1 * RATE, 3 * RATE), (10 * RATE, 14 * RATE)]  # joined: [0, 2) and [2, 6)
    to_file = TimeMap(regions)
    assert to_file(0.0) == 1.0 and to_file(1.5) == 2.5
    assert to_file(2.0) == 10.0 and to_file(5.0) == 13.0  # a start on a cut: the next region
    assert to_file(2.0, end=True) == 3.0  # an end on a cut: the region before it


@pytest.fixture(scope="module")
def gappy(clips):
    """beckett, 12 s of noise at -40 dB, clone-test, 8 s of silence: where each clip is."""
    rng = np.random.default_rng(0)
    noise = (0.01 * rng.standard_normal(12 * RATE)).astype(np.float32)
    a, b = load_audio(clips["beckett"].audio), load_audio(clips["clone-test"].audio)
    audio = np.concatenate([a, noise, b, np.zeros(8 * RATE, np.float32)])
    return audio, len(a) / RATE, (len(a) + len(noise)) / RATE


def test_speech_regions_skip_noise_and_silence(gappy):
    audio, first_end, second_start = gappy
    regions = [(s / RATE, e / RATE) for s, e in speech_regions(audio)]
    assert regions and regions[0][0] < 1.0
    speech = sum(e - s for s, e in regions)
    assert speech < len(audio) / RATE - 15  # most of the 20 s of gaps is gone
    assert not any(first_end + 1 < s < second_start - 1 for s, _ in regions)


def test_transcribe_with_vad_keeps_the_text_and_the_file_timeline(gappy, clips):
    import audiofast

    audio, _, second_start = gappy
    model = audiofast.load_model("whisper-tiny.en", threads=2)
    result = model.transcribe(audio, vad_filter=True)
    reference = f"{clips['beckett'].reference} {clips['clone-test'].reference}"
    assert wer(reference, result.text) <= 0.1, result.text
    assert result.stats["vad_speech_s"] < len(audio) / RATE - 15
    assert result.duration == pytest.approx(len(audio) / RATE)
    # clone-test's words end on its own place in the file, after the 12 s of noise (a segment
    # may start before the cut: Whisper's segment times are coarse, and faster-whisper's too)
    last = result.segments[-1]
    assert "America" in last.text and second_start < last.end <= len(audio) / RATE - 7.5, \
        [(s.start, s.end, s.text) for s in result.segments]
    silent = model.transcribe(np.zeros(10 * RATE, np.float32), vad_filter=True)
    assert silent.segments == [] and silent.text == ""
