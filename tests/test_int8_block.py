"""The fused int8 DiT block (diffusion/int8_block.py): norm + adaLN modulation + quantization
in the kernel's one pass, against the unfused int8 path and the QAD fake-quant forward."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from audiofast.asr import kernels
from audiofast.diffusion.attention import Attention
from audiofast.diffusion.config import DiTConfig
from audiofast.diffusion.dit import DiT, DiTBlock
from audiofast.diffusion.int8 import Int8Conv1x1, Int8Linear, quantize_dit
from audiofast.diffusion.int8_block import FusedInt8Block, modulated_linear, self_attention
from audiofast.diffusion.layers import RMSNorm, RotaryEmbedding
from audiofast.diffusion.qad import FakeQuantConv1x1, fake_quantize_

pytestmark = pytest.mark.usefixtures("one_torch_thread", "kernel")


def _dit(differential: bool) -> DiT:
    cfg = DiTConfig(io_channels=40, embed_dim=96, depth=2, num_heads=3, cond_token_dim=32,
                    global_cond_dim=32, local_add_cond_dim=None, num_memory_tokens=4,
                    differential=differential, qk_norm="rms", norm_force_fp32=True, ff_mult=4.0,
                    ff_bias=False, timestep_features_type="expo", timestep_features_dim=32,
                    timestep_features_logsnr=False)
    torch.manual_seed(0)
    dit = DiT(cfg)
    with torch.no_grad():  # a trained network's zero-initialized parts are not zero
        for p in dit.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return dit.eval()


def test_modulated_linear_is_the_unfused_int8_linear() -> None:
    gen = torch.Generator().manual_seed(2)
    norm = RMSNorm(64)
    with torch.no_grad():
        norm.gamma.copy_(torch.rand(64, generator=gen) + 0.5)
    linear = Int8Linear.from_linear(torch.nn.Linear(64, 48), use_kernel=True)
    x = torch.randn(3, 10, 64, generator=gen) * torch.linspace(0.2, 3, 64)
    scale, shift = torch.randn(3, 1, 64, generator=gen), torch.randn(3, 1, 64, generator=gen)
    with torch.no_grad():
        fused = modulated_linear(linear, x, norm, scale, shift)
        unfused = linear(norm(x) * (1 + scale) + shift)
        plain = modulated_linear(linear, x, norm)
        plain_ref = linear(norm(x))
    # float order differs only (gamma folded into the multiplier): a rounding tie at most
    torch.testing.assert_close(fused, unfused, atol=2e-2, rtol=0)
    assert (fused - unfused).abs().mean() < 1e-4
    torch.testing.assert_close(plain, plain_ref, atol=2e-2, rtol=0)
    # each sample takes its own modulation: swapping two samples' vectors changes the output
    with torch.no_grad():
        swapped = modulated_linear(linear, x, norm, scale.flip(0), shift.flip(0))
    assert (swapped - fused).abs().max() > 0.1


@pytest.mark.parametrize("differential", [False, True])
def test_fused_dit_matches_fake_quant_forward(differential: bool, monkeypatch) -> None:
    dit = _dit(differential)
    fake = fake_quantize_(copy.deepcopy(dit))
    fused = quantize_dit(copy.deepcopy(dit), use_kernel=True)
    assert all(type(layer) is FusedInt8Block for layer in fused.transformer.layers)
    calls, head_calls = [], []
    original, original_heads = kernels.modulated_linear, kernels.dit_attention_int8
    monkeypatch.setattr(kernels, "modulated_linear",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    monkeypatch.setattr(kernels, "dit_attention_int8",
                        lambda *a, **k: head_calls.append(1) or original_heads(*a, **k))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 40, 24, generator=gen)
    t = torch.tensor([0.9, 0.3])
    cross, glob = torch.randn(2, 7, 32, generator=gen), torch.randn(2, 32, generator=gen)
    with torch.no_grad():
        a, b = fake(x, t, cross, glob), fused(x, t, cross, glob)
        exact = dit(x, t, cross, glob)
    assert len(calls) == 3 * 2  # three pre-norm linears per block ran fused
    # the int8 attention kernel takes plain self-attention; differential stays in PyTorch
    # (int8_attention.py's arithmetic, as the fake-quant forward)
    assert len(head_calls) == (0 if differential else 2)
    # the stated bound: float rounding order differs, so a value near a rounding step of the
    # 8-bit attention can land one step away, and a step in the 8-bit softmax weights of a
    # 7-token cross-attention moves a weight by 1/255 of the largest; later blocks carry it
    assert (a - b).abs().max() <= 2e-2 * a.abs().max()
    assert (a - b).abs().mean() <= 1e-3 * a.abs().max()
    # int8 is not float: with 8-bit attention in both, which side of a rounding step a value
    # lands on is itself part of int8's error (measured: 5e-4 of 2.7e-3 here; 4e-8 with
    # float self-attention), so the two int8 forwards are closer than either is to float
    assert (exact - b).abs().mean() > 4 * (a - b).abs().mean()


def test_unfused_fallback_without_kernel_is_the_block() -> None:
    dit = _dit(False)
    reference = quantize_dit(copy.deepcopy(dit), use_kernel=False)
    as_blocks = copy.deepcopy(reference)
    for layer in as_blocks.transformer.layers:
        layer.__class__ = DiTBlock
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 40, 16, generator=gen)
    args = (x, torch.tensor([0.5, 0.5]), torch.randn(2, 5, 32, generator=gen),
            torch.randn(2, 32, generator=gen))
    with torch.no_grad():
        torch.testing.assert_close(reference(*args), as_blocks(*args), atol=1e-5, rtol=1e-5)


def test_modulated_linear_bad_shapes_are_one_line() -> None:
    linear = Int8Linear.from_linear(torch.nn.Linear(32, 16), use_kernel=True)
    x = np.zeros((10, 32), np.float32)
    mod = np.ones((3, 32), np.float32)
    with pytest.raises(ValueError, match="whole samples of `tokens` rows"):
        kernels.modulated_linear(x, 3, mod, mod, 1e-5, linear.packed())
    with pytest.raises(ValueError, match=r"mult and shift must be \(samples, in\)"):
        kernels.modulated_linear(x, 5, mod, mod, 1e-5, linear.packed())


@pytest.mark.parametrize("head_dim", [32, 64])  # RoPE on all channels, and on the first half
def test_fused_self_attention_is_attention(head_dim: int) -> None:
    torch.manual_seed(3)
    attn = Attention(128, head_dim=head_dim)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1 if p.ndim == 1 else 0))
    attn.to_qkv = Int8Linear.from_linear(attn.to_qkv, use_kernel=True)
    x = torch.randn(2, 21, 128)
    qkv = attn.to_qkv(x)
    rope = RotaryEmbedding(max(head_dim // 2, 32))(21)
    mask = torch.arange(21) < torch.tensor([[21], [15]])  # the second item padded
    with torch.no_grad():
        fused = self_attention(attn, x, qkv, rope, None)
        reference = attn(x, rope=rope, projected=qkv)
        unrotated = self_attention(attn, x, qkv, torch.zeros_like(rope), None)
        masked = self_attention(attn, x, qkv, rope, mask)
        masked_reference = attn(x, rope=rope, padding_mask=mask, projected=qkv)
    torch.testing.assert_close(fused, reference, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(masked, masked_reference, atol=1e-5, rtol=1e-4)
    assert (masked[1] - reference[1]).abs().max() > 1e-2  # the mask was applied
    assert (unrotated - reference).abs().max() > 1e-2  # the positions were applied


def test_qk_norm_rope_bad_shapes_are_one_line() -> None:
    gain = np.ones(32, np.float32)
    angles = np.zeros((5, 32), np.float32)
    with pytest.raises(ValueError, match=r"qkv must be \(batch x tokens, 3 x heads x head_dim\)"):
        kernels.qk_norm_rope(np.zeros((10, 3 * 2 * 32), np.float32), 3, 2, gain, gain, 1e-6,
                             angles, angles)
    with pytest.raises(ValueError, match=r"cos and sin \(tokens, rot\)"):
        kernels.qk_norm_rope(np.zeros((10, 3 * 2 * 32), np.float32), 5, 2, gain[:16], gain,
                             1e-6, angles, angles)
    with pytest.raises(ValueError, match="rotary channels must be even"):
        kernels.qk_norm_rope(np.zeros((10, 3 * 2 * 32), np.float32), 5, 2, gain, gain, 1e-6,
                             np.zeros((5, 3), np.float32), np.zeros((5, 3), np.float32))


def test_gated_linear_is_the_unfused_glu_and_residual() -> None:
    gen = torch.Generator().manual_seed(6)
    linear = Int8Linear.from_linear(torch.nn.Linear(64, 48), use_kernel=True)
    a = torch.randn(3 * 10, 128, generator=gen) * 2
    x = torch.randn(3 * 10, 48, generator=gen)
    gate = torch.rand(3, 48, generator=gen)
    value, g = a.chunk(2, -1)
    with torch.no_grad():
        glu_ref = x + linear(value * torch.nn.functional.silu(g)) * gate.repeat_interleave(10, 0)
        plain_ref = x + linear(value) * gate.repeat_interleave(10, 0)
    glu = kernels.gated_linear(a.numpy(), 10, linear.packed(), True, x.numpy(), gate.numpy())
    plain = kernels.gated_linear(value.contiguous().numpy(), 10, linear.packed(), False,
                                 x.numpy(), gate.numpy())
    bare = kernels.gated_linear(value.contiguous().numpy(), 10, linear.packed())
    for got, want in ((glu, glu_ref), (plain, plain_ref)):  # a rounding tie at most
        assert np.abs(got - want.numpy()).max() < 2e-2
        assert np.abs(got - want.numpy()).mean() < 1e-4
    torch.testing.assert_close(torch.from_numpy(bare), linear(value), atol=1e-5, rtol=1e-5)
    swapped = kernels.gated_linear(a.numpy(), 10, linear.packed(), True, x.numpy(),
                                   gate.flip(0).numpy())
    assert np.abs(swapped - glu).max() > 0.1  # each sample takes its own gate
    with pytest.raises(ValueError, match=r"x must be \(rows, 2 x in\)"):
        kernels.gated_linear(value.contiguous().numpy(), 10, linear.packed(), True, x.numpy(),
                             gate.numpy())
    with pytest.raises(ValueError, match=r"gate must be \(samples, out\)"):
        kernels.gated_linear(a.numpy(), 10, linear.packed(), True, x.numpy(), gate[:2].numpy())
    with pytest.raises(ValueError, match="give both residual and gate"):
        kernels.gated_linear(a.numpy(), 10, linear.packed(), True, x.numpy())


def _glu_case():
    """A GLU projection 32 -> 2 x 48 (three pairs of blocks: the two threads get two and one)
    over 3 samples x 10 rows, with its modulation."""
    gen = torch.Generator().manual_seed(8)
    proj = Int8Linear.from_weight(torch.randn(96, 32, generator=gen) * 0.3,
                                  torch.randn(96, generator=gen))
    x = torch.randn(30, 32, generator=gen)
    mult, shift = torch.rand(3, 32, generator=gen) + 0.5, torch.randn(3, 32, generator=gen)
    return proj, [t.numpy() for t in (x, mult, shift)]


def test_glu_pairs_epilogue_is_the_glu_of_the_linear() -> None:
    """modulated_linear(glu_pairs=True) on the pair-ordered packing = value * silu(gate) of the
    plain call's two halves (exp8's polynomial: float32-close), and the layout is checked."""
    proj, (x, mult, shift) = _glu_case()
    full = kernels.modulated_linear(x, 10, mult, shift, 1e-6, proj.packed())
    paired = kernels.modulated_linear(x, 10, mult, shift, 1e-6, proj.packed(True), True)
    value, gate = torch.from_numpy(full).chunk(2, -1)
    assert paired.shape == (30, 48)
    torch.testing.assert_close(torch.from_numpy(paired), value * torch.nn.functional.silu(gate),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="multiple of 32"):
        kernels.modulated_linear(x, 10, mult, shift, 1e-6,
                                 Int8Linear.from_linear(torch.nn.Linear(32, 48)).packed(), True)


def test_glu_pairs_epilogue_is_the_same_without_vnni(tmp_path) -> None:
    """The VNNI epilogue (registers, 16 lanes) and the AVX2 one (via memory, 8 lanes) make
    the same bits."""
    if not kernels.uses_vnni():
        pytest.skip("this CPU has no AVX-512 VNNI: both runs would take the AVX2 path")
    code = ("import sys, numpy as np\nsys.path.insert(0, sys.argv[2])\n"
            "from test_int8_block import _glu_case\nfrom audiofast.asr import kernels\n"
            "proj, (x, mult, shift) = _glu_case()\n"
            "np.save(sys.argv[1], kernels.modulated_linear(x, 10, mult, shift, 1e-6, "
            "proj.packed(True), True))\n"
            "print('avx512_vnni' if kernels.uses_vnni() else 'avx2')\n")
    here = str(Path(__file__).parent)
    for name, env, isa in (("vnni", {}, "avx512_vnni"),
                           ("avx2", {"AUDIOFAST_NO_VNNI": "1"}, "avx2")):
        ran = subprocess.run([sys.executable, "-c", code, str(tmp_path / f"{name}.npy"), here],
                             env={**os.environ, **env}, check=True, capture_output=True, text=True)
        assert ran.stdout.strip() == isa  # the path this run was meant to take
    np.testing.assert_array_equal(np.load(tmp_path / "vnni.npy"), np.load(tmp_path / "avx2.npy"))


def test_io_layers_pad_inputs_to_the_kernel_width() -> None:
    """A 1x1 conv 40 channels wide (the kernel takes multiples of 32): the kernel, zero-padded
    to 64, against the PyTorch arithmetic and QAD's fake-quant conv on the same weights."""
    conv = _dit(False).preprocess_conv
    kernel, reference = Int8Conv1x1.from_conv(conv), Int8Conv1x1.from_conv(conv, False)
    fake = FakeQuantConv1x1(40, 40, 1, bias=False)
    fake.weight = conv.weight
    x = torch.randn(2, 40, 24, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b, c, exact = kernel(x), reference(x), fake(x), conv(x)
    assert kernel.packed()[0].shape == (3, 64 // 4, 64)  # 40 inputs packed as 64
    torch.testing.assert_close(a, b, atol=1e-5 * b.abs().max().item(), rtol=0)
    torch.testing.assert_close(b, c, atol=1e-6 * b.abs().max().item(), rtol=0)
    assert (a - exact).abs().max() > 1e-4 * exact.abs().max()  # int8 is not float
    rows = x.transpose(1, 2).reshape(-1, 40).contiguous()  # the kernel pads inside: exact
    inside = kernels.quant_linear(rows.numpy(), kernel.packed())
    np.testing.assert_array_equal(inside, kernels.quant_linear(
        torch.nn.functional.pad(rows, (0, 24)).numpy(), kernel.packed()))
    with pytest.raises(ValueError, match=r"\(rows, in\) float32"):  # narrower than one pad
        kernels.quant_linear(rows[:, :32].contiguous().numpy(), kernel.packed())
    dit = quantize_dit(_dit(False), io=True)
    assert isinstance(dit.postprocess_conv, Int8Conv1x1)
    assert isinstance(dit.transformer.project_in, Int8Linear)
    assert not isinstance(quantize_dit(_dit(False)).preprocess_conv, Int8Linear)  # off by default
