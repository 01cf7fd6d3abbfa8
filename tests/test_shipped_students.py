"""The distilled students committed under evals/students/ load and generate as they say:
the CFG-folded one at 8 steps, the 4-step (progressive) one and its int8 copy, one DiT pass
per step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from audiofast.diffusion.distill import root_baseline
from audiofast.diffusion.generate import generate, load_for_generation
from audiofast.diffusion.int8 import Int8Linear
from audiofast.diffusion.int8_attention import uses_int8_attention

ROOT = Path(__file__).resolve().parents[1]
STUDENTS = ROOT / "evals" / "students"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize(("name", "stage", "steps", "int8"), [
    ("cfg5", "cfg", 8, False), ("steps4", "steps", 4, False), ("steps4-int8", "qad", 4, True)])
def test_shipped_student_samples_itself(name: str, stage: str, steps: int, int8: bool):
    model = load_for_generation(STUDENTS / name)
    assert model.load_report.ok
    student = model.config.student
    assert (student.stage, student.sampler.steps, student.guidance.scale) == (stage, steps, 5.0)
    assert any(isinstance(m, Int8Linear) for m in model.dit.modules()) is int8
    assert uses_int8_attention(model.dit) is int8  # QAD trained it with 8-bit attention
    assert isinstance(model.dit.preprocess_conv, Int8Linear) is int8  # and int8 io layers
    rows = []
    model.dit.register_forward_pre_hook(lambda _m, args: rows.append(args[0].shape[0]))
    audio = generate(model, ["a soft organ playing a C4 note"], 1.0, seed=0, progress=False)
    assert rows == [1] * steps and torch.isfinite(audio).all() and audio.abs().max() > 1e-3
    assert root_baseline(STUDENTS / name).resolve() == (ROOT / "evals" / "teacher").resolve()


def test_generate_command_runs_a_shipped_student(tmp_path: Path):
    out = tmp_path / "clip.wav"
    done = subprocess.run([sys.executable, "-m", "audiofast.cli", "generate",
                           "a loud saw playing a A3 note", "--model", "evals/students/steps4",
                           "--seconds", "1", "--out", str(out)], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 44 + 2 * 15000
