"""Typed stage configs for ``audiofast distill --stage cfg|steps|qad`` (``configs/distill/*.yaml``).

Every key is known: an unknown or mistyped key, or a value out of range, is a one-line
:class:`StageConfigError` naming it, raised before any model loads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from audiofast.yaml_file import read_yaml_mapping

STAGES = ("cfg", "steps", "qad")
STEP_METHODS = ("progressive", "dmd")  # steps: step_distill.py, dmd.py


class StageConfigError(ValueError):
    """A malformed stage config (one line, naming the key)."""


@dataclass(frozen=True)
class GuidanceSpec:
    scale: float = 5.0  # the scale folded in (the default one when a range is folded)
    range: tuple[float, float] | None = None  # fold every scale in [lo, hi] (scale embedding)
    apg_scale: float = 1.0  # the sampler's APG projection (1: full, 0: plain CFG)


@dataclass(frozen=True)
class SamplerSpec:
    name: str = "pingpong"
    steps: int = 8  # the parent's steps (cfg, qad) or the student's target (steps: --to)
    parent_steps: int = 8  # steps: the parent's schedule the student halves (--from)
    times: tuple[float, ...] | None = None  # steps: the student's own times (--times, 1 ... 0)


@dataclass(frozen=True)
class DataSpec:
    """Training latents: ``synth`` (the proving ground's captioned clips, encoded by the
    checkpoint's pretransform) or ``gaussian`` (random latents and the given prompts: for
    architecture smoke tests; guidance and step distillation only need x_t and a caption)."""

    kind: str = "synth"
    clips: int = 2000
    seed: int = 1  # the teacher trained on seed 1; evaluation uses seeds 1000+
    seconds: float | None = None  # default: the checkpoint's sample_size
    prompts: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrainSpec:
    steps: int = 300
    batch: int = 16
    lr: float = 1e-4
    warmup: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    ema_decay: float | None = None
    checkpoint_every: int = 25
    seed: int = 0
    schedule_time_prob: float = 0.5  # share of items at the sampler's own times


@dataclass(frozen=True)
class DMDSpec:
    """``--stage steps --method dmd`` (:mod:`audiofast.diffusion.dmd`): the fake-score critic
    and its adversarial head (:mod:`audiofast.diffusion.adversarial`)."""

    critic_steps: int = 2  # critic updates per generator update (DMD2's two time-scale rule)
    critic_lr: float = 1e-4
    real_apg_scale: float | None = None  # the real score's APG (None: the folded one, else 1)
    gan_weight: float = 0.01  # generator: adversarial term beside the DMD loss
    critic_gan_weight: float = 0.1  # critic: adversarial terms beside its flow-matching loss
    contrastive_weight: float = 1.0  # critic: real clips under rolled prompts are negatives
    r1_weight: float = 1.0  # noise-perturbation R1 (reals) and R2 (fakes)
    r1_sigma: float = 0.01
    feature_layer: int | None = None  # critic block whose output the head reads (None: middle)
    t_min: float = 0.02  # times the generator's samples are noised to for the scores
    t_max: float = 0.98


@dataclass(frozen=True)
class GateSpec:
    """The automatic gate at the end of a stage (see :mod:`audiofast.diffusion.stage_gate`)."""

    enabled: bool = True
    clips: int = 160
    seed: int = 0
    max_fad_ratio: float = 1.1
    max_fad_ratio_upper: float = 1.2  # the bootstrap interval's upper end must stay under it
    interval_level: float = 0.95
    bootstrap_replicates: int = 200
    min_pitch_ratio: float = 0.95  # proving ground only: vs the baseline's pitch accuracy
    min_category_ratio: float = 0.95
    baseline_steps: int = 8
    baseline_cfg: float = 5.0
    baseline_sampler: str = "pingpong"


@dataclass(frozen=True)
class StageConfig:
    stage: str
    guidance: GuidanceSpec = field(default_factory=GuidanceSpec)
    sampler: SamplerSpec = field(default_factory=SamplerSpec)
    data: DataSpec = field(default_factory=DataSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    gate: GateSpec = field(default_factory=GateSpec)
    method: str = "progressive"  # steps: progressive distillation or dmd
    dmd: DMDSpec = field(default_factory=DMDSpec)

    @classmethod
    def from_dict(cls, data: Any, where: str = "config") -> StageConfig:
        cfg = _build(cls, data, where)
        if cfg.stage not in STAGES:
            raise StageConfigError(f"{where}.stage={cfg.stage!r}: choose from {list(STAGES)}")
        g = cfg.guidance
        if g.range is not None and not g.range[0] <= g.scale <= g.range[1]:
            raise StageConfigError(f"{where}.guidance.range={list(g.range)} must contain "
                                   f"guidance.scale={g.scale}")
        if cfg.sampler.name not in ("pingpong", "euler"):
            raise StageConfigError(f"{where}.sampler.name={cfg.sampler.name!r}: choose from "
                                   "['pingpong', 'euler']")
        s = cfg.sampler
        if s.times is not None:
            from audiofast.diffusion.student import StudentSampler

            if cfg.stage != "steps":
                raise StageConfigError(f"{where}.sampler.times: only the steps stage takes times")
            if len(s.times) != s.steps + 1 or not StudentSampler.valid_times(s.times):
                raise StageConfigError(f"{where}.sampler.times={list(s.times)}: need "
                                       f"{s.steps + 1} times decreasing from 1.0 to 0.0")
        elif cfg.stage == "steps" and (s.steps < 1 or s.parent_steps % s.steps):
            raise StageConfigError(f"{where}.sampler: parent_steps={s.parent_steps} must be a "
                                   f"multiple of steps={s.steps}")
        if cfg.method not in STEP_METHODS or cfg.method != "progressive" and cfg.stage != "steps":
            raise StageConfigError(f"{where}.method={cfg.method!r}: the steps stage takes one of "
                                   f"{list(STEP_METHODS)}; other stages take 'progressive'")
        d = cfg.dmd
        if d.critic_steps < 1 or d.critic_lr <= 0 or not 0 < d.t_min < d.t_max <= 1:
            raise StageConfigError(f"{where}.dmd: need critic_steps >= 1, critic_lr > 0 and "
                                   "0 < t_min < t_max <= 1")
        if cfg.data.kind not in ("synth", "gaussian"):
            raise StageConfigError(f"{where}.data.kind={cfg.data.kind!r}: choose from "
                                   "['synth', 'gaussian']")
        if cfg.data.kind == "gaussian" and not cfg.data.prompts:
            raise StageConfigError(f"{where}.data.prompts: gaussian data needs prompts")
        for name in ("steps", "batch", "checkpoint_every"):
            low = 0 if name == "steps" and cfg.stage == "qad" else 1  # qad 0: PTQ, no training
            if getattr(cfg.train, name) < low:
                raise StageConfigError(f"{where}.train.{name} must be >= {low}")
        gate = cfg.gate
        if not 0 < gate.interval_level < 1 or gate.bootstrap_replicates < 10:
            raise StageConfigError(f"{where}.gate: interval_level must be in (0, 1) and "
                                   "bootstrap_replicates >= 10")
        if gate.max_fad_ratio_upper < gate.max_fad_ratio:
            raise StageConfigError(f"{where}.gate.max_fad_ratio_upper must be >= max_fad_ratio")
        if cfg.train.lr <= 0:
            raise StageConfigError(f"{where}.train.lr must be > 0")
        return cfg

    @classmethod
    def from_file(cls, path: str | Path) -> StageConfig:
        path = Path(path)
        data = read_yaml_mapping(path, "stage config", StageConfigError)
        return cls.from_dict(data, where=path.name)

    def replace(self, **sections: dict[str, Any]) -> StageConfig:
        """This config with some fields of some sections changed (CLI overrides), checked
        again as a whole."""
        data = self.to_dict()
        for name, values in sections.items():
            data[name].update(values)
        return StageConfig.from_dict(data, where="options")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _build(cls: type, data: Any, where: str) -> Any:
    """``cls(**data)`` with every key checked against ``cls``'s fields and typed."""
    if not isinstance(data, dict):
        raise StageConfigError(f"{where} must be a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise StageConfigError(f"{where}.{unknown[0]}: unknown key (known: {sorted(known)})")
    values = {}
    for name, value in data.items():
        values[name] = _coerce(hints[name], value, f"{where}.{name}")
    try:
        return cls(**values)
    except TypeError as exc:
        raise StageConfigError(f"{where}: {exc}") from None


def _coerce(hint: Any, value: Any, where: str) -> Any:
    text = str(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    if value is None:
        if "None" in text:
            return None
        raise StageConfigError(f"{where} must not be null")
    if "tuple[float, float]" in text:
        if not (isinstance(value, (list, tuple)) and len(value) == 2
                and all(isinstance(v, (int, float)) for v in value) and value[0] <= value[1]):
            raise StageConfigError(f"{where}={value!r}: expected [low, high]")
        return (float(value[0]), float(value[1]))
    if "tuple[float, ...]" in text:
        if not (isinstance(value, (list, tuple)) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            raise StageConfigError(f"{where}={value!r}: expected a list of numbers")
        return tuple(float(v) for v in value)
    if "tuple[str" in text:
        if not (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
            raise StageConfigError(f"{where}={value!r}: expected a list of strings")
        return tuple(value)
    for kind, ok in (("bool", (bool,)), ("int", (int,)), ("float", (int, float)), ("str", (str,))):
        if text.startswith(kind) or text == f"<class '{kind}'>":
            if isinstance(value, bool) and kind != "bool" or not isinstance(value, ok):
                raise StageConfigError(f"{where}={value!r}: expected {kind}")
            return float(value) if kind == "float" else value
    return value


def load_stage_config(stage: str, path: str | Path | None = None,
                      method: str | None = None) -> StageConfig:
    """The stage's config from ``path``, else the shipped ``configs/distill/<stage>.yaml``
    (``steps-dmd.yaml`` for ``--method dmd``), else the built-in defaults."""
    if path is None:
        from audiofast.resources import data_file

        name = f"{stage}-{method}" if method and method != "progressive" else stage
        default = data_file(f"configs/distill/{name}.yaml")
        if not default.is_file():
            return StageConfig.from_dict({"stage": stage, "method": method or "progressive"})
        path = default
    cfg = StageConfig.from_file(path)
    if cfg.stage != stage:
        raise StageConfigError(f"{Path(path).name}: stage={cfg.stage!r} but --stage {stage}")
    if method is not None and cfg.method != method:
        raise StageConfigError(f"{Path(path).name}: method={cfg.method!r} but --method {method}")
    return cfg
