"""The resumable training loop: a run killed and resumed equals an uninterrupted run, and
checkpoints are replaced atomically."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from audiofast.training import TrainOptions, save_atomic, train


def _regression_step(model: torch.nn.Module):
    target = torch.randn(8, 1, generator=torch.Generator().manual_seed(1))

    def step(_: int, gen: torch.Generator):
        x = torch.randn(16, 8, generator=gen)
        return (model(x) - x @ target).pow(2).mean(), {}

    return step


def _fresh() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(8, 1)


def test_resume_replays_the_same_run(tmp_path: Path) -> None:
    opts = TrainOptions(steps=12, lr=1e-2, warmup=2, ema_decay=0.9, checkpoint_every=4)
    straight = _fresh()
    ema_straight = train(straight, _regression_step(straight), opts, tmp_path / "a.ckpt")

    # Interrupt at step 10 (the last checkpoint was at 8), then resume on a fresh model.
    first = _fresh()
    step = _regression_step(first)

    def interrupted(k: int, gen: torch.Generator):
        if k == 10:
            raise KeyboardInterrupt
        return step(k, gen)

    with pytest.raises(KeyboardInterrupt):
        train(first, interrupted, opts, tmp_path / "b.ckpt")
    assert torch.load(tmp_path / "b.ckpt")["step"] == 8
    resumed = _fresh()
    ema_resumed = train(resumed, _regression_step(resumed), opts, tmp_path / "b.ckpt")

    assert torch.equal(straight.weight, resumed.weight)
    assert torch.equal(ema_straight.weight, ema_resumed.weight)
    assert not torch.equal(straight.weight, _fresh().weight)  # it did train
    steps = [json.loads(line)["step"] for line in (tmp_path / "b.ckpt.log.jsonl").open()]
    assert steps == list(range(12))  # each step logged once across the two runs


def test_non_finite_loss_stops_with_the_step(tmp_path: Path) -> None:
    model = _fresh()

    def step(k: int, gen: torch.Generator):
        return model(torch.full((1, 8), float("nan"))).sum(), {}

    with pytest.raises(FloatingPointError, match="loss is nan at step 0"):
        train(model, step, TrainOptions(steps=3), tmp_path / "c.ckpt")
    assert not (tmp_path / "c.ckpt").exists()


def test_save_atomic_keeps_the_old_file_when_writing_fails(tmp_path: Path) -> None:
    path = tmp_path / "state.pt"
    save_atomic({"x": torch.ones(2)}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        save_atomic({"x": Unpicklable()}, path)
    assert torch.equal(torch.load(path)["x"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["state.pt"]  # no temp file left behind


def test_killed_training_process_resumes(tmp_path: Path) -> None:
    """SIGKILL a real training process after its first checkpoint; rerunning finishes the run
    with the same weights as an uninterrupted one."""
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time, torch
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_training import _fresh, _regression_step
        from audiofast.training import TrainOptions, train
        model = _fresh()
        step = _regression_step(model)
        slow = sys.argv[2] == "slow"
        def paced(k, gen):
            if slow:
                time.sleep(0.05)
            return step(k, gen)
        train(model, paced, TrainOptions(steps=200, lr=1e-2, checkpoint_every=10), sys.argv[1])
        torch.save(model.state_dict(), sys.argv[1] + ".final")
    """))
    ckpt = tmp_path / "k.ckpt"
    proc = subprocess.Popen([sys.executable, str(script), str(ckpt), "slow"],
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while not ckpt.exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = torch.load(ckpt)["step"]
    assert 0 < killed_at < 200
    subprocess.run([sys.executable, str(script), str(ckpt), "fast"], check=True,
                   stderr=subprocess.DEVNULL)
    subprocess.run([sys.executable, str(script), str(tmp_path / "ref.ckpt"), "fast"],
                   check=True, stderr=subprocess.DEVNULL)
    resumed = torch.load(str(ckpt) + ".final")
    reference = torch.load(str(tmp_path / "ref.ckpt") + ".final")
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)


def test_unreadable_checkpoint_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.ckpt"
    path.write_bytes(b"not a checkpoint")
    model = _fresh()
    with pytest.raises(RuntimeError, match=r"bad.ckpt: unreadable checkpoint .*delete it"):
        train(model, _regression_step(model), TrainOptions(steps=2), path)
