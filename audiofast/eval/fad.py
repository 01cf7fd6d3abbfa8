"""Frechet Audio Distance: embed clips, fit a Gaussian, compare to a reference Gaussian.

The default embedder runs offline on packaged weights: the Whisper encoder's last layer
(``whisper-base``, 512-d, one frame per 20 ms). The last layer is where Whisper's encoder
summarises what the decoder needs, so it reacts to everything that damages intelligibility
and timbre (noise, band limits, smearing) while being indifferent to loudness; the frames are
the samples of the Gaussian, as fadtk does with its frame-level embedders. VGGish, PANN,
CLAP and EnCodec plug in through the ``frechet-audio-distance`` package where their weights
are on disk (``ExternalEmbedder``). Embeddings and (mean, covariance) statistics are cached
per embedder.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from tqdm import tqdm

from audiofast.audio import SAMPLE_RATE, load_audio
from audiofast.cache import cache_dir

AUDIO_SUFFIXES = {".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".aac"}


@dataclass
class Stats:
    mu: np.ndarray
    cov: np.ndarray
    n: int = 0

    @classmethod
    def of(cls, embeddings: np.ndarray) -> Stats:
        x = np.asarray(embeddings, dtype=np.float64)
        if x.ndim != 2 or len(x) < 2:
            raise ValueError(f"need (samples >= 2, dim) embeddings, got shape {x.shape}")
        return cls(x.mean(0), np.cov(x, rowvar=False), len(x))

    def save(self, path: Path) -> None:
        np.savez(path, mu=self.mu, cov=self.cov, n=self.n)

    @classmethod
    def load(cls, path: Path, name: str | None = None) -> Stats:
        """Our ``.npz`` (mu, cov, n) or a fadtk statistics file (``<name>.mu``/``<name>.cov``)."""
        data = np.load(path)
        if name is not None:
            return cls(data[f"{name}.mu"], data[f"{name}.cov"])
        return cls(data["mu"], data["cov"], int(data["n"]))


def _sqrt_psd(matrix: np.ndarray) -> np.ndarray:
    values, vectors = np.linalg.eigh(matrix)
    return (vectors * np.sqrt(np.clip(values, 0, None))) @ vectors.T


def frechet_distance(a: Stats, b: Stats) -> float:
    """|mu_a - mu_b|^2 + tr(S_a + S_b - 2 (S_a S_b)^1/2).

    tr((S_a S_b)^1/2) is computed as tr((A S_b A)^1/2) with A = S_a^1/2: a symmetric PSD
    matrix whose square root comes from an eigendecomposition, so no complex round-off.
    """
    if a.mu.shape != b.mu.shape:
        raise ValueError(f"statistics of different dimensions: {a.mu.shape} vs {b.mu.shape}")
    root_a = _sqrt_psd(a.cov)
    middle = root_a @ b.cov @ root_a
    trace_sqrt = np.sqrt(np.clip(np.linalg.eigvalsh((middle + middle.T) / 2), 0, None)).sum()
    diff = a.mu - b.mu
    value = diff @ diff + np.trace(a.cov) + np.trace(b.cov) - 2 * trace_sqrt
    return float(max(value, 0.0))


class Embedder(Protocol):
    name: str

    def embed(self, audio: np.ndarray) -> np.ndarray: ...  # (frames, dim) for 16 kHz mono


class WhisperEmbedder:
    """Last encoder layer of a packaged Whisper on CTranslate2, padding frames dropped.

    ``short_windows`` encodes a clip under 30 s at its own length instead of a padded 30 s
    window (CTranslate2 accepts that): many times cheaper for short clips, but a different
    embedding, so it has its own cache name and both sides of a comparison must use it.
    """

    def __init__(self, model: str = "whisper-base", threads: int = 0, short_windows: bool = False):
        from audiofast.asr.ct2_runtime import CT2Whisper

        self.name = f"{model}-short" if short_windows else model
        self.short_windows = short_windows
        self.runtime = CT2Whisper(model, threads=threads, encoder="ct2")  # FAD: one encoder

    def embed(self, audio: np.ndarray) -> np.ndarray:
        from audiofast.asr.features import N_SAMPLES, log_mel_spectrogram, pad_or_trim

        if self.short_windows and len(audio) < N_SAMPLES:
            mel = log_mel_spectrogram(np.asarray(audio, dtype=np.float32), self.runtime.n_mels)
            mel = mel[..., : mel.shape[-1] // 2 * 2]  # the encoder halves the frame count
            return np.array(self.runtime.encode(mel))[0].astype(np.float32)
        chunks = []
        for start in range(0, len(audio), N_SAMPLES):
            piece = audio[start : start + N_SAMPLES]
            mel = pad_or_trim(log_mel_spectrogram(piece, self.runtime.n_mels))
            encoded = np.array(self.runtime.encode(mel))[0]
            frames = max(2, int(np.ceil(len(piece) / (2 * 160))))  # 2 mel frames per output
            chunks.append(encoded[:frames])
        return np.concatenate(chunks).astype(np.float32)


class EmbedderUnavailableError(RuntimeError):
    """An embedder whose weights or package are not on this machine."""


class ExternalEmbedder:
    """VGGish / PANN / CLAP / EnCodec through ``frechet-audio-distance``, weights on disk."""

    SAMPLE_RATES = {"vggish": 16000, "pann": 16000, "clap": 48000, "encodec": 24000}

    def __init__(self, name: str, ckpt_dir: str | Path):
        if name not in self.SAMPLE_RATES:
            raise ValueError(f"unknown external embedder {name!r}")
        ckpt_dir = Path(ckpt_dir)
        if not ckpt_dir.is_dir() or not any(ckpt_dir.iterdir()):
            raise EmbedderUnavailableError(
                f"{name} needs its weights in {ckpt_dir} (this machine cannot download them); "
                "the offline default is --embedder whisper-base"
            )
        try:
            from frechet_audio_distance import FrechetAudioDistance
        except ImportError:
            raise EmbedderUnavailableError(
                f"{name} needs the frechet-audio-distance package: pip install it"
            ) from None
        self.name = name
        self.rate = self.SAMPLE_RATES[name]
        self.impl = FrechetAudioDistance(model_name=name, sample_rate=self.rate,
                                         ckpt_dir=str(ckpt_dir), verbose=False)

    def embed(self, audio: np.ndarray) -> np.ndarray:
        import torch
        import torchaudio.functional as AF

        resampled = AF.resample(torch.from_numpy(audio), SAMPLE_RATE, self.rate).numpy()
        embeddings = np.asarray(self.impl.get_embeddings([resampled], sr=self.rate))
        return embeddings.reshape(-1, embeddings.shape[-1])  # PANN returns 1-D: keep 2-D


def get_embedder(name: str = "whisper-base", ckpt_dir: str | Path | None = None) -> Embedder:
    if name.startswith("whisper"):
        return WhisperEmbedder(name)
    return ExternalEmbedder(name, ckpt_dir or cache_dir() / "fad-weights" / name)


def audio_files(directory: Path) -> list[Path]:
    files = sorted(p for p in Path(directory).rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"{directory}: no audio files")
    return files


def embed_file(embedder: Embedder, path: Path) -> np.ndarray:
    """Embeddings of one file, cached by (embedder, file content)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:24]
    cached = cache_dir() / "embeddings" / embedder.name / f"{digest}.npy"
    if cached.is_file():
        return np.load(cached)
    embeddings = embedder.embed(load_audio(path))
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp.npy")
    np.save(tmp, embeddings)
    tmp.replace(cached)
    return embeddings


def embed_dir(embedder: Embedder, directory: Path) -> dict[str, np.ndarray]:
    files = audio_files(directory)
    return {str(p.relative_to(directory)): embed_file(embedder, p)
            for p in tqdm(files, desc=f"embed {Path(directory).name}", leave=False)}


def fad_inf(embeddings: np.ndarray, reference: Stats, steps: int = 8, seed: int = 0) -> float:
    """FAD extrapolated to infinitely many samples: FAD is ~linear in 1/n, so fit
    FAD(n) = a + b / n over subsets of growing size and return the intercept a."""
    rng = np.random.default_rng(seed)
    total = len(embeddings)
    smallest = max(embeddings.shape[1] // 2, total // 5)  # below ~dim/2 samples S is too noisy
    sizes = np.linspace(smallest, total, steps).astype(int)
    values = [frechet_distance(Stats.of(embeddings[rng.choice(total, n, replace=False)]),
                               reference) for n in sizes]
    slope, intercept = np.polyfit(1.0 / sizes, values, 1)
    return float(intercept)


@dataclass
class FADResult:
    embedder: str
    fad: float
    fad_inf: float
    per_clip: dict[str, float]
    n_clips: int
    n_frames: int


def reference_stats(embedder: Embedder, reference: Path, stats_name: str | None = None) -> Stats:
    """Statistics of a reference: a stats file, or a directory of audio (cached)."""
    if reference.is_file():
        return Stats.load(reference, stats_name)
    embeddings = embed_dir(embedder, reference)
    return Stats.of(np.concatenate(list(embeddings.values())))


def fad(candidate: Path, reference: Path, embedder: Embedder | None = None,
        stats_name: str | None = None) -> FADResult:
    embedder = embedder or get_embedder()
    ref = reference_stats(embedder, Path(reference), stats_name)
    per_file = embed_dir(embedder, Path(candidate))
    everything = np.concatenate(list(per_file.values()))
    per_clip = {name: frechet_distance(Stats.of(e), ref) for name, e in per_file.items()}
    return FADResult(embedder.name, frechet_distance(Stats.of(everything), ref),
                     fad_inf(everything, ref), per_clip, len(per_file), len(everything))
