"""A resumable training loop: atomic checkpoints, exact resume, progress and a loss log.

Every stage that trains (the teacher's autoencoder and DiT, later the distillation stages) runs
through :func:`train`. Randomness for step ``k`` comes from a generator seeded with
``(seed, k)``, so a run killed at any point and resumed from its last checkpoint replays the
same batches and noise as an uninterrupted run would. Checkpoints are written to a temporary
file and renamed over the old one, so a kill mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

# A step gets (step index, its generator) and returns the loss tensor to backpropagate plus
# any extra numbers to log.
StepFn = Callable[[int, torch.Generator], tuple[torch.Tensor, dict[str, float]]]


@dataclass(frozen=True)
class TrainOptions:
    steps: int
    lr: float = 3e-4
    warmup: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    ema_decay: float | None = None  # keep an exponential moving average of the weights
    checkpoint_every: int = 50
    seed: int = 0


def save_atomic(state: Mapping[str, Any], path: str | Path) -> None:
    """``torch.save`` to a temporary file in the same directory, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(dict(state), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def step_generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def _logged_step(line: str) -> int:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return 1 << 62  # a torn last line from a kill: dropped


def _lr_factor(step: int, opts: TrainOptions) -> float:
    """Linear warm-up, then cosine decay to 10% at the last step."""
    if step < opts.warmup:
        return (step + 1) / opts.warmup
    progress = (step - opts.warmup) / max(opts.steps - opts.warmup, 1)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def train(
    model: torch.nn.Module,
    step_fn: StepFn,
    opts: TrainOptions,
    checkpoint: str | Path,
    desc: str = "train",
    params: list[torch.nn.Parameter] | None = None,
) -> torch.nn.Module:
    """Train ``model`` for ``opts.steps`` steps of ``step_fn``, resuming from ``checkpoint`` if
    it exists. Returns the EMA copy of the model when ``opts.ema_decay`` is set, else the model.

    A ``<checkpoint>.log.jsonl`` beside the checkpoint gets one line per step.
    """
    checkpoint = Path(checkpoint)
    params = [p for p in (params or model.parameters()) if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=opts.lr, weight_decay=opts.weight_decay)
    ema = None
    if opts.ema_decay is not None:
        ema = copy.deepcopy(model).requires_grad_(False)
    start = 0
    if checkpoint.is_file():
        try:
            state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        except Exception as exc:  # not written by save_atomic: say which file, in one line
            raise RuntimeError(
                f"{checkpoint}: unreadable checkpoint ({type(exc).__name__}); delete it to "
                "start this stage over"
            ) from None
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if ema is not None:
            ema.load_state_dict(state["ema"])
        start = int(state["step"])
    log_path = checkpoint.with_name(checkpoint.name + ".log.jsonl")
    if log_path.is_file():  # drop lines of steps past the checkpoint: they will be redone
        kept = [ln for ln in log_path.read_text().splitlines() if _logged_step(ln) < start]
        log_path.write_text("".join(line + "\n" for line in kept))

    def save(step: int) -> None:
        state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
        if ema is not None:
            state["ema"] = ema.state_dict()
        save_atomic(state, checkpoint)

    model.train()
    bar = tqdm(range(start, opts.steps), initial=start, total=opts.steps, desc=desc)
    with log_path.open("a", encoding="utf-8") as log:
        for step in bar:
            for group in optimizer.param_groups:
                group["lr"] = opts.lr * _lr_factor(step, opts)
            loss, extra = step_fn(step, step_generator(opts.seed, step))
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{desc}: loss is {loss.item()} at step {step}")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, opts.grad_clip)
            optimizer.step()
            if ema is not None:
                decay = min(opts.ema_decay, (1 + step) / (10 + step))
                with torch.no_grad():
                    for e, p in zip(ema.parameters(), model.parameters(), strict=True):
                        e.lerp_(p, 1 - decay)
            record = {"step": step, "loss": round(loss.item(), 6)} | extra
            log.write(json.dumps(record) + "\n")
            bar.set_postfix(loss=f"{loss.item():.4f}")
            if (step + 1) % opts.checkpoint_every == 0 or step + 1 == opts.steps:
                log.flush()
                save(step + 1)
    model.eval()
    return (ema if ema is not None else model).eval()
