"""The draft-decoder drafter: lossless verification on real audio, and its training command."""

import json

import pytest
import torch

from audiofast.asr.drafters.model import ModelDrafter, draft_from_target
from audiofast.asr.fast_runtime import FastWhisper
from audiofast.cli import main
from audiofast.models.ct2_to_hf import whisper_from_ct2


@pytest.fixture(scope="module")
def tiny_fp32():
    return FastWhisper("whisper-tiny.en", threads=2, precision="fp32")


def test_draft_is_the_targets_first_and_last_layer(tiny):
    target, _ = whisper_from_ct2(tiny.resolved.ct2_dir)
    draft = draft_from_target(target, (0, -1))
    assert draft.config.decoder_layers == 2 and draft.config.encoder_layers == 0
    last = target.model.decoder.layers[-1].fc2.weight
    assert torch.equal(draft.model.decoder.layers[1].fc2.weight, last)
    assert draft.proj_out.weight is draft.model.decoder.embed_tokens.weight


@pytest.mark.parametrize("clip", ["two_cities", "beckett"])
def test_model_drafting_is_lossless(tiny_fp32, tiny, clips, clip, tmp_path_factory):
    """Whatever the draft proposes, greedy verification keeps exactly the plain transcript."""
    folder = tmp_path_factory.getbasetemp() / "draft"
    if not folder.exists():
        draft_from_target(whisper_from_ct2(tiny.resolved.ct2_dir)[0]).save_pretrained(folder)
    tiny_fp32.drafter_name = "none"
    plain = tiny_fp32.transcribe(clips[clip].audio)
    tiny_fp32.drafter_name, tiny_fp32.draft_model = "model", folder
    before = dict(tiny_fp32.stats)
    drafted = tiny_fp32.transcribe(clips[clip].audio)
    assert [s.tokens for s in drafted.segments] == [s.tokens for s in plain.segments]
    assert tiny_fp32.stats["accepted"] > before["accepted"]  # drafts were used
    assert tiny_fp32.stats["engine_calls"] - before["engine_calls"] < drafted.stats["tokens"]


def test_drafter_cache_refeeds_only_what_changed(tiny):
    """A drafter that reuses its cache (feeding only the tokens new since its last call)
    drafts exactly what a fresh drafter feeding the whole context drafts."""
    draft = draft_from_target(whisper_from_ct2(tiny.resolved.ct2_dir)[0])
    encoded = torch.randn(1500, draft.config.d_model).numpy()
    cached, fresh = (ModelDrafter(draft, "fp32", special_from=tiny.tokenizer.eot)
                     for _ in range(2))
    cached.set_audio(encoded)
    context = [tiny.tokenizer.sot, tiny.tokenizer.timestamp_begin, 440, 2068]
    first = cached.propose(context)
    assert cached.fed[: len(context)] == context
    longer = [*context, *(first[:1] or [262]), 50]
    fresh.set_audio(encoded)
    assert cached.propose(longer) == fresh.propose(longer)


def test_distill_drafter_command_trains_saves_and_resumes(tmp_path, capsys):
    args = ["distill", "--stage", "drafter", "--model", "whisper-tiny.en", "--steps", "2",
            "--sentences", "6", "--workdir", str(tmp_path / "work"), "--out",
            str(tmp_path / "draft"), "--threads", "2"]
    assert main(args) == 0
    assert (tmp_path / "draft" / "config.json").is_file()
    head_ids = json.loads((tmp_path / "draft" / "head_ids.json").read_text())
    assert len(head_ids) == 8000 and 50257 in head_ids and 50363 in head_ids
    log = tmp_path / "work" / "whisper-tiny.en-drafter2.ckpt.log.jsonl"
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert steps == [0, 1]
    # Asking for more steps resumes from the checkpoint instead of starting over.
    assert main([*args[:6], "3", *args[7:]]) == 0
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert steps == [0, 1, 2]
    assert "agree" in log.read_text()
