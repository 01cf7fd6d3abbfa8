"""Audio in: decode, resample and downmix in one pass (ffmpeg, through PyAV).

A file already in Whisper's format (mono, 16 kHz, PCM WAV or FLAC) is read with soundfile
instead: the same samples (int16 / 32768, nothing to resample or mix). Every other input goes
through ffmpeg's decoders and resampler via PyAV, which gives the samples torchcodec gives
(equal on the real clips, tested) without importing torch: torchcodec's import pulls in
``torch._dynamo``, ~1.5 s of a cold ``audiofast transcribe`` (measured).

Every failure a user can cause (missing file, empty file, a text file, a video without sound, a
clip with no samples) becomes an :class:`AudioError` with one line that names the file.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

SAMPLE_RATE = 16_000  # what Whisper's front end expects


class AudioError(ValueError):
    """Audio could not be read; the message is one line naming the input."""


AudioSource = str | Path | bytes | np.ndarray | Any  # Any: a torch tensor


def load_audio(source: AudioSource, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Decode ``source`` (any format ffmpeg reads) to mono float32 at ``sample_rate``.

    Arrays and tensors are taken as already-decoded mono samples at ``sample_rate``.
    """
    if not isinstance(source, str | Path | bytes):
        if hasattr(source, "detach"):  # a torch tensor (not imported here: see above)
            source = source.detach().cpu().numpy()
        samples = np.asarray(source, dtype=np.float32)
        if samples.ndim == 2:  # (channels, samples)
            samples = samples.mean(0)
        if samples.ndim != 1:
            raise AudioError(f"audio array must be 1-D or (channels, samples), got "
                             f"{tuple(samples.shape)}")
        return _check_samples(samples, "array")

    if isinstance(source, bytes):
        name, payload = "<bytes>", source
        if not payload:
            raise AudioError("<bytes>: empty input, no audio")
    else:
        path = Path(source)
        name = str(path)
        if not path.exists():
            raise AudioError(f"{name}: no such file")
        if path.is_dir():
            raise AudioError(f"{name}: is a directory, not an audio file")
        if path.stat().st_size == 0:
            raise AudioError(f"{name}: empty file, no audio")
        payload = str(path)
        direct = _read_direct(path, sample_rate)
        if direct is not None:
            return _check_samples(direct, name)
    try:
        samples = _decode(io.BytesIO(payload) if isinstance(payload, bytes) else payload,
                          sample_rate)
    except AudioError as err:
        raise AudioError(f"{name}: {err}") from None
    except Exception as err:  # av.error.FFmpegError and kin: not audio ffmpeg can read
        raise AudioError(f"{name}: cannot decode audio ({_decode_failure(str(err))})") from None
    return _check_samples(samples, name)


def _decode(source: Any, sample_rate: int) -> np.ndarray:
    """All of the first audio stream, resampled and downmixed to mono float32 by ffmpeg."""
    import av

    with av.open(source, metadata_errors="ignore") as container:
        if not container.streams.audio:
            raise AudioError("cannot decode audio (no audio stream in the file)")
        resampler = av.AudioResampler(format="flt", layout="mono", rate=sample_rate)
        pieces = []
        for frame in container.decode(container.streams.audio[0]):
            pieces += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
        pieces += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)


def _read_direct(path: Path, sample_rate: int) -> np.ndarray | None:
    """The samples of a mono PCM WAV/FLAC file at ``sample_rate``, or None when ffmpeg must
    decode it (another rate, channels or encoding, or anything soundfile cannot open)."""
    try:
        import soundfile

        with soundfile.SoundFile(str(path)) as f:
            if (f.samplerate != sample_rate or f.channels != 1 or f.format not in
                    ("WAV", "FLAC") or f.subtype != "PCM_16"):
                return None
            return f.read(dtype="float32")
    except Exception:  # not a file soundfile reads: ffmpeg decides, and reports failures
        return None


def _decode_failure(message: str) -> str:
    """Turn an ffmpeg error into a short reason."""
    if "stream" in message.lower():
        return "no audio stream in the file"
    if "Invalid data" in message:
        return "not a recognised audio format"
    return message.strip().splitlines()[0][:200] if message.strip() else "unknown error"


def _check_samples(samples: np.ndarray, name: str) -> np.ndarray:
    if samples.size == 0:
        raise AudioError(f"{name}: audio has no samples")
    if not np.isfinite(samples).all():
        raise AudioError(f"{name}: audio contains NaN or infinite samples")
    return np.ascontiguousarray(samples, dtype=np.float32)
