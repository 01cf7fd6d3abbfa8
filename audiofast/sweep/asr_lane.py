"""The ASR lane of a sweep: what a trial configures, how it is timed and how it is judged.

A trial is an :class:`ASRConfig`: engine (the fused int8 decoder ``fast`` or CTranslate2
``ct2``), window pad, vocab-diet checkpoint (``vocab_keep``: 0 is the full vocabulary),
drafter and its draft length / n-gram order, precision (fast) or compute type (ct2), encoder,
beam size (ct2) and threads. Its judge spec (``fast:MODEL@int8+pad2``) carries what changes
transcripts; drafters are lossless and threads change only time, so those are timed but
judged from the transcript cache for free.

- speed: seconds to transcribe the real clips with the model loaded, median of ``runs``
  (after one untimed warm-up on the shortest clip), in the trial's configuration;
- quality: the gate's TTS WER delta against the baseline on the selection half of the gate's
  sentences; the gate's verdict there is the trial's constraint.
"""

from __future__ import annotations

import dataclasses
import gc
import os
from dataclasses import dataclass
from typing import Any

from audiofast.asr.engine import PRECISIONS  # the fast engine's: int8, int4 mixes, -kv8, fp32
from audiofast.sweep.config import existing_dir, get, section
from audiofast.sweep.params import Domain, Param, SweepConfigError

SETTING_KEYS = ("model", "baseline", "speed", "gate", "vocab_models", "draft_model")
COMPUTE_TYPES = ("int8", "int8_float32", "int16", "float32")


@dataclass(frozen=True)
class ASRConfig:
    model: str  # packaged name, directory or hub id (a vocab diet: its checkpoint directory)
    engine: str = "fast"
    window_pad: float | None = 2.0
    precision: str = "int8"  # fast engine
    compute_type: str = "int8"  # ct2 engine
    drafter: str = "none"
    draft_model: str | None = None
    draft_len: int | None = None  # the drafter's longest draft (None: its default)
    ngram_order: int | None = None  # the n-gram drafter's longest n-gram (None: its default)
    encoder: str = "ct2"
    beam_size: int = 1
    threads: int = 0
    vocab_keep: int = 0  # 0: the full vocabulary

    def spec(self) -> str:
        """The judge's spec: what decides the transcript (not drafter, not threads)."""
        if self.engine == "fast":
            spec = f"fast:{self.model}@{self.precision}"
        else:
            spec = f"{self.model}@{self.compute_type}"
        spec += {"ct2": "", "openvino": "+ov", "auto": "+auto", "fused": "+fenc"}[self.encoder]
        if self.window_pad is not None:
            spec += f"+pad{self.window_pad:g}"
        if self.engine == "ct2" and self.beam_size > 1:
            spec += f"+beam{self.beam_size}"
        return spec

    def label(self) -> str:
        parts = [self.engine, self.precision if self.engine == "fast" else self.compute_type,
                 "pad" + ("off" if self.window_pad is None else f"{self.window_pad:g}")]
        if self.vocab_keep:
            parts.append(f"vocab{self.vocab_keep}")
        if self.drafter != "none":
            parts.append(f"{self.drafter}(len {self.draft_len or '-'}"
                         + (f", n {self.ngram_order}" if self.ngram_order else "") + ")")
        if self.encoder != "ct2":
            parts.append(f"enc {self.encoder}")
        if self.beam_size > 1:
            parts.append(f"beam{self.beam_size}")
        parts.append(f"threads {self.threads or 'all'}")
        return " ".join(parts)


def load_settings(raw: dict, where: str) -> dict:
    model = get(raw, "model", str, None, where)
    if model is None:
        raise SweepConfigError(f"{where}.model: required (e.g. whisper-base)")
    settings: dict[str, Any] = {"model": _model_path(model, f"{where}.model")}
    settings["baseline"] = get(raw, "baseline", str, model, where)
    from audiofast.eval.roundtrip import parse_asr_spec

    try:
        parse_asr_spec(settings["baseline"])
    except ValueError as exc:
        raise SweepConfigError(f"{where}.baseline: {exc}") from None
    speed = section(raw, "speed", {"runs", "clips", "warmup"}, where)
    runs = get(speed, "runs", int, 3, f"{where}.speed")
    if runs < 1:
        raise SweepConfigError(f"{where}.speed.runs={runs}: must be >= 1")
    clips = get(speed, "clips", list, None, f"{where}.speed")
    if clips is not None:
        from audiofast.eval.datasets import real_speech_clips

        names = [c.name for c in real_speech_clips()]
        bad = [c for c in clips if c not in names]
        if bad or not clips:
            raise SweepConfigError(f"{where}.speed.clips: no real clip {bad[0] if bad else ''!r}"
                                   f" (have {names})")
    settings["speed"] = {"runs": runs, "clips": clips,
                         "warmup": get(speed, "warmup", bool, True, f"{where}.speed")}
    gate = section(raw, "gate", {"config", "threads", "select", "sentences", "voices",
                                 "augmentation"}, where)
    gwhere = f"{where}.gate"
    settings["gate"] = {"config": get(gate, "config", str, None, gwhere),
                        "threads": get(gate, "threads", int, 0, gwhere),
                        "select": get(gate, "select", str, "even", gwhere),
                        "sentences": get(gate, "sentences", int, None, gwhere),
                        "voices": get(gate, "voices", list, None, gwhere)}
    if "augmentation" in gate:
        settings["gate"]["augmentation"] = gate["augmentation"]
    if settings["gate"]["select"] not in ("even", "odd"):
        raise SweepConfigError(f"{gwhere}.select={gate['select']!r}: choose from ['even', 'odd']")
    if settings["gate"]["config"] and not os.path.isfile(settings["gate"]["config"]):
        raise SweepConfigError(f"{gwhere}.config: no such file: {settings['gate']['config']}")
    vocab = get(raw, "vocab_models", dict, {}, where)
    settings["vocab_models"] = {}
    for key, path in vocab.items():
        keep = int(key) if isinstance(key, str) and key.isdigit() else key
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise SweepConfigError(f"{where}.vocab_models.{key}: keys are kept-token counts")
        settings["vocab_models"][keep] = _model_path(
            existing_dir(path, f"{where}.vocab_models.{keep}"), f"{where}.vocab_models.{keep}")
    draft = raw.get("draft_model")
    settings["draft_model"] = None if draft is None else existing_dir(draft, f"{where}.draft_model")
    return settings


def _model_path(model: str, where: str) -> str:
    if any(c in model for c in "+@:"):
        raise SweepConfigError(f"{where}={model!r}: a model path may not hold '+', '@' or ':'")
    return model


def domains(settings: dict) -> dict[str, Domain]:
    return {
        "engine": Domain("choice", ("fast", "ct2")),
        "window_pad": Domain("float", low=0, high=30, nullable=True),
        "vocab_keep": Domain("int", low=0),
        "drafter": Domain("choice", ("none", "ngram", "model")),
        "draft_len": Domain("int", low=1, high=32),
        "ngram_order": Domain("int", low=1, high=8),
        "precision": Domain("choice", PRECISIONS),
        "compute_type": Domain("choice", COMPUTE_TYPES),
        "encoder": Domain("choice", ("ct2", "openvino", "auto", "fused")),
        "beam_size": Domain("int", low=1, high=16),
        "threads": Domain("int", low=0, high=1024),
    }


def check_space(space: dict[str, Param], settings: dict, where: str) -> None:
    if "vocab_keep" in space:
        for keep in space["vocab_keep"].values():
            if keep and keep not in settings["vocab_models"]:
                raise SweepConfigError(
                    f"{where}.space.vocab_keep={keep}: no checkpoint for it in vocab_models "
                    f"(have {sorted(settings['vocab_models'])}; make one: audiofast distill "
                    f"--stage vocab --keep {keep})")
            if space["vocab_keep"].kind in ("int", "float"):
                raise SweepConfigError(f"{where}.space.vocab_keep: list the kept-token counts")
    if "drafter" in space and "model" in space["drafter"].values() and not \
            settings["draft_model"]:
        raise SweepConfigError(f"{where}.space.drafter: 'model' needs draft_model (a draft "
                               "decoder from audiofast distill --stage drafter)")


def default_config(settings: dict) -> dict:
    """What ``audiofast transcribe --model MODEL`` runs with no other option."""
    import argparse

    from audiofast.asr import kernels
    from audiofast.asr.options import TranscribeOptions
    from audiofast.asr.runtime import auto_engine
    from audiofast.cli.transcribe import add_transcribe

    # Build the kernels now if they are not (a minute, once): a sweep must compare against the
    # default a set-up machine runs, and `auto` picks CTranslate2 while they are unbuilt (the
    # first whisper-base pipeline run measured a CTranslate2 "default" that way).
    kernels.backend()

    parser = argparse.ArgumentParser()
    add_transcribe(parser.add_subparsers())
    args = parser.parse_args(["transcribe", "-"])
    engine = args.engine if args.engine != "auto" else auto_engine(
        TranscribeOptions(beam_size=args.beam_size, batch_size=args.batch_size),
        args.compute_type, args.precision, args.drafter)
    return dataclasses.asdict(ASRConfig(
        settings["model"], engine, args.window_pad, args.precision or "int8", args.compute_type,
        args.drafter, None, None, None, args.encoder, args.beam_size, args.threads))


def suggest(trial, space: dict[str, Param], settings: dict) -> dict:
    """The trial's configuration: parameters not in ``space`` keep transcribe's defaults; the
    engine's own ones are asked only where they apply (conditional space)."""
    base = default_config(settings)

    def ask(name: str) -> Any:
        return space[name].suggest(trial) if name in space else base[name]

    cfg = dict(base, engine=ask("engine"), window_pad=ask("window_pad"),
               encoder=ask("encoder"), threads=ask("threads"))
    if cfg["engine"] == "fast":
        # (the vocab diet only here: CTranslate2 cannot detect the language with a diet
        # model, whose language tokens are renumbered, and the gate does not name one)
        cfg |= {"precision": ask("precision"), "drafter": ask("drafter"), "beam_size": 1,
                "vocab_keep": ask("vocab_keep")}
        if cfg["drafter"] != "none":
            cfg["draft_len"] = ask("draft_len") if "draft_len" in space else None
        if cfg["drafter"] == "ngram":
            cfg["ngram_order"] = ask("ngram_order") if "ngram_order" in space else None
        if cfg["drafter"] == "model":
            cfg["draft_model"] = settings["draft_model"]
    else:
        cfg |= {"compute_type": ask("compute_type"), "beam_size": ask("beam_size"),
                "drafter": "none"}
    if cfg["vocab_keep"]:
        cfg["model"] = settings["vocab_models"][cfg["vocab_keep"]]
    return cfg


def gate_config(settings: dict) -> dict:
    from pathlib import Path

    from audiofast.eval.gate import load_config

    g = settings["gate"]
    config = load_config(Path(g["config"]) if g["config"] else None)
    if g["voices"]:
        config["asr"]["voices"] = list(g["voices"])
    if "augmentation" in g:
        config["asr"]["augmentation"] = g["augmentation"]
    return config


def gate_halves(settings: dict) -> tuple[dict, list[str], list[str]]:
    from audiofast.sweep.split import halves

    config = gate_config(settings)
    g = settings["gate"]
    return (config, *halves(config, g["select"], g["sentences"]))


def violation(verdict) -> float:
    """How far a verdict is from passing (0: passed), a constraint Optuna can rank by."""
    if verdict.passed:
        return 0.0
    total = 0.0
    for c in verdict.checks:
        if not c["passed"]:
            over = c["value"] - c["limit"] if not isinstance(c["value"], bool) else 1.0
            total += max(float(over), 1e-6)
    return total


def evaluate(config: dict, settings: dict) -> dict:
    """Gate on the selection half (quality, constraint), then time on the real clips."""
    from audiofast.eval.gate import gate_asr
    from audiofast.sweep.asr_runtime import measure_speed, set_threads, speed_clips

    c = ASRConfig(**config)
    gcfg, selection, _ = gate_halves(settings)
    set_threads(ASRConfig(c.model, threads=settings["gate"]["threads"]))  # the judge's own
    verdict = gate_asr(c.spec(), settings["baseline"], gcfg, settings["gate"]["threads"],
                       texts=selection, anchors=False)
    gc.collect()
    speed = measure_speed(c, speed_clips(settings), settings["speed"]["runs"],
                          settings["speed"]["warmup"])
    return {"speed": speed["seconds"], "quality": verdict.details["delta"]["tts"]["delta"],
            "passed": verdict.passed, "violation": violation(verdict),
            "checks": verdict.checks, "runs": speed["runs"], "spec": c.spec(),
            "label": c.label()}


def label(config: dict) -> str:
    return ASRConfig(**config).label()


def quality_limit(settings: dict) -> float:
    """The gate's limit on the quality objective (the plot's dashed line), as it applies to
    the selection half (widened for its fewer sentences: gate.limit_scale)."""
    from audiofast.eval.gate import limit_scale

    config, selection, _ = gate_halves(settings)
    return float(config["asr"]["max_tts_wer_delta"]) * limit_scale(config["asr"], len(selection))
