"""Whisper's log-mel front end in torch (25 ms Hann window, 10 ms hop, Slaney mel, log10).

Matches openai/whisper's ``log_mel_spectrogram``: the same filterbank (librosa's Slaney
scale), the drop of the last STFT frame, and the clamp to 8 decades below the peak.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torchaudio

from audiofast.audio import SAMPLE_RATE

N_FFT = 400
HOP_LENGTH = 160
CHUNK_SECONDS = 30
N_SAMPLES = CHUNK_SECONDS * SAMPLE_RATE
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames per window
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100


@lru_cache(maxsize=4)
def mel_filters(n_mels: int) -> torch.Tensor:
    """(n_mels, n_fft // 2 + 1) Slaney-normalised mel filterbank, as librosa builds it."""
    fbanks = torchaudio.functional.melscale_fbanks(
        n_freqs=N_FFT // 2 + 1,
        f_min=0.0,
        f_max=SAMPLE_RATE / 2,
        n_mels=n_mels,
        sample_rate=SAMPLE_RATE,
        norm="slaney",
        mel_scale="slaney",
    )
    return fbanks.T.contiguous()


def log_mel_spectrogram(
    audio: np.ndarray | torch.Tensor, n_mels: int = 80, padding: int = 0
) -> torch.Tensor:
    """(n_mels, frames) log-mel features of 16 kHz mono audio, ``padding`` zeros appended."""
    audio = torch.as_tensor(audio, dtype=torch.float32)
    if padding:
        audio = torch.nn.functional.pad(audio, (0, padding))
    window = torch.hann_window(N_FFT)
    stft = torch.stft(audio, N_FFT, HOP_LENGTH, window=window, return_complex=True)
    power = stft[..., :-1].abs() ** 2
    log_spec = torch.clamp(mel_filters(n_mels) @ power, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def pad_or_trim(mel: torch.Tensor, frames: int = N_FRAMES) -> torch.Tensor:
    """Cut or zero-pad the time axis to ``frames`` (Whisper's fixed 30 s window)."""
    if mel.shape[-1] > frames:
        return mel[..., :frames]
    if mel.shape[-1] < frames:
        return torch.nn.functional.pad(mel, (0, frames - mel.shape[-1]))
    return mel
