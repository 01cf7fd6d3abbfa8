"""Batch-invariant int8 linears: a row's output does not depend on the rows sharing its call.

fbgemm's dynamic int8 linear picks one activation scale from the min/max of the whole input,
so a token verified together with draft rows is quantized differently from the same token
decoded alone, and a near-tie argmax can flip: int8 drafting changed a word on 2 of the 4 real
clips before this module. Fixing the scale makes each row's integer arithmetic independent of
its neighbours: inputs are clamped to a calibrated range and one *anchor* row holding the
range's two ends is appended, so the min/max the kernel sees is always that range (the extra
row is nearly free: a verify call is memory-bound on the weights, not on rows).

The ranges are calibrated once per model by recording every linear's input min/max while
decoding speech, widened by a margin, and cached as JSON.
"""

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

MARGIN = 1.25  # calibrated extremes are widened by this much before clamping


class InvariantInt8Linear(nn.Module):
    """A dynamic int8 linear with a fixed activation range (or recording one, until fixed).

    Plain attributes (no Optional tuples) so that TorchScript can compile the decoder step."""

    def __init__(self, qlinear: nn.Module, in_features: int):
        super().__init__()
        self.qlinear = qlinear
        self.in_features = in_features
        self.fixed = False
        self.low, self.high = 0.0, 0.0  # the clamp range, once fixed
        self.seen_low, self.seen_high = math.inf, -math.inf  # extremes recorded so far
        self.anchor = torch.zeros(1, in_features)

    def set_range(self, low: float, high: float) -> None:
        self.low, self.high = min(low, 0.0), max(high, 0.0)  # the kernel's range holds zero
        self.anchor = torch.zeros(1, self.in_features)
        self.anchor[0, 0], self.anchor[0, 1] = self.low, self.high
        self.fixed = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fixed:
            x = torch.cat([x.clamp(self.low, self.high), self.anchor])
            return self.qlinear(x)[:-1]
        self.seen_low = min(self.seen_low, float(x.min()))
        self.seen_high = max(self.seen_high, float(x.max()))
        return self.qlinear(x)


def make_invariant(module: nn.Module, skip: tuple[str, ...] = ()) -> list[str]:
    """Wrap every dynamic-int8 linear under ``module`` except those whose name ends with one
    of ``skip``; the wrapped names, in order."""
    names = []
    for name, child in list(module.named_modules()):
        if isinstance(child, torch.ao.nn.quantized.dynamic.Linear) and not name.endswith(skip):
            parent_name, _, attr = name.rpartition(".")
            parent = module.get_submodule(parent_name) if parent_name else module
            setattr(parent, attr, InvariantInt8Linear(child, child.in_features))
            names.append(name)
    return names


def _linears(module: nn.Module) -> dict[str, InvariantInt8Linear]:
    return {n: m for n, m in module.named_modules() if isinstance(m, InvariantInt8Linear)}


def ranges(module: nn.Module) -> dict[str, list[float]]:
    return {name: [m.low, m.high] for name, m in _linears(module).items() if m.fixed}


def load_ranges(module: nn.Module, table: dict[str, list[float]]) -> None:
    linears = _linears(module)
    if set(table) != set(linears):
        raise ValueError("int8 range table does not match the model's linears "
                         "(delete the cached table to recalibrate)")
    for name, (low, high) in table.items():
        linears[name].set_range(low, high)


@contextmanager
def calibrating(module: nn.Module, margin: float = MARGIN) -> Iterator[None]:
    """Record input extremes while the body runs (plain dynamic int8), then fix the ranges."""
    linears = _linears(module)
    for m in linears.values():
        m.fixed, m.seen_low, m.seen_high = False, math.inf, -math.inf
    yield
    for name, m in linears.items():
        if m.seen_low > m.seen_high:
            raise RuntimeError(f"calibration never ran {name}: decode at least one token")
        m.set_range(m.seen_low * margin, m.seen_high * margin)


def cached_ranges(module: nn.Module, path: Path, calibrate: Callable[[], None]) -> None:
    """Load the range table at ``path``, or calibrate with ``calibrate()`` and save it."""
    if path.is_file():
        load_ranges(module, json.loads(path.read_text()))
        return
    with calibrating(module):
        calibrate()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(ranges(module), f)
    os.replace(tmp, path)
