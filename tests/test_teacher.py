"""The proving-ground teacher: its pretransform, its training recipe end to end on a toy budget,
the quality metrics, and the committed checkpoint's measured pitch accuracy with and without CFG."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from audiofast.diffusion.checkpoint import build_model
from audiofast.diffusion.config import ConfigError, SA3Config
from audiofast.diffusion.generate import generate, load_for_generation, save_audio
from audiofast.diffusion.quality import (
    CATEGORIES,
    category_of,
    classify,
    pitch_accuracy,
    semitone_error,
    track_pitch,
    train_classifier,
)
from audiofast.diffusion.synth_data import render_tone
from audiofast.diffusion.teacher import (
    CLIP_SECONDS,
    SAMPLE_RATE,
    SynthSet,
    TeacherRecipe,
    TeacherSize,
    teacher_config,
    train_teacher,
)

TEACHER = Path(__file__).resolve().parents[1] / "evals" / "teacher"


def test_teacher_config_is_an_sa3_config_with_a_few_million_dit_parameters() -> None:
    config = SA3Config.from_dict(teacher_config())
    assert config.sample_rate == SAMPLE_RATE and config.audio_channels == 1
    assert config.io_channels == 513 and config.autoencoder.downsampling_ratio == 256
    model = build_model(teacher_config())
    dit_params = sum(p.numel() for p in model.dit.parameters())
    assert 2e6 < dit_params < 10e6
    keys = set(model.state_dict())
    assert {"pretransform.model.mean", "pretransform.model.std",
            "conditioner.conditioners.prompt.padding_embedding",
            "model.model.transformer.layers.0.self_attn.to_qkv.weight"} <= keys


def test_spectrogram_round_trip_keeps_pitch_and_length() -> None:
    model = build_model(teacher_config())
    audio = torch.from_numpy(render_tone("saw", (57,), CLIP_SECONDS, SAMPLE_RATE) * 0.4)
    audio = audio.float()[None, None]
    model.autoencoder.calibrate(audio)
    latents = model.autoencoder.encode(audio)
    assert latents.shape == (1, 513, 128)
    assert latents.mean().abs() < 1e-3  # calibrated: standardized per bin
    back = model.autoencoder.decode(latents)
    assert back.shape == audio.shape
    (f0,) = track_pitch(back[:, 0])
    assert semitone_error(f0, 57) < 0.2


def test_spectrogram_config_errors_name_the_key() -> None:
    config = teacher_config()
    config["model"]["pretransform"]["config"]["latent_dim"] = 512
    with pytest.raises(ConfigError, match="latent_dim 512; a 1024-point STFT has 513 bins"):
        SA3Config.from_dict(config)
    config["model"]["pretransform"]["type"] = "vae"
    with pytest.raises(ConfigError, match="model.pretransform.type"):
        SA3Config.from_dict(config)


def test_pitch_tracker_and_metrics_on_real_synthetic_notes() -> None:
    clips = SynthSet.build(24, seed=11)
    notes = [i for i, m in enumerate(clips.meta) if m["kind"] == "note"]
    midis = [clips.meta[i]["midi"][0] for i in notes]
    f0s = track_pitch(clips.audio[notes])
    assert len(notes) >= 8 and pitch_accuracy(f0s, midis) == 1.0
    shifted = [None if f is None else f * 2 ** (1 / 12) for f in f0s]  # one semitone sharp
    assert pitch_accuracy(shifted, midis) == 0.0
    assert semitone_error(None, 60) == math.inf


def test_category_classifier_learns_the_synthetic_categories() -> None:
    train = SynthSet.build(600, seed=7)
    labels = torch.tensor([CATEGORIES.index(category_of(m)) for m in train.meta])
    classifier = train_classifier(train.audio, labels, steps=150)
    held_out = SynthSet.build(60, seed=8)
    predicted = classify(classifier, held_out.audio)
    truth = [category_of(m) for m in held_out.meta]
    assert np.mean([p == t for p, t in zip(predicted, truth, strict=True)]) >= 0.85


def test_training_recipe_runs_end_to_end_and_resumes(tmp_path: Path) -> None:
    """A toy budget through every stage; the second call finds the export and does nothing."""
    recipe = TeacherRecipe(size=TeacherSize(dit_width=64, dit_depth=1, dit_heads=2),
                           train_clips=16, dit_steps=3, dit_batch=4)
    out = train_teacher(recipe, tmp_path)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert train_teacher(recipe, tmp_path) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    assert json.loads((out / "recipe.json").read_text())["dit_steps"] == 3
    model = load_for_generation(out)  # the MiniLM encoder comes from its PyPI package
    audio = generate(model, ["a loud sine playing a A3 note"], 1.0, steps=2, progress=False)
    assert audio.shape == (1, 1, SAMPLE_RATE)
    wav = save_audio(tmp_path / "x.wav", audio[0], SAMPLE_RATE)
    assert wav.stat().st_size > SAMPLE_RATE


@pytest.mark.skipif(not (TEACHER / "model.safetensors").is_file(), reason="no committed teacher")
def test_committed_teacher_pitch_beats_chance_and_cfg_helps() -> None:
    """The issue's bar: generated notes match their captioned pitch well above chance (one of
    25 pitches), and guidance improves it, which is what CFG folding must keep. Measured on
    these 24 captions (8-step pingpong, seed 0): 0.21 at cfg 1, 0.54 at cfg 5."""
    model = load_for_generation(TEACHER)
    captions = SynthSet.build(60, seed=4242)
    notes = [i for i, m in enumerate(captions.meta) if m["kind"] == "note"][:24]
    prompts = [captions.captions[i] for i in notes]
    midis = [captions.meta[i]["midi"][0] for i in notes]
    accuracy = {}
    for cfg in (1.0, 5.0):
        audio = generate(model, prompts, CLIP_SECONDS, steps=8, cfg_scale=cfg,
                         sampler="pingpong", seed=0, progress=False)
        accuracy[cfg] = pitch_accuracy(track_pitch(audio[:, 0]), midis)
    assert accuracy[1.0] >= 0.1, accuracy  # chance is 0.04
    assert accuracy[5.0] >= 0.4, accuracy
    assert accuracy[5.0] >= accuracy[1.0] + 0.15, accuracy


def test_recipe_fields_are_plain_numbers() -> None:
    """scripts/train_teacher.py exposes every int/float field as a flag."""
    fields = {f.name: f.type for f in dataclasses.fields(TeacherRecipe)}
    assert fields.pop("size") == "TeacherSize"
    assert set(fields.values()) <= {"int", "float"}
