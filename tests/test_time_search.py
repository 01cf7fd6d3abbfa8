"""Sampling-time search (diffusion/time_search.py): the descent finds what its scorer rewards,
keeps the gate's constraints, resumes from its trial log, and the exported student samples
at the chosen times (the shipped 4-step student as the subject)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from audiofast.diffusion import time_search as ts
from audiofast.diffusion.distill_config import GateSpec
from audiofast.diffusion.generate import generate, load_for_generation

ROOT = Path(__file__).resolve().parents[1]
STEPS4 = ROOT / "evals" / "students" / "steps4"
GRID = [1.0, 0.99, 0.97, 0.93, 0.86, 0.75, 0.6, 0.45, 0.3, 0.15, 0.0]
GATE = GateSpec()

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Bowl:
    """A scorer whose FAD ratio is the distance to a target time set; ``banned`` times
    fail the category check."""

    def __init__(self, target: tuple[float, ...], banned: float | None = None):
        self.target, self.banned, self.calls = target, banned, []

    def __call__(self, times: tuple[float, ...]) -> ts.Trial:
        self.calls.append(times)
        distance = sum(abs(a - b) for a, b in zip(times, self.target, strict=True))
        category = 0.5 if self.banned in times else 1.0
        return ts.Trial(times, 1.0 + distance, 1.0, category)


def test_descent_reaches_the_scorer_minimum(tmp_path: Path) -> None:
    score = Bowl((1.0, 0.86, 0.45, 0.15, 0.0))
    best, trials = ts.search_times(score, GRID, (1.0, 0.97, 0.75, 0.45, 0.0), GATE, tmp_path,
                                   max_trials=60, progress=False)
    assert best == (1.0, 0.86, 0.45, 0.15, 0.0)
    assert trials[0].times == (1.0, 0.97, 0.75, 0.45, 0.0)  # the start is scored first
    assert all(a > b for a, b in zip(best[:-1], best[1:], strict=True))


def test_descent_keeps_the_gate_constraints(tmp_path: Path) -> None:
    score = Bowl((1.0, 0.86, 0.45, 0.15, 0.0), banned=0.15)
    best, _ = ts.search_times(score, GRID, (1.0, 0.97, 0.75, 0.45, 0.0), GATE, tmp_path,
                              max_trials=60, progress=False)
    assert 0.15 not in best
    assert ts.Trial(best, 0, 1, 1).allowed(GATE)


def test_search_resumes_from_its_trial_log_and_stops_at_the_budget(tmp_path: Path) -> None:
    start = (1.0, 0.97, 0.75, 0.45, 0.0)
    first = Bowl((1.0, 0.86, 0.45, 0.15, 0.0))
    ts.search_times(first, GRID, start, GATE, tmp_path, max_trials=5, progress=False)
    assert len(first.calls) == 5  # the budget
    logged = json.loads((tmp_path / "trials.json").read_text())["trials"]
    assert len(logged) == 5
    again = Bowl((1.0, 0.86, 0.45, 0.15, 0.0))
    best, trials = ts.search_times(again, GRID, start, GATE, tmp_path, max_trials=60,
                                   progress=False)
    assert not set(again.calls) & set(first.calls)  # nothing scored twice
    assert best == (1.0, 0.86, 0.45, 0.15, 0.0) and len(trials) > 5
    with pytest.raises(ValueError, match="was scored on None, not {'clips': 96}"):
        ts.search_times(again, GRID, start, GATE, tmp_path, calibration={"clips": 96},
                        progress=False)


def test_bad_times_and_grids_are_one_line_errors(tmp_path: Path) -> None:
    model = load_for_generation(STEPS4)
    with pytest.raises(ValueError, match=r"times must decrease from 1\.0 to 0\.0"):
        ts.with_times(model, (1.0, 0.5, 0.6, 0.0))
    with pytest.raises(ValueError, match="grid is too coarse"):
        ts.search_times(Bowl((1.0, 0.5, 0.0)), [1.0, 0.5, 0.0], (1.0, 0.6, 0.55, 0.0), GATE,
                        tmp_path, progress=False)
    teacher = load_for_generation(ROOT / "evals" / "teacher")
    with pytest.raises(ValueError, match="needs a distilled student"):
        ts.with_times(teacher, (1.0, 0.5, 0.0))


def test_grid_holds_the_students_own_times() -> None:
    model = load_for_generation(STEPS4)
    grid = ts.time_grid(model, 16)
    own = model.config.student.sampler.times
    assert len(grid) == 17 and grid[0] == 1.0 and grid[-1] == 0.0
    assert all(min(abs(g - t) for g in grid) < 1e-4 for t in own)


def test_exported_student_samples_at_the_chosen_times(tmp_path: Path) -> None:
    times = [1.0, 0.957918, 0.512497, 0.184307, 0.0]
    out = tmp_path / "steps4-times"
    done = subprocess.run([sys.executable, "-m", "audiofast.cli", "distill", "--stage", "times",
                           "--model", str(STEPS4), "--times", *map(str, times), "--out",
                           str(out), "--no-gate"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    model = load_for_generation(out)
    assert list(model.config.student.sampler.times) == times
    assert json.loads((out / ts.RECORD_NAME).read_text())["searched"] is False
    seen = []
    model.dit.register_forward_pre_hook(lambda _m, args: seen.append(round(float(args[1][0]), 6)))
    generate(model, ["a soft organ playing a C4 note"], 1.0, seed=0, progress=False)
    assert seen == times[:-1]  # one DiT pass at each chosen time
    original = load_for_generation(STEPS4)
    for (name, a), (_, b) in zip(original.dit.state_dict().items(),
                                 model.dit.state_dict().items(), strict=True):
        assert torch.equal(a, b), name  # the weights are the student's own
    bad = subprocess.run([sys.executable, "-m", "audiofast.cli", "distill", "--stage", "times",
                          "--model", str(STEPS4), "--times", "1", "0.2", "0.5", "0", "--out",
                          str(tmp_path / "bad"), "--no-gate"], capture_output=True, text=True,
                         cwd=ROOT)
    assert bad.returncode != 0 and not (tmp_path / "bad").exists()
    assert bad.stderr.strip().splitlines()[-1].startswith("audiofast: error: times must")


@pytest.mark.parametrize("times", [[1.0, 0.5, 0.6, 0.0], [0.9, 0.5, 0.0], [1.0, 0.5], [1.0]])
def test_a_config_with_bad_times_is_refused(times: list[float]) -> None:
    from audiofast.diffusion.config_schema import ConfigError
    from audiofast.diffusion.student import read_student

    raw = {"audiofast": {"stage": "steps", "parent": "p", "sampler": {"times": times}}}
    with pytest.raises(ConfigError, match="needs times decreasing from 1.0 to 0.0"):
        read_student(raw)
    ok = read_student({"audiofast": {"stage": "steps", "parent": "p",
                                     "sampler": {"times": [1.0, 0.5, 0.0]}}})
    assert ok.sampler.times == (1.0, 0.5, 0.0)
