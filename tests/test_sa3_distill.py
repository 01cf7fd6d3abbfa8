"""SA3 distillation stages (cfg, steps, qad) and int8 inference on tiny models.

Tiny proving-ground checkpoints (MiniLM captions, spectrogram latents, the SA3 DiT at width 64)
for the training behaviour; tiny configs with the real SA3 layout (T5Gemma conditioner, SAME
autoencoder, inpainting inputs, differential attention) for the architecture paths.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from audiofast.diffusion.checkpoint import CheckpointError
from audiofast.diffusion.distill import load_parent, prepare_stage, run_stage
from audiofast.diffusion.distill_config import StageConfig, StageConfigError, load_stage_config
from audiofast.diffusion.generate import generate, load_for_generation
from audiofast.diffusion.int8 import Int8Linear, quantize_dit
from audiofast.diffusion.qad import FakeQuantLinear, fake_quantize_
from audiofast.diffusion.synthetic import (
    tiny_config,
    write_checkpoint_with_text_encoder,
    write_synthetic_checkpoint,
)
from audiofast.diffusion.teacher import TeacherSize, teacher_config
from audiofast.training import step_generator, train

ROOT = Path(__file__).resolve().parents[1]
AUDIOFAST = [sys.executable, "-m", "audiofast.cli"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def stage_config(stage: str, steps: int = 30, **sections) -> StageConfig:
    data = {"stage": stage, "data": {"kind": "synth", "clips": 48, "seed": 1},
            "train": {"steps": steps, "batch": 8, "lr": 5e-4, "warmup": 5,
                      "checkpoint_every": 5},
            "gate": {"enabled": False}}
    if stage == "steps":
        data["sampler"] = {"parent_steps": 4, "steps": 2}
    else:
        data["sampler"] = {"steps": 4}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return StageConfig.from_dict(data)


def _held_out_loss(stage, batches: int = 6) -> float:
    """The stage's loss on fixed batches (generators the training never draws)."""
    with torch.no_grad():
        return sum(stage.step(k, step_generator(99, k))[0].item()
                   for k in range(batches)) / batches


@pytest.fixture(scope="module")
def ladder(teacher_dir: Path, tmp_path_factory) -> dict:
    """teacher -> cfg (range 1-7) -> steps (4 -> 2) -> qad, each trained 30 steps, with the
    stage's held-out loss before and after training."""
    root = tmp_path_factory.mktemp("ladder")
    out, parent = {}, teacher_dir
    for name, extra in [("cfg", {"guidance": {"scale": 3.0, "range": [1.0, 7.0]}}),
                        ("steps", {"train": {"lr": 1e-4}}), ("qad", {"train": {"lr": 2e-5}})]:
        cfg = stage_config(name, **extra)
        stage = prepare_stage(name, parent, cfg, root / "work")
        before = _held_out_loss(stage)
        train(stage.student, stage.step, stage.options, stage.checkpoint, params=stage.params)
        after = _held_out_loss(stage)
        result = run_stage(name, parent, cfg, root / name, root / "work")  # resumes: finished
        out[name] = {"dir": result.checkpoint, "before": before, "after": after}
        parent = result.checkpoint
    return out


@pytest.mark.parametrize(("name", "factor"), [("cfg", 0.9), ("steps", 0.9), ("qad", 0.99)])
def test_each_stage_lowers_its_loss(ladder: dict, name: str, factor: float) -> None:
    """QAD starts at the int8 rounding error of an already trained student, so it has the
    least to gain (measured: -4 % in 30 steps on this tiny model)."""
    assert ladder[name]["after"] < factor * ladder[name]["before"], ladder[name]


def test_students_describe_how_to_sample_them(ladder: dict) -> None:
    cfg = load_for_generation(ladder["cfg"]["dir"]).config.student
    assert cfg.guidance.range == (1.0, 7.0) and cfg.guidance.scale == 3.0
    assert cfg.sampler.steps == 4
    steps = load_for_generation(ladder["steps"]["dir"]).config.student
    assert steps.sampler.steps == 2
    assert steps.sampler.times == cfg.sampler.times[::2]  # every other parent time
    assert steps.guidance == cfg.guidance  # inherited
    qad = load_for_generation(ladder["qad"]["dir"])
    assert qad.config.student.quantization["scheme"] == "w8a8"
    assert qad.config.student.sampler == steps.sampler
    assert "io_layers" in qad.config.student.quantization  # QAD trains through them
    int8 = [m for m in qad.dit.modules() if isinstance(m, Int8Linear)]
    # per block 7 linears, project_out, and the io layers: project_in, the pre/post 1x1 convs
    assert len(int8) == 2 * 7 + 1 + 3 and all(m.weight.dtype == torch.int8 for m in int8)
    weights = load_file(str(ladder["qad"]["dir"] / "model.safetensors"))
    assert weights["model.model.transformer.layers.0.self_attn.to_qkv.weight"].dtype == torch.int8
    assert weights["model.model.preprocess_conv.weight"].dtype == torch.int8


def test_folded_student_runs_one_pass_per_step(ladder: dict) -> None:
    model = load_for_generation(ladder["cfg"]["dir"])
    rows = []
    model.dit.register_forward_pre_hook(lambda _m, args: rows.append(args[0].shape[0]))
    audio = generate(model, ["a loud saw playing a A3 note"], 0.5, seed=0, progress=False)
    assert rows == [1] * 4 and torch.isfinite(audio).all()  # 4 steps, 1 row each: no CFG pass
    other = generate(model, ["a loud saw playing a A3 note"], 0.5, cfg_scale=6.0, seed=0,
                     progress=False)
    assert not torch.equal(audio, other)  # the scale embedding was trained: it matters
    with pytest.raises(ValueError, match=r"outside this checkpoint's folded range \[1, 7\]"):
        generate(model, ["x"], 0.5, cfg_scale=9.0, progress=False)


def test_generate_command_samples_the_int8_student(ladder: dict, tmp_path: Path) -> None:
    out = tmp_path / "clip.wav"
    done = subprocess.run([*AUDIOFAST, "generate", "a soft organ playing a C4 note", "--model",
                           str(ladder["qad"]["dir"]), "--seconds", "0.5", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 44 + 2 * 7000


@pytest.mark.usefixtures("kernel")
def test_int8_kernel_matches_fake_quant_forward(ladder: dict) -> None:
    """The exported int8 DiT against the QAD student's fake-quant forward on the same weights:
    the same arithmetic up to rounding ties (x * (1/s) vs x / s, and a float-order difference
    that moves an 8-bit attention value or softmax weight one step; later blocks carry it)."""
    float_parent = load_for_generation(ladder["steps"]["dir"])
    fake = fake_quantize_(float_parent.dit)
    real = quantize_dit(load_for_generation(ladder["steps"]["dir"]).dit)
    assert all(m.use_kernel for m in real.modules() if isinstance(m, Int8Linear))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 513, 40, generator=gen)
    t = torch.tensor([1.0, 0.5, 0.2])
    cross, glob = torch.randn(3, 17, 64, generator=gen), torch.randn(3, 64, generator=gen)
    with torch.no_grad():
        a = fake(x, t, cross, glob, guidance=3.0)
        b = real(x, t, cross, glob, guidance=3.0)
    # the stated bound, as tests/test_int8_block.py: rare one-step flips, a small mean
    assert (a - b).abs().max() <= 2e-2 * a.abs().max()
    assert (a - b).abs().mean() <= 1e-3 * a.abs().max()
    with torch.no_grad():
        exact = load_for_generation(ladder["steps"]["dir"]).dit(x, t, cross, glob, guidance=3.0)
    # int8 is not float; the median, as a rare flip moves the largest values, not the typical
    assert (exact - b).abs().median() > 100 * (a - b).abs().median()


@pytest.mark.usefixtures("kernel")
def test_int8_linear_rows_match_reference() -> None:
    gen = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(96, 40)
    x = torch.randn(7, 5, 96, generator=gen) * torch.linspace(0.1, 4, 96)
    kernel = Int8Linear.from_linear(linear, use_kernel=True)
    reference = Int8Linear.from_linear(linear, use_kernel=False)
    fake = FakeQuantLinear(96, 40)
    fake.load_state_dict(linear.state_dict())
    with torch.no_grad():
        y, r, f = kernel(x), reference(x), fake(x)
        exact = linear(x)
    assert y.shape == (7, 5, 40)
    torch.testing.assert_close(y, r, atol=2e-3, rtol=0)
    torch.testing.assert_close(r, f, atol=1e-5, rtol=1e-5)
    assert 0 < (y - exact).abs().max() < 0.1  # int8 is not float, and not far from it


def test_malformed_stage_config_names_the_key(tmp_path: Path) -> None:
    bad = {"stage": "cfg", "train": {"stepz": 10}}
    with pytest.raises(StageConfigError, match=r"^config\.train\.stepz: unknown key"):
        StageConfig.from_dict(bad)
    with pytest.raises(StageConfigError, match=r"train\.lr='fast': expected float"):
        StageConfig.from_dict({"stage": "cfg", "train": {"lr": "fast"}})
    with pytest.raises(StageConfigError, match=r"guidance.range=\[2.0, 4.0\] must contain"):
        StageConfig.from_dict({"stage": "cfg", "guidance": {"scale": 5, "range": [2, 4]}})
    path = tmp_path / "steps.yaml"
    path.write_text(yaml.safe_dump({"stage": "steps", "sampler": {"parent_steps": 8,
                                                                   "steps": 3}}))
    with pytest.raises(StageConfigError, match="parent_steps=8 must be a multiple of steps=3"):
        load_stage_config("steps", path)
    path.write_text(yaml.safe_dump({"stage": "steps"}))
    with pytest.raises(StageConfigError, match="stage='steps' but --stage cfg"):
        load_stage_config("cfg", path)
    for stage in ("cfg", "steps", "qad"):  # the shipped configs parse
        assert load_stage_config(stage, ROOT / "configs" / "distill" / f"{stage}.yaml").stage \
            == stage
    done = subprocess.run([*AUDIOFAST, "distill", "--stage", "cfg", "--model", "x", "--config",
                           str(path)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "audiofast: error: steps.yaml: stage='steps' but --stage cfg"]


def test_checkpoint_of_wrong_architecture_is_one_line(teacher_dir: Path, tmp_path: Path) -> None:
    other = write_synthetic_checkpoint(
        tmp_path / "wide", teacher_config(TeacherSize(96, 2, 3, 2)), seed=1)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "model_config.json").write_text((teacher_dir / "model_config.json").read_text())
    (mixed / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError) as err:
        load_parent(mixed)
    assert len(str(err.value).splitlines()) == 1
    assert "checkpoint does not match its config: " in str(err.value)
    assert "46 of another shape" in str(err.value)  # every width-dependent tensor
    # a training checkpoint left by another architecture in the work directory
    cfg = stage_config("cfg", steps=5)
    wide = prepare_stage("cfg", other, cfg, tmp_path / "w1")
    train(wide.student, wide.step, wide.options, wide.checkpoint, params=wide.params)
    narrow = prepare_stage("cfg", teacher_dir, cfg, tmp_path / "w2")
    with pytest.raises(RuntimeError) as err:
        train(narrow.student, narrow.step, narrow.options, wide.checkpoint, params=narrow.params)
    message = str(err.value)
    assert len(message.splitlines()) == 1 and "checkpoint of another architecture" in message
    assert "has shape [" in message and "model.model." in message


def _write_yaml(path: Path, cfg: StageConfig) -> Path:
    data = cfg.to_dict()
    data["guidance"]["range"] = None
    path.write_text(yaml.safe_dump(json.loads(json.dumps(data))))
    return path


def test_sigkilled_stage_resumes_bit_equal(teacher_dir: Path, tmp_path: Path) -> None:
    config = _write_yaml(tmp_path / "cfg.yaml", stage_config("cfg", steps=40))
    args = [*AUDIOFAST, "distill", "--stage", "cfg", "--model", str(teacher_dir), "--config",
            str(config), "--threads", "1"]
    whole = subprocess.run([*args, "--workdir", str(tmp_path / "a"), "--out",
                            str(tmp_path / "whole")], capture_output=True, text=True, cwd=ROOT)
    assert whole.returncode == 0, whole.stderr
    proc = subprocess.Popen([*args, "--workdir", str(tmp_path / "b"), "--out",
                             str(tmp_path / "resumed")], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    log = None
    while time.time() < deadline and proc.poll() is None:
        logs = list((tmp_path / "b").glob("cfg-*.ckpt.log.jsonl"))
        if logs and len(logs[0].read_text().splitlines()) >= 17:
            log = logs[0]
            break
        time.sleep(0.05)
    assert log is not None and proc.poll() is None, "the stage ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    ckpt = next((tmp_path / "b").glob("cfg-*.ckpt"))
    killed_at = torch.load(ckpt, weights_only=False)["step"]
    assert killed_at % 5 == 0 and 15 <= killed_at < 40
    resumed = subprocess.run([*args, "--workdir", str(tmp_path / "b"), "--out",
                              str(tmp_path / "resumed")], capture_output=True, text=True,
                             cwd=ROOT)
    assert resumed.returncode == 0, resumed.stderr
    a = load_file(str(tmp_path / "whole" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert steps == list(range(40))  # every step logged once, none twice


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_accelerate_run_matches_one(teacher_dir: Path, tmp_path: Path) -> None:
    """Two CPU processes on gloo with half the batch each follow the one-process loss curve
    (the same items: each process takes its share of one draw)."""
    config = _write_yaml(tmp_path / "cfg.yaml", stage_config("cfg", steps=8))
    common = ["distill", "--stage", "cfg", "--model", str(teacher_dir), "--config", str(config),
              "--threads", "1", "--no-gate"]
    one = subprocess.run([*AUDIOFAST, *common, "--workdir", str(tmp_path / "one"), "--out",
                          str(tmp_path / "s1")], capture_output=True, text=True, cwd=ROOT)
    assert one.returncode == 0, one.stderr
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes",
              "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(_free_port()), "-m", "audiofast.cli"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    two = subprocess.run([*launch, *common, "--workdir", str(tmp_path / "two"), "--out",
                          str(tmp_path / "s2")], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]

    def losses(workdir: Path) -> torch.Tensor:
        log = next(workdir.glob("cfg-*.ckpt.log.jsonl"))
        return torch.tensor([json.loads(ln)["loss"] for ln in log.read_text().splitlines()])

    l1, l2 = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(l1) == len(l2) == 8
    torch.testing.assert_close(l2, l1, rtol=1e-3, atol=1e-5)
    a = load_file(str(tmp_path / "s1" / "model.safetensors"))
    b = load_file(str(tmp_path / "s2" / "model.safetensors"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4


@pytest.mark.parametrize("differential", [False, True], ids=["small-layout", "medium-layout"])
def test_stages_run_on_the_real_sa3_layout(differential: bool, tmp_path: Path) -> None:
    """The real SA3 structure (T5Gemma prompt, seconds conditioning, inpainting inputs, SAME
    autoencoder; differential attention and SAME-L for the medium layout) at toy width, each
    stage a few steps on Gaussian latents, then the int8 student generates."""
    parent = write_checkpoint_with_text_encoder(
        tmp_path / "sa3", tiny_config(differential=differential, sliding_window=differential))
    data = {"kind": "gaussian", "clips": 8, "seconds": 0.02, "prompts": ["soft piano", "rain"]}
    for name in ("cfg", "steps", "qad"):
        cfg = stage_config(name, steps=3, data=data)
        parent = run_stage(name, parent, cfg, tmp_path / name, tmp_path / "work").checkpoint
    model = load_for_generation(parent)
    assert model.load_report.ok
    assert model.config.student.sampler.steps == 2
    audio = generate(model, ["loud drums"], 0.02, progress=False)
    assert audio.shape == (1, 2, int(0.02 * 44100)) and torch.isfinite(audio).all()


def test_generate_preset_supplies_model_and_int8(ladder: dict, tmp_path: Path) -> None:
    """A sweep's audio preset names the model and its settings; the command line still wins."""
    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "fast.yaml").write_text(yaml.safe_dump(
        {"lane": "audio", "model": str(ladder["steps"]["dir"]), "steps": 2,
         "quantization": "int8"}))
    env = dict(os.environ, AUDIOFAST_PRESETS=str(presets))
    out = tmp_path / "clip.wav"
    done = subprocess.run([*AUDIOFAST, "generate", "a loud saw playing a A3 note", "--preset",
                           "fast", "--seconds", "0.5", "--out", str(out)], capture_output=True,
                          text=True, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert out.is_file()
    missing = subprocess.run([*AUDIOFAST, "generate", "x", "--preset", "nope"],
                             capture_output=True, text=True, cwd=ROOT, env=env)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"audiofast: error: no preset 'nope' ({presets / 'nope.yaml'}); have: fast"]
