"""Quantization-aware distillation (QAD) of the Whisper decoder to int4 weights.

Post-training int4 (int4_pack.py: searched group scales) rounds every weight to a 16-level
grid; QAD then trains the float weights *through* that rounding (straight-through estimator)
to match the full-precision decoder's next-token distributions on its own transcripts of
domain audio (no labels), so the rounded decoder recovers what rounding cost. The grid - each
group's scale - is fixed at PTQ's choice for the whole run: what is trained is exactly what
the packer rounds to. The export writes the weights snapped onto their grid, so packing them
again (which searches the scales anew) finds the same grid (:func:`grid_reproduced` checks).

``audiofast distill --stage qad --lane asr --bits 4`` runs :func:`distill_qad`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import nn
from torch.nn.utils import parametrize

from audiofast.asr.ct2_runtime import CT2Whisper
from audiofast.asr.engine import MODEL_SETTINGS, weight_bits
from audiofast.asr.int4_pack import GROUP, dequantize_int4, fake_quantize, quantize_int4
from audiofast.asr.vocab_diet import kd_loss
from audiofast.atomic import staged_directory
from audiofast.distill.asr import (
    CORPORA,
    Example,
    _batch,
    build_examples,
    decoder_hidden,
    examples_cache,
    model_name,
    split_corpus,
)
from audiofast.distill.gptq import gptq_decoder
from audiofast.eval.datasets import domain_corpus
from audiofast.models.ct2_to_hf import whisper_from_ct2
from audiofast.training import TrainOptions, train

# The decoder linears the fused decoder runs in int4 (fused_decoder.pack_decoder: all but the
# cross-attention K/V projection, which runs once per window, and the output head).
INT4_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
                "encoder_attn.q_proj", "encoder_attn.out_proj", "fc1", "fc2")


class Int4Grid(nn.Module):
    """A weight's int4 grid, fixed (PTQ's searched scales); the forward pass rounds onto it
    and gradients pass straight through."""

    def __init__(self, weight: torch.Tensor, group: int = GROUP):
        super().__init__()
        _, scale = quantize_int4(weight, group)
        self.register_buffer("scale", scale.float())  # (out, in / group)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return fake_quantize(weight, self.scale)


def int4_linears(model) -> list[nn.Linear]:
    """The decoder linears that run in int4, layer by layer."""
    return [layer.get_submodule(name) for layer in model.model.decoder.layers
            for name in INT4_LINEARS]


def attach_grids(model, group: int = GROUP) -> None:
    for linear in int4_linears(model):
        parametrize.register_parametrization(linear, "weight", Int4Grid(linear.weight, group))


def snap_to_grids(model) -> None:
    """Replace each trained weight by its rounded value (and drop the grids)."""
    for linear in int4_linears(model):
        parametrize.remove_parametrizations(linear, "weight", leave_parametrized=True)


def grid_reproduced(model, group: int = GROUP) -> float:
    """The fraction of int4 weights that packing (a fresh scale search) rounds to exactly
    the value the model holds: 1.0 when the export's grid survives a reload."""
    same = total = 0
    for linear in int4_linears(model):
        weight = linear.weight.detach()
        same += int((dequantize_int4(*quantize_int4(weight, group)) == weight).sum())
        total += weight.numel()
    return same / total


def calibration_batches(examples: list[Example], batch_size: int
                        ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Every example once, in batches: encoder states, decoder inputs and the mask of the
    positions fed (prompt and target, not padding): GPTQ's calibration inputs."""
    batches = []
    for first in range(0, len(examples), batch_size):
        index = torch.arange(first, min(first + batch_size, len(examples)))
        encoded, inputs, _ = _batch(examples, index, list)
        fed = torch.zeros_like(inputs, dtype=torch.bool)
        for row, i in enumerate(index.tolist()):
            fed[row, : len(examples[i].prompt) + len(examples[i].target) - 1] = True
        batches.append((encoded, inputs, fed))
    return batches


def train_qad(teacher, student, examples: list[Example], opts: TrainOptions,
              checkpoint: str | Path, batch_size: int = 4, temperature: float = 1.0,
              alpha: float = 1.0, prompt_kl: bool = True):
    """KL to the teacher's logits (``alpha`` < 1 adds cross-entropy on its tokens) through
    the rounded weights; only the decoder's int4 linears train."""
    teacher.eval().requires_grad_(False)
    student.requires_grad_(False)
    params = []
    for linear in int4_linears(student):
        linear.parametrizations.weight.original.requires_grad_(True)
        params.append(linear.parametrizations.weight.original)

    def step(_: int, generator: torch.Generator):
        index = torch.randperm(len(examples), generator=generator)[:batch_size]
        encoded, inputs, labels = _batch(examples, index, list)
        with torch.no_grad():
            teacher_logits = teacher.proj_out(decoder_hidden(teacher, encoded, inputs))
        logits = student.proj_out(decoder_hidden(student, encoded, inputs))
        # KL at every fed position, the prompt's included: the logits after start-of-
        # transcript give Whisper's no-speech probability, which decides whether a window is
        # silence (trained on the targets alone, the student emptied a noisy window).
        fed = torch.zeros_like(labels, dtype=torch.bool)
        for row, i in enumerate(index.tolist()):
            fed[row, : len(examples[i].prompt) + len(examples[i].target) - 1] = True
        if prompt_kl:  # the prompt's positions predict its next token
            labels = torch.where(fed & (labels == -100), inputs.roll(-1, 1), labels)
        loss = kd_loss(logits, teacher_logits, labels, temperature, alpha)
        mask = labels != -100  # agreement over what the loss saw
        agree = (logits[mask].argmax(-1) == teacher_logits[mask].argmax(-1)).float().mean()
        return loss, {"agree": round(agree.item(), 4)}

    return train(student, step, opts, checkpoint, desc="int4 QAD", params=params).eval()


@dataclass(frozen=True)
class QadRecipe:
    precision: str = "int4-head8"  # int4 layers; the head int8 (or int4: then PTQ only)
    group: int = GROUP
    train_sentences: int = 1200  # 400 (101 clips) overfit: held-out agreement fell (int4.md)
    steps: int = 300
    batch_size: int = 4
    lr: float = 1e-5
    temperature: float = 1.0
    alpha: float = 1.0  # KL to the full-precision decoder only
    prompt_kl: bool = True  # KL on the prompt's positions too (the no-speech probability)
    corpus: str = "flite"  # or "varied" (asr.CORPORA)
    rounding: str = "nearest"  # or "gptq": rounded with GPTQ before training (gptq.py)


def distill_qad(model: str, recipe: QadRecipe, workdir: str | Path,
                out: str | Path | None = None, threads: int = 0) -> Path:
    """QAD ``model``'s decoder to ``recipe.precision`` and export it (``--model DIR``); the
    spoken examples and the checkpoint in ``workdir`` make a killed run resume."""
    if (weight_bits(recipe.precision) or (8,))[0] != 4:
        raise ValueError(f"QAD trains int4 layers: precision int4 or int4-head8 (-kv8), not "
                         f"{recipe.precision!r}")
    if recipe.group != GROUP:
        raise ValueError(f"the packer rounds in groups of {GROUP}; QAD must train on the same")
    if recipe.rounding not in ("nearest", "gptq"):
        raise ValueError(f"rounding is nearest or gptq, not {recipe.rounding!r}")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    teacher_rt = CT2Whisper(model, threads=threads, encoder="ct2")
    if threads:
        torch.set_num_threads(threads)
    sentences, _ = split_corpus(domain_corpus())
    voices, augmentations = CORPORA[recipe.corpus]
    examples = build_examples(teacher_rt, sentences[: recipe.train_sentences],
                              cache=examples_cache(workdir, teacher_rt, recipe.train_sentences,
                                                   recipe.corpus),
                              voices=voices, augmentations=augmentations)
    teacher, _ = whisper_from_ct2(teacher_rt.resolved.ct2_dir)
    student = copy.deepcopy(teacher)
    if recipe.rounding == "gptq":
        gptq_decoder(student, INT4_LINEARS, calibration_batches(examples, recipe.batch_size),
                     recipe.group)
    attach_grids(student, recipe.group)
    name = f"{model_name(teacher_rt)}-qad-{recipe.precision}"
    # The checkpoint is the recipe's, less its step count: asking for more steps resumes,
    # another learning rate or corpus starts afresh instead of continuing a different run.
    fields = asdict(replace(recipe, steps=0))
    for key, default in (("corpus", "flite"), ("rounding", "nearest")):
        if fields[key] == default:  # a default keeps the key runs had before it existed
            del fields[key]
    run = hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:8]
    if recipe.steps:
        opts = TrainOptions(steps=recipe.steps, lr=recipe.lr, weight_decay=0.0,
                            warmup=max(1, recipe.steps // 10), checkpoint_every=10)
        student = train_qad(teacher, student, examples, opts, workdir / f"{name}-{run}.ckpt",
                            recipe.batch_size, recipe.temperature, recipe.alpha,
                            recipe.prompt_kl)
    snap_to_grids(student)
    return export_qad(student, teacher_rt.resolved.ct2_dir, Path(out or workdir / name),
                      {"precision": recipe.precision, "teacher": model,
                       "grid_reproduced": grid_reproduced(student, recipe.group),
                       "recipe": asdict(recipe)})


def export_qad(student, source_dir: Path, out_dir: Path, settings: dict) -> Path:
    """A CTranslate2 folder (float32 weights: the snapped values exactly) with the source's
    tokenizer and config, and ``audiofast.json`` naming its decoder precision; atomic."""
    from audiofast.asr.vocab_diet_export import whisper_spec

    if (source_dir / "vocabulary.json").is_file():
        tokens = json.loads((source_dir / "vocabulary.json").read_text(encoding="utf-8"))
    else:
        tokens = (source_dir / "vocabulary.txt").read_text(encoding="utf-8").splitlines()
    with staged_directory(out_dir) as staging:
        whisper_spec(student, tokens, "float32").save(str(staging))
        for file in ("tokenizer.json", "config.json"):
            if (source_dir / file).is_file():
                shutil.copy(source_dir / file, staging / file)
        (staging / MODEL_SETTINGS).write_text(json.dumps(settings, indent=2))
    return out_dir
