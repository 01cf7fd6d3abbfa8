"""``audiofast distill --stage cfg|steps|qad``: one SA3 acceleration stage, end to end.

    parent checkpoint -> training latents -> student (warm start) -> resumable training
    (:func:`audiofast.training.train`) -> student checkpoint -> automatic gate

A stage reads the parent (any SA3 checkpoint: the proving-ground teacher, a real SA3 ``-base``
model, or the previous stage's student) and writes a new checkpoint directory whose
``model_config.json`` says how to sample it (:mod:`audiofast.diffusion.student`):

- ``cfg``: guidance folded in (:mod:`~audiofast.diffusion.cfg_distill`), one pass per step;
- ``steps``: half the steps (:mod:`~audiofast.diffusion.step_distill`, or with ``method: dmd``
  distribution matching against the root teacher, :mod:`~audiofast.diffusion.dmd`), its
  times recorded;
- ``qad``: W8A8 quantization-aware distillation (:mod:`~audiofast.diffusion.qad`), exported as
  real int8 (:mod:`~audiofast.diffusion.int8`).

Work lives in ``workdir`` (latents, the atomic training checkpoint and its loss log), so a
killed stage resumes at its last checkpoint and ends bit-equal to an uninterrupted run. Under
``accelerate launch`` every process trains on its share of each batch
(:mod:`~audiofast.diffusion.distill_batch`) with gradients averaged.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from audiofast.diffusion.cfg_distill import X0Fn, prediction_loss
from audiofast.diffusion.checkpoint import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    CheckpointError,
    SA3Model,
    build_model,
)
from audiofast.diffusion.distill_batch import DistillBatch, Shard, draw_batch
from audiofast.diffusion.distill_config import StageConfig
from audiofast.diffusion.flow_matching import LatentSet, encode_captions
from audiofast.diffusion.generate import latent_lengths, load_for_generation, model_denoiser
from audiofast.diffusion.sampling import schedule
from audiofast.diffusion.step_distill import halve_schedule, parent_paths, step_distill_loss
from audiofast.diffusion.student import (
    FoldedGuidance,
    StudentConfig,
    StudentSampler,
    with_student,
)
from audiofast.training import GradientSync, StepFn, TrainOptions, save_atomic, train

log = logging.getLogger(__name__)


@dataclass
class StageResult:
    checkpoint: Path
    gate_passed: bool | None  # None: gate disabled


# -- models -------------------------------------------------------------------------------------


def load_parent(source: str | Path, device: str = "cpu") -> SA3Model:
    """The parent, text encoder attached, refusing a partial load with one line."""
    model = load_for_generation(source, device=device)
    report = model.load_report
    if not report.ok:
        first = (report.missing or report.unexpected or [m[0] for m in report.mismatched])[0]
        raise CheckpointError(f"{source}: checkpoint does not match its config: {first} "
                              f"({report.loaded} tensors loaded, {len(report.missing)} missing, "
                              f"{len(report.mismatched)} of another shape)")
    return model.requires_grad_(False)


def parent_schedule(parent: SA3Model, cfg: StageConfig, stage: str,
                    content_latents: int) -> torch.Tensor:
    """The times the parent is sampled at: its own when it is a student, else its config's
    schedule at the stage's parent steps."""
    own = parent.config.student.sampler if parent.config.student else None
    steps = cfg.sampler.parent_steps if stage == "steps" else cfg.sampler.steps
    if own is not None:
        if stage == "steps" and own.steps != steps:
            raise ValueError(f"the parent samples {own.steps} steps: use --from {own.steps}")
        return torch.tensor(own.times)
    return schedule(steps, parent.config.diffusion.sampling_shift, seq_len=content_latents)


def x0_function(model: SA3Model, apg_scale: float = 1.0) -> X0Fn:
    """``f(x_t, t, batch) -> x0`` at the batch's guidance scales (:func:`model_denoiser`)."""

    def x0(xt: torch.Tensor, t: torch.Tensor, batch: DistillBatch) -> torch.Tensor:
        return model_denoiser(model, batch.cond, batch.guidance, apg_scale)(xt, t)

    return x0


def make_student(parent: SA3Model, student_cfg: StudentConfig) -> SA3Model:
    """The parent's weights in a model built for ``student_cfg`` (a new guidance embedding
    starts at zero, so the student starts as the parent)."""
    config = with_student(parent.config, dataclasses.replace(student_cfg, quantization=None))
    student = build_model(config)
    missing, unexpected = student.load_state_dict(parent.state_dict(), strict=False)
    stray = [k for k in missing if "to_guidance_embed" not in k] + list(unexpected)
    if stray:
        raise CheckpointError(f"student and parent differ in {stray[0]}")
    for name, conditioner in parent.conditioners.items():  # text encoders live outside the tree
        if hasattr(conditioner, "_encoder"):
            student.conditioners[name]._encoder = conditioner._encoder
    return student


# -- data ---------------------------------------------------------------------------------------


def training_latents(parent: SA3Model, cfg: StageConfig, workdir: Path) -> LatentSet:
    """Latents and caption states for the stage, cached in ``workdir`` by the data spec."""
    spec = cfg.data
    pretransform = parent.config.raw.get("model", {}).get("pretransform")
    key = hashlib.sha256(json.dumps([dataclasses.asdict(spec), pretransform], sort_keys=True,
                                    default=str).encode())
    path = workdir / f"latents-{key.hexdigest()[:12]}.pt"
    if path.is_file():
        return LatentSet(**torch.load(path, weights_only=False))
    text = parent.conditioners[parent.config.conditioning.text[0].id]
    if spec.kind == "synth":
        from audiofast.diffusion.teacher import CLIP_SECONDS, SynthSet

        clips = SynthSet.build(spec.clips, seed=spec.seed)
        with torch.no_grad():
            latents = torch.cat([parent.autoencoder.encode(clips.audio[i : i + 64]).float()
                                 for i in range(0, len(clips), 64)])
        captions, seconds = clips.captions, CLIP_SECONDS
    else:  # gaussian: standard-normal latents with the prompts cycled
        seconds = spec.seconds or parent.config.sample_size / parent.config.sample_rate
        length = latent_lengths(parent.config, seconds).content
        gen = torch.Generator().manual_seed(spec.seed)
        latents = torch.randn(spec.clips, parent.config.io_channels, length, generator=gen)
        captions = [spec.prompts[i % len(spec.prompts)] for i in range(spec.clips)]
    distinct = sorted(set(captions))
    index = {c: i for i, c in enumerate(distinct)}
    hidden, mask = encode_captions(text, distinct)
    data = LatentSet(latents, torch.tensor([index[c] for c in captions]), hidden.float(), mask,
                     distinct, float(seconds))
    save_atomic(dataclasses.asdict(data), path)
    return data


# -- the stage ----------------------------------------------------------------------------------


def student_config(stage: str, parent: SA3Model, cfg: StageConfig, parent_ref: str,
                   times: torch.Tensor) -> StudentConfig:
    """What the stage's student will say about itself in its ``model_config.json``."""
    inherited = parent.config.student
    guidance = inherited.guidance if inherited else None
    if stage == "cfg":
        g = cfg.guidance
        guidance = FoldedGuidance(g.scale, g.range, g.apg_scale)
    elif stage == "steps":
        given = cfg.sampler.times
        times = torch.tensor(given) if given else halve_schedule(times, cfg.sampler.steps)
    quant = None
    if stage == "qad":
        from audiofast.diffusion.int8 import QUANTIZATION

        quant = dict(QUANTIZATION)
    sampler = StudentSampler(cfg.sampler.name, tuple(round(float(t), 6) for t in times))
    return StudentConfig(stage, parent_ref, guidance, sampler, quant)


def stage_step(stage: str, student: SA3Model, parent: SA3Model, data: LatentSet,
               cfg: StageConfig, scfg: StudentConfig, times: torch.Tensor, shard: Shard,
               device: str, critic=None, critic_source: SA3Model | None = None,
               sync: GradientSync | None = None):
    """The training step of ``stage``: a batch, the parent's target, the student's loss
    (``steps`` by DMD: the critic and the root teacher it was copied from, the real score)."""
    t = cfg.train
    pguid = parent.config.student.guidance if parent.config.student else None
    guidance = scfg.guidance or FoldedGuidance(cfg.guidance.scale, cfg.guidance.range)
    teacher_x0 = x0_function(parent, cfg.guidance.apg_scale if pguid is None else 1.0)
    student_x0 = x0_function(student)
    sampler_times = scfg.sampler.times

    if stage == "steps" and cfg.method == "dmd":  # the student's own times only
        from audiofast.diffusion.dmd import dmd_step, real_score

        def draw(gen: torch.Generator) -> DistillBatch:
            return draw_batch(parent, data, t.batch, gen, sampler_times, 1.0, guidance.range,
                              guidance.scale, shard, device)

        return dmd_step(student_x0, real_score(critic_source, guidance, cfg.dmd), critic, draw,
                        torch.tensor(sampler_times), cfg.dmd, sync)

    def step(_: int, gen: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        batch = draw_batch(parent, data, t.batch, gen, sampler_times, t.schedule_time_prob,
                           guidance.range, guidance.scale, shard, device)
        if stage == "steps":
            paths = parent_paths(times, torch.tensor(sampler_times))
            return step_distill_loss(student_x0, teacher_x0, batch, paths), {}
        # cfg: the guided parent in one pass; qad: the float parent under int8 rounding
        return prediction_loss(student_x0, teacher_x0, batch), {}

    return step


@dataclass
class Stage:
    """A stage ready to train: the frozen parent, the student, its step and where it saves."""

    name: str
    parent: SA3Model
    student: SA3Model
    student_config: StudentConfig
    step: StepFn
    params: list[torch.nn.Parameter]
    options: TrainOptions
    checkpoint: Path
    sync: GradientSync | None
    companion: object | None = None  # dmd: the critic, saved with the training checkpoint


def prepare_stage(stage: str, parent_source: str | Path, cfg: StageConfig, workdir: str | Path,
                  device: str = "cpu", accelerator=None) -> Stage:
    """Load the parent, build the training latents and the warm-started student."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    parent = load_parent(parent_source, device)
    if stage == "qad" and parent.config.student and parent.config.student.quantization:
        raise CheckpointError(f"{parent_source} is already int8: run qad on its float parent")
    seconds = cfg.data.seconds or parent.config.sample_size / parent.config.sample_rate
    content = latent_lengths(parent.config, seconds).content
    times = parent_schedule(parent, cfg, stage, content)
    scfg = student_config(stage, parent, cfg, str(parent_source), times)
    data = training_latents(parent, cfg, workdir)
    student = make_student(parent, scfg).to(device)
    if stage == "qad":
        from audiofast.diffusion.qad import fake_quantize_

        fake_quantize_(student.dit, io=True)
    student.requires_grad_(False)
    params = list(student.dit.parameters())
    for p in params:
        p.requires_grad_(True)
    sync, shard = None, Shard()
    if accelerator is not None and accelerator.num_processes > 1:
        sync = GradientSync(accelerator)
        shard = Shard(accelerator.process_index, accelerator.num_processes)
    t = cfg.train
    opts = TrainOptions(t.steps, lr=t.lr, warmup=t.warmup, weight_decay=t.weight_decay,
                        grad_clip=t.grad_clip, ema_decay=t.ema_decay,
                        checkpoint_every=t.checkpoint_every, seed=t.seed)
    critic = teacher = None
    if stage == "steps" and cfg.method == "dmd":
        from audiofast.diffusion.dmd import Critic, check_parent

        check_parent(parent, str(parent_source))
        teacher = load_parent(root_baseline(parent_source), device)
        critic = Critic(parent, cfg.dmd, device, cfg.train.seed)
    step = stage_step(stage, student, parent, data, cfg, scfg, times, shard, device, critic,
                      teacher, sync)
    run_key = json.dumps([stage, str(parent_source), cfg.to_dict()], sort_keys=True, default=str)
    run_key = hashlib.sha256(run_key.encode()).hexdigest()[:12]  # another config starts afresh
    return Stage(stage, parent, student, scfg, step, params, opts,
                 workdir / f"{stage}-{run_key}.ckpt", sync, critic)


def run_stage(stage: str, parent_source: str | Path, cfg: StageConfig, out: str | Path,
              workdir: str | Path, device: str = "cpu", baseline: str | Path | None = None,
              accelerator=None) -> StageResult:
    """Train one stage's student from ``parent_source`` into ``out`` and gate it."""
    out = Path(out)
    s = prepare_stage(stage, parent_source, cfg, workdir, device, accelerator)
    trained = train(s.student, s.step, s.options, s.checkpoint, desc=f"distill {stage}",
                    params=s.params, sync=s.sync, companion=s.companion)
    if s.sync is not None and not s.sync.is_main:
        return StageResult(out, None)
    trained.requires_grad_(False)
    trained.config = with_student(s.parent.config, s.student_config)
    if stage == "qad":
        from audiofast.diffusion.int8 import quantize_dit

        quantize_dit(trained.dit, io=True)
    export_student(trained, out, cfg)
    passed = None
    if cfg.gate.enabled:
        passed = gate_stage(out, baseline or root_baseline(parent_source), cfg, device)
    return StageResult(out, passed)


def export_student(model: SA3Model, directory: Path, cfg: StageConfig) -> Path:
    """``model_config.json`` (with the student section) + ``model.safetensors`` (float tensors
    as float32, int8 weights as int8) + the stage config, renamed into place as a whole.
    A parent's bundled text encoder (T5Gemma subfolder) is copied along."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(staging / WEIGHTS_NAME))
    raw = copy.deepcopy(model.config.raw)
    (staging / CONFIG_NAME).write_text(json.dumps(raw, indent=2), encoding="utf-8")
    (staging / "stage.json").write_text(json.dumps(cfg.to_dict(), indent=2), encoding="utf-8")
    parent = Path(model.config.student.parent) if model.config.student else None
    for text in model.config.conditioning.text:
        if text.subfolder and parent is not None and (parent / text.subfolder).is_dir():
            shutil.copytree(parent / text.subfolder, staging / text.subfolder)
    staging.chmod(0o755)
    if directory.exists():
        shutil.rmtree(directory)
    staging.rename(directory)
    return directory


def root_baseline(source: str | Path) -> Path:
    """The first non-student checkpoint up the ``parent`` chain: what users ran before."""
    path = Path(source)
    for _ in range(16):
        try:
            raw = json.loads((path / CONFIG_NAME).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return path
        parent = (raw.get("audiofast") or {}).get("parent")
        if not parent or not Path(parent).is_dir():
            return path
        path = Path(parent)
    return path


def gate_stage(student_dir: Path, baseline_dir: str | Path, cfg: StageConfig,
               device: str = "cpu") -> bool:
    """Gate the exported student against the baseline; report beside the checkpoint."""
    from audiofast.diffusion.stage_gate import gate_student

    student = load_for_generation(student_dir, device=device)
    baseline = load_for_generation(baseline_dir, device=device)
    prompts = list(cfg.data.prompts) or None
    verdict = gate_student(student, baseline, cfg.gate, prompts,
                           (str(student_dir), str(baseline_dir)))
    verdict.write(student_dir / "gate")
    log.info("gate %s", "PASS" if verdict.passed else "FAIL")
    return verdict.passed
