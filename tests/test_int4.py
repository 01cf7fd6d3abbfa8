"""The int4 linear: group-wise quantizer, packing, and the C++ kernel against a dequantized
matmul; AVX2 and VNNI identical; bad arrays refused in one line."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from audiofast.asr import kernels
from audiofast.asr.int4_pack import (
    dequantize_int4,
    fake_quantize,
    int4_linear_tensors,
    pack_int4_weight,
    quantize_int4,
)


def _case(out: int, width: int, rows: int, seed: int):
    torch.manual_seed(seed)
    linear = torch.nn.Linear(width, out)
    x = (torch.randn(rows, width) * torch.linspace(0.1, 10, rows)[:, None]).numpy()
    return linear, x, [t.numpy() for t in int4_linear_tensors(linear.weight, linear.bias)]


def _row_quantized(x: np.ndarray) -> np.ndarray:
    """x as the kernel sees it: each row in 8 bits over its own range, 0 included (the rule
    quant_linear.h states), in float64."""
    lo, hi = np.minimum(x.min(1), 0), np.maximum(x.max(1), 0)
    scale = ((hi - lo) / np.float32(255)).astype(np.float32)
    zero = np.clip(np.rint(-lo / scale), 0, 255)
    q = np.clip(np.rint(x * (np.float32(1) / scale)[:, None]) + zero[:, None], 0, 255)
    return (q - zero[:, None]) * scale[:, None].astype(np.float64)


@pytest.mark.parametrize("shape", [(37, 64), (100, 512), (2048, 512), (512, 2048)])
def test_int4_rows_equal_a_dequantized_matmul(kernel, shape):
    """Every output equals (row-quantized x) @ (int4 values x group scales)^T + bias to within
    2e-6 of the row's largest output (the float accumulation over groups); k rows give the k
    single-row results bit for bit."""
    linear, x, tensors = _case(*shape, rows=9, seed=shape[0])
    y = kernels.quant_linear(x, tensors)
    q, scale = quantize_int4(linear.weight)
    weight = dequantize_int4(q, scale).double().numpy()
    reference = _row_quantized(x) @ weight.T + linear.bias.detach().double().numpy()
    error = np.abs(y - reference).max(1) / np.abs(reference).max(1)
    assert (error < 2e-6).all(), error
    apart = np.concatenate([kernels.quant_linear(x[i : i + 1], tensors) for i in range(9)])
    assert np.array_equal(apart, y)
    exact = x.astype(np.float64) @ linear.weight.detach().double().numpy().T
    exact += linear.bias.detach().double().numpy()
    assert (np.abs(y - exact).max(1) / np.abs(exact).max(1) < 0.1).all()  # still the layer


def test_int4_is_the_same_without_vnni(kernel, tmp_path):
    if not kernels.uses_vnni():
        pytest.skip("this CPU has no AVX-512 VNNI: both runs would take the AVX2 path")
    _, x, tensors = _case(515, 2048, rows=7, seed=3)
    np.savez(tmp_path / "case.npz", x, *tensors)
    code = ("import sys, numpy as np\nfrom audiofast.asr import kernels\n"
            "a = np.load(sys.argv[1]); arrays = [a[f'arr_{i}'] for i in range(5)]\n"
            "np.save(sys.argv[2], kernels.quant_linear(arrays[0], arrays[1:]))\n"
            "print('avx512_vnni' if kernels.uses_vnni() else 'avx2')\n")
    for name, env, isa in (("default", {}, "avx512_vnni"),
                           ("avx2", {"AUDIOFAST_NO_VNNI": "1"}, "avx2")):
        ran = subprocess.run([sys.executable, "-c", code, str(tmp_path / "case.npz"),
                              str(tmp_path / f"{name}.npy")], env={**os.environ, **env},
                             check=True, capture_output=True, text=True)
        assert ran.stdout.strip() == isa  # the path this run was meant to take
    assert np.array_equal(np.load(tmp_path / "default.npy"), np.load(tmp_path / "avx2.npy"))


def test_group_scales_search_beats_absmax_and_bound_the_error():
    torch.manual_seed(0)
    weight = torch.randn(64, 256) * 0.02
    weight[3, 10] = 0.5  # an outlier costs only its own group's resolution
    searched, plain = quantize_int4(weight), quantize_int4(weight, search=False)
    err = {name: ((dequantize_int4(*qs) - weight) ** 2).sum().item()
           for name, qs in (("searched", searched), ("plain", plain))}
    assert err["searched"] < err["plain"]
    q, scale = plain
    assert q.dtype == torch.int8 and int(q.min()) >= -8 and int(q.max()) <= 7
    assert scale.dtype == torch.float16 and scale.shape == (64, 4)
    step = scale.float().repeat_interleave(64, 1)
    assert ((dequantize_int4(q, scale) - weight).abs() <= step / 2 + 1e-7).all()
    rows_without_outlier = torch.ones(64, dtype=torch.bool)
    rows_without_outlier[3] = False
    assert scale[3, 0] > 5 * scale[rows_without_outlier, 0].float().max()
    assert scale[3, 1] < 2 * scale[rows_without_outlier, 1].float().max()


def test_fake_quantize_rounds_forward_and_passes_gradients():
    weight = (torch.randn(16, 128) * 0.05).requires_grad_()
    q, scale = quantize_int4(weight)
    out = fake_quantize(weight, scale)
    assert torch.equal(out.detach(), dequantize_int4(q, scale))
    (out * torch.arange(128.0)).sum().backward()
    assert torch.equal(weight.grad, torch.arange(128.0).expand(16, 128))


def test_int4_refuses_bad_shapes_and_arrays(kernel):
    with pytest.raises(ValueError, match="divide the width"):
        quantize_int4(torch.randn(4, 96), group=64)
    with pytest.raises(ValueError, match="divisible by 32"):
        pack_int4_weight(torch.zeros(4, 16, dtype=torch.int8))
    _, x, (packed, scales, zero, bias) = _case(32, 128, rows=1, seed=0)
    with pytest.raises(ValueError, match="float16"):
        kernels.quant_linear(x, [packed, scales.astype(np.float32), zero, bias])
    with pytest.raises(ValueError, match="blocks do not match"):
        kernels.quant_linear(x, [packed, scales, np.zeros(40, np.float32),
                                 np.zeros(40, np.float32)])
    with pytest.raises(ValueError, match=r"\(rows, in\) float32"):
        kernels.quant_linear(x[:, :64].copy(), [packed, scales, zero, bias])


@pytest.fixture(scope="module")
def fast_int4(kernel):
    from audiofast.asr.fast_runtime import FastWhisper

    return FastWhisper("whisper-base", threads=2, precision="int4")


def test_int4_decoder_rows_alone_and_drafting_lossless(fast_int4, clips):
    """With int4 weights in every linear a k-row verify call still equals k single rows bit
    for bit, so n-gram drafting keeps plain greedy's tokens exactly, with drafts accepted."""
    engine = fast_int4.engine
    assert engine.numerics.startswith("int4-fused") and engine.numerics.endswith("-g64")
    tokens = np.array([50258, 50259, 50359, 50364, 440, 2068, 3699, 291, 257, 1702])
    engine.set_audio(fast_int4.encode(np.zeros((80, 3000), np.float32) - 0.5))
    engine(tokens[:4], 0)
    together = engine(tokens[4:], 4, rowwise=True)
    apart = np.concatenate([engine(tokens[i : i + 1], i) for i in range(4, len(tokens))])
    assert np.array_equal(together, apart)
    accepted = 0
    for clip in ("two_cities", "beckett"):
        fast_int4.drafter_name = "none"
        plain = [s.tokens for s in fast_int4.transcribe(clips[clip].audio).segments]
        fast_int4.drafter_name = "ngram"
        before = fast_int4.stats["accepted"]
        drafted = fast_int4.transcribe(clips[clip].audio)
        assert [s.tokens for s in drafted.segments] == plain, clip
        accepted += fast_int4.stats["accepted"] - before
    assert accepted > 0


def test_int8_cross_attention_kv_tracks_fp16_and_keeps_rows_alone(kernel, clips):
    """``-kv8``: the window's cross-attention K/V in int8 (a scale per frame and head) give
    logits within a small KL of the fp16 K/V's on a real window, the same argmax along its
    transcript, and verify rows still equal single rows bit for bit."""
    from audiofast.asr.decoding import log_softmax
    from audiofast.asr.fast_runtime import FastWhisper
    from audiofast.asr.features import log_mel_spectrogram, pad_or_trim
    from audiofast.audio import load_audio

    fp16 = FastWhisper("whisper-base", threads=2, precision="int8")
    kv8 = FastWhisper(threads=2, precision="int8-kv8", ct2=fp16.ct2)
    assert "-kv8-" in kv8.engine.numerics and "-kv16-" in fp16.engine.numerics
    mel = log_mel_spectrogram(load_audio(clips["two_cities"].audio), fp16.n_mels)
    encoded = fp16.encode(pad_or_trim(mel, 3000))
    tokens = [50258, 50259, 50359, 50363]
    engine = fp16.engine
    engine.set_audio(encoded)
    logits = engine(tokens, 0)[-1]
    while int(logits.argmax()) != 50257 and len(tokens) < 60:
        tokens.append(int(logits.argmax()))
        logits = engine(tokens[-1:], len(tokens) - 1)[0]
    out = {}
    for name, runtime in (("fp16", fp16), ("kv8", kv8)):
        runtime.engine.set_audio(encoded)
        out[name] = log_softmax(runtime.engine(np.array(tokens), 0)[3:-1])
    assert np.array_equal(out["kv8"].argmax(-1), out["fp16"].argmax(-1))
    kl = (np.exp(out["fp16"]) * (out["fp16"] - out["kv8"])).sum(-1).mean()
    assert 0 < kl < 1e-3, kl
    together = kv8.engine(np.array(tokens[4:10]), 4, rowwise=True)
    kv8.engine(np.array(tokens[:4]), 0)
    apart = np.concatenate([kv8.engine(np.array(tokens[i : i + 1]), i) for i in range(4, 10)])
    assert np.array_equal(together, apart)
    backend = kv8.engine.backend  # int8 K/V without their scales: refused, not misread
    _, keys, values, _ = backend.project_audio(encoded)
    with pytest.raises(ValueError, match="need their scales"):
        kernels.decoder_forward(np.array([50258]), 0, 0, backend.params, backend.k_cache,
                                backend.v_cache, keys, values, 16, backend.lm_head.out_features)
    with pytest.raises(ValueError, match="16 or 8"):
        type(backend)(backend.tensors(), kv_bits=4)
