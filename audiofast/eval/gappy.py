"""A long file with gaps between real speech: silence, noise, music, music under noise.

No such recording ships offline, so it is assembled: the four real clips, each after 15 s of
a different kind of gap, and 10 s of music at the end (chords and drums from the SA3 proving
ground's synthesizer). Whisper tends to write text into such gaps; the VAD filter and the
hallucination threshold are measured on it (scripts/bench_vad.py, tests).
"""

from __future__ import annotations

import numpy as np

from audiofast.audio import SAMPLE_RATE, load_audio
from audiofast.eval.datasets import real_speech_clips

GAP_KINDS = ("silence", "noise", "music", "music+noise")


def gap(kind: str, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """``seconds`` of one kind of non-speech (noise at about -30 dB)."""
    from audiofast.diffusion.synth_data import render_drums, render_tone

    n = int(seconds * SAMPLE_RATE)
    if kind == "silence":
        return np.zeros(n, np.float32)
    noise = (0.03 * rng.standard_normal(n)).astype(np.float32)
    if kind == "noise":
        return noise
    music = 0.3 * render_tone("saw", (57, 61, 64), seconds, SAMPLE_RATE)[:n] + \
        0.3 * render_drums(100, seconds, SAMPLE_RATE, rng)[:n]
    return (music + (noise if kind == "music+noise" else 0)).astype(np.float32)


def gappy_file() -> tuple[np.ndarray, str]:
    """The file (16 kHz mono) and the clips' references joined."""
    rng = np.random.default_rng(0)
    clips = real_speech_clips()
    parts, refs = [], []
    for clip, kind in zip(clips, GAP_KINDS, strict=True):
        parts += [gap(kind, 15.0, rng), load_audio(clip.audio)]
        refs.append(clip.reference)
    parts.append(gap("music", 10.0, rng))
    return np.concatenate(parts), " ".join(refs)
