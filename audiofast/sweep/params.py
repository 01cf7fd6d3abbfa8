"""Search-space entries of a sweep YAML, checked against what each lane parameter can take.

In ``space:`` a list is a set of choices (``engine: [fast, ct2]``), a mapping is a range
(``draft_len: {low: 2, high: 10}``, optional ``step`` and ``log``) and a scalar fixes the
value. Every value is checked against the parameter's :class:`Domain` when the YAML loads, so
a bad range is one line naming it before any trial runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class SweepConfigError(ValueError):
    """A malformed sweep or pipeline YAML, or an unusable storage (one line, naming it)."""


@dataclass(frozen=True)
class Domain:
    """The values a lane parameter may take: ``choice`` among ``choices``, or an ``int`` /
    ``float`` in ``[low, high]`` (None: unbounded); ``nullable`` also allows null."""

    kind: str
    choices: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    nullable: bool = False
    help: str = ""

    def check(self, value: Any, where: str) -> Any:
        if value is None:
            if self.nullable:
                return None
            raise SweepConfigError(f"{where}: null is not allowed")
        if self.kind == "choice":
            if value not in self.choices:
                raise SweepConfigError(f"{where}={value!r}: choose from {list(self.choices)}")
            return value
        numeric = (int,) if self.kind == "int" else (int, float)
        if isinstance(value, bool) or not isinstance(value, numeric):
            raise SweepConfigError(f"{where}={value!r}: expected {self.kind}")
        if self.low is not None and value < self.low or self.high is not None and value > \
                self.high:
            raise SweepConfigError(f"{where}={value!r}: out of range [{_fmt(self.low)}, "
                                   f"{_fmt(self.high)}]")
        return float(value) if self.kind == "float" else value


def _fmt(bound: float | None) -> str:
    return "inf" if bound is None else f"{bound:g}"


@dataclass(frozen=True)
class Param:
    """One searched (or fixed) parameter."""

    name: str
    kind: str  # "fixed", "categorical", "int" or "float"
    choices: tuple[Any, ...] = ()
    low: float = 0
    high: float = 0
    step: float | None = None
    log: bool = False
    value: Any = None  # kind "fixed"

    def suggest(self, trial) -> Any:
        if self.kind == "fixed":
            return self.value
        if self.kind == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high),
                                     step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)

    def contains(self, value: Any) -> bool:
        if self.kind == "fixed":
            return value == self.value
        if self.kind == "categorical":
            return value in self.choices
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.kind == "int" and not float(value).is_integer():
            return False
        if not self.low <= value <= self.high:
            return False
        return not self.step or math.isclose((value - self.low) / self.step,
                                             round((value - self.low) / self.step))

    def values(self) -> list[Any]:
        """The values it can take, for reports (a range: its ends)."""
        if self.kind == "fixed":
            return [self.value]
        if self.kind == "categorical":
            return list(self.choices)
        return [self.low, self.high]

    def describe(self) -> str:
        if self.kind in ("fixed", "categorical"):
            return ", ".join("null" if v is None else str(v) for v in self.values())
        extra = f" step {self.step:g}" if self.step else ""
        return f"{self.low:g} .. {self.high:g}{extra}{' (log)' if self.log else ''}"


RANGE_KEYS = {"low", "high", "step", "log"}


def parse_param(name: str, raw: Any, domain: Domain, where: str) -> Param:
    """A :class:`Param` from its YAML value, every value checked against ``domain``."""
    if isinstance(raw, list):
        if not raw:
            raise SweepConfigError(f"{where}: an empty list of choices")
        values = tuple(domain.check(v, f"{where}[{i}]") for i, v in enumerate(raw))
        if len(set(map(repr, values))) != len(values):
            raise SweepConfigError(f"{where}={raw!r}: a choice is listed twice")
        if len(values) == 1:
            return Param(name, "fixed", value=values[0])
        return Param(name, "categorical", choices=values)
    if isinstance(raw, dict):
        return _parse_range(name, raw, domain, where)
    return Param(name, "fixed", value=domain.check(raw, where))


def _parse_range(name: str, raw: dict, domain: Domain, where: str) -> Param:
    unknown = sorted(set(raw) - RANGE_KEYS)
    if unknown:
        raise SweepConfigError(f"{where}.{unknown[0]}: unknown range key (known: "
                               f"{sorted(RANGE_KEYS)})")
    if domain.kind == "choice":
        raise SweepConfigError(f"{where}: a range needs a numeric parameter; list the choices "
                               f"({list(domain.choices)})")
    if "low" not in raw or "high" not in raw:
        raise SweepConfigError(f"{where}: a range needs low and high")
    low = domain.check(raw["low"], f"{where}.low")
    high = domain.check(raw["high"], f"{where}.high")
    if low is None or high is None:
        raise SweepConfigError(f"{where}: low and high must be numbers")
    if low > high:
        raise SweepConfigError(f"{where}: low {low:g} > high {high:g}")
    step, log = raw.get("step"), raw.get("log", False)
    if not isinstance(log, bool):
        raise SweepConfigError(f"{where}.log={log!r}: expected true or false")
    if step is not None:
        ok = (int,) if domain.kind == "int" else (int, float)
        if isinstance(step, bool) or not isinstance(step, ok) or step <= 0:
            raise SweepConfigError(f"{where}.step={step!r}: expected a {domain.kind} > 0")
        if log:
            raise SweepConfigError(f"{where}: step and log cannot be combined")
        if not math.isclose((high - low) / step, round((high - low) / step)):
            raise SweepConfigError(f"{where}: high - low is not a multiple of step {step:g}")
    if log and low <= 0:
        raise SweepConfigError(f"{where}: a log range needs low > 0")
    return Param(name, domain.kind, low=low, high=high,
                 step=None if step is None else (int(step) if domain.kind == "int" else step),
                 log=log)
