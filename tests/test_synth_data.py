"""The proving ground's synthetic clips are what their captions say."""

from __future__ import annotations

import numpy as np
import pytest

from audiofast.diffusion.synth_data import (
    INSTRUMENTS,
    LOUDNESS,
    midi_to_hz,
    note_name,
    render_drums,
    render_tone,
    synth_dataset,
)

SR = 16000


def f0_hz(audio: np.ndarray) -> float:
    """Autocorrelation pitch (the idea behind YIN): the first repeat period between 1 and
    20 ms that correlates within 10 % of the best one (later multiples are octave errors),
    refined by parabolic interpolation."""
    x = audio[: SR // 2] - audio[: SR // 2].mean()
    ac = np.fft.irfft(np.abs(np.fft.rfft(x, 2 * len(x))) ** 2)[: SR // 50]
    lo = SR // 1000
    good = ac[lo:-1] >= 0.9 * ac[lo:].max()
    peaks = good & (ac[lo:-1] >= ac[lo - 1:-2]) & (ac[lo:-1] >= ac[lo + 1:])
    lag = lo + int(np.flatnonzero(peaks)[0])
    a, b, c = ac[lag - 1], ac[lag], ac[lag + 1]
    return SR / (lag + 0.5 * (a - c) / (a - 2 * b + c))


@pytest.mark.parametrize("instrument", INSTRUMENTS)
@pytest.mark.parametrize("midi", [48, 57, 69])
def test_notes_sound_at_their_pitch(instrument, midi):
    audio = render_tone(instrument, (midi,), 2.0, SR)
    assert f0_hz(audio) == pytest.approx(midi_to_hz(midi), rel=0.01)


def test_note_names_and_unknown_instrument():
    assert [note_name(m) for m in (60, 69, 49)] == ["C4", "A4", "C#3"]
    with pytest.raises(ValueError, match="unknown instrument 'kazoo'"):
        render_tone("kazoo", (60,), 0.1, SR)


def test_drums_follow_the_tempo():
    bpm = 120
    audio = render_drums(bpm, 4.0, SR, np.random.default_rng(0))
    frames = np.abs(audio[: len(audio) // 160 * 160]).reshape(-1, 160).sum(axis=1)  # 10 ms
    onsets = np.flatnonzero(np.diff((frames > frames.max() * 0.2).astype(int)) == 1)
    assert np.median(np.diff(onsets)) * 0.01 == pytest.approx(60 / bpm / 2, abs=0.02)


def test_dataset_is_seeded_captioned_and_scaled():
    clips = synth_dataset(40, seed=1)
    again = synth_dataset(40, seed=1)
    assert all(a.caption == b.caption and np.array_equal(a.audio, b.audio)
               for a, b in zip(clips, again, strict=True))
    assert [c.caption for c in synth_dataset(40, seed=2)] != [c.caption for c in clips]
    kinds = {c.meta["kind"] for c in clips}
    assert kinds == {"note", "chord", "noise", "drums"}
    for clip in clips:
        assert clip.audio.dtype == np.float32 and clip.audio.shape == (2 * SR,)
        assert np.abs(clip.audio).max() == pytest.approx(LOUDNESS[clip.meta["loudness"]],
                                                         rel=1e-4)
        assert clip.meta["loudness"] in clip.caption
        if clip.meta["kind"] == "note":
            assert note_name(clip.meta["midi"][0]) in clip.caption
            assert clip.meta["category"] in clip.caption
