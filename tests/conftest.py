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
def live(base, kernel):
    """What the live server decodes on by default: the fused int8 decoder over ``base``'s
    CTranslate2 model (``load_model``'s auto runtime)."""
    from audiofast.asr.runtime import AutoWhisper
    from audiofast.stream.decoder import StreamDecoder

    runtime = AutoWhisper(base, threads=2)
    assert StreamDecoder(runtime).engine == "fast"
    return runtime


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


@pytest.fixture(scope="session")
def kernel():
    """The built kernels. Where a compiler exists and the CPU runs them, a failed build fails
    the tests instead of skipping them."""
    import os
    import shutil

    from audiofast.asr import kernels

    if kernels.backend() != "avx2":
        if shutil.which(kernels.compiler()) and kernels._cpu_supports_kernel() and \
                os.environ.get("AUDIOFAST_KERNELS") != "none":
            pytest.fail(f"{kernels.compiler()} is here and the CPU has AVX2/F16C, but the "
                        "kernels did not build")
        pytest.skip("the C++ kernel cannot be built here (no compiler or no AVX2/F16C)")
    return kernels


@pytest.fixture(scope="session")
def teacher_dir(tmp_path_factory) -> Path:
    """A tiny proving-ground teacher (SA3 DiT at width 64, 2 blocks) trained for 100 steps:
    enough that its conditional and unconditional predictions differ, so there is guidance to
    fold (a random one has none). Shared by the SA3 distillation tests."""
    from audiofast.diffusion.teacher import TeacherRecipe, TeacherSize, train_teacher

    size = TeacherSize(dit_width=64, dit_depth=2, dit_heads=2, memory_tokens=2)
    recipe = TeacherRecipe(size=size, train_clips=64, dit_steps=100, dit_batch=16, dit_lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train_teacher(recipe, tmp_path_factory.mktemp("sa3"))
    finally:
        torch.set_num_threads(threads)
