"""Distillation data and stages for the ASR lane: the full model teaches smaller parts.

Data: domain sentences (``domain_corpus``) spoken by the flite voices, several sentences to a
clip so a window holds ~25 s of speech, encoded once by the int8 CTranslate2 encoder (the
encoder every engine here runs), and transcribed by the full model with greedy decoding:
the teacher's own tokens (timestamps included) are the targets, so no labels are needed.

Stages (``audiofast distill --stage ...``):

- ``vocab``: recover a vocab-diet model (:mod:`audiofast.asr.vocab_diet`): targets re-spelled
  with kept tokens, loss = cross-entropy + KL to the teacher's logits over the kept ids.
- ``drafter``: train a small draft decoder (:mod:`audiofast.asr.drafters.model`) on the
  teacher's logits.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from audiofast.asr.ct2_runtime import CT2Whisper
from audiofast.asr.drafters.model import draft_from_target, save_head_ids
from audiofast.asr.features import N_FRAMES, log_mel_spectrogram, pad_or_trim
from audiofast.asr.options import TranscribeOptions
from audiofast.asr.vocab_diet import (
    DietVocab,
    kd_loss,
    select_tokens,
    slice_vocab,
    whisper_always_kept,
)
from audiofast.asr.vocab_diet_export import export_diet_whisper
from audiofast.atomic import staged_directory
from audiofast.audio import SAMPLE_RATE, load_audio
from audiofast.eval.augment import apply as augment
from audiofast.eval.datasets import domain_corpus
from audiofast.eval.tts import synthesize
from audiofast.models.ct2_to_hf import whisper_from_ct2
from audiofast.training import TrainOptions, save_atomic, train

VOICES = ("flite:slt", "flite:kal", "flite:awb", "flite:rms")
# The "varied" corpus: every synthesizer here at several rates and pitches, every other clip
# through one of the judge's augmentations, so that recovery learns the vocabulary rather than
# four flite voices (80 steps on those over-fitted: real clips 2.8 -> 5.6 % at 32k).
VARIED_VOICES = ("flite:slt", "espeak-ng:en-us", "piper:joe", "flite:kal@rate=0.9",
                 "espeak-ng:en-gb@rate=1.15,pitch=35", "piper:joe@rate=0.85", "flite:awb",
                 "espeak-ng:en-us@rate=0.85,pitch=70", "piper:joe@rate=1.15",
                 "flite:rms@rate=1.1")
VARIED_AUGMENTATIONS = (None, "noise:20", None, "reverb:0.3", None, "noise:10", None,
                        "telephone", None, "reverb:0.6", None, "lowpass:3000")
CORPORA = {"flite": (VOICES, (None,)), "varied": (VARIED_VOICES, VARIED_AUGMENTATIONS)}
CLIP_SECONDS = 25.0
GAP_SECONDS = 0.4


@dataclass
class Example:
    encoded: torch.Tensor  # (frames, d_model) encoder output of one 30 s window, fp16
    prompt: list[int]  # start-of-transcript sequence
    target: list[int]  # the teacher's greedy tokens, end-of-text last
    text: str  # what was spoken


def split_corpus(sentences: list[str], every: int = 20) -> tuple[list[str], list[str]]:
    """(train, held-out): every ``every``-th sentence is held out, the same on every run."""
    held = [s for i, s in enumerate(sentences) if i % every == 0]
    return [s for i, s in enumerate(sentences) if i % every], held


def group_sentences(sentences: list[str], words_per_second: float = 2.6) -> list[list[str]]:
    """Consecutive sentences packed into clips of about ``CLIP_SECONDS`` of speech."""
    groups, current, seconds = [], [], 0.0
    for sentence in sentences:
        estimate = len(sentence.split()) / words_per_second + GAP_SECONDS
        if current and seconds + estimate > CLIP_SECONDS:
            groups.append(current)
            current, seconds = [], 0.0
        current.append(sentence)
        seconds += estimate
    return groups + [current] if current else groups


def speak(sentences: list[str], voice: str) -> np.ndarray:
    """The sentences read by ``voice`` with short pauses, 16 kHz, cut to 30 s."""
    gap = np.zeros(round(GAP_SECONDS * SAMPLE_RATE), dtype=np.float32)
    parts = [part for s in sentences for part in (load_audio(synthesize(s, voice)), gap)]
    return np.concatenate(parts)[: 30 * SAMPLE_RATE]


def examples_cache(workdir: Path, teacher: CT2Whisper, sentences: int,
                   corpus: str = "flite") -> Path:
    """Where the spoken examples of ``sentences`` training sentences are kept."""
    suffix = "" if corpus == "flite" else f"-{corpus}"
    return workdir / f"examples-{model_name(teacher)}-{sentences}{suffix}.pt"


def build_examples(teacher: CT2Whisper, sentences: list[str], cache: str | Path | None = None,
                   voices: tuple[str, ...] = VOICES,
                   augmentations: tuple[str | None, ...] = (None,)) -> list[Example]:
    """Spoken, encoded and teacher-transcribed clips (cached in ``cache`` once built); clip
    ``i`` is read by ``voices[i]`` and goes through ``augmentations[i]`` (both cycled)."""
    if cache is not None and Path(cache).is_file():
        return [Example(**e) for e in torch.load(cache, weights_only=False)["examples"]]
    tok = teacher.tokenizer
    prompt = tok.sot_sequence("en", "transcribe", timestamps=True)
    options = TranscribeOptions(language="en", window_pad=None)  # the teacher's own 30 s windows
    examples = []
    groups = group_sentences(sentences)
    for i, group in enumerate(tqdm(groups, desc="teacher transcripts")):
        audio = augment(speak(group, voices[i % len(voices)]),
                        augmentations[i % len(augmentations)], seed=i)
        mel = pad_or_trim(log_mel_spectrogram(audio, teacher.n_mels), N_FRAMES)
        encoded = teacher.encode(mel)
        result = teacher.decode(encoded, prompt, options, temperature=0.0)
        examples.append(Example(
            torch.from_numpy(np.array(encoded))[0].half(), prompt,
            [*result.tokens, tok.eot], " ".join(group),
        ))
    if cache is not None:
        save_atomic({"examples": [vars(e) for e in examples]}, cache)
    return examples


def _batch(examples: list[Example], index: torch.Tensor, to_ids) -> tuple[torch.Tensor, ...]:
    """Encoder states, decoder inputs and labels (-100 on prompt and padding) of a batch."""
    rows = [examples[int(i)] for i in index]
    seqs = [(to_ids(e.prompt), to_ids(e.target)) for e in rows]
    length = max(len(p) + len(t) - 1 for p, t in seqs)
    inputs = torch.zeros(len(rows), length, dtype=torch.long)
    labels = torch.full((len(rows), length), -100, dtype=torch.long)
    for r, (p, t) in enumerate(seqs):
        ids = p + t[:-1]
        inputs[r, : len(ids)] = torch.tensor(ids)
        labels[r, len(p) - 1 : len(p) - 1 + len(t)] = torch.tensor(t)
    encoded = torch.stack([e.encoded for e in rows]).float()
    return encoded, inputs, labels


def teacher_knows(examples: list[Example], index: torch.Tensor, vocab: DietVocab,
                  shape: torch.Size) -> torch.Tensor:
    """For a :func:`_batch` of ``vocab.encode``-d examples: True at the label positions of
    tokens the diet kept, False at the pieces of re-spelled ones (see kd_loss)."""
    knows = torch.zeros(shape, dtype=torch.bool)
    for r, i in enumerate(index):
        example = examples[int(i)]
        at = len(vocab.encode(example.prompt)) - 1
        flags = []
        for token in example.target:
            pieces = vocab.split(token)
            flags += [pieces == [token]] * len(pieces)
        knows[r, at:at + len(flags)] = torch.tensor(flags)
    return knows


def decoder_hidden(model, encoded: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """Final hidden states of a Hugging Face Whisper decoder (before the output head)."""
    return model.model.decoder(input_ids=inputs, encoder_hidden_states=encoded).last_hidden_state


def recover_vocab(teacher, student, vocab: DietVocab, examples: list[Example],
                  opts: TrainOptions, checkpoint: str | Path, batch_size: int = 4,
                  kd_kept_only: bool = False):
    """Teach the diet model to spell with kept tokens what the teacher said with any token
    (``kd_kept_only``: the KL term only where the teacher's own token was kept)."""
    teacher.eval().requires_grad_(False)
    kept_head = teacher.proj_out.weight.detach()[torch.from_numpy(vocab.kept_ids)]
    student.model.encoder.requires_grad_(False)
    student.model.decoder.embed_positions.requires_grad_(False)

    def step(_: int, generator: torch.Generator):
        index = torch.randperm(len(examples), generator=generator)[:batch_size]
        encoded, inputs, labels = _batch(examples, index, vocab.encode)
        with torch.no_grad():
            teacher_logits = decoder_hidden(teacher, encoded, inputs) @ kept_head.T
        to_diet = torch.from_numpy(vocab.to_diet)
        diet_inputs = to_diet[inputs]
        diet_labels = torch.where(labels >= 0, to_diet[labels.clamp(min=0)], -100)
        logits = student.proj_out(decoder_hidden(student, encoded, diet_inputs))
        knows = teacher_knows(examples, index, vocab, labels.shape) if kd_kept_only else None
        loss = kd_loss(logits, teacher_logits, diet_labels, teacher_knows=knows)
        return loss, {}

    student = train(student, step, opts, checkpoint, desc="vocab recovery",
                    params=list(student.model.decoder.parameters()))
    return student.eval()


def domain_tokens(runtime: CT2Whisper, sentences: list[str], keep: int,
                  full_size: int) -> list[int]:
    """The ``keep`` ids a Whisper diet keeps for ``sentences``: specials, timestamps, byte
    tokens, then the most frequent (for the diet model and for a drafter's cut head)."""
    always = whisper_always_kept(runtime.resolved.ct2_dir / "tokenizer.json",
                                 runtime.tokenizer.eot, full_size)
    return select_tokens(sentences, runtime.tokenizer.encode, keep, full_size, always,
                         token_text=lambda i: runtime.tokenizer.decode([i]))


def model_name(runtime: CT2Whisper) -> str:
    """A file-name-safe name for the model (packaged models live in folders named 'model')."""
    resolved = runtime.resolved
    name = resolved.spec if resolved.kind == "packaged" else resolved.ct2_dir.name
    return name.replace("/", "_")


@dataclass(frozen=True)
class VocabDietRecipe:
    keep: int = 8000
    train_sentences: int = 400  # domain sentences spoken for recovery (~60 clips of ~25 s)
    corpus: str = "flite"  # or "varied" (CORPORA)
    kd_kept_only: bool = False  # KL to the teacher only at tokens the diet kept (kd_loss)
    steps: int = 60
    batch_size: int = 4
    lr: float = 2e-5


def distill_vocab(model: str, recipe: VocabDietRecipe, workdir: str | Path,
                  out: str | Path | None = None, threads: int = 0) -> Path:
    """Select, slice, recover and export a vocab-diet model; every stage resumes from
    ``workdir`` (the spoken examples and the recovery checkpoint are kept there)."""

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    teacher_rt = CT2Whisper(model, threads=threads, encoder="ct2")
    if threads:
        torch.set_num_threads(threads)
    tok, source = teacher_rt.tokenizer, teacher_rt.resolved.ct2_dir
    sentences, _ = split_corpus(domain_corpus())
    teacher, _ = whisper_from_ct2(source)
    full_size = teacher.config.vocab_size
    vocab = DietVocab(domain_tokens(teacher_rt, sentences, recipe.keep, full_size), full_size)
    vocab.attach_tokenizer(source / "tokenizer.json")
    name = f"{model_name(teacher_rt)}-diet{recipe.keep}"
    if recipe.corpus != "flite":
        name += f"-{recipe.corpus}"
    if recipe.kd_kept_only:
        name += "-keptkd"
    student = slice_vocab(copy.deepcopy(teacher), vocab)
    if recipe.steps:  # spoken examples only for recovery: a sliced diet needs none
        voices, augmentations = CORPORA[recipe.corpus]
        examples = build_examples(
            teacher_rt, sentences[: recipe.train_sentences],
            cache=examples_cache(workdir, teacher_rt, recipe.train_sentences, recipe.corpus),
            voices=voices, augmentations=augmentations)
        opts = TrainOptions(steps=recipe.steps, lr=recipe.lr, warmup=max(1, recipe.steps // 10),
                            checkpoint_every=10)
        student = recover_vocab(teacher, student, vocab, examples, opts,
                                workdir / f"{name}.ckpt", recipe.batch_size,
                                recipe.kd_kept_only)
    return export_diet_whisper(student, vocab, source, out or workdir / name,
                               tok.timestamp_begin)


def train_drafter(teacher, draft, examples: list[Example], opts: TrainOptions,
                  checkpoint: str | Path, batch_size: int = 4, temperature: float = 1.0):
    """Distil the target's next-token distributions (on its own transcripts) into the draft;
    acceptance is agreement with the target's argmax, which KL to its logits trains for."""
    teacher.eval().requires_grad_(False)
    draft.model.decoder.embed_positions.requires_grad_(False)

    def step(_: int, generator: torch.Generator):
        index = torch.randperm(len(examples), generator=generator)[:batch_size]
        encoded, inputs, labels = _batch(examples, index, list)
        with torch.no_grad():
            teacher_logits = teacher.proj_out(decoder_hidden(teacher, encoded, inputs))
        logits = draft.proj_out(decoder_hidden(draft, encoded, inputs))
        loss = kd_loss(logits, teacher_logits, labels, temperature, alpha=0.8)
        mask = labels != -100
        agree = (logits[mask].argmax(-1) == teacher_logits[mask].argmax(-1)).float().mean()
        return loss, {"agree": round(agree.item(), 4)}

    draft = train(draft, step, opts, checkpoint, desc="drafter",
                  params=list(draft.model.decoder.parameters()))
    return draft.eval()


@dataclass(frozen=True)
class DrafterRecipe:
    layers: tuple[int, ...] = (0, -1)
    train_sentences: int = 400
    steps: int = 150
    batch_size: int = 4
    lr: float = 1e-4
    head_keep: int = 8000  # the draft's output head is cut to the corpus's frequent tokens


def distill_drafter(model: str, recipe: DrafterRecipe, workdir: str | Path,
                    out: str | Path | None = None, threads: int = 0) -> Path:
    """Train a draft decoder for ``model`` and save it (a Hugging Face Whisper folder)."""

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    teacher_rt = CT2Whisper(model, threads=threads, encoder="ct2")
    if threads:
        torch.set_num_threads(threads)
    source = teacher_rt.resolved.ct2_dir
    sentences, _ = split_corpus(domain_corpus())
    examples = build_examples(teacher_rt, sentences[: recipe.train_sentences],
                              cache=examples_cache(workdir, teacher_rt, recipe.train_sentences))
    teacher, _ = whisper_from_ct2(source)
    draft = draft_from_target(teacher, recipe.layers)
    opts = TrainOptions(steps=recipe.steps, lr=recipe.lr, warmup=max(1, recipe.steps // 10),
                        checkpoint_every=10)
    name = f"{model_name(teacher_rt)}-drafter{len(recipe.layers)}"
    draft = train_drafter(teacher, draft, examples, opts, workdir / f"{name}.ckpt",
                          recipe.batch_size)
    out = Path(out or workdir / name)
    with staged_directory(out) as staging:  # a kill never leaves half a model at out
        draft.save_pretrained(staging)
        save_head_ids(staging, domain_tokens(teacher_rt, sentences, recipe.head_keep,
                                             draft.config.vocab_size))
    return out
