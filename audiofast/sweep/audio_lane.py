"""The audio lane of a sweep (Stable Audio 3): which checkpoint, how many steps, which
sampler, which guidance scale, whether the DiT runs int8.

A trial generates the gate's captions with its settings (``generate`` through
:func:`audiofast.diffusion.stage_gate.generate_clips`) and is judged as the stage gate
(:func:`audiofast.diffusion.stage_gate.gate_student`) judges a student, but at the trial's
steps / sampler / scale: on proving-ground checkpoints FAD ratio to the baseline plus the
teacher's pitch and category accuracy as ratios (all checks of the gate spec), elsewhere the
FAD ratio against the baseline's own clips at other seeds. Speed is the generation time per
clip; quality is the FAD ratio; a failed check makes the trial infeasible.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from audiofast.sweep.config import existing_dir, get, section
from audiofast.sweep.params import Domain, Param, SweepConfigError

SETTING_KEYS = ("students", "baseline", "gate", "judge", "prompts")
_CACHE: dict[Any, Any] = {}  # per process: loaded models, the judge, the baseline's scores


def load_settings(raw: dict, where: str) -> dict:
    from audiofast.diffusion.distill_config import StageConfig, StageConfigError

    students = get(raw, "students", dict, None, where)
    if not students:
        raise SweepConfigError(f"{where}.students: required (name: checkpoint directory)")
    settings: dict[str, Any] = {"students": {
        str(k): existing_dir(v, f"{where}.students.{k}") for k, v in students.items()}}
    baseline = raw.get("baseline")
    if baseline is None:
        raise SweepConfigError(f"{where}.baseline: required (the checkpoint users ran before)")
    settings["baseline"] = existing_dir(baseline, f"{where}.baseline")
    try:
        spec = StageConfig.from_dict({"stage": "cfg", "gate": get(raw, "gate", dict, {}, where)},
                                     where=where).gate
    except StageConfigError as exc:
        raise SweepConfigError(str(exc)) from None
    settings["gate"] = spec
    judge = section(raw, "judge", {"train_clips", "steps"}, where)
    settings["judge"] = {"train_clips": get(judge, "train_clips", int, 1500, f"{where}.judge"),
                         "steps": get(judge, "steps", int, 300, f"{where}.judge")}
    settings["prompts"] = [str(p) for p in get(raw, "prompts", list, [], where)]
    return settings


def domains(settings: dict) -> dict[str, Domain]:
    return {"student": Domain("choice", tuple(settings["students"])),
            "steps": Domain("int", low=1, high=256),
            "sampler": Domain("choice", ("pingpong", "euler")),
            "cfg_scale": Domain("float", low=0, high=30, nullable=True),
            "quantization": Domain("choice", ("none", "int8"))}


def check_space(space: dict[str, Param], settings: dict, where: str) -> None:
    if "student" not in space and len(settings["students"]) > 1:
        raise SweepConfigError(f"{where}.space.student: list the students to try")


def _student_meta(path: str) -> dict:
    raw = json.loads((Path(path) / "model_config.json").read_text(encoding="utf-8"))
    return raw.get("audiofast") or {}


def default_config(settings: dict) -> dict:
    """The baseline as users ran it: the gate spec's baseline steps, scale and sampler."""
    g = settings["gate"]
    same = [n for n, p in settings["students"].items()
            if Path(p).resolve() == Path(settings["baseline"]).resolve()]
    return {"student": same[0] if same else "baseline", "model": settings["baseline"],
            "steps": g.baseline_steps,
            "sampler": g.baseline_sampler, "cfg_scale": g.baseline_cfg, "quantization": "none"}


def suggest(trial, space: dict[str, Param], settings: dict) -> dict:
    def ask(name: str, default: Any) -> Any:
        return space[name].suggest(trial) if name in space else default

    name = ask("student", next(iter(settings["students"])))
    path = settings["students"][name]  # as written in the YAML (the default's comparison)
    meta = _student_meta(path)
    own = meta.get("sampler") or {}
    cfg = {"student": name, "model": path,
           "steps": ask("steps", max(1, len(own.get("times", [])) - 1) or 8),
           "sampler": ask("sampler", own.get("name", "pingpong")),
           "quantization": "int8" if meta.get("quantization") else ask("quantization", "none")}
    guidance = meta.get("guidance")
    scale = ask("cfg_scale", None)
    if guidance and guidance.get("range") is None:
        scale = None  # one scale folded in: the student's own
    elif guidance and scale is not None:
        lo, hi = guidance["range"]
        scale = min(max(scale, lo), hi)
    cfg["cfg_scale"] = scale
    return cfg


def _model(path: str, quantization: str):
    key = ("model", path, quantization)
    if key not in _CACHE:
        from audiofast.diffusion.generate import load_for_generation

        model = load_for_generation(path)
        if quantization == "int8" and not (model.config.student and
                                           model.config.student.quantization):
            from audiofast.diffusion.int8 import quantize_dit

            quantize_dit(model.dit)
        _CACHE[key] = model.requires_grad_(False)
    return _CACHE[key]


def score(config: dict, settings: dict, seed_offset: int = 0) -> dict:
    """Generate the gate's captions at the trial's settings and check them (a verdict)."""
    from audiofast.diffusion.stage_gate import _mono16k, generate_clips, is_proving_ground
    from audiofast.eval.gate import Verdict

    spec = settings["gate"]
    seed = spec.seed + seed_offset
    model = _model(config["model"], config["quantization"])
    baseline = _model(settings["baseline"], "none")
    run = dict(steps=config["steps"], cfg=config["cfg_scale"], sampler=config["sampler"])
    base = dict(steps=spec.baseline_steps, cfg=spec.baseline_cfg, sampler=spec.baseline_sampler)
    verdict = Verdict("audio", config["model"], settings["baseline"], passed=False)
    if is_proving_ground(model):
        from audiofast.diffusion.teacher import CLIP_SECONDS

        judge, captions = _judge(settings, seed)
        generate_clips(model, captions.captions[:1], CLIP_SECONDS, seed, **run)  # warm-up
        cand, cand_s = generate_clips(model, captions.captions, CLIP_SECONDS, seed, **run)
        key = ("base", settings["baseline"], seed)
        if key not in _CACHE:
            ref, _ = generate_clips(baseline, captions.captions, CLIP_SECONDS, seed, **base)
            _CACHE[key] = judge.score(ref, captions.meta)
        c, b = judge.score(cand, captions.meta), _CACHE[key]
        for name, minimum in (("pitch_accuracy", spec.min_pitch_ratio),
                              ("category_accuracy", spec.min_category_ratio)):
            ratio = c[name] / b[name] if b[name] > 0 else (1.0 if c[name] >= b[name] else 0.0)
            verdict.check(f"{name}_ratio", ratio, minimum, ratio >= minimum)
        fad_c, fad_b, details = c["fad"], b["fad"], {"candidate": c, "baseline": b}
    else:
        from audiofast.diffusion.quality import fad_between
        from audiofast.eval.fad import WhisperEmbedder

        if not settings["prompts"]:
            raise SweepConfigError("the audio lane on a non-proving-ground checkpoint needs "
                                   "prompts")
        captions = [settings["prompts"][i % len(settings["prompts"])] for i in range(spec.clips)]
        seconds = min(4.0, model.config.sample_size / model.config.sample_rate)
        sr = model.config.sample_rate
        generate_clips(model, captions[:1], seconds, seed, **run)  # warm-up
        start = time.perf_counter()
        cand = _mono16k(generate_clips(model, captions, seconds, seed, **run)[0], sr)
        cand_s = time.perf_counter() - start
        ref = _mono16k(generate_clips(baseline, captions, seconds, seed, **base)[0], sr)
        other = _mono16k(generate_clips(baseline, captions, seconds, seed + 10_000, **base)[0],
                         sr)
        embedder = WhisperEmbedder(threads=2, short_windows=True)
        fad_c, fad_b = fad_between(embedder, cand, other), fad_between(embedder, ref, other)
        details = {"candidate": {"fad": fad_c}, "baseline": {"fad": fad_b}}
    ratio = fad_c / max(fad_b, 1e-12)
    verdict.check("fad_ratio", ratio, spec.max_fad_ratio, ratio <= spec.max_fad_ratio)
    verdict.passed = all(ch["passed"] for ch in verdict.checks)
    verdict.details = details
    return {"verdict": verdict, "ratio": ratio, "s_per_clip": cand_s / spec.clips}


def _judge(settings: dict, seed: int):
    from audiofast.diffusion.quality import build_judge
    from audiofast.diffusion.teacher import SynthSet

    spec, j = settings["gate"], settings["judge"]
    key = ("judge", spec.clips, seed, j["train_clips"], j["steps"])
    if key not in _CACHE:
        reference = SynthSet.build(spec.clips, seed=2000 + seed)
        _CACHE[key] = (build_judge(reference, j["train_clips"], j["steps"]),
                       SynthSet.build(spec.clips, seed=1000 + seed))
    return _CACHE[key]


def evaluate(config: dict, settings: dict) -> dict:
    out = score(config, settings)
    v = out["verdict"]
    return {"speed": out["s_per_clip"], "quality": out["ratio"], "passed": v.passed,
            "violation": _audio_violation(v),
            "checks": v.checks, "spec": label(config), "label": label(config)}


def _audio_violation(verdict) -> float:
    """Distance from passing: FAD over its limit, accuracy ratios under theirs."""
    total = 0.0
    for c in verdict.checks:
        if not c["passed"]:
            gap = c["value"] - c["limit"] if c["name"] == "fad_ratio" else c["limit"] - c["value"]
            total += max(float(gap), 1e-6)
    return total


def confirm(config: dict, settings: dict) -> dict:
    """The chosen settings at seeds the search never used (gate seed + 1)."""
    v = score(config, settings, seed_offset=1)["verdict"]
    return {"passed": v.passed, "checks": v.checks, "spec": label(config),
            "on": f"captions and noise at seed {settings['gate'].seed + 1}"}


def compare(default: dict, chosen: dict, settings: dict) -> dict:
    out: dict = {"on": f"{settings['gate'].clips} gate captions", "runs": 1,
                 "metric": "FAD ratio"}
    for role, config in (("default", default), ("chosen", chosen)):
        s = score(config, settings)
        out[role] = {"config": config, "seconds": s["s_per_clip"], "fad_ratio": s["ratio"],
                     "quality_text": f"{s['ratio']:.3f}"}
    out["speed_ratio"] = out["default"]["seconds"] / max(out["chosen"]["seconds"], 1e-9)
    return out


def label(config: dict) -> str:
    scale = "own" if config.get("cfg_scale") is None else f"{config['cfg_scale']:.3g}"
    q = " int8" if config.get("quantization") == "int8" else ""
    return f"{config['student']} {config['sampler']} {config['steps']} steps cfg {scale}{q}"


def quality_limit(settings: dict) -> float:
    return float(settings["gate"].max_fad_ratio)
