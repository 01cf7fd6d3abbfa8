"""SA3 model modules: upstream key layout, shapes, init structure, checkpoint loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from audiofast.diffusion import (
    CheckpointError,
    ConfigError,
    SA3Config,
    build_model,
    load_checkpoint,
)
from audiofast.diffusion.config import DEFAULT_SAMPLING_SHIFT
from audiofast.diffusion.synthetic import randomize_, tiny_config, write_synthetic_checkpoint

DATA = Path(__file__).parent / "data" / "sa3"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: threads only add overhead


# -- layout -------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["small", "medium"])
def test_state_dict_matches_upstream_manifest(variant: str) -> None:
    """Built from the same config, our modules have exactly upstream's keys and shapes."""
    manifest = json.loads((DATA / f"{variant}_manifest.json").read_text())
    expected = {k: v for k, v in manifest.items() if not k.startswith("_")}
    config = SA3Config.from_file(DATA / manifest["_config"])
    model = build_model(config, device="meta")
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert sorted(set(expected) - set(ours)) == []
    assert sorted(set(ours) - set(expected)) == []
    assert {k: v for k, v in ours.items() if v != expected[k]} == {}


def test_real_configs_describe_sa3() -> None:
    small = SA3Config.from_file(DATA / "small_model_config.json")
    medium = SA3Config.from_file(DATA / "medium_model_config.json")
    assert (small.dit.embed_dim, small.dit.depth, small.dit.num_heads) == (1024, 20, 16)
    assert (medium.dit.embed_dim, medium.dit.depth, medium.dit.num_heads) == (1536, 24, 24)
    assert not small.dit.differential and medium.dit.differential
    for cfg in (small, medium):
        assert cfg.sample_rate == 44100 and cfg.audio_channels == 2 and cfg.io_channels == 256
        assert cfg.autoencoder.downsampling_ratio == 4096
        assert cfg.diffusion.default_sampler == "pingpong"
        assert cfg.diffusion.sampling_shift == DEFAULT_SAMPLING_SHIFT  # none configured
    assert small.autoencoder.encoder.sliding_window is None  # SAME-S: chunks of 34 tokens
    assert medium.autoencoder.encoder.sliding_window == (1, 1)  # SAME-L: sliding window


# -- config errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda c: c["model"]["diffusion"]["config"].update(norm_type="layer_norm"),
            "unsupported SA3 config: model.diffusion.config.norm_type='layer_norm' "
            "(supported: ['rms_norm'])",
        ),
        (
            lambda c: c["model"].pop("pretransform"),
            "malformed SA3 config: config.model.pretransform is missing or not an object",
        ),
        (
            lambda c: c["model"]["conditioning"]["configs"][0].update(type="clap"),
            "unsupported SA3 config: model.conditioning.configs[0].type='clap' "
            "(supported: ['t5gemma', 'minilm', 'number'])",
        ),
        (
            lambda c: c["model"]["diffusion"]["config"].update(embed_dim=65),
            "malformed SA3 config: model.diffusion.config has embed_dim not divisible by num_heads",
        ),
    ],
)
def test_malformed_config_is_one_clear_line(edit, message: str) -> None:
    config = tiny_config()
    edit(config)
    with pytest.raises(ConfigError) as err:
        SA3Config.from_dict(config)
    assert str(err.value) == message


# -- forward shapes and init structure ------------------------------------------------------------


@pytest.mark.parametrize("differential", [False, True])
def test_dit_forward_shapes(differential: bool) -> None:
    torch.manual_seed(0)
    model = build_model(tiny_config(differential=differential)).eval()
    randomize_(model)
    x, t = torch.randn(2, 8, 12), torch.tensor([0.25, 1.0])
    cross, glob = torch.randn(2, 9, 768), torch.randn(2, 768)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 9:] = False
    with torch.no_grad():
        v = model.dit(x, t, cross, glob)
        v_zero_local = model.dit(x, t, cross, glob, torch.zeros(2, 9, 12))
        v_masked = model.dit(x, t, cross, glob, padding_mask=mask)
    assert v.shape == x.shape and torch.isfinite(v).all()
    torch.testing.assert_close(v, v_zero_local, rtol=0, atol=0)  # None means zeros, like upstream
    torch.testing.assert_close(v_masked[0], v[0])  # item 0 is unpadded
    assert not torch.allclose(v_masked[1], v[1])


def test_dit_at_init_is_the_residual_path_only() -> None:
    """Zero-initialized branch outputs and 1x1 convs: a fresh DiT is project_out @ project_in."""
    torch.manual_seed(0)
    dit = build_model(tiny_config(differential=True)).dit.eval()
    x = torch.randn(2, 8, 10)
    with torch.no_grad():
        v = dit(x, torch.tensor([0.5, 0.1]), torch.randn(2, 9, 768), torch.randn(2, 768))
        tr = dit.transformer
        linear = tr.project_out.weight @ tr.project_in.weight
    torch.testing.assert_close(v, torch.einsum("oc,bct->bot", linear, x))
    assert not dit.preprocess_conv.weight.any() and not dit.postprocess_conv.weight.any()


@pytest.mark.parametrize("sliding_window", [False, True])
def test_autoencoder_round_trip_shapes(sliding_window: bool) -> None:
    torch.manual_seed(0)
    ae = build_model(tiny_config(sliding_window=sliding_window)).autoencoder.eval()
    randomize_(ae)
    audio = torch.randn(2, 2, 16 * 8) * 0.3  # 8 latents of 16 samples
    with torch.no_grad():
        latents = ae.encode(audio)
        decoded = ae.decode(latents)
    assert latents.shape == (2, 8, 8)
    assert decoded.shape == audio.shape and torch.isfinite(decoded).all()


def test_chunked_encoder_is_local() -> None:
    """SAME-S style attention: a latent depends on its own chunk and half of each neighbour."""
    torch.manual_seed(0)
    ae = build_model(tiny_config()).autoencoder.eval()
    randomize_(ae)
    audio = torch.randn(1, 2, 16 * 16)  # 16 latents, chunks of 2 latents
    changed = audio.clone()
    changed[..., -16:] += 1.0  # perturb the last latent's samples only
    with torch.no_grad():
        diff = (ae.encode(changed) - ae.encode(audio)).abs().amax(dim=1)[0]
    assert (diff[:12] == 0).all() and diff[-1] > 0


def test_conditioners_with_tiny_t5gemma() -> None:
    from transformers import T5GemmaConfig, T5GemmaEncoderModel

    class CharTokenizer:
        def __call__(self, texts, truncation, max_length, padding, return_tensors):
            ids = torch.zeros(len(texts), max_length, dtype=torch.long)
            for i, text in enumerate(texts):
                codes = [2 + ord(ch) % 60 for ch in text][:max_length]
                ids[i, : len(codes)] = torch.tensor(codes)
            return {"input_ids": ids, "attention_mask": (ids != 0).long()}

    enc = dict(
        vocab_size=64,
        hidden_size=768,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=16,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    encoder = T5GemmaEncoderModel(
        T5GemmaConfig(encoder=enc, decoder=enc, vocab_size=64, is_encoder_decoder=False)
    )
    model = build_model(tiny_config()).eval()
    prompt = model.conditioners["prompt"]
    prompt.set_encoder(encoder, CharTokenizer())
    assert not any(
        k.startswith("conditioner.conditioners.prompt.") and "padding" not in k
        for k in model.state_dict()
    )  # the text encoder stays out of the checkpoint
    with torch.no_grad():
        tokens, mask = prompt(["drums", "a long piano prompt"])
        cond = model.condition({"prompt": ["drums"], "seconds_total": [400.0]})
        at_max, _ = model.conditioners["seconds_total"]([384.0])
    assert tokens.shape == (2, 8, 768) and mask.tolist()[0] == [True] * 5 + [False] * 3
    torch.testing.assert_close(tokens[0, 5:], prompt.padding_embedding.expand(3, -1))
    assert cond.cross_attn_cond.shape == (1, 9, 768) and cond.global_cond.shape == (1, 768)
    torch.testing.assert_close(cond.cross_attn_cond[:, 8], cond.global_cond)
    torch.testing.assert_close(cond.global_cond, at_max[:, 0])  # 400 s clamps to max_val 384


# -- checkpoints --------------------------------------------------------------------------------


def test_synthetic_checkpoint_round_trip(tmp_path: Path) -> None:
    directory = write_synthetic_checkpoint(tmp_path / "ckpt", tiny_config(differential=True))
    model = load_checkpoint(directory)
    from safetensors.torch import load_file

    stored = load_file(directory / "model.safetensors")
    assert model.load_report.ok and model.load_report.loaded == len(stored)
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in stored.items())
    assert not model.training and not any(p.requires_grad for p in model.parameters())


def test_load_report_lists_missing_unexpected_and_mismatched(tmp_path: Path, caplog) -> None:
    key = "model.model.transformer.layers.0.self_attn.to_qkv.weight"
    directory = write_synthetic_checkpoint(
        tmp_path / "ckpt",
        drop=("model.model.transformer.memory_tokens",),
        reshape={key: (3, 3), "model.model.extra.weight": (2,)},
    )
    model = load_checkpoint(directory)
    report = model.load_report
    assert report.missing == ["model.model.transformer.memory_tokens"]
    assert report.unexpected == ["model.model.extra.weight"]
    assert report.mismatched == [(key, (3, 3), (192, 64))]
    assert model.state_dict()[key].abs().sum() > 0  # skipped, not overwritten with zeros
    printed = caplog.text  # a warning through logging (the library never prints)
    assert "1 missing, 1 unexpected, 1 shape mismatches" in printed
    assert f"shape mismatch: {key}: file [3, 3] vs model [192, 64]" in printed


def test_missing_and_corrupt_files_fail_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="directory not found"):
        load_checkpoint(tmp_path / "nope")
    directory = write_synthetic_checkpoint(tmp_path / "ckpt")
    (directory / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(directory)
    assert str(err.value).startswith("SA3 weights unreadable:") and "\n" not in str(err.value)
    (directory / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="SA3 weights not found"):
        load_checkpoint(directory)
    (directory / "model_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON") as err:
        load_checkpoint(directory)
    assert "\n" not in str(err.value)
