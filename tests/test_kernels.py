"""The C++ kernels: the int8 linear, its thread pool and build; running without them."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from audiofast.asr import kernels


def test_without_kernels_int8_says_why_and_auto_uses_ct2():
    """Where the kernels cannot run (forced here), a warning names the reason, the int8
    decoder refuses in one line, and --engine auto transcribes on CTranslate2."""
    code = ("import warnings\n"
            "from audiofast.asr import kernels\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    print(kernels.backend())\n"
            "print(any('AUDIOFAST_KERNELS=none' in str(w.message) for w in caught))\n"
            "from audiofast.asr.engine import KernelsUnavailable\n"
            "from audiofast.asr.fast_runtime import FastWhisper\n"
            "try:\n"
            "    FastWhisper('whisper-tiny.en', threads=1)\n"
            "except KernelsUnavailable as exc:\n"
            "    print(exc)\n")
    env = {**os.environ, "AUDIOFAST_KERNELS": "none"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.split("\n")
    assert out[:2] == ["none", "True"]
    assert "needs audiofast's C++ kernels" in out[2] and "--engine ct2" in out[2]
    from audiofast.eval.datasets import real_speech_clips

    clip = next(c for c in real_speech_clips() if c.name == "beckett")
    run = subprocess.run([sys.executable, "-m", "audiofast.cli", "transcribe", str(clip.audio),
                          "--model", "whisper-tiny.en"], capture_output=True,
                         text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Fail better" in run.stdout


def _quantized_linear(out_features: int, in_features: int, seed: int):
    """A float linear, fbgemm's dynamic int8 linear over the same int8 weights (one activation
    range per call, 7-bit), and the kernel's tensors."""
    import warnings

    from audiofast.asr.int8_pack import int8_linear_tensors, per_channel_qint8

    torch.manual_seed(seed)
    linear = torch.nn.Linear(in_features, out_features)
    with warnings.catch_warnings():  # torch.ao's eager quantized modules are deprecated
        warnings.simplefilter("ignore")
        fbgemm = torch.ao.nn.quantized.dynamic.Linear(in_features, out_features,
                                                      dtype=torch.qint8)
        fbgemm.set_weight_bias(per_channel_qint8(linear.weight.detach()), linear.bias.detach())
    return linear, fbgemm, int8_linear_tensors(linear.weight, linear.bias)


def int8_linear(x: torch.Tensor, tensors: list[torch.Tensor]) -> torch.Tensor:
    """The kernel on torch tensors (it takes and returns numpy arrays)."""
    return torch.from_numpy(kernels.quant_linear(x.numpy(), [t.numpy() for t in tensors]))


@pytest.mark.parametrize("shape", [(100, 512), (2048, 512), (512, 2048), (37, 384)])
def test_int8_linear_rows_alone_and_as_fbgemm(kernel, shape):
    """The fused decoder's int8 linear: each row quantized with its own range and summed
    exactly, so k rows give k single-row results bit for bit, whatever the thread count; with
    8-bit activations it is closer to the float linear than fbgemm's 7-bit dynamic int8 (same
    int8 weights)."""
    linear, quantized, tensors = _quantized_linear(*shape, seed=shape[0])
    x = torch.randn(9, shape[1]) * torch.linspace(0.1, 10, 9)[:, None]
    together = int8_linear(x, tensors)
    apart = torch.cat([int8_linear(x[i : i + 1], tensors) for i in range(9)])
    assert torch.equal(together, apart)
    try:
        kernels.set_threads(1)
        assert torch.equal(int8_linear(x, tensors), together)
    finally:
        kernels.set_threads(0)
    expected = linear(x)
    fbgemm = torch.cat([quantized(x[i : i + 1]) for i in range(9)])
    error = (together - expected).abs().amax(-1) / expected.abs().amax(-1)
    assert (error < 0.03).all(), error
    assert (together - expected).abs().mean() < (fbgemm - expected).abs().mean()


def test_int8_linear_is_the_same_without_vnni(kernel, tmp_path):
    """AVX2 and AVX-512 VNNI sum the same integers: outputs identical bit for bit, so a
    transcript does not depend on which of the two CPUs ran it."""
    if not kernels.uses_vnni():
        pytest.skip("this CPU has no AVX-512 VNNI: both runs would take the AVX2 path")
    _, _, tensors = _quantized_linear(300, 512, seed=3)
    x = torch.randn(5, 512)
    torch.save((x, tensors), tmp_path / "case.pt")
    code = ("import sys, torch\nfrom audiofast.asr import kernels\nkernels.backend()\n"
            "x, t = torch.load(sys.argv[1])\n"
            "y = kernels.quant_linear(x.numpy(), [a.numpy() for a in t])\n"
            "torch.save(torch.from_numpy(y), sys.argv[2])\n"
            "print('avx512_vnni' if kernels.uses_vnni() else 'avx2')\n")
    for name, env, isa in (("default", {}, "avx512_vnni"),
                           ("avx2", {"AUDIOFAST_NO_VNNI": "1"}, "avx2")):
        ran = subprocess.run([sys.executable, "-c", code, str(tmp_path / "case.pt"),
                              str(tmp_path / f"{name}.pt")], env={**os.environ, **env},
                             check=True, capture_output=True, text=True)
        assert ran.stdout.strip() == isa  # the path this run was meant to take
    assert torch.equal(torch.load(tmp_path / "default.pt"), torch.load(tmp_path / "avx2.pt"))


def test_int8_linear_rejects_unpacked_weights(kernel):
    _, _, (packed, scale, row_sums, bias) = _quantized_linear(32, 64, seed=0)
    with pytest.raises(ValueError, match="packed"):
        int8_linear(torch.randn(1, 64), [packed.view(32, 64), scale, row_sums, bias])
    with pytest.raises(ValueError, match="one value per output"):
        int8_linear(torch.randn(1, 64), [packed, scale[:5], row_sums, bias])
    with pytest.raises(ValueError, match=r"\(rows, in\) float32"):
        int8_linear(torch.randn(1, 32), [packed, scale, row_sums, bias])
    with pytest.raises(TypeError, match="numpy arrays"):
        kernels.quant_linear(np.zeros((1, 64), np.float32), [packed, scale, row_sums, bias])
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.quant_linear(np.zeros((1, 64), np.float32),
                            [packed.numpy(), scale.numpy()[::1], row_sums.numpy(),
                             np.zeros(64, np.float32)[::2]])


# -- the thread pool and the build (issue: reliability) ------------------------------------------

def _int8_case(seed: int, rows: int = 9):
    _, _, tensors = _quantized_linear(640, 512, seed=seed)
    return torch.randn(rows, 512, generator=torch.Generator().manual_seed(seed)), tensors


def test_two_threads_share_the_pool(kernel):
    """Two engines in two threads (a server with two models): each call's result is what it
    is alone, and neither hangs or crashes."""
    import threading

    cases = [_int8_case(s) for s in (1, 2)]
    alone = [int8_linear(x, t) for x, t in cases]
    wrong, errors = [], []

    def worker(i: int) -> None:
        try:
            for _ in range(300):
                if not torch.equal(int8_linear(*cases[i]), alone[i]):
                    wrong.append(i)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung in the pool"
    assert not errors and not wrong


def test_thread_count_change_during_runs(kernel):
    """kernels.set_threads from another thread rebuilds the pool only between loops."""
    import threading

    x, tensors = _int8_case(3)
    alone = int8_linear(x, tensors)
    stop, wrong = threading.Event(), []

    def toggle() -> None:
        while not stop.is_set():
            for n in (1, 2):
                kernels.set_threads(n)

    toggler = threading.Thread(target=toggle)
    toggler.start()
    try:
        for _ in range(300):
            if not torch.equal(int8_linear(x, tensors), alone):
                wrong.append(1)
    finally:
        stop.set()
        toggler.join()
        kernels.set_threads(0)
    assert not wrong


def test_pool_works_in_a_forked_child(kernel):
    """A child forked after the pool started (multiprocessing, gunicorn, DataLoader workers)
    inherits a pool with no threads behind it: it must make its own, not spin forever."""
    import multiprocessing

    x, tensors = _int8_case(4)
    expected = int8_linear(x, tensors)  # the parent's pool now has workers
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        result = pool.apply_async(_child_int8, (x, tensors))
        got = result.get(timeout=60)
    assert torch.equal(got, expected)


def _child_int8(x, tensors):
    kernels.set_threads(2)
    return int8_linear(x, tensors)


def test_a_worker_exception_reaches_the_caller(kernel):
    """bad_alloc in a pool thread becomes Python's MemoryError in the calling thread (before:
    std::terminate ended the process); the process and the pool go on."""
    kernels.set_threads(2)
    assert kernels.pool_selftest(1000, -1) == sum(range(1000))
    for throw_at in (10, 990):  # the caller's slice, then a worker's
        with pytest.raises(MemoryError):
            kernels.pool_selftest(1000, throw_at)
    assert kernels.pool_selftest(1000, -1) == sum(range(1000))
    kernels.set_threads(0)


def test_decoder_forward_checks_inputs(kernel):
    """The library reads raw pointers: a wrong dtype or shape is refused, in one line naming
    the input, before anything is read."""
    d, n_ctx = 64, 4
    params = [np.zeros((10, d), np.float32), np.zeros((n_ctx, d), np.float32)] + \
        [np.zeros(1, np.float32)] * (7 + 30)
    cache = np.zeros((1, 1, 1, n_ctx, 64), np.float32)
    cross = [np.zeros((1, 3, 64), np.float16)]

    def call(k=cache, v=cache, ck=cross, p=params):
        kernels.decoder_forward(np.array([1]), 0, 0, kernels.as_arrays(p), k, v,
                                kernels.as_arrays(ck), kernels.as_arrays(cross), 0, 10)

    with pytest.raises(ValueError, match="k_cache and v_cache must be float32"):
        call(k=np.zeros((1, 1, 1, n_ctx, 64), np.int32))
    with pytest.raises(ValueError, match="k_cache and v_cache must be float32"):
        call(v=np.zeros((1, 1, 1, n_ctx + 1, 64), np.float32))
    with pytest.raises(ValueError, match="embeddings must be contiguous float32"):
        call(p=[params[0].astype(np.float16), *params[1:]])
    with pytest.raises(ValueError, match="keys and values must be contiguous .* float16 or int8"):
        call(ck=[cross[0].astype(np.float32)])
    with pytest.raises(ValueError, match="positions exceed the decoder context"):
        kernels.decoder_forward(np.array([1]), n_ctx, 0, kernels.as_arrays(params), cache,
                                cache, kernels.as_arrays(cross), kernels.as_arrays(cross), 0, 10)


def test_a_failing_compiler_means_no_kernels_and_a_reason(tmp_path):
    """A compiler that fails (here: ``false``) leaves no library behind, and the backend is
    "none" with a warning naming the failure; transcription then runs on CTranslate2."""
    code = ("import warnings\nfrom audiofast.asr import kernels\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    print(kernels.backend())\n"
            "print(str(caught[0].message))\n"
            "print(kernels.is_built())\n")
    env = {**os.environ, "CXX": "false", "AUDIOFAST_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout.splitlines()
    assert out[0] == "none"
    assert "building it failed (false failed" in out[1]
    assert out[2] == "False" and not list(tmp_path.rglob("*.so"))


def test_build_is_keyed_by_its_sources(monkeypatch, tmp_path):
    """A changed source or flag gives another build key, so a reinstall never loads a stale
    library whatever the file times say."""
    key = kernels.build_key()
    assert kernels.is_built() == kernels._built_library().is_file()
    assert key in str(kernels._built_library())
    source = tmp_path / "extra.cpp"
    source.write_text("// one version\n")
    monkeypatch.setattr(kernels, "SOURCES", [*kernels.SOURCES, source])
    kernels.build_key.cache_clear()
    first = kernels.build_key()
    source.write_text("// another version\n")
    kernels.build_key.cache_clear()
    assert first != kernels.build_key() != key
    monkeypatch.setattr(kernels, "CFLAGS", [*kernels.CFLAGS, "-DX"])
    kernels.build_key.cache_clear()
    assert kernels.build_key() not in (first, key)
    assert not kernels.is_built()  # nothing was built for that key
    kernels.build_key.cache_clear()


def test_cross_kv_split_to_fp16_heads_as_numpy_rounds(kernel):
    """The window's projected K/V go to (heads, frames, 64) fp16 in C (F16C): the same bits
    as numpy's float16 conversion of the same layout, ties, tiny, huge and infinite values
    included."""
    heads, frames = 8, 37
    rng = np.random.default_rng(3)
    kv = (rng.standard_normal((frames, 2 * heads * 64)) * 10).astype(np.float32)
    kv.flat[:6] = [65520.0, -1e6, np.inf, 3e-8, 1.00048828125, 2.0 ** -24 * 1.5]  # edges
    keys, values = kernels.split_heads_f16(kv, heads)
    for got, half in zip((keys, values), np.split(kv, 2, axis=1), strict=True):
        want = half.reshape(frames, heads, 64).transpose(1, 0, 2).astype(np.float16)
        assert got.dtype == np.float16 and got.shape == (heads, frames, 64)
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    with pytest.raises(ValueError, match="kv must be"):
        kernels.split_heads_f16(kv[:, :100], heads)


def test_cross_kv_split_to_int8_heads_as_numpy_rounds(kernel):
    """``-kv8``: each (head, frame)'s 64 values over one scale, max |x| / 127, rounded to
    nearest even - the bits numpy's float32 arithmetic gives (what the decoder's numerics key
    names), ties, all-zero rows (scale 1) and a row's maximum included."""
    heads, frames = 8, 37
    rng = np.random.default_rng(4)
    kv = (rng.standard_normal((frames, 2 * heads * 64)) * 3).astype(np.float32)
    kv[0, :64] = 0.0  # frame 0, head 0 key: all zero
    kv[1, :64] = np.r_[127.0, np.arange(63) - 30.5]  # scale 1: every other value a .5 tie
    kv[2, 64:128] = -1e30  # huge and negative
    got = kernels.split_heads_i8(kv, heads)
    for k, half in enumerate(np.split(kv, 2, axis=1)):
        x = half.reshape(frames, heads, 64).transpose(1, 0, 2)
        scale = np.abs(x).max(-1) / np.float32(127)
        scale[scale == 0] = 1.0
        want = np.rint(x / scale[..., None]).astype(np.int8)
        assert got[k].dtype == np.int8 and np.array_equal(got[k], want)
        assert got[2 + k].dtype == np.float32 and np.array_equal(got[2 + k], scale)
    assert got[2][0, 0] == 1.0 and not got[0][0, 0].any()
    assert list(got[0][0, 1, 1:5]) == [-30, -30, -28, -28]  # -30.5, -29.5, ... to even
    assert np.abs(got[0]).max() == 127
    with pytest.raises(ValueError, match="kv must be"):
        kernels.split_heads_i8(kv[:, :100], heads)
