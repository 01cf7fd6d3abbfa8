"""8-bit self-attention (diffusion/int8_attention.py, kernels/dit_attention.cpp): the kernel
against the PyTorch arithmetic QAD trains with, both against float attention, on both CPU
paths, and how checkpoints switch it on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from audiofast.asr import kernels
from audiofast.diffusion.attention import Attention
from audiofast.diffusion.int8_attention import int8_attention, uses_int8_attention
from audiofast.diffusion.layers import RotaryEmbedding, apply_rotary

pytestmark = pytest.mark.usefixtures("one_torch_thread", "kernel")

HEADS, TOKENS = 6, 132  # the proving-ground teacher's self-attention: 6 heads of 32


def _case(head_dim: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    attn = Attention(HEADS * head_dim, head_dim)
    with torch.no_grad():
        attn.q_norm.gamma.uniform_(0.5, 2.0, generator=gen)
        attn.k_norm.gamma.uniform_(0.5, 2.0, generator=gen)
    qkv = torch.randn(3, TOKENS, 3 * HEADS * head_dim, generator=gen) * 2
    qkv[1, 7] *= 40  # one loud token: per-row scales keep it from coarsening the rest
    rope = RotaryEmbedding(max(head_dim // 2, 16))(TOKENS)
    return attn, qkv, rope


def _kernel(attn: Attention, qkv: torch.Tensor, rope: torch.Tensor, mask=None) -> torch.Tensor:
    b, n, _ = qkv.shape
    out = kernels.dit_attention_int8(
        qkv.reshape(b * n, -1).numpy(), n, attn.heads, attn.q_norm.gamma.detach().numpy(),
        attn.k_norm.gamma.detach().numpy(), attn.q_norm.eps, rope.cos().numpy(),
        rope.sin().numpy(), mask)
    return torch.from_numpy(out).reshape(b, n, -1)


def _heads(attn: Attention, qkv: torch.Tensor, rope: torch.Tensor):
    qs, ks, v = attn._project(qkv[..., : attn.heads], None, qkv)
    return apply_rotary(attn.q_norm(qs[0]), rope), apply_rotary(attn.k_norm(ks[0]), rope), v


def _rows(o: torch.Tensor) -> torch.Tensor:
    b, h, n, d = o.shape
    return o.transpose(1, 2).reshape(b, n, h * d)


@pytest.mark.parametrize("head_dim", [32, 64, 24])  # 24: not a multiple of 16, float path
def test_kernel_is_the_pytorch_arithmetic(head_dim: int) -> None:
    attn, qkv, rope = _case(head_dim)
    with torch.no_grad():
        q, k, v = _heads(attn, qkv, rope)
        reference = _rows(int8_attention(q, k, v))
        exact = _rows(F.scaled_dot_product_attention(q, k, v))
    fused = _kernel(attn, qkv, rope)
    scale = exact.abs().max()
    # the same integer sums; only float rounding (and a rare 8-bit weight tie) differs
    assert (fused - reference).abs().max() <= 1e-3 * scale
    # 8 bits are not float32, and not far from it
    err = (reference - exact).norm() / exact.norm()
    assert 1e-3 < err < 0.04, err


@pytest.mark.parametrize("context", [17, 40])  # the proving ground's 17 caption tokens
def test_cross_attention_kernel_is_the_pytorch_arithmetic(context: int) -> None:
    gen = torch.Generator().manual_seed(7)
    attn = Attention(HEADS * 32, 32, context_dim=HEADS * 32)
    with torch.no_grad():
        attn.q_norm.gamma.uniform_(0.5, 2.0, generator=gen)
        attn.k_norm.gamma.uniform_(0.5, 2.0, generator=gen)
    q = torch.randn(2, TOKENS, HEADS * 32, generator=gen) * 2
    kv = torch.randn(2, context, 2 * HEADS * 32, generator=gen) * 2
    rows = kernels.dit_cross_attention_int8(q.reshape(-1, q.shape[-1]).numpy(),
                                            kv.reshape(-1, kv.shape[-1]).numpy(), 2, HEADS,
                                            attn.q_norm.gamma.detach().numpy(),
                                            attn.k_norm.gamma.detach().numpy(), attn.q_norm.eps)
    with torch.no_grad():
        k, v = kv.chunk(2, -1)
        qh, kh, vh = attn._heads(q), attn._heads(k), attn._heads(v)
        qh, kh = attn.q_norm(qh), attn.k_norm(kh)
        reference = _rows(int8_attention(qh, kh, vh))
        exact = _rows(F.scaled_dot_product_attention(qh, kh, vh))
    fused = torch.from_numpy(rows).reshape(2, TOKENS, -1)
    # a rare step in an 8-bit weight moves an output by up to max|v| / sum(p8) (<= 1/255)
    assert (fused - reference).abs().max() <= 4e-3 * exact.abs().max()
    assert (fused - reference).abs().mean() <= 1e-5 * exact.abs().max()
    assert 1e-3 < (reference - exact).norm() / exact.norm() < 0.04
    with pytest.raises(ValueError, match=r"kv \(batch x context, 2 x heads x d\)"):
        kernels.dit_cross_attention_int8(q.reshape(-1, q.shape[-1]).numpy(),
                                         kv[..., :32].reshape(-1, 32).numpy(), 2, HEADS,
                                         attn.q_norm.gamma.detach().numpy(),
                                         attn.k_norm.gamma.detach().numpy(), 1e-6)


def test_value_mask_zeroes_padded_values() -> None:
    attn, qkv, rope = _case(32)
    mask = torch.ones(3, TOKENS)
    mask[2, 100:] = 0
    with torch.no_grad():
        q, k, v = _heads(attn, qkv, rope)
        reference = _rows(int8_attention(q, k, v * mask[:, None, :, None]))
    fused = _kernel(attn, qkv, rope, mask.numpy())
    assert (fused - reference).abs().max() <= 1e-3 * reference.abs().max()
    assert (fused[2] - _kernel(attn, qkv, rope)[2]).abs().max() > 1e-2  # the mask mattered


def test_vnni_and_avx2_paths_sum_the_same_integers(tmp_path) -> None:
    """Both paths compute exact integer sums (int32 / floats below 2^24): they agree to float
    rounding, far tighter than either's distance to float attention."""
    if not kernels.dit_attention_uses_vnni(32):
        pytest.skip("this CPU has no AVX-512 VNNI: only the float path can run here")
    attn, qkv, rope = _case(32, seed=4)
    root = str(Path(__file__).parents[1])
    script = "\n".join([
        f"import sys; sys.path.insert(0, {root!r})",
        "import numpy as np",
        "from tests.test_int8_attention import _case, _kernel",
        "from audiofast.asr import kernels",
        "attn, qkv, rope = _case(32, seed=4)",
        "assert not kernels.dit_attention_uses_vnni(32)",
        f"np.save({str(tmp_path / 'avx2.npy')!r}, _kernel(attn, qkv, rope).numpy())"])
    env = {**os.environ, "AUDIOFAST_NO_VNNI": "1"}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, cwd=root)
    vnni = _kernel(attn, qkv, rope)
    avx2 = torch.from_numpy(np.load(tmp_path / "avx2.npy"))
    assert (vnni - avx2).abs().max() <= 2e-3 * vnni.abs().max()
    assert (vnni - avx2).abs().mean() < 1e-5 * vnni.abs().max()


def test_bad_shapes_are_one_line() -> None:
    gain = np.ones(32, np.float32)
    angles = np.zeros((5, 16), np.float32)
    qkv = np.zeros((10, 3 * 2 * 32), np.float32)
    with pytest.raises(ValueError, match=r"qkv must be \(batch x tokens, 3 x heads x head_dim\)"):
        kernels.dit_attention_int8(qkv, 3, 2, gain, gain, 1e-6, angles, angles)
    with pytest.raises(ValueError, match=r"value_mask must be \(batch, tokens\)"):
        kernels.dit_attention_int8(qkv, 5, 2, gain, gain, 1e-6, angles, angles,
                                   np.ones((5, 2), np.float32))
    with pytest.raises(ValueError, match="rotary channels must be even"):
        kernels.dit_attention_int8(qkv, 5, 2, gain, gain, 1e-6, np.zeros((5, 3), np.float32),
                                   np.zeros((5, 3), np.float32))


def test_gradients_pass_the_rounding() -> None:
    """Straight-through: QAD's gradient reaches the queries, keys and values."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 16, 32, generator=gen, requires_grad=True) for _ in range(3))
    int8_attention(q, k, v).square().sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (q, k, v))


def test_int8_checkpoints_say_whether_attention_is_8_bit(tmp_path) -> None:
    """New QAD students record it; int8 checkpoints written before it keep float attention."""
    from audiofast.diffusion.checkpoint import load_checkpoint
    from audiofast.diffusion.int8 import QUANTIZATION

    shipped = Path(__file__).parents[1] / "evals" / "students" / "steps4-int8"
    record = json.loads((shipped / "model_config.json").read_text())
    for name, quantization in [("before", {k: v for k, v in QUANTIZATION.items()
                                           if k != "attention"}),
                               ("after", dict(QUANTIZATION))]:
        record["audiofast"]["quantization"] = quantization
        (tmp_path / name).mkdir()
        (tmp_path / name / "model_config.json").write_text(json.dumps(record))
        (tmp_path / name / "model.safetensors").symlink_to(shipped / "model.safetensors")
    assert not uses_int8_attention(load_checkpoint(tmp_path / "before").dit)
    blocks = load_checkpoint(tmp_path / "after").dit.transformer.layers
    assert all(b.self_attn.int8 and b.cross_attn.int8 for b in blocks)
