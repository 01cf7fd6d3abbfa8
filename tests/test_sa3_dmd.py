"""``audiofast distill --stage steps --method dmd`` on a tiny proving-ground teacher: the stage
lowers its distribution-matching loss, critic and generator updates interleave as configured,
a SIGKILLed run resumes bit-equal, and bad setups are one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from audiofast.diffusion.distill import prepare_stage, run_stage
from audiofast.diffusion.distill_config import StageConfig, StageConfigError
from audiofast.diffusion.dmd import distribution_matching_loss
from audiofast.diffusion.generate import load_for_generation
from audiofast.training import step_generator, train
from tests.test_sa3_distill import AUDIOFAST, ROOT, stage_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def dmd_config(steps: int = 12, critic_steps: int = 2, lr: float = 2e-4) -> StageConfig:
    base = stage_config("steps", steps=steps, train={"lr": lr, "batch": 4},
                        dmd={"critic_steps": critic_steps, "critic_lr": 1e-3}).to_dict()
    return StageConfig.from_dict(base | {"method": "dmd"})


@pytest.fixture(scope="module")
def folded_dir(teacher_dir: Path, tmp_path_factory) -> Path:
    """A CFG-folded tiny student (scale 3): DMD's parent and warm start."""
    root = tmp_path_factory.mktemp("dmd")
    cfg = stage_config("cfg", steps=10, guidance={"scale": 3.0})
    return run_stage("cfg", teacher_dir, cfg, root / "cfg", root / "work").checkpoint


def _held_out(stage, batches: int = 4) -> dict[str, float]:
    """The critic's losses on fixed batches (generators training never draws), nothing updated."""
    rows = []
    with torch.no_grad():
        for k in range(batches):
            rows.append(stage.step(k, step_generator(99, k), update_critic=False)[1])
    return {key: sum(r[key] for r in rows) / batches for key in rows[0]}


def test_dmd_lowers_its_loss_and_interleaves_critic_updates(folded_dir: Path, tmp_path: Path):
    cfg = dmd_config(steps=12, critic_steps=3, lr=1e-5)
    stage = prepare_stage("steps", folded_dir, cfg, tmp_path / "work")
    before = _held_out(stage)
    train(stage.student, stage.step, stage.options, stage.checkpoint, params=stage.params,
          companion=stage.companion)
    after = _held_out(stage)
    # the adversarial head learns to tell the student's clips from real ones of the same
    # prompt, while the fake score keeps denoising the student's clips as well as before
    assert after["critic_gan"] < 0.8 * before["critic_gan"], (before, after)
    assert after["critic_fit"] < 1.02 * before["critic_fit"], (before, after)
    log = stage.checkpoint.with_name(stage.checkpoint.name + ".log.jsonl")
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["critic_updates"] for r in lines] == [3 * (r["step"] + 1) for r in lines]
    assert all({"dmd", "generator_gan", "critic_denoise", "critic_gan", "critic_contrastive",
                "critic_r1"} <= r.keys() for r in lines)
    assert stage.companion.updates == 3 * 12
    saved = torch.load(stage.checkpoint, weights_only=False)["companion"]
    assert saved["updates"] == 36
    assert saved["head"].keys() == stage.companion.head.state_dict().keys()


def test_dmd_student_samples_half_the_parent_steps(folded_dir: Path, tmp_path: Path):
    out = run_stage("steps", folded_dir, dmd_config(steps=4), tmp_path / "dmd",
                    tmp_path / "work").checkpoint
    student = load_for_generation(out).config.student
    parent = load_for_generation(folded_dir).config.student
    assert student.sampler.steps == 2 and student.sampler.times == parent.sampler.times[::2]
    assert student.guidance == parent.guidance


def test_sigkilled_dmd_stage_resumes_bit_equal(folded_dir: Path, tmp_path: Path):
    config = tmp_path / "dmd.yaml"
    config.write_text(yaml.safe_dump(dmd_config(steps=20).to_dict()))
    args = [*AUDIOFAST, "distill", "--stage", "steps", "--method", "dmd", "--model",
            str(folded_dir), "--config", str(config), "--threads", "1"]
    whole = subprocess.run([*args, "--workdir", str(tmp_path / "a"), "--out",
                            str(tmp_path / "whole")], capture_output=True, text=True, cwd=ROOT)
    assert whole.returncode == 0, whole.stderr
    proc = subprocess.Popen([*args, "--workdir", str(tmp_path / "b"), "--out",
                             str(tmp_path / "resumed")], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline, log = time.time() + 300, None
    while time.time() < deadline and proc.poll() is None:
        logs = list((tmp_path / "b").glob("steps-*.ckpt.log.jsonl"))
        if logs and len(logs[0].read_text().splitlines()) >= 7:
            log = logs[0]
            break
        time.sleep(0.05)
    assert log is not None and proc.poll() is None, "the stage ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = torch.load(next((tmp_path / "b").glob("steps-*.ckpt")), weights_only=False)["step"]
    assert killed_at % 5 == 0 and 5 <= killed_at < 20
    resumed = subprocess.run([*args, "--workdir", str(tmp_path / "b"), "--out",
                              str(tmp_path / "resumed")], capture_output=True, text=True,
                             cwd=ROOT)
    assert resumed.returncode == 0, resumed.stderr
    a = load_file(str(tmp_path / "whole" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(20))
    assert [r["critic_updates"] for r in rows] == [2 * (k + 1) for k in range(20)]


def test_dmd_needs_a_folded_parent(teacher_dir: Path, tmp_path: Path):
    done = subprocess.run([*AUDIOFAST, "distill", "--stage", "steps", "--method", "dmd",
                           "--model", str(teacher_dir), "--from", "4", "--to", "2", "--workdir",
                           str(tmp_path / "w"), "--out", str(tmp_path / "o"), "--no-gate"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0
    assert "--method dmd distills a CFG-folded parent" in done.stderr.strip().splitlines()[-1]


def test_dmd_config_errors_name_the_key():
    with pytest.raises(StageConfigError, match="method='dmd'"):
        StageConfig.from_dict({"stage": "cfg", "method": "dmd"})
    with pytest.raises(StageConfigError, match="critic_steps"):
        StageConfig.from_dict({"stage": "steps", "method": "dmd", "dmd": {"critic_steps": 0}})
    with pytest.raises(StageConfigError, match="unknown key"):
        StageConfig.from_dict({"stage": "steps", "dmd": {"critic_step": 2}})


def test_distribution_matching_gradient_is_the_normalized_score_difference():
    """d loss / d x0_g = (p_fake - p_real) / mean|x0_g - p_real| per item, over the elements."""
    gen = torch.Generator().manual_seed(0)
    x0_g = torch.randn(3, 4, 5, generator=gen).requires_grad_(True)
    p_real, p_fake = torch.randn(3, 4, 5, generator=gen), torch.randn(3, 4, 5, generator=gen)
    loss, rms = distribution_matching_loss(x0_g, p_real, p_fake)
    loss.backward()
    scale = (x0_g.detach() - p_real).abs().mean(dim=(1, 2), keepdim=True)
    expected = (p_fake - p_real) / scale
    torch.testing.assert_close(x0_g.grad * x0_g.numel(), expected)
    torch.testing.assert_close(rms, expected.pow(2).mean().sqrt())
