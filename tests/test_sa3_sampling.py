"""SA3 samplers, guidance and generation: hand-checked steps, schedules, CFG/APG, seeds, files."""

from __future__ import annotations

import math
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from audiofast.diffusion import CheckpointError, Conditioning, SA3Config, build_model
from audiofast.diffusion.config import DEFAULT_SAMPLING_SHIFT, ScheduleShift
from audiofast.diffusion.generate import generate, latent_lengths, load_for_generation, save_audio
from audiofast.diffusion.sampling import (
    apg_project,
    guided_denoiser,
    sample_euler,
    sample_pingpong,
    schedule,
    unconditional,
)
from audiofast.diffusion.synthetic import (
    randomize_,
    tiny_config,
    tiny_text_encoder,
    write_checkpoint_with_text_encoder,
    write_synthetic_checkpoint,
)

DATA = Path(__file__).parent / "data" / "sa3"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: threads only add overhead


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    model = build_model(tiny_config()).eval().requires_grad_(False)
    randomize_(model)
    model.conditioners["prompt"].set_encoder(*tiny_text_encoder())
    return model


def toy_denoise(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """An analytic stand-in for a network: x0_hat = x / 2 - t / 4."""
    return x / 2 - t[:, None, None] / 4


# -- samplers -------------------------------------------------------------------------------------


def test_euler_two_steps_by_hand() -> None:
    seen = []
    x = torch.tensor([2.0, -4.0]).reshape(2, 1, 1)
    out = sample_euler(lambda x, t: seen.append(t.tolist()) or toy_denoise(x, t), x, schedule(2))
    # x = 2 at t = 1: x0 = 1 - 0.25 = 0.75, v = (2 - 0.75) / 1 = 1.25, x = 2 - 0.5 * 1.25 = 1.375
    #   t = 0.5: x0 = 0.6875 - 0.125 = 0.5625, v = (1.375 - 0.5625) / 0.5 = 1.625,
    #   x = 1.375 - 0.5 * 1.625 = 0.5625 (a last Euler step to t = 0 lands on x0_hat).
    # x = -4: x0 = -2.25, v = -1.75, x = -3.125; x0 = -1.6875, v = -2.875, x = -1.6875.
    assert out.flatten().tolist() == pytest.approx([0.5625, -1.6875])
    assert seen == [[1.0, 1.0], [0.5, 0.5]]


def test_pingpong_two_steps_by_hand() -> None:
    x = torch.full((1, 1, 1), 2.0)
    eps = torch.randn(1, 1, 1, generator=torch.Generator().manual_seed(7)).item()
    out = sample_pingpong(toy_denoise, x, schedule(2), generator=torch.Generator().manual_seed(7))
    # t = 1: x0 = 0.75, re-noised to t = 0.5: x = 0.5 * 0.75 + 0.5 * eps = 0.375 + 0.5 eps.
    # t = 0.5: x0 = x / 2 - 0.125 = 0.0625 + 0.25 eps, returned as is (t_next = 0, no noise).
    assert out.item() == pytest.approx(0.0625 + 0.25 * eps)


# -- schedules ------------------------------------------------------------------------------------


def _check_endpoints_and_order(ts: torch.Tensor) -> None:
    assert ts[0].item() == 1.0 and ts[-1].item() == 0.0
    assert (ts[1:] < ts[:-1]).all()


def test_default_logsnr_schedule() -> None:
    ts = schedule(4, DEFAULT_SAMPLING_SHIFT)  # what SA3 configs sample with
    _check_endpoints_and_order(ts)
    expected = torch.sigmoid(8.2 * torch.linspace(1, 0, 5) - 2)
    torch.testing.assert_close(ts[1:-1], expected[1:-1])
    assert ts[2].item() == pytest.approx(1 / (1 + math.exp(-2.1)))  # 0.8909: t = 0.5
    # Length-dependent variant: 4000 latents is one doubling of the 2000 anchor, start -7.2.
    ts = schedule(2, ScheduleShift("logsnr", {"rate": 1.0}), seq_len=4000)
    assert ts[1].item() == pytest.approx(1 / (1 + math.exp(-2.6)))  # -(2 - 0.5 * 9.2)


@pytest.mark.parametrize(("seq_len", "mu"), [(256, -0.5), (2176, -0.825), (10**6, -1.15)])
def test_length_shift_schedule(seq_len: int, mu: float) -> None:
    """t / (t + e^mu (1 - t)) with mu from -0.5 (256 latents) to -1.15 (4096 and beyond)."""
    ts = schedule(8, ScheduleShift("full"), seq_len=seq_len)
    _check_endpoints_and_order(ts)
    t = torch.linspace(1, 0, 9)
    torch.testing.assert_close(ts, t / (t + math.exp(mu) * (1 - t)))
    half = schedule(2, ScheduleShift("full"), seq_len)[1].item()
    assert half == pytest.approx(1 / (1 + math.exp(mu)))  # t = 0.5


def test_other_shifts_and_errors() -> None:
    torch.testing.assert_close(schedule(4, ScheduleShift("none")), torch.linspace(1, 0, 5))
    flux = schedule(2, ScheduleShift("flux", {"alpha_min": 3.0, "alpha_max": 3.0}), seq_len=1)
    assert flux.tolist() == pytest.approx([1.0, 0.75, 0.0])  # 3 * 0.5 / (1 + 2 * 0.5)
    with pytest.raises(ValueError, match="'full' schedule shift depends on length"):
        schedule(4, ScheduleShift("full"))


# -- guidance -------------------------------------------------------------------------------------


class FakeDiT:
    """v depends on x, the cross-attention tokens and the global embedding; calls are logged."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, x, t, cross, glob, local=None, mask=None):
        self.calls.append((x.shape[0], cross.clone(), glob.clone(), mask))
        ramp = torch.linspace(-1, 1, x.shape[-1])
        return 0.3 * x + cross.mean(dim=(1, 2))[:, None, None] * ramp + glob[:, :1, None]


def _cond(batch: int = 2) -> Conditioning:
    torch.manual_seed(1)
    return Conditioning(torch.randn(batch, 9, 768) + 1, torch.ones(batch, 9), torch.randn(batch, 4))


def test_cfg_scale_one_is_the_conditional_pass(tiny_model) -> None:
    calls = []

    def dit(*args):
        calls.append(args[0].shape[0])
        return tiny_model.dit(*args)

    cond, x, t = _cond(), torch.randn(2, 8, 12), torch.tensor([0.7, 0.7])
    cond.global_cond = torch.randn(2, 768)
    x0 = guided_denoiser(dit, cond, cfg_scale=1.0)(x, t)
    v = tiny_model.dit(x, t, cond.cross_attn_cond, cond.global_cond)
    assert torch.equal(x0, x - t[:, None, None] * v)
    assert calls == [2]  # one call, batch not doubled


def test_cfg_is_one_doubled_call_on_x0_predictions() -> None:
    cond, x, t = _cond(), torch.randn(2, 3, 10), torch.tensor([0.6, 0.6])
    dit = FakeDiT()
    plain = guided_denoiser(dit, cond, cfg_scale=3.0, apg_scale=0.0)(x, t)
    ((batch, cross, glob, _),) = dit.calls
    assert batch == 4 and not cross[2:].any() and torch.equal(cross[:2], cond.cross_attn_cond)
    assert torch.equal(glob[2:], cond.global_cond)  # global conditioning kept
    x0_c = guided_denoiser(FakeDiT(), cond)(x, t)
    x0_u = guided_denoiser(FakeDiT(), unconditional(cond))(x, t)
    torch.testing.assert_close(plain, x0_c + 2.0 * (x0_c - x0_u))

    apg = guided_denoiser(FakeDiT(), cond, cfg_scale=3.0)(x, t)  # apg_scale=1 by default
    dot = ((apg - x0_c) * x0_c).sum(dim=(1, 2))
    torch.testing.assert_close(dot, torch.zeros(2), atol=1e-4, rtol=0)
    assert not torch.allclose(apg, plain)


@pytest.mark.parametrize("masked", [False, True])
def test_apg_projection(masked: bool) -> None:
    torch.manual_seed(0)
    delta, ref = torch.randn(2, 3, 10), torch.randn(2, 3, 10)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 6:] = False
    parallel, orthogonal = apg_project(delta, ref, mask if masked else None)
    m = mask[:, None].float() if masked else torch.ones(2, 1, 10)
    torch.testing.assert_close((parallel + orthogonal) * m, delta * m)
    dot = (orthogonal * ref * m).sum(dim=(1, 2))
    torch.testing.assert_close(dot, torch.zeros(2), atol=1e-5, rtol=0)
    scale = (parallel * ref * m).sum(dim=(1, 2)) / (ref * ref * m).sum(dim=(1, 2))
    torch.testing.assert_close(parallel, scale[:, None, None] * ref * m)
    if masked:
        assert not orthogonal[1, :, 6:].any()


# -- generation -----------------------------------------------------------------------------------


def test_latent_lengths_follow_upstream() -> None:
    small = SA3Config.from_file(DATA / "small_model_config.json")
    # 10 s + 6 s headroom = 705600 samples -> 173 latents of 4096 -> aligned to 2 (chunk 32 /
    # stride 16) = 174. Content ceil(441000 / 4096) = 108; attended 108 + int(64.6) = 172.
    assert latent_lengths(small, 10.0) == (174, 108, 172)
    assert latent_lengths(small, 120.0) == (1292, 1292, 1292)  # capped at sample_size
    with pytest.raises(ValueError, match=r"seconds must be in \(0, 120.00\]"):
        latent_lengths(small, 121.0)


@pytest.mark.parametrize(("sampler", "cfg_scale"), [("pingpong", 1.0), ("euler", 3.0)])
def test_seeds_and_batches(tiny_model, sampler: str, cfg_scale: float) -> None:
    run = dict(seconds=0.01, steps=2, cfg_scale=cfg_scale, sampler=sampler, progress=False)
    prompts = ["soft piano", "loud drums"]
    both = generate(tiny_model, prompts, seed=3, **run)
    assert both.shape == (2, 2, 441) and torch.isfinite(both).all()
    torch.testing.assert_close(both, generate(tiny_model, prompts, seed=3, **run), rtol=0, atol=0)
    second = generate(tiny_model, ["loud drums"], seed=4, **run)  # prompt i gets seed + i
    torch.testing.assert_close(both[1:], second, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(both[1:], generate(tiny_model, ["loud drums"], seed=5, **run))


def _checkpoint_with_text_encoder(tmp_path: Path) -> Path:
    """A synthetic checkpoint with the real layout and a tiny T5Gemma in its subfolder."""
    return write_checkpoint_with_text_encoder(tmp_path / "ckpt")


def test_checkpoint_round_trip_to_wav(tmp_path: Path) -> None:
    directory = _checkpoint_with_text_encoder(tmp_path)

    model = load_for_generation(directory)  # finds and attaches the bundled text encoder
    assert model.load_report.ok
    audio = generate(model, ["rain of wind"], seconds=0.015, steps=2, progress=False)
    path = save_audio(tmp_path / "out" / "clip.wav", audio[0], model.config.sample_rate)
    with wave.open(str(path)) as f:
        assert (f.getframerate(), f.getnchannels(), f.getsampwidth()) == (44100, 2, 2)
        assert f.getnframes() == int(0.015 * 44100) == 661
        pcm = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2").reshape(-1, 2).T
    assert np.abs(pcm / 32767 - audio[0].numpy()).max() <= 1 / 32767


def test_local_directory_without_text_encoder(tmp_path: Path) -> None:
    model = load_for_generation(write_synthetic_checkpoint(tmp_path / "ckpt"))
    with pytest.raises(RuntimeError, match="no text encoder attached"):
        generate(model, ["soft piano"], seconds=0.01, steps=1, progress=False)
    with pytest.raises(CheckpointError, match="directory not found"):
        load_for_generation(tmp_path / "missing")


def test_hub_id_offline_is_one_clear_line(monkeypatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(CheckpointError) as err:
        load_for_generation("stabilityai/stable-audio-3-small-music")
    assert str(err.value) == (
        "cannot download stabilityai/stable-audio-3-small-music: the Hub is unreachable "
        "(offline, or HF_HUB_OFFLINE is set); download model_config.json and model.safetensors "
        "and pass their directory instead"
    )


def test_generate_command_writes_stereo_wav(tmp_path: Path, capsys) -> None:
    from audiofast.cli import main

    directory = _checkpoint_with_text_encoder(tmp_path)
    out = tmp_path / "gen.wav"
    assert main(["generate", "a plucked string", "--model", str(directory), "--seconds", "0.02",
                 "--steps", "2", "--cfg", "2.0", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    with wave.open(str(out)) as f:
        assert (f.getframerate(), f.getnchannels(), f.getnframes()) == (44100, 2, 882)
    with pytest.raises(SystemExit, match="directory not found"):
        main(["generate", "x", "--model", str(tmp_path / "nope")])


def test_euler_matches_diffusers_flow_match_scheduler() -> None:
    """An independent implementation of the same flow ODE step (diffusers'
    FlowMatchEulerDiscreteScheduler, fed our schedule as its sigmas) lands on the same sample."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    gen = torch.Generator().manual_seed(0)
    mix = torch.randn(8, 8, generator=gen) * 0.5

    def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.einsum("ij,bjt->bit", mix, x)) + t[:, None, None] * x

    def denoise(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return x - t[:, None, None] * velocity(x, t)

    ts = schedule(12, DEFAULT_SAMPLING_SHIFT)
    x = torch.randn(2, 8, 16, generator=gen)
    ours = sample_euler(denoise, x.clone(), ts)
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0)
    scheduler.set_timesteps(sigmas=ts[:-1].tolist())
    torch.testing.assert_close(scheduler.sigmas.float(), ts, atol=1e-6, rtol=0)
    theirs = x.clone()
    for i, timestep in enumerate(scheduler.timesteps):
        v = velocity(theirs, scheduler.sigmas[i].float().expand(2))
        theirs = scheduler.step(v, timestep, theirs).prev_sample
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ours, sample_euler(denoise, x.clone(), schedule(6)), atol=1e-3)
