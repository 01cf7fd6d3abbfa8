"""The C++ cross-attention kernel against the same arithmetic in PyTorch."""

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
