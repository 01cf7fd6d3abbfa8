"""The sweep YAML (``configs/sweeps/*.yaml``), checked as a whole before any trial runs.

Common keys: ``lane`` (asr | audio), ``study``, ``trials``, ``seed``, ``storage``, ``workers``,
``out``, ``preset``, ``budgets``, ``choose``, ``heartbeat`` and ``space``; the lane's own keys
are read by its module (:mod:`asr_lane`, :mod:`audio_lane`). An unknown key, a parameter the
lane does not have, or a value out of range is a one-line :class:`SweepConfigError`.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audiofast.sweep.params import Param, SweepConfigError, parse_param
from audiofast.yaml_file import read_yaml_mapping

COMMON_KEYS = {"lane", "study", "trials", "seed", "storage", "workers", "out", "preset",
               "budgets", "choose", "heartbeat", "space", "sampler"}
# What decides a trial's result: a study may only be resumed with the same values.
TRIAL_KEYS = ("lane", "space", "seed", "sampler")


@dataclass
class SweepConfig:
    path: Path
    study: str
    lane: str
    space: dict[str, Param]
    settings: dict[str, Any]  # the lane's own, checked by its module
    trials: int = 20
    seed: int = 0
    sampler: str = "tpe"
    storage: str | None = None  # None: SQLite in ``out``
    workers: int = 1
    out: Path = Path("runs/sweeps")
    preset: str | None = None  # name of the preset the chosen configuration is written as
    budgets: tuple[float, ...] = ()  # quality budgets of the report's "best per budget" table
    choose_budget: float | None = None  # the chosen one: fastest feasible within this budget
    heartbeat_interval: int = 10
    grace_period: int = 60
    raw: dict[str, Any] = field(default_factory=dict)

    def fingerprint(self) -> str:
        """A hash of what decides trial results (lane settings, space, sampler seed)."""
        lane_keys = {k: v for k, v in self.raw.items() if k not in COMMON_KEYS}
        data = {k: self.raw.get(k) for k in TRIAL_KEYS} | {"lane_settings": lane_keys}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()
                              ).hexdigest()[:16]

    @property
    def run_dir(self) -> Path:
        """Where the report, the plot and (by default) the SQLite study go."""
        return self.out / self.study

    def lane_module(self):
        return lane_module(self.lane)


def lane_module(lane: str):
    if lane == "asr":
        from audiofast.sweep import asr_lane

        return asr_lane
    from audiofast.sweep import audio_lane

    return audio_lane


def deep_merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "space":
            out[key] = deep_merge(out[key], value)
        elif key == "space" and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = copy.deepcopy(value)
    return out


def read_yaml(path: Path, what: str = "sweep config") -> dict:
    return read_yaml_mapping(path, what, SweepConfigError)


def load_sweep_config(path: str | Path, overrides: dict | None = None) -> SweepConfig:
    """The checked config of ``path``, with ``overrides`` (a pipeline's ``set:``) merged in."""
    path = Path(path)
    raw = deep_merge(read_yaml(path), overrides or {})
    where = path.name
    lane = raw.get("lane")
    if lane not in ("asr", "audio"):
        raise SweepConfigError(f"{where}.lane={lane!r}: choose from ['asr', 'audio']")
    module = lane_module(lane)
    known = COMMON_KEYS | set(module.SETTING_KEYS)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SweepConfigError(f"{where}.{unknown[0]}: unknown key (known: {sorted(known)})")
    settings = module.load_settings(raw, where)
    space_raw = raw.get("space") or {}
    if not isinstance(space_raw, dict):
        raise SweepConfigError(f"{where}.space: expected a mapping of parameters")
    domains = module.domains(settings)
    space = {}
    for name, value in space_raw.items():
        if name not in domains:
            raise SweepConfigError(f"{where}.space.{name}: unknown parameter for the {lane} lane "
                                   f"(known: {sorted(domains)})")
        space[name] = parse_param(name, value, domains[name], f"{where}.space.{name}")
    module.check_space(space, settings, where)
    heartbeat = get(raw, "heartbeat", dict, {}, where)
    choose = get(raw, "choose", dict, {}, where)
    _only(heartbeat, {"interval", "grace"}, f"{where}.heartbeat")
    _only(choose, {"budget"}, f"{where}.choose")
    cfg = SweepConfig(
        path=path, study=get(raw, "study", str, path.stem, where), lane=lane, space=space,
        settings=settings, raw=raw,
        trials=positive(get(raw, "trials", int, 20, where), f"{where}.trials"),
        seed=get(raw, "seed", int, 0, where),
        sampler=get(raw, "sampler", str, "tpe", where),
        storage=get(raw, "storage", str, None, where),
        workers=positive(get(raw, "workers", int, 1, where), f"{where}.workers"),
        out=Path(get(raw, "out", str, "runs/sweeps", where)),
        preset=get(raw, "preset", str, None, where),
        budgets=budgets(get(raw, "budgets", list, [], where), f"{where}.budgets"),
        choose_budget=get(choose, "budget", float, None, f"{where}.choose"),
        heartbeat_interval=positive(get(heartbeat, "interval", int, 10, f"{where}.heartbeat"),
                                    f"{where}.heartbeat.interval"),
        grace_period=positive(get(heartbeat, "grace", int, 60, f"{where}.heartbeat"),
                              f"{where}.heartbeat.grace"),
    )
    if cfg.sampler not in ("tpe", "random", "nsga2"):
        raise SweepConfigError(f"{where}.sampler={cfg.sampler!r}: choose from "
                               "['tpe', 'random', 'nsga2']")
    if cfg.grace_period <= cfg.heartbeat_interval:
        raise SweepConfigError(f"{where}.heartbeat: grace {cfg.grace_period} must exceed "
                               f"interval {cfg.heartbeat_interval}")
    if cfg.preset is not None and not cfg.preset.replace("-", "").replace("_", "").replace(
            ".", "").isalnum():
        raise SweepConfigError(f"{where}.preset={cfg.preset!r}: use letters, digits, - _ .")
    return cfg


def _only(section: dict, keys: set[str], where: str) -> None:
    unknown = sorted(set(section) - keys)
    if unknown:
        raise SweepConfigError(f"{where}.{unknown[0]}: unknown key (known: {sorted(keys)})")


def get(data: dict, key: str, kind: type, default: Any, where: str) -> Any:
    """``data[key]`` checked to be a ``kind`` (float accepts int; None gives ``default``)."""
    value = data.get(key)
    if value is None:
        return default
    ok = (int, float) if kind is float else (kind,)
    if isinstance(value, bool) and kind is not bool or not isinstance(value, ok):
        raise SweepConfigError(f"{where}.{key}={value!r}: expected {kind.__name__}")
    return float(value) if kind is float else value


def budgets(values: list, where: str) -> tuple[float, ...]:
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SweepConfigError(f"{where}[{i}]={v!r}: expected a number")
    return tuple(sorted(float(v) for v in values))


def positive(value: int, where: str) -> int:
    if value < 1:
        raise SweepConfigError(f"{where}={value}: must be >= 1")
    return value


def section(raw: dict, key: str, keys: set[str], where: str) -> dict:
    """A sub-mapping of the YAML whose keys must all be in ``keys``."""
    data = get(raw, key, dict, {}, where)
    _only(data, keys, f"{where}.{key}")
    return data


def existing_dir(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise SweepConfigError(f"{where}={value!r}: expected a directory path")
    if not Path(value).expanduser().is_dir():
        raise SweepConfigError(f"{where}: no such directory: {value}")
    return value
