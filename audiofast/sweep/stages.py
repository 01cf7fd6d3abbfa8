"""The stage kinds a pipeline YAML can name, each a thin call into the library.

ASR lane: ``resolve_model`` -> ``distill_vocab`` -> ``distill_drafter`` -> ``sweep`` ->
``confirm`` (the gate on the held-back half + real recordings) -> ``export_preset``.
Audio lane: ``train_teacher`` -> ``distill_sa3`` (cfg, steps, qad) -> ``gate_audio`` ->
``export_generate_preset``. Each kind declares its inputs and the source folders whose hash
is its code version (pipeline.py puts it in the stage's cache key).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audiofast.sweep.params import SweepConfigError

PACKAGE = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Context:
    name: str
    dir: Path  # the stage's own folder (wiped when its key changes)
    workdir: Path  # the pipeline's


@dataclass(frozen=True)
class Kind:
    run: Callable[[dict, Context], dict]
    code: tuple[str, ...]  # paths under audiofast/ whose sources version this kind
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    files: Callable[[dict], list[str]] | None = None  # files read besides the inputs

    def check(self, inputs: dict, where: str) -> None:
        known = set(self.required) | set(self.optional)
        unknown = sorted(set(inputs) - known)
        if unknown:
            raise SweepConfigError(f"{where}.{unknown[0]}: unknown input (known: {sorted(known)})")
        missing = [k for k in self.required if k not in inputs]
        if missing:
            raise SweepConfigError(f"{where}.{missing[0]}: required")


KINDS: dict[str, Kind] = {}


def kind(name: str, code: tuple[str, ...], required=(), optional=(), files=None):
    def register(fn):
        KINDS[name] = Kind(fn, code, tuple(required), tuple(optional), files)
        return fn
    return register


@functools.cache
def code_version(paths: tuple[str, ...]) -> str:
    """audiofast's version and a hash of the sources under ``paths`` (relative to the package)."""
    from audiofast import __version__

    digest = hashlib.sha256(__version__.encode())
    for rel in sorted(paths):
        root = PACKAGE / rel
        files = [root] if root.is_file() else sorted(
            p for ext in ("*.py", "*.cpp", "*.h") for p in root.rglob(ext))
        for f in files:
            digest.update(str(f.relative_to(PACKAGE)).encode() + f.read_bytes())
    return digest.hexdigest()[:12]


def _opt(inputs: dict, key: str, default: Any = None) -> Any:
    value = inputs.get(key)
    return default if value is None else value


# -- ASR lane -----------------------------------------------------------------------------------

ASR_CODE = ("asr", "distill", "models", "training.py", "eval/datasets.py", "eval/tts.py")
SWEEP_CODE = ("sweep", "asr", "eval", "models", "cli/transcribe.py")


@kind("resolve_model", ("models",), required=("model",))
def resolve_model(inputs: dict, ctx: Context) -> dict:
    from audiofast.models import resolve_model as resolve

    resolved = resolve(inputs["model"])
    return {"model": str(inputs["model"]), "ct2_dir": str(resolved.ct2_dir)}


@kind("distill_vocab", ASR_CODE, required=("model", "keep"),
      optional=("steps", "sentences", "threads"))
def distill_vocab(inputs: dict, ctx: Context) -> dict:
    from audiofast.distill.asr import VocabDietRecipe, distill_vocab

    extra = {} if inputs.get("steps") is None else {"steps": int(inputs["steps"])}
    recipe = VocabDietRecipe(keep=int(inputs["keep"]),
                             train_sentences=int(_opt(inputs, "sentences", 400)), **extra)
    out = distill_vocab(inputs["model"], recipe, ctx.dir / "work",
                        ctx.dir / f"diet{recipe.keep}", int(_opt(inputs, "threads", 0)))
    return {"out": str(out), "keep": recipe.keep}


@kind("distill_drafter", ASR_CODE, required=("model",),
      optional=("keep", "steps", "sentences", "threads"))
def distill_drafter(inputs: dict, ctx: Context) -> dict:
    from audiofast.distill.asr import DrafterRecipe, distill_drafter

    extra = {} if inputs.get("steps") is None else {"steps": int(inputs["steps"])}
    recipe = DrafterRecipe(train_sentences=int(_opt(inputs, "sentences", 400)),
                           head_keep=int(_opt(inputs, "keep", 8000)), **extra)
    out = distill_drafter(inputs["model"], recipe, ctx.dir / "work", ctx.dir / "drafter",
                          int(_opt(inputs, "threads", 0)))
    return {"out": str(out)}


def _sweep_config(handle: dict):
    from audiofast.sweep.config import load_sweep_config

    cfg = load_sweep_config(handle["config"], handle["set"])
    cfg.out, cfg.study = Path(handle["out"]), handle["study"]
    return cfg


def _handle(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        raise SweepConfigError(f"no sweep at {path}: run its sweep stage") from None


def _gate_files(inputs: dict) -> list[str]:
    """The gate config a sweep reads (its YAML's gate.config, else configs/gates.yaml) and
    that config's sentences: part of the sweep's cache key."""
    import yaml

    from audiofast.eval.gate import DEFAULT_CONFIG
    from audiofast.resources import data_root
    from audiofast.sweep.config import deep_merge, read_yaml

    try:
        raw = deep_merge(read_yaml(Path(inputs["config"])), inputs.get("set") or {})
        gate = Path((raw.get("gate") or {}).get("config") or DEFAULT_CONFIG)
        texts = Path(yaml.safe_load(gate.read_text())["asr"]["texts"])
    except (OSError, KeyError, TypeError, ValueError, SweepConfigError):
        return []
    return [str(gate), str(texts if texts.is_absolute() else data_root() / texts)]


@kind("sweep", SWEEP_CODE, required=("config",),
      optional=("trials", "workers", "set", "storage", "study"), files=_gate_files)
def sweep(inputs: dict, ctx: Context) -> dict:
    from audiofast.sweep.config import load_sweep_config
    from audiofast.sweep.runner import finish, search, storage_url

    overrides = inputs.get("set") or {}
    cfg = load_sweep_config(inputs["config"], overrides)
    cfg.out = ctx.dir
    cfg.study = str(_opt(inputs, "study", cfg.study))
    url = storage_url(cfg, inputs.get("storage"))
    search(cfg, url, inputs.get("trials"), inputs.get("workers"), overrides)
    summary = finish(cfg, url, confirm=False)
    handle = {"config": str(inputs["config"]), "set": overrides, "storage": url,
              "study": cfg.study, "out": str(cfg.out)}
    (ctx.dir / "handle.json").write_text(json.dumps(handle, indent=1))
    return {"handle": str(ctx.dir / "handle.json"), "study": cfg.study,
            "chosen": summary["chosen"], "report_path": summary["paths"]["markdown"]}


@kind("confirm", SWEEP_CODE, required=("sweep",))
def confirm(inputs: dict, ctx: Context) -> dict:
    """The gate: the chosen configuration on the held-back half + the real recordings."""
    from audiofast.sweep.pipeline import StageFailed
    from audiofast.sweep.runner import finish

    handle = _handle(inputs["sweep"])
    summary = finish(_sweep_config(handle), handle["storage"], confirm=True)
    if summary["chosen"] is None:
        raise StageFailed("no trial passed the gate on the selection half")
    verdict = summary["confirm"]
    if not verdict["passed"]:
        failed = [c["name"] for c in verdict["checks"] if not c["passed"]]
        raise StageFailed(f"trial {summary['chosen']} failed the gate on {verdict['on']} "
                          f"({', '.join(failed)}); see {summary['paths']['markdown']}")
    return {"passed": True, "trial": summary["chosen"],
            "speed_ratio": round(summary["compare"]["speed_ratio"], 3),
            "report_path": summary["paths"]["markdown"]}


@kind("export_preset", SWEEP_CODE, required=("sweep", "name"))
def export_preset(inputs: dict, ctx: Context) -> dict:
    from audiofast.sweep.pipeline import StageFailed
    from audiofast.sweep.runner import finish

    handle = _handle(inputs["sweep"])
    summary = finish(_sweep_config(handle), handle["storage"], confirm=True,
                     preset=str(inputs["name"]))
    if not summary.get("preset"):
        raise StageFailed("no confirmed configuration to export")
    return {"preset": summary["preset"], "report_path": summary["paths"]["markdown"]}


# -- audio lane ---------------------------------------------------------------------------------

SA3_CODE = ("diffusion", "training.py", "eval/fad.py")


@kind("train_teacher", SA3_CODE, optional=(
    "source", "width", "depth", "heads", "memory_tokens", "train_clips", "dit_steps",
    "dit_batch", "dit_lr", "seed"))
def train_teacher(inputs: dict, ctx: Context) -> dict:
    if inputs.get("source"):
        if not Path(inputs["source"]).is_dir():
            raise SweepConfigError(f"train_teacher.source: no such checkpoint: {inputs['source']}")
        return {"out": str(inputs["source"])}
    from audiofast.diffusion.teacher import TeacherRecipe, TeacherSize, train_teacher

    size = {k: inputs[f] for k, f in (("dit_width", "width"), ("dit_depth", "depth"),
                                      ("dit_heads", "heads"), ("memory_tokens", "memory_tokens"))
            if inputs.get(f) is not None}
    recipe = {k: inputs[k] for k in ("train_clips", "dit_steps", "dit_batch", "dit_lr", "seed")
              if inputs.get(k) is not None}
    return {"out": str(train_teacher(TeacherRecipe(size=TeacherSize(**size), **recipe),
                                     ctx.dir / "work"))}


@kind("distill_sa3", SA3_CODE, required=("stage", "parent"),
      optional=("config", "set", "device", "baseline"))
def distill_sa3(inputs: dict, ctx: Context) -> dict:
    from audiofast.diffusion.distill import run_stage
    from audiofast.diffusion.distill_config import StageConfigError, load_stage_config
    from audiofast.sweep.pipeline import StageFailed

    try:
        cfg = load_stage_config(inputs["stage"], inputs.get("config"))
        if inputs.get("set"):
            cfg = cfg.replace(**inputs["set"])
    except StageConfigError as exc:
        raise SweepConfigError(str(exc)) from None
    result = run_stage(inputs["stage"], inputs["parent"], cfg, ctx.dir / "student",
                       ctx.dir / "work", _opt(inputs, "device", "cpu"), inputs.get("baseline"))
    if result.gate_passed is False:
        raise StageFailed(f"{inputs['stage']}: gate failed: "
                          f"{result.checkpoint / 'gate' / 'gate.md'}")
    return {"out": str(result.checkpoint), "gate_passed": result.gate_passed}


@kind("gate_audio", SA3_CODE, required=("student",),
      optional=("baseline", "config", "set", "device"))
def gate_audio(inputs: dict, ctx: Context) -> dict:
    from audiofast.diffusion.distill import gate_stage, root_baseline
    from audiofast.diffusion.distill_config import (
        StageConfig,
        StageConfigError,
        load_stage_config,
    )
    from audiofast.sweep.pipeline import StageFailed

    student = Path(inputs["student"])
    try:  # the gate section of any stage config (default: qad's)
        cfg = StageConfig.from_file(inputs["config"]) if inputs.get("config") else \
            load_stage_config("qad")
        if inputs.get("set"):
            cfg = cfg.replace(**inputs["set"])
    except StageConfigError as exc:
        raise SweepConfigError(str(exc)) from None
    baseline = inputs.get("baseline") or root_baseline(student)
    if not gate_stage(student, baseline, cfg, _opt(inputs, "device", "cpu")):
        raise StageFailed(f"gate failed: {student / 'gate' / 'gate.md'}")
    return {"passed": True, "report_path": str(student / "gate" / "gate.md")}


@kind("export_generate_preset", ("sweep",), required=("model", "name"),
      optional=("steps", "cfg_scale", "sampler"))
def export_generate_preset(inputs: dict, ctx: Context) -> dict:
    from audiofast.sweep.preset import write_preset

    config = {"model": str(inputs["model"])} | {
        k: inputs[k] for k in ("steps", "cfg_scale", "sampler") if inputs.get(k) is not None}
    source = {"study": None, "trial": None, "confirmed": "gate_audio stage"}
    return {"preset": str(write_preset(str(inputs["name"]), "audio", config, source))}
