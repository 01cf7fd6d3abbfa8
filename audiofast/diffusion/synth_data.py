"""The proving ground's data: procedurally synthesized, captioned audio whose content is known.

No Stable Audio weights exist offline, so distillation is proven on a small teacher trained
here, and its quality must be *measurable*: every clip is rendered from parameters (an
instrument playing a note or chord at a known pitch and loudness, a noise colour, a drum
pattern at a known tempo) and captioned from templates, so a generated clip can be checked
against its caption (pitch tracking, a category classifier) instead of by ear.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

INSTRUMENTS = ("sine", "square", "saw", "pluck", "organ")
NOISES = ("white", "pink", "brown")
NOTE_NAMES = ("C", "C#", "D", "D#", "E", "F", "F#", "G", "G#", "A", "A#", "B")
CHORDS = {"major": (0, 4, 7), "minor": (0, 3, 7)}
LOUDNESS = {"soft": 0.12, "loud": 0.5}  # peak amplitude
MIDI_RANGE = (48, 72)  # C3 .. C5: well inside what a small model and a pitch tracker handle


@dataclass(frozen=True)
class SynthClip:
    audio: np.ndarray  # float32 [samples], mono
    caption: str
    meta: dict[str, Any] = field(default_factory=dict)  # category, instrument, midi, ...


def midi_to_hz(midi: float) -> float:
    return 440.0 * 2.0 ** ((midi - 69) / 12)


def note_name(midi: int) -> str:
    return f"{NOTE_NAMES[midi % 12]}{midi // 12 - 1}"


def _envelope(n: int, sr: int, attack: float, release: float) -> np.ndarray:
    env = np.ones(n, dtype=np.float32)
    a, r = min(n, int(attack * sr)), min(n, int(release * sr))
    env[:a] = np.linspace(0, 1, a, endpoint=False)
    if r:
        env[n - r:] *= np.linspace(1, 0, r)
    return env


def _additive(freq: float, n: int, sr: int, weights: list[float]) -> np.ndarray:
    """Harmonics below Nyquist only, so square and saw do not alias."""
    t = np.arange(n) / sr
    out = np.zeros(n)
    for k, w in enumerate(weights, start=1):
        if k * freq < sr / 2:
            out += w * np.sin(2 * np.pi * k * freq * t)
    return out


def _pluck(freq: float, n: int, sr: int) -> np.ndarray:
    """A plucked string as its modes: harmonics that start together and die faster the
    higher they are (exactly tuned, unlike a Karplus-Strong delay line rounded to samples)."""
    t = np.arange(n) / sr
    out = np.zeros(n)
    for k in range(1, 21):
        if k * freq < sr / 2:
            out += k ** -1.2 * np.sin(2 * np.pi * k * freq * t) * np.exp(-t * (1.5 + 1.5 * k))
    return out


def render_tone(instrument: str, midis: tuple[int, ...], seconds: float, sr: int) -> np.ndarray:
    n = int(seconds * sr)
    harmonics = {
        "sine": [1.0],
        "square": [1.0 / k if k % 2 else 0.0 for k in range(1, 40)],
        "saw": [1.0 / k for k in range(1, 40)],
        "organ": [1.0, 0.5, 0.0, 0.25, 0.0, 0.12],
    }
    out = np.zeros(n)
    for midi in midis:
        freq = midi_to_hz(midi)
        if instrument == "pluck":
            out += _pluck(freq, n, sr)
        elif instrument in harmonics:
            out += _additive(freq, n, sr, harmonics[instrument])
        else:
            raise ValueError(f"unknown instrument {instrument!r}; one of {INSTRUMENTS}")
    attack = 0.005 if instrument == "pluck" else 0.02
    return out * _envelope(n, sr, attack, 0.05)


def render_noise(color: str, seconds: float, sr: int, rng: np.random.Generator) -> np.ndarray:
    """White, pink (1/f) or brown (1/f^2) noise, shaped in the frequency domain."""
    n = int(seconds * sr)
    spectrum = np.fft.rfft(rng.standard_normal(n))
    f = np.maximum(np.fft.rfftfreq(n, 1 / sr), 20.0)
    power = {"white": 0.0, "pink": 1.0, "brown": 2.0}[color]
    return np.fft.irfft(spectrum / f ** (power / 2), n) * _envelope(n, sr, 0.05, 0.05)


def render_drums(bpm: int, seconds: float, sr: int, rng: np.random.Generator) -> np.ndarray:
    """Kick on beats 1 and 3, snare on 2 and 4, closed hat on every eighth note."""
    n = int(seconds * sr)
    out = np.zeros(n)
    beat = 60.0 / bpm

    def hit(start: float, sound: np.ndarray) -> None:
        i = int(start * sr)
        if i < n:
            out[i:i + len(sound)] += sound[: n - i]

    t = np.arange(int(0.25 * sr)) / sr
    kick = np.sin(2 * np.pi * (50 + 90 * np.exp(-t * 30)) * t) * np.exp(-t * 12)
    snare = rng.standard_normal(len(t)) * np.exp(-t * 25) * 0.6
    hat = rng.standard_normal(len(t) // 4) * np.exp(-t[: len(t) // 4] * 120) * 0.3
    for k in range(int(seconds / beat) + 1):
        hit(k * beat, kick if k % 2 == 0 else snare)
        hit(k * beat, hat)
        hit(k * beat + beat / 2, hat)
    return out


def random_clip(rng: np.random.Generator, sr: int = 16000, seconds: float = 2.0) -> SynthClip:
    """One captioned clip: a note (50%), a chord (20%), noise (15%) or drums (15%)."""
    kind = rng.choice(["note", "chord", "noise", "drums"], p=[0.5, 0.2, 0.15, 0.15])
    loudness = str(rng.choice(list(LOUDNESS)))
    if kind in ("note", "chord"):
        instrument = str(rng.choice(INSTRUMENTS))
        root = int(rng.integers(*MIDI_RANGE))
        if kind == "note":
            midis, what = (root,), f"{note_name(root)} note"
        else:
            quality = str(rng.choice(list(CHORDS)))
            midis = tuple(root + step for step in CHORDS[quality])
            what = f"{NOTE_NAMES[root % 12]} {quality} chord"
        audio = render_tone(instrument, midis, seconds, sr)
        caption = f"a {loudness} {instrument} playing a {what}"
        meta = {"category": instrument, "midi": list(midis), "kind": kind}
    elif kind == "noise":
        color = str(rng.choice(NOISES))
        audio = render_noise(color, seconds, sr, rng)
        caption, meta = f"{loudness} {color} noise", {"category": f"{color} noise"}
    else:
        bpm = int(rng.choice([90, 100, 110, 120, 130, 140]))
        audio = render_drums(bpm, seconds, sr, rng)
        caption, meta = f"a {loudness} drum beat at {bpm} bpm", {"category": "drums",
                                                                  "bpm": bpm}
    peak = np.abs(audio).max() or 1.0
    audio = (audio / peak * LOUDNESS[loudness]).astype(np.float32)
    return SynthClip(audio, caption, meta | {"loudness": loudness, "kind": str(kind)})


def synth_dataset(n: int, seed: int = 0, sr: int = 16000, seconds: float = 2.0) -> list[SynthClip]:
    """``n`` clips, the same for the same seed (one generator drives every choice)."""
    rng = np.random.default_rng(seed)
    return [random_clip(rng, sr, seconds) for _ in range(n)]
