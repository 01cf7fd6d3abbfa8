"""Whisper's log-mel front end in numpy (25 ms Hann window, 10 ms hop, Slaney mel, log10).

Matches openai/whisper's ``log_mel_spectrogram``: a centred STFT (reflect padding, periodic
Hann window), the drop of the last frame, librosa's Slaney-scale filterbank, and the clamp to 8
decades below the peak. numpy, not torch: this is the first thing every transcription runs,
and importing torch was most of a cold start (tests check it against torch/torchaudio).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from audiofast.asr.blas import one_blas_thread
from audiofast.audio import SAMPLE_RATE

N_FFT = 400
HOP_LENGTH = 160
CHUNK_SECONDS = 30
N_SAMPLES = CHUNK_SECONDS * SAMPLE_RATE
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames per window
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100

# The Slaney mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above.
_HZ_PER_MEL = 200.0 / 3
_BREAK_HZ = 1000.0
_BREAK_MEL = _BREAK_HZ / _HZ_PER_MEL
_LOG_STEP = np.log(6.4) / 27.0


def hz_to_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    log_part = _BREAK_MEL + np.log(np.maximum(hz, _BREAK_HZ) / _BREAK_HZ) / _LOG_STEP
    return np.where(hz < _BREAK_HZ, hz / _HZ_PER_MEL, log_part)


def mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    log_part = _BREAK_HZ * np.exp(_LOG_STEP * (np.maximum(mel, _BREAK_MEL) - _BREAK_MEL))
    return np.where(mel < _BREAK_MEL, mel * _HZ_PER_MEL, log_part)


@lru_cache(maxsize=4)
def mel_filters(n_mels: int) -> np.ndarray:
    """(n_mels, n_fft // 2 + 1) float32: triangles evenly spaced in mel from 0 Hz to Nyquist,
    each scaled to unit area (Slaney normalisation)."""
    freqs = np.linspace(0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(SAMPLE_RATE / 2), n_mels + 2))
    rising = (freqs[None, :] - edges[:-2, None]) / np.diff(edges)[:-1, None]
    falling = (edges[2:, None] - freqs[None, :]) / np.diff(edges)[1:, None]
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    return (triangles * (2.0 / (edges[2:] - edges[:-2]))[:, None]).astype(np.float32)


@lru_cache(maxsize=1)
def _window() -> np.ndarray:
    """The periodic Hann window (torch.hann_window's default)."""
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)


def log_mel_spectrogram(audio: np.ndarray, n_mels: int = 80, padding: int = 0) -> np.ndarray:
    """(n_mels, frames) float32 log-mel features of 16 kHz mono audio, ``padding`` zeros
    appended."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if padding:
        audio = np.concatenate([audio, np.zeros(padding, np.float32)])
    half = N_FFT // 2
    padded = np.pad(audio, half, mode="reflect")
    count = 1 + (len(padded) - N_FFT) // HOP_LENGTH
    frames = np.lib.stride_tricks.as_strided(
        padded, (count, N_FFT), (padded.strides[0] * HOP_LENGTH, padded.strides[0]),
        writeable=False)
    spectrum = np.fft.rfft(frames * _window(), axis=-1)[:-1]  # Whisper drops the last frame
    power = (spectrum.real ** 2 + spectrum.imag ** 2).astype(np.float32)
    with one_blas_thread():  # see blas.py
        mel = mel_filters(n_mels) @ power.T
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)


def pad_or_trim(mel: np.ndarray, frames: int = N_FRAMES) -> np.ndarray:
    """Cut or zero-pad the time axis to ``frames`` (Whisper's fixed 30 s window)."""
    if mel.shape[-1] > frames:
        return mel[..., :frames]
    if mel.shape[-1] < frames:
        pad = [(0, 0)] * (mel.ndim - 1) + [(0, frames - mel.shape[-1])]
        return np.pad(mel, pad)
    return mel
