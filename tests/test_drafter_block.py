"""The block drafter: the kernel's hidden states, numpy == torch, lossless drafts alone and in
batches on real audio, its training command and its errors."""

import json

import numpy as np
import pytest
import torch

from audiofast.asr import kernels
from audiofast.asr.drafters.block import BlockConfig, BlockDrafter, BlockDraftWeights
from audiofast.asr.fast_runtime import FastWhisper
from audiofast.asr.features import log_mel_spectrogram, pad_or_trim
from audiofast.asr.options import TranscribeOptions
from audiofast.audio import load_audio
from audiofast.cli import main
from audiofast.distill.asr import Example
from audiofast.distill.asr_block import (
    BlockDraftNet,
    collect_samples,
    export_block_drafter,
    train_block_drafter,
)
from audiofast.training import TrainOptions

pytestmark = pytest.mark.usefixtures("kernel")


@pytest.fixture(scope="module")
def fused_tiny(tiny):
    return FastWhisper(ct2=tiny, precision="int8", threads=2)


def windows(runtime, clips, names, frames=3000):
    mels = [pad_or_trim(log_mel_spectrogram(load_audio(clips[name].audio), runtime.n_mels)
                        [:, :frames], frames) for name in names]
    return runtime.encode_batch(np.stack(mels))


def test_hidden_states_are_what_the_head_reads(fused_tiny, clips):
    """The kernel's hidden rows are the final-norm states its head read: the exact fp32 head
    over them gives the rescored logits; a row's state in a batch is its state alone."""
    engine, tok = fused_tiny.engine, fused_tiny.tokenizer
    encoded = windows(fused_tiny, clips, ["beckett", "two_cities"])
    prompt = tok.sot_sequence("en", "transcribe", timestamps=True)
    fed = [*prompt, tok.timestamp_begin, *tok.encode(" It was the best of times")]
    engine.set_audio(encoded[:1])
    logits = engine(fed, 0, last=4)
    hidden = engine.last_hidden
    assert hidden.shape == (4, engine.d_model)
    exact = engine.backend.tensors()["exact_head"]
    for row, state in zip(logits, hidden, strict=True):  # the best few: rescored for sure
        top = np.argsort(-row)[:4]
        np.testing.assert_allclose(row[top], exact[top] @ state, rtol=1e-4, atol=1e-4)
    one, two = engine.sequence(encoded[:1]), engine.sequence(encoded[1:])
    engine.forward_batch([(two, fed[:5], 0, 0), (one, fed, 0, 4)])
    assert np.array_equal(engine.last_hidden[1], hidden)
    assert engine.last_hidden[0].shape == (5, engine.d_model)


def test_a_hidden_buffer_of_the_wrong_shape_is_refused(fused_tiny):
    backend = fused_tiny.engine.backend
    fused_tiny.engine.set_audio(np.zeros((1, 1500, backend.d_model), np.float32))
    cross = fused_tiny.engine._cross
    with pytest.raises(ValueError, match=r"hidden must be a C-contiguous float32 \(2, 384\)"):
        kernels.decoder_forward(np.array([50257, 50362]), 0, 0, backend.params, backend.k_cache,
                                backend.v_cache, cross[1], cross[2], 16, 51864,
                                hidden=np.empty((1, 384), np.float32))


def small_net(d=64, width=64, vocab=300, seed=0):
    torch.manual_seed(seed)
    config = BlockConfig(d, width, block=4, mlp_blocks=2, special_from=250)
    net = BlockDraftNet(config, torch.randn(vocab, d), torch.arange(0, vocab, 2))
    with torch.no_grad():  # away from the zero init, so every input matters
        net.unknown.normal_()
        for norm in (net.ln_hidden, net.ln_out, *(b["ln"] for b in net.mlp)):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_(std=0.1)
    return net.eval()


def test_numpy_drafter_is_the_torch_network(tmp_path):
    """The exported drafter's numpy forward (fp32) is BlockDraftNet's within float rounding;
    the int8 kernel's stays close."""
    net = small_net()
    folder = export_block_drafter(net, tmp_path / "block")
    hidden, token = torch.randn(64), 7
    prev = torch.tensor([token, -1, 40, 12])
    with torch.no_grad():
        expected = net(hidden[None], torch.tensor([token]), prev[None])[0].numpy()
    embed = net.embed.numpy()
    prev_embed = np.stack([embed[7], net.unknown.detach().numpy(), embed[40], embed[12]])
    for int8, tol in ((False, 1e-4), (True, 0.15)):
        weights = BlockDraftWeights(folder, int8=int8)
        got = weights.logits(weights.context(hidden.numpy(), embed[token]), prev_embed)
        assert got.shape == expected.shape == (4, 150)
        assert np.abs(got - expected).max() <= tol * max(1.0, np.abs(expected).max())
    assert BlockConfig.load(folder) == net.config


def test_drafts_stop_before_special_tokens(tmp_path):
    net = small_net()
    weights = BlockDraftWeights(export_block_drafter(net, tmp_path / "b"), int8=False)
    drafter = BlockDrafter(weights, net.embed.numpy())
    for seed in range(20):
        drafter.observe(np.random.default_rng(seed).normal(size=64).astype(np.float32))
        assert all(t < 250 for t in drafter.propose([1, 2, seed]))
    with pytest.raises(RuntimeError, match="hidden states: decode on the fused decoder"):
        drafter.observe(None)


def test_unconfident_guesses_end_the_draft(tmp_path):
    net = small_net()
    weights = BlockDraftWeights(export_block_drafter(net, tmp_path / "b"), int8=False)
    hidden = [np.random.default_rng(seed).normal(size=64).astype(np.float32)
              for seed in range(20)]
    drafts = {}
    for min_prob in (0.0, 1.0):
        drafter = BlockDrafter(weights, net.embed.numpy(), min_prob=min_prob)
        drafts[min_prob] = []
        for seed, state in enumerate(hidden):
            drafter.observe(state)
            drafts[min_prob].append(drafter.propose([1, 2, seed % 200]))
    assert any(drafts[0.0]) and not any(drafts[1.0])


@pytest.fixture(scope="module")
def memorised_drafter(fused_tiny, clips, tmp_path_factory):
    """A block drafter trained on the target's own transcript of two_cities' first window (so
    it guesses much of it right, and other clips mostly wrong)."""
    tok = fused_tiny.tokenizer
    encoded = windows(fused_tiny, clips, ["two_cities"])
    prompt = tok.sot_sequence("en", "transcribe", timestamps=True)
    plain = fused_tiny.decode(encoded, prompt, TranscribeOptions(language="en"), 0.0)
    example = Example(torch.from_numpy(encoded[0]).half(), prompt, [*plain.tokens, tok.eot], "")
    samples = collect_samples(fused_tiny.engine, [example], 4, tok.eot)
    embed = torch.from_numpy(np.asarray(fused_tiny.engine.embed))
    kept = torch.tensor(sorted(set(range(2000)) | set(plain.tokens) | {tok.eot}))
    to_kept = torch.full((embed.shape[0],), -100, dtype=torch.long)
    to_kept[kept] = torch.arange(len(kept))
    config = BlockConfig(embed.shape[1], 128, 4, 1, tok.eot, tok.timestamp_begin)
    net = BlockDraftNet(config, embed, kept)
    folder = tmp_path_factory.mktemp("block")
    net = train_block_drafter(net, samples, to_kept,
                              TrainOptions(steps=150, lr=3e-3, warmup=10), folder / "ckpt",
                              batch_size=64)
    return export_block_drafter(net, folder / "drafter")


@pytest.mark.parametrize("clip", ["two_cities", "beckett"])
def test_block_drafting_is_lossless(fused_tiny, memorised_drafter, clips, clip):
    """Whatever the block drafter guesses, the transcript is plain greedy's, token for token."""
    fused_tiny.drafter_name = "none"
    plain = fused_tiny.transcribe(clips[clip].audio)
    fused_tiny.drafter_name, fused_tiny.draft_model = "block", memorised_drafter
    before = dict(fused_tiny.stats)
    try:
        drafted = fused_tiny.transcribe(clips[clip].audio)
    finally:
        fused_tiny.drafter_name = "none"
    assert [s.tokens for s in drafted.segments] == [s.tokens for s in plain.segments]
    assert fused_tiny.stats["drafted"] > before["drafted"]
    if clip == "two_cities":  # the drafts it learnt were used
        assert fused_tiny.stats["accepted"] - before["accepted"] > 20


def test_block_drafting_in_a_batch_gives_each_window_plain_greedy(fused_tiny, memorised_drafter,
                                                                  clips):
    names = ["two_cities", "endgame_nagg_nell", "beckett", "clone-test"]
    encoded = windows(fused_tiny, clips, names, frames=1000)
    prompt = fused_tiny.tokenizer.prompt([], "en", "transcribe", timestamps=True)
    options = TranscribeOptions(language="en")
    alone = [fused_tiny.decode(encoded[i : i + 1], prompt, options, 0.0) for i in range(4)]
    fused_tiny.drafter_name, fused_tiny.draft_model = "block", memorised_drafter
    before = dict(fused_tiny.stats)
    try:
        for size in (2, 4):
            together = fused_tiny.decode_batch(encoded[:size], [prompt] * size, options)
            assert [r.tokens for r in together] == [r.tokens for r in alone[:size]]
            assert [r.avg_logprob for r in together] == [r.avg_logprob for r in alone[:size]]
    finally:
        fused_tiny.drafter_name = "none"
    assert fused_tiny.stats["accepted"] > before["accepted"]


def test_block_drafter_errors_name_the_fix(fused_tiny, tmp_path, clips):
    fused_tiny.drafter_name, fused_tiny.draft_model = "block", None
    try:
        with pytest.raises(ValueError, match="--drafter block needs --draft-model DIR"):
            fused_tiny.make_drafter()
        fused_tiny.draft_model = tmp_path
        with pytest.raises(FileNotFoundError, match="holds no block drafter"):
            fused_tiny.make_drafter()
    finally:
        fused_tiny.drafter_name, fused_tiny.draft_model = "none", None
    (tmp_path / "block_drafter.npz").write_bytes(b"not a zip")
    (tmp_path / "block_drafter.json").write_text('{"d_model": 384}')
    with pytest.raises(ValueError, match="not a complete block drafter export"):
        BlockDraftWeights(tmp_path)
    fp32 = FastWhisper(ct2=fused_tiny.ct2, precision="fp32", drafter="block",
                       draft_model=tmp_path)
    with pytest.raises(ValueError, match="needs --precision int8 or int4"):
        fp32.make_drafter()


def test_distill_block_drafter_command_trains_resumes_and_transcribes(tmp_path, clips, capsys):
    args = ["distill", "--stage", "drafter", "--kind", "block", "--model", "whisper-tiny.en",
            "--steps", "2", "--sentences", "6", "--workdir", str(tmp_path / "work"), "--out",
            str(tmp_path / "block"), "--threads", "2"]
    assert main(args) == 0
    config = json.loads((tmp_path / "block" / "block_drafter.json").read_text())
    assert config["block"] == 4 and config["d_model"] == 384
    log = tmp_path / "work" / "whisper-tiny.en-block4-6.ckpt.log.jsonl"
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [0, 1]
    assert main([*args[:8], "3", *args[9:]]) == 0  # more steps: resumed, not restarted
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [0, 1, 2]
    assert "accepted" in log.read_text()
    capsys.readouterr()
    clip = str(clips["beckett"].audio)
    assert main(["transcribe", clip, "--model", "whisper-tiny.en", "--engine", "fast"]) == 0
    plain = capsys.readouterr().out
    assert main(["transcribe", clip, "--model", "whisper-tiny.en", "--engine", "fast",
                 "--drafter", "block", "--draft-model", str(tmp_path / "block")]) == 0
    assert capsys.readouterr().out == plain and "fail" in plain.lower()


def test_kind_is_refused_outside_the_drafter_stage():
    """--kind chooses a drafter; given to another stage it used to be ignored silently (the
    console command prints this SystemExit's one line and exits 2)."""
    from audiofast.cli import main

    for stage in ("vocab", "steps"):
        with pytest.raises(SystemExit, match=f"--kind is for --stage drafter, not {stage}"):
            main(["distill", "--stage", stage, "--kind", "block"])
