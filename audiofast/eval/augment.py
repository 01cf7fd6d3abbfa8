"""Make synthetic speech harder: additive noise at an SNR, room reverb, telephone band.

Each augmentation is a pure function of (audio, parameter, seed), so an augmented eval set is
reproducible and cacheable. ``apply`` takes a spec such as ``noise:10`` (10 dB SNR),
``reverb:0.4`` (RT60 of 0.4 s), ``telephone`` or ``lowpass:2000`` (cut-off in Hz).
"""

from __future__ import annotations

import numpy as np
import torch
import torchaudio.functional as AF

from audiofast.audio import SAMPLE_RATE


def add_noise(audio: np.ndarray, snr_db: float, seed: int = 0) -> np.ndarray:
    """White Gaussian noise scaled so that signal power / noise power = ``snr_db``."""
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal(len(audio)).astype(np.float32)
    signal_power = float(np.mean(audio**2)) or 1e-12
    noise *= np.sqrt(signal_power / (10 ** (snr_db / 10)) / float(np.mean(noise**2)))
    return (audio + noise).astype(np.float32)


def reverb(audio: np.ndarray, rt60: float, seed: int = 0) -> np.ndarray:
    """Convolve with a synthetic room response: exponentially decaying noise (60 dB at rt60)."""
    rng = np.random.default_rng(seed)
    n = max(1, int(rt60 * SAMPLE_RATE))
    t = np.arange(n) / SAMPLE_RATE
    response = rng.standard_normal(n) * np.exp(-6.9078 * t / rt60)  # ln(1000) = 6.9078
    response[0] = 1.0  # the direct path
    response /= np.sqrt(np.sum(response**2))
    wet = np.convolve(audio, response)[: len(audio)]
    peak = np.abs(wet).max() or 1.0
    return (wet * min(1.0, np.abs(audio).max() / peak)).astype(np.float32)


def lowpass(audio: np.ndarray, cutoff_hz: float) -> np.ndarray:
    """Two cascaded biquads: a 4th-order low-pass."""
    x = torch.from_numpy(audio)
    for _ in range(2):
        x = AF.lowpass_biquad(x, SAMPLE_RATE, cutoff_hz)
    return x.numpy().astype(np.float32)


def telephone(audio: np.ndarray) -> np.ndarray:
    """300-3400 Hz band, through 8 kHz and back, as a narrow-band phone line sounds."""
    x = torch.from_numpy(audio)
    x = AF.highpass_biquad(x, SAMPLE_RATE, 300.0)
    x = AF.lowpass_biquad(x, SAMPLE_RATE, 3400.0)
    x = AF.resample(AF.resample(x, SAMPLE_RATE, 8000), 8000, SAMPLE_RATE)
    return x.numpy().astype(np.float32)[: len(audio)]


def time_stretch(audio: np.ndarray, factor: float) -> np.ndarray:
    """Play ``factor`` times faster with the pitch kept (phase vocoder)."""
    x = torch.from_numpy(audio)
    window = torch.hann_window(512)
    spec = torch.stft(x, 512, 128, window=window, return_complex=True)
    phase_advance = torch.linspace(0, torch.pi * 128, spec.shape[0])[..., None]
    stretched = AF.phase_vocoder(spec, factor, phase_advance)
    out = torch.istft(stretched, 512, 128, window=window)
    return out.numpy().astype(np.float32)


def apply(audio: np.ndarray, spec: str | None, seed: int = 0) -> np.ndarray:
    """Apply one augmentation named by ``spec`` (see the module docstring)."""
    if not spec:
        return audio
    name, _, arg = spec.partition(":")
    if name == "noise":
        return add_noise(audio, float(arg), seed)
    if name == "reverb":
        return reverb(audio, float(arg), seed)
    if name == "lowpass":
        return lowpass(audio, float(arg))
    if name == "stretch":
        return time_stretch(audio, float(arg))
    if name == "telephone":
        return telephone(audio)
    raise ValueError(f"unknown augmentation {spec!r}: noise:SNR, reverb:RT60, lowpass:HZ, "
                     "stretch:FACTOR, telephone")
