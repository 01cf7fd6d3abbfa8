"""``audiofast distill``: the ASR lane's vocab-diet, drafter and int4 QAD stages and the
Stable Audio 3 lane's cfg / steps / qad stages, each a thin shell over its library call."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def add_distill(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "distill", help="train a faster model from a full one (resumable)",
        description="ASR: vocab, drafter, qad --lane asr --bits 4 (int4 decoder). Stable Audio "
        "3: cfg (fold guidance), steps (fewer sampler steps), qad (int8 quantization-aware "
        "distillation). SA3 stages and ASR qad end with a gate and exit 1 when it fails.")
    p.add_argument("--stage", choices=["vocab", "drafter", "cfg", "steps", "qad", "times"],
                   required=True,
                   help="vocab: cut the output vocabulary and recover; drafter: draft decoder; "
                   "cfg / steps / qad: the SA3 stages (qad --lane asr: the Whisper decoder); "
                   "times: search a distilled SA3 student's sampling times (no training)")
    p.add_argument("--lane", choices=["asr", "sa3"], default=None,
                   help="for qad: which lane (default: sa3; --bits implies asr)")
    p.add_argument("--kind", choices=["model", "block"], default=None,
                   help="drafter: a 2-layer draft decoder (model, default) or a block drafter "
                   "that guesses several tokens per pass from the target's hidden state (block)")
    p.add_argument("--bits", type=int, choices=[4], default=None,
                   help="ASR qad: the decoder layers' weight bits")
    p.add_argument("--head-bits", type=int, choices=[8, 4], default=8,
                   help="ASR qad: the output head's weight bits (4: rounded, not trained)")
    p.add_argument("--rounding", choices=["nearest", "gptq"], default=None,
                   help="ASR qad: how the int4 layers are first rounded: to the nearest grid "
                   "value (default) or with GPTQ on the training clips; --steps 0 exports that")
    p.add_argument("--model", default=None,
                   help="ASR target (default: whisper-base) or SA3 parent checkpoint directory")
    p.add_argument("--keep", type=int, default=8000,
                   help="vocab: tokens to keep; drafter: tokens its cut output head can draft")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps (vocab: 0 = slice only; qad: 0 = int8 without training)")
    p.add_argument("--lr", type=float, default=None, help="ASR stages: learning rate")
    p.add_argument("--sentences", type=int, default=None,
                   help="domain sentences spoken for training (default: the stage's recipe)")
    p.add_argument("--corpus", choices=["flite", "varied"], default=None,
                   help="vocab, ASR qad: the spoken training clips: flite's four voices "
                        "(default) or every TTS voice at several rates with noise, reverb "
                        "and telephone augmentations (varied)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="data and checkpoints; rerun the same command to resume after a kill")
    p.add_argument("--out", type=Path, default=None, help="output folder")
    p.add_argument("--threads", type=int, default=0)
    sa3 = p.add_argument_group("Stable Audio 3 stages")
    sa3.add_argument("--config", type=Path, default=None,
                     help="stage YAML (default: configs/distill/<stage>.yaml)")
    sa3.add_argument("--cfg", type=float, default=None, help="cfg: the guidance scale to fold")
    sa3.add_argument("--cfg-range", type=float, nargs=2, metavar=("LO", "HI"), default=None,
                     help="cfg: fold every scale in [LO, HI] (a guidance-scale embedding)")
    sa3.add_argument("--from", dest="from_steps", type=int, default=None,
                     help="steps: the parent's sampler steps")
    sa3.add_argument("--to", dest="to_steps", type=int, default=None,
                     help="steps: the student's sampler steps; times: search this many steps "
                     "(default: the student's own)")
    sa3.add_argument("--method", choices=["progressive", "dmd"], default=None,
                     help="steps: progressive distillation (default) or DMD2-style distribution "
                     "matching with an adversarial critic (configs/distill/steps-dmd.yaml)")
    sa3.add_argument("--times", type=float, nargs="+", default=None,
                     help="times: use these sampler times (1 ... 0) instead of searching; "
                     "steps: train the student at these times (e.g. a search's) instead of "
                     "every other parent time")
    sa3.add_argument("--trials", type=int, default=40,
                     help="times: how many time sets the search may score")
    sa3.add_argument("--batch", type=int, default=None, help="training batch (all processes)")
    sa3.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    sa3.add_argument("--baseline", default=None,
                     help="what the gate compares against (default: the first non-student "
                     "checkpoint up the parent chain)")
    sa3.add_argument("--no-gate", action="store_true", help="skip the gate at the end")
    p.set_defaults(run=_run_distill)


def _run_distill(args: argparse.Namespace) -> int:
    if args.kind is not None and args.stage != "drafter":
        raise SystemExit(f"audiofast: error: --kind is for --stage drafter, not {args.stage}")
    asr_qad = args.stage == "qad" and (args.lane == "asr" or args.bits is not None)
    if args.corpus is not None and not (args.stage == "vocab" or asr_qad):
        raise SystemExit("audiofast: error: --corpus is for --stage vocab and --stage qad "
                         f"--lane asr, not {args.stage}")
    if asr_qad:
        return _run_qad_asr(args)
    if args.stage in ("cfg", "steps", "qad"):
        return _run_distill_sa3(args)
    if args.stage == "times":
        return _run_time_search(args)
    from audiofast.distill.asr import DrafterRecipe, VocabDietRecipe, distill_drafter, distill_vocab

    given = _asr_recipe_overrides(args)
    workdir = args.workdir or Path("runs/distill")
    if args.stage == "vocab":
        recipe = VocabDietRecipe(keep=args.keep, **given)
        out = distill_vocab(args.model, recipe, workdir, args.out, args.threads)
    elif args.kind == "block":
        from audiofast.distill.asr_block import BlockDrafterRecipe, distill_block_drafter

        recipe = BlockDrafterRecipe(head_keep=args.keep, **given)
        out = distill_block_drafter(args.model, recipe, workdir, args.out, args.threads)
    else:
        recipe = DrafterRecipe(head_keep=args.keep, **given)
        out = distill_drafter(args.model, recipe, workdir, args.out, args.threads)
    print(out)
    return 0


def _asr_recipe_overrides(args: argparse.Namespace) -> dict:
    """The recipe fields the command line set; the rest keep the stage's recipe defaults."""
    return {k: v for k, v in (("steps", args.steps), ("lr", args.lr),
                              ("train_sentences", args.sentences), ("corpus", args.corpus))
            if v is not None}


def _run_qad_asr(args: argparse.Namespace) -> int:
    from audiofast.distill.asr_qad import QadRecipe, distill_qad
    from audiofast.eval.gate import gate_asr, load_config

    precision = "int4" if args.head_bits == 4 else "int4-head8"
    rounding = {"rounding": args.rounding} if args.rounding else {}
    recipe = QadRecipe(precision=precision, **_asr_recipe_overrides(args), **rounding)
    model = args.model or "whisper-base"
    out = distill_qad(model, recipe, args.workdir or Path("runs/distill"), args.out, args.threads)
    print(out)
    if args.no_gate:
        return 0
    verdict = gate_asr(f"fast:{out}", model, load_config(), threads=args.threads)
    verdict.write(out / "gate")
    print(verdict.markdown())
    return 0 if verdict.passed else 1


def _run_distill_sa3(args: argparse.Namespace) -> int:
    import torch

    from audiofast.diffusion.checkpoint import CheckpointError
    from audiofast.diffusion.config_schema import ConfigError
    from audiofast.diffusion.distill import run_stage
    from audiofast.diffusion.distill_config import StageConfigError, load_stage_config

    if args.model is None:
        raise SystemExit("audiofast: error: --model: the parent checkpoint directory is required")
    guidance = {k: v for k, v in (("scale", args.cfg), ("range", args.cfg_range)) if v is not None}
    if "range" in guidance and "scale" not in guidance:
        guidance["scale"] = sum(guidance["range"]) / 2
    sampler = {k: v for k, v in (("parent_steps", args.from_steps), ("steps", args.to_steps),
                                 ("times", args.times)) if v is not None}
    train = {k: v for k, v in (("steps", args.steps), ("batch", args.batch)) if v is not None}
    try:
        if args.method not in (None, "progressive") and args.stage != "steps":
            raise StageConfigError(f"--method {args.method}: only --stage steps has methods")
        cfg = load_stage_config(args.stage, args.config, args.method).replace(
            guidance=guidance, sampler=sampler, train=train,
            gate={"enabled": False} if args.no_gate else {})
    except StageConfigError as e:
        raise SystemExit(f"audiofast: error: {e}") from None
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("audiofast: error: --device cuda: no CUDA device is available")
    accelerator = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under accelerate launch / torchrun
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=args.device == "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    out = args.out or Path("runs/students") / args.stage
    workdir = args.workdir or Path("runs/distill")
    try:
        result = run_stage(args.stage, args.model, cfg, out, workdir, args.device,
                           args.baseline, accelerator)
    except (CheckpointError, ConfigError, StageConfigError, ValueError) as e:
        raise SystemExit(f"audiofast: error: {e}") from None
    if accelerator is not None and not accelerator.is_main_process:
        return 0
    print(result.checkpoint)
    if result.gate_passed is False:
        print(f"audiofast: gate FAILED: see {result.checkpoint / 'gate' / 'gate.md'}",
              file=sys.stderr)
        return 1
    return 0


def _run_time_search(args: argparse.Namespace) -> int:
    import torch

    from audiofast.diffusion import time_search as ts
    from audiofast.diffusion.checkpoint import CheckpointError
    from audiofast.diffusion.distill import gate_stage, root_baseline
    from audiofast.diffusion.distill_config import load_stage_config
    from audiofast.diffusion.generate import load_for_generation
    from audiofast.diffusion.stage_gate import is_proving_ground

    if args.model is None:
        raise SystemExit("audiofast: error: --model: the student checkpoint directory is required")
    torch.set_num_threads(args.threads or torch.get_num_threads())
    cfg = load_stage_config("steps")
    baseline = args.baseline or root_baseline(args.model)
    out = args.out or Path("runs/students") / f"{Path(args.model).name}-times"
    try:
        student = load_for_generation(args.model)
        own = student.config.student.sampler if student.config.student else None
        if own is None:
            raise ValueError(f"{args.model} is not a distilled student (no sampler times)")
        if args.times:
            times, record = tuple(args.times), {"times": list(args.times), "searched": False}
            ts.with_times(student, times)  # the same checks as a searched set
        elif not is_proving_ground(student):
            raise ValueError("the time search scores on the proving ground's captioned clips: "
                             "give this checkpoint its times with --times")
        else:
            steps = args.to_steps or own.steps  # fewer steps than it was distilled for: --to
            start = own.times if steps == own.steps else tuple(ts.time_grid(student, steps))
            grid = ts.time_grid(student, 4 * own.steps)
            calibration = {"model": str(args.model), "baseline": str(baseline),
                           "clips": cfg.gate.clips, "seed": ts.CALIBRATION_SEED}
            judge = ts.CalibrationJudge(student, load_for_generation(baseline), cfg.gate,
                                        clips=cfg.gate.clips)
            times, trials = ts.search_times(judge, grid, start, cfg.gate,
                                            (args.workdir or Path("runs/distill")) / "times",
                                            max_trials=args.trials, calibration=calibration)
            record = {"times": list(times), "searched": True, "start": list(start),
                      "grid": grid, "trials": [vars(t) for t in trials]}
    except (CheckpointError, ValueError) as e:
        raise SystemExit(f"audiofast: error: {e}") from None
    ts.export_with_times(args.model, times, out, record)
    print(out)
    if args.no_gate:
        return 0
    if not gate_stage(out, baseline, cfg):
        print(f"audiofast: gate FAILED: see {out / 'gate' / 'gate.md'}", file=sys.stderr)
        return 1
    return 0
