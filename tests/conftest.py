"""Shared fixtures: real packaged models and real recordings, loaded once per session."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from audiofast.asr.ct2_runtime import CT2Whisper
from audiofast.eval.datasets import EvalClip, real_speech_clips


@pytest.fixture(scope="session")
def base() -> CT2Whisper:
    return CT2Whisper("whisper-base", threads=2)


@pytest.fixture(scope="session")
def tiny() -> CT2Whisper:
    return CT2Whisper("whisper-tiny.en", threads=2)


@pytest.fixture(scope="session")
def clips() -> dict[str, EvalClip]:
    return {clip.name: clip for clip in real_speech_clips()}


@pytest.fixture(scope="session")
def ffmpeg() -> str:
    path = shutil.which("ffmpeg")
    if path is None:
        pytest.fail("ffmpeg is missing: run scripts/setup.sh")
    return path


def convert(ffmpeg: str, src: Path, dst: Path, rate: int, channels: int) -> Path:
    """Re-encode ``src`` with ffmpeg (codec from the suffix)."""
    subprocess.run(
        [ffmpeg, "-loglevel", "error", "-y", "-i", str(src), "-ar", str(rate),
         "-ac", str(channels), str(dst)],
        check=True,
    )
    return dst



@pytest.fixture
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def fadtk_stats() -> Path:
    from audiofast.eval.fadtk_data import fadtk_dir

    return fadtk_dir() / "stats" / "fma_pop.npz"
