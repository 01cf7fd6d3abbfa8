"""``audiofast generate``: text to audio with a Stable Audio 3 checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="text to audio with a Stable Audio 3 checkpoint")
    p.add_argument("prompt")
    p.add_argument("--model", default=None,
                   help="checkpoint directory (model_config.json + model.safetensors) or hub id")
    p.add_argument("--preset", default=None, metavar="NAME",
                   help="a configuration chosen by 'audiofast sweep' (model, steps, cfg, "
                   "sampler, int8): sets the options left at their defaults")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--steps", type=int, default=None,
                   help="sampler steps (default: the checkpoint's own, else 8)")
    p.add_argument("--cfg", type=float, default=None,
                   help="guidance scale (default 1: no CFG; a CFG-folded student: its scale)")
    p.add_argument("--sampler", choices=["pingpong", "euler"], default=None,
                   help="default: the checkpoint's (pingpong for post-trained models)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("out.wav"))
    p.set_defaults(run=_run_generate, preset_defaults={
        k: p.get_default(k) for k in ("model", "steps", "cfg", "sampler")})


def _run_generate(args: argparse.Namespace) -> int:
    from audiofast.diffusion.checkpoint import CheckpointError
    from audiofast.diffusion.generate import generate, load_for_generation, save_audio
    from audiofast.sweep.preset import apply_cli_preset

    extra = apply_cli_preset(args, "audio")
    if args.model is None:
        raise SystemExit("audiofast: error: --model (or a --preset naming one) is required")
    try:
        model = load_for_generation(args.model)
        if extra.get("quantization") == "int8" and not (
                model.config.student and model.config.student.quantization):
            from audiofast.diffusion.int8 import quantize_dit

            quantize_dit(model.dit)  # post-training int8 of a float checkpoint
        audio = generate(model, [args.prompt], seconds=args.seconds, steps=args.steps,
                         cfg_scale=args.cfg, sampler=args.sampler, seed=args.seed)
    except (CheckpointError, ValueError) as e:
        raise SystemExit(f"audiofast: error: {e}") from None
    path = save_audio(args.out, audio[0], model.config.sample_rate)
    print(path)
    return 0
