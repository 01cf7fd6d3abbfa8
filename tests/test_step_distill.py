"""Progressive distillation at any student times: the parent paths the targets follow, and a
steps stage trained at times a search chose (uneven strides on the parent's grid)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from audiofast.diffusion.checkpoint import Conditioning
from audiofast.diffusion.distill import prepare_stage
from audiofast.diffusion.distill_batch import DistillBatch
from audiofast.diffusion.distill_config import StageConfig, StageConfigError
from audiofast.diffusion.step_distill import parent_paths, progressive_target

# the proving ground's shifted 8-step schedule and a searched 4-step set (docs/diffusion.md)
PARENT = torch.tensor([1.0, 0.994376, 0.98448, 0.957912, 0.890903, 0.745547, 0.512497,
                       0.273885, 0.0])
SEARCHED = torch.tensor([1.0, 0.98448, 0.931662, 0.386393, 0.0])


def _paths(student: torch.Tensor) -> list[list[float]]:
    return [[round(v, 6) for v in p.tolist()] for p in parent_paths(PARENT, student)]


def test_even_strides_follow_every_other_parent_time() -> None:
    assert _paths(PARENT[::2]) == [[1.0, 0.994376], [0.98448, 0.957912],
                                   [0.890903, 0.745547], [0.512497, 0.273885]]


def test_searched_times_take_the_parent_times_between_them() -> None:
    assert _paths(SEARCHED) == [[1.0, 0.994376], [0.98448, 0.957912],
                                [0.931662, 0.890903, 0.745547, 0.512497],
                                [0.386393, 0.273885]]
    # no parent time between two student times: the target is the parent's one-step x0
    assert _paths(torch.tensor([1.0, 0.999, 0.0]))[0] == [1.0]


def _batch(slots: list[int], times: list[float]) -> DistillBatch:
    n = len(slots)
    gen = torch.Generator().manual_seed(0)
    cond = Conditioning(torch.randn(n, 3, 4, generator=gen), torch.ones(n, 3, dtype=torch.bool),
                        torch.randn(n, 4, generator=gen))
    return DistillBatch(torch.randn(n, 2, 5, generator=gen), torch.randn(n, 2, 5, generator=gen),
                        torch.tensor(times), cond, torch.full((n,), 5.0),
                        torch.tensor(slots))


def test_each_item_runs_its_own_slots_path() -> None:
    """A recording parent: every item is evaluated exactly at its slot's path times, with its
    own conditioning, and its target is the parent's last prediction on that path."""
    paths = parent_paths(PARENT, SEARCHED)
    slots = [2, 0, -1, 3, 2, 1]
    times = [float(paths[s][0]) if s >= 0 else 0.6 for s in slots]
    batch = _batch(slots, times)
    seen: dict[int, list[float]] = {i: [] for i in range(len(slots))}

    def parent(x: torch.Tensor, t: torch.Tensor, part: DistillBatch) -> torch.Tensor:
        for row in range(len(t)):  # which item is this? its global conditioning says
            item = int((batch.cond.global_cond == part.cond.global_cond[row]).all(1).nonzero())
            seen[item].append(round(float(t[row]), 6))
        return 0.5 * x + t[:, None, None]

    target = progressive_target(parent, batch, paths)
    for i, s in enumerate(slots):
        want = [round(v, 6) for v in paths[s].tolist()] if s >= 0 else [0.6]
        assert seen[i] == want, (i, s)
    # the free item's target is one prediction at its own time
    torch.testing.assert_close(target[2], 0.5 * batch.xt[2] + 0.6)
    assert not torch.allclose(target[0], 0.5 * batch.xt[0] + batch.t[0])  # 4 steps, not one


def test_bad_student_times_are_one_line() -> None:
    base = {"stage": "steps", "sampler": {"parent_steps": 8, "steps": 4}}
    for times, match in [([1.0, 0.9, 0.5, 0.0], r"need 5 times decreasing from 1.0 to 0.0"),
                         ([1.0, 0.5, 0.9, 0.2, 0.0], r"need 5 times decreasing"),
                         ([1, "x", 0], r"expected a list of numbers")]:
        with pytest.raises(StageConfigError, match=match):
            StageConfig.from_dict({**base, "sampler": {**base["sampler"], "times": times}})
    with pytest.raises(StageConfigError, match="only the steps stage takes times"):
        StageConfig.from_dict({"stage": "cfg", "sampler": {"times": [1.0, 0.0]}})


@pytest.mark.usefixtures("one_torch_thread")
def test_steps_stage_trains_at_given_times(teacher_dir: Path, tmp_path: Path) -> None:
    """Uneven strides are allowed once times are given (3 does not divide 4 parent steps)."""
    cfg = StageConfig.from_dict({
        "stage": "steps", "sampler": {"parent_steps": 4, "steps": 3,
                                      "times": [1.0, 0.9, 0.35, 0.0]},
        "data": {"kind": "synth", "clips": 16, "seed": 1},
        "train": {"steps": 2, "batch": 4, "warmup": 1}, "gate": {"enabled": False}})
    stage = prepare_stage("steps", teacher_dir, cfg, tmp_path)
    assert stage.student_config.sampler.times == (1.0, 0.9, 0.35, 0.0)
    loss, _ = stage.step(0, torch.Generator().manual_seed(0))
    assert torch.isfinite(loss) and loss.item() > 0


def test_cli_times_of_the_wrong_length_are_one_line() -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "audiofast.cli", "distill", "--stage", "steps",
                           "--model", "evals/students/cfg5", "--times", "1", "0.5", "0"],
                          capture_output=True, text=True, cwd=root)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "audiofast: error: options.sampler.times=[1.0, 0.5, 0.0]: need 5 times decreasing "
        "from 1.0 to 0.0"]
