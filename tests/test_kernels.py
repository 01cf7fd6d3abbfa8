"""The C++ kernels: cross-attention against PyTorch; the fused decoder's int8 linear."""

import os
import subprocess
import sys

import pytest
import torch

from audiofast.asr import kernels


@pytest.fixture(scope="module")
def kernel():
    if kernels.backend() != "avx2":
        pytest.skip("the C++ kernel is not built here (no compiler or no AVX2/F16C)")
    return torch.ops.audiofast.cross_attention


@pytest.mark.parametrize("frames", [1, 7, 1500])
def test_kernel_matches_torch(kernel, frames):
    gen = torch.Generator().manual_seed(frames)
    q = torch.randn(8, 64, generator=gen) * 0.125
    keys = torch.randn(8, frames, 64, generator=gen).half()
    values = torch.randn(8, frames, 64, generator=gen).half()
    expected = kernels._cross_attention_torch(q, keys, values)
    assert torch.allclose(kernel(q, keys, values), expected, atol=1e-5, rtol=1e-4)
    # A strided query row (the engine passes q[:, r]) reads the same numbers.
    wide = torch.randn(8, 3, 64, generator=gen)
    assert torch.equal(kernel(wide[:, 1], keys, values),
                       kernel(wide[:, 1].contiguous(), keys, values))


def test_kernel_rejects_wrong_layouts(kernel):
    q = torch.randn(8, 64)
    keys = torch.randn(8, 10, 64).half()
    with pytest.raises(RuntimeError, match="float16"):
        kernel(q, keys.float(), keys.float())
    with pytest.raises(RuntimeError, match=r"\(heads, 64\) float32"):
        kernel(torch.randn(8, 32), keys, keys)


def test_fallback_registers_the_same_op():
    """Where the kernel cannot be built the op still exists (the decoder's scripted step
    names it), computed by PyTorch; a warning says why."""
    code = ("import warnings, torch\n"
            "from audiofast.asr import kernels\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    print(kernels.backend())\n"
            "print(any('AUDIOFAST_KERNELS=torch' in str(w.message) for w in caught))\n"
            "q, kv = torch.randn(2, 64), torch.randn(2, 5, 64).half()\n"
            "print(torch.ops.audiofast.cross_attention(q, kv, kv).shape)\n")
    env = {**os.environ, "AUDIOFAST_KERNELS": "torch"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.split("\n")
    assert out[:3] == ["torch", "True", "torch.Size([2, 64])"]


def _quantized_linear(out_features: int, in_features: int, seed: int):
    from audiofast.asr.fused_decoder import int8_linear_tensors
    from audiofast.asr.invariant_int8 import quantize_per_channel

    torch.manual_seed(seed)
    linear = torch.nn.Linear(in_features, out_features)
    quantized = quantize_per_channel(linear)
    return linear, quantized, int8_linear_tensors(linear)


@pytest.mark.parametrize("shape", [(100, 512), (2048, 512), (512, 2048), (37, 384)])
def test_int8_linear_rows_alone_and_as_fbgemm(kernel, shape):
    """The fused decoder's int8 linear: each row quantized with its own range and summed
    exactly, so k rows give k single-row results bit for bit, whatever the thread count; with
    8-bit activations it is closer to the float linear than fbgemm's 7-bit dynamic int8 (same
    int8 weights)."""
    linear, quantized, tensors = _quantized_linear(*shape, seed=shape[0])
    x = torch.randn(9, shape[1]) * torch.linspace(0.1, 10, 9)[:, None]
    together = torch.ops.audiofast.int8_linear(x, tensors)
    apart = torch.cat([torch.ops.audiofast.int8_linear(x[i : i + 1], tensors) for i in range(9)])
    assert torch.equal(together, apart)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(torch.ops.audiofast.int8_linear(x, tensors), together)
    finally:
        torch.set_num_threads(threads)
    expected = linear(x)
    fbgemm = torch.cat([quantized(x[i : i + 1]) for i in range(9)])
    error = (together - expected).abs().amax(-1) / expected.abs().amax(-1)
    assert (error < 0.03).all(), error
    assert (together - expected).abs().mean() < (fbgemm - expected).abs().mean()


def test_int8_linear_is_the_same_without_vnni(kernel, tmp_path):
    """AVX2 and AVX-512 VNNI sum the same integers: outputs identical bit for bit, so a
    transcript does not depend on which of the two CPUs ran it."""
    _, _, tensors = _quantized_linear(300, 512, seed=3)
    x = torch.randn(5, 512)
    torch.save((x, tensors), tmp_path / "case.pt")
    code = ("import sys, torch\nfrom audiofast.asr import kernels\nkernels.backend()\n"
            "x, t = torch.load(sys.argv[1])\n"
            "torch.save(torch.ops.audiofast.int8_linear(x, t), sys.argv[2])\n")
    for name, env in (("default", {}), ("avx2", {"AUDIOFAST_NO_VNNI": "1"})):
        subprocess.run([sys.executable, "-c", code, str(tmp_path / "case.pt"),
                        str(tmp_path / f"{name}.pt")], env={**os.environ, **env}, check=True)
    assert torch.equal(torch.load(tmp_path / "default.pt"), torch.load(tmp_path / "avx2.pt"))


def test_int8_linear_rejects_unpacked_weights(kernel):
    _, _, (packed, scale, row_sums, bias) = _quantized_linear(32, 64, seed=0)
    with pytest.raises(RuntimeError, match="packed"):
        torch.ops.audiofast.int8_linear(torch.randn(1, 64), [packed.view(32, 64), scale,
                                                             row_sums, bias])
    with pytest.raises(RuntimeError, match="one value per output"):
        torch.ops.audiofast.int8_linear(torch.randn(1, 64), [packed, scale[:5], row_sums, bias])
    with pytest.raises(RuntimeError, match=r"\(rows, in\) float32"):
        torch.ops.audiofast.int8_linear(torch.randn(1, 32), [packed, scale, row_sums, bias])
