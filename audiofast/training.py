"""A resumable training loop: atomic checkpoints, exact resume, progress and a loss log
(EMA from diffusers' ``EMAModel``; data-parallel gradient averaging under accelerate).

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


def _check_state(model: torch.nn.Module, state: Mapping[str, torch.Tensor], where: Path) -> None:
    """A checkpoint of another architecture: one line naming the first key that differs."""
    own = model.state_dict()
    for key, value in own.items():
        if key not in state:
            raise RuntimeError(f"{where}: checkpoint of another architecture: no {key}")
        if tuple(state[key].shape) != tuple(value.shape):
            raise RuntimeError(f"{where}: checkpoint of another architecture: {key} has shape "
                               f"{list(state[key].shape)}, this model {list(value.shape)}")
    extra = [k for k in state if k not in own]
    if extra:
        raise RuntimeError(f"{where}: checkpoint of another architecture: unexpected {extra[0]}")


class GradientSync:
    """Data-parallel glue for :func:`train` under ``accelerate launch``: averages gradients and
    losses over processes; only the main process writes checkpoints and logs."""

    def __init__(self, accelerator):  # an accelerate.Accelerator
        self.accelerator = accelerator

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def mean(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(tensor.detach().clone(), reduction="mean")

    def average_gradients(self, params: list[torch.nn.Parameter]) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = self.mean(torch.cat([g.reshape(-1) for g in grads]))
        offset = 0
        for p, g in zip(params, grads, strict=True):
            p.grad = flat[offset : offset + g.numel()].view_as(g).to(g.dtype)
            offset += g.numel()

    def barrier(self) -> None:
        self.accelerator.wait_for_everyone()


def train(
    model: torch.nn.Module,
    step_fn: StepFn,
    opts: TrainOptions,
    checkpoint: str | Path,
    desc: str = "train",
    params: list[torch.nn.Parameter] | None = None,
    sync: GradientSync | None = None,
    companion: Any = None,
) -> torch.nn.Module:
    """Train ``model`` for ``opts.steps`` steps of ``step_fn``, resuming from ``checkpoint`` if
    it exists. Returns the EMA copy of the model when ``opts.ema_decay`` is set, else the model.

    A ``<checkpoint>.log.jsonl`` beside the checkpoint gets one line per step. With ``sync``
    (several processes), each step's gradients and loss are averaged over processes before
    the update, so every process keeps the same weights. A ``companion`` (anything with
    ``state_dict()`` / ``load_state_dict()``, e.g. DMD's critic and its optimizer, which the
    step updates itself) is saved in the same checkpoint and restored with it.
    """
    main = sync is None or sync.is_main
    checkpoint = Path(checkpoint)
    params = [p for p in (params or model.parameters()) if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=opts.lr, weight_decay=opts.weight_decay)
    ema = None
    if opts.ema_decay is not None:  # diffusers' EMA: decay min(ema_decay, (1 + k) / (10 + k))
        from diffusers.training_utils import EMAModel

        ema = EMAModel(params, decay=opts.ema_decay)
    start = 0
    if checkpoint.is_file():
        try:
            state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        except Exception as exc:  # not written by save_atomic: say which file, in one line
            raise RuntimeError(
                f"{checkpoint}: unreadable checkpoint ({type(exc).__name__}); delete it to "
                "start this stage over"
            ) from None
        _check_state(model, state["model"], checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if ema is not None:
            ema.load_state_dict(state["ema"])
        if companion is not None:
            companion.load_state_dict(state["companion"])
        start = int(state["step"])
    log_path = checkpoint.with_name(checkpoint.name + ".log.jsonl")
    if not main:
        log_path = Path(os.devnull)
    elif log_path.is_file():  # drop lines of steps past the checkpoint: they will be redone
        kept = [ln for ln in log_path.read_text().splitlines() if _logged_step(ln) < start]
        log_path.write_text("".join(line + "\n" for line in kept))

    def save(step: int) -> None:
        if not main:
            return
        state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
        if ema is not None:
            state["ema"] = ema.state_dict()
        if companion is not None:
            state["companion"] = companion.state_dict()
        save_atomic(state, checkpoint)

    model.train()
    bar = tqdm(range(start, opts.steps), initial=start, total=opts.steps, desc=desc,
               disable=not main)
    with log_path.open("a", encoding="utf-8") as log:
        for step in bar:
            for group in optimizer.param_groups:
                group["lr"] = opts.lr * _lr_factor(step, opts)
            loss, extra = step_fn(step, step_generator(opts.seed, step))
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{desc}: loss is {loss.item()} at step {step}")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if sync is not None:
                sync.average_gradients(params)
                loss = sync.mean(loss)
            torch.nn.utils.clip_grad_norm_(params, opts.grad_clip)
            optimizer.step()
            if ema is not None:
                ema.step(params)
            record = {"step": step, "loss": round(loss.item(), 6)} | extra
            log.write(json.dumps(record) + "\n")
            bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
            if (step + 1) % opts.checkpoint_every == 0 or step + 1 == opts.steps:
                log.flush()
                save(step + 1)
                if sync is not None:
                    sync.barrier()
    model.eval()
    if ema is None:
        return model
    averaged = copy.deepcopy(model).requires_grad_(False)
    by_id = {id(p): name for name, p in model.named_parameters()}
    named = dict(averaged.named_parameters())
    ema.copy_to([named[by_id[id(p)]] for p in params])
    return averaged.eval()
