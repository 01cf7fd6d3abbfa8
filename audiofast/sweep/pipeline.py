"""Declarative lane pipelines: ``audiofast pipeline run pipelines/asr.yaml``.

A pipeline YAML names a ``workdir``, ``vars`` and an ordered list of ``stages`` (``name``,
``kind``, ``with``). ``${var}`` is a variable; ``${stages.NAME.KEY}`` an output of an earlier
stage (a whole-string reference keeps the value's type). Each stage's cache key hashes the key
of the stage before it, its kind and name, its inputs (variables resolved, references to
earlier outputs kept as written: those stages' keys stand for them), the contents of input
files, and the code of its kind (:mod:`audiofast.sweep.stages`). So a changed input re-runs
its stage and every stage after it, and nothing before.

A stage is skipped when ``NAME/stage.json`` holds its key, finished, with its outputs present;
a stage killed midway resumes in its own folder on the next run (same key), and is started
afresh when its key changed. ``--from NAME`` re-runs NAME and everything after it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audiofast.sweep.config import read_yaml
from audiofast.sweep.params import SweepConfigError

REF = re.compile(r"\$\{([A-Za-z0-9_.\-]+)\}")
PIPELINE_KEYS = {"name", "lane", "workdir", "vars", "stages"}
STAGE_KEYS = {"name", "kind", "with"}


class StageFailed(RuntimeError):
    """A stage ran and said no (a gate failed): the pipeline stops there."""


@dataclass
class Stage:
    name: str
    kind: str
    inputs: dict[str, Any]  # variables resolved, stage references still ${...}


@dataclass
class Pipeline:
    path: Path
    name: str
    workdir: Path
    stages: list[Stage]
    lane: str = ""


@dataclass
class StageReport:
    name: str
    kind: str
    key: str
    status: str  # cached, ran, failed, not run, would run
    seconds: float = 0.0
    outputs: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    traceback: str = ""


def load_pipeline(path: str | Path, workdir: str | Path | None = None) -> Pipeline:
    from audiofast.sweep.stages import KINDS

    path = Path(path)
    raw = read_yaml(path, "pipeline")
    where = path.name
    unknown = sorted(set(raw) - PIPELINE_KEYS)
    if unknown:
        raise SweepConfigError(f"{where}.{unknown[0]}: unknown key (known: "
                               f"{sorted(PIPELINE_KEYS)})")
    variables = raw.get("vars") or {}
    if not isinstance(variables, dict) or not isinstance(raw.get("stages"), list):
        raise SweepConfigError(f"{where}: expected vars (a mapping) and stages (a list)")
    stages: list[Stage] = []
    for i, item in enumerate(raw["stages"]):
        at = f"{where}.stages[{i}]"
        if not isinstance(item, dict):
            raise SweepConfigError(f"{at}: expected a mapping with name, kind, with")
        bad = sorted(set(item) - STAGE_KEYS)
        if bad:
            raise SweepConfigError(f"{at}.{bad[0]}: unknown key (known: {sorted(STAGE_KEYS)})")
        name, kind = item.get("name"), item.get("kind")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_\-]+", name):
            raise SweepConfigError(f"{at}.name={name!r}: letters, digits, - and _")
        if any(s.name == name for s in stages):
            raise SweepConfigError(f"{at}.name={name!r}: two stages of that name")
        if kind not in KINDS:
            raise SweepConfigError(f"{at}.kind={kind!r}: choose from {sorted(KINDS)}")
        inputs = item.get("with") or {}
        if not isinstance(inputs, dict):
            raise SweepConfigError(f"{at}.with: expected a mapping")
        KINDS[kind].check(inputs, f"{where}.{name}.with")
        resolved = _resolve(inputs, variables, {s.name for s in stages}, f"{where}.{name}")
        stages.append(Stage(name, kind, resolved))
    wd = Path(workdir or raw.get("workdir") or Path("runs/pipelines") / path.stem)
    return Pipeline(path, str(raw.get("name") or path.stem), wd, stages, str(raw.get("lane", "")))


def _resolve(value: Any, variables: dict, earlier: set[str], where: str) -> Any:
    """Variables substituted; ``${stages.X.k}`` checked to name an earlier stage, kept."""
    if isinstance(value, dict):
        return {_resolve(k, variables, earlier, where): _resolve(v, variables, earlier, where)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, variables, earlier, where) for v in value]
    if not isinstance(value, str):
        return value

    def lookup(ref: str) -> Any:
        if ref.startswith("stages."):
            parts = ref.split(".")
            if len(parts) != 3 or parts[1] not in earlier:
                raise SweepConfigError(f"{where}: ${{{ref}}} does not name an output of an "
                                       f"earlier stage (earlier: {sorted(earlier)})")
            return "${" + ref + "}"
        if ref not in variables:
            raise SweepConfigError(f"{where}: ${{{ref}}}: no such variable "
                                   f"(vars: {sorted(variables)})")
        return variables[ref]

    whole = REF.fullmatch(value)
    if whole:
        return lookup(whole.group(1))
    return REF.sub(lambda m: str(lookup(m.group(1))), value)


def substitute(value: Any, outputs: dict[str, dict]) -> Any:
    """Stage references replaced by the earlier stages' outputs (at run time)."""
    if isinstance(value, dict):
        return {substitute(k, outputs): substitute(v, outputs) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, outputs) for v in value]
    if not isinstance(value, str):
        return value

    def get(ref: str) -> Any:
        _, stage, key = ref.split(".")
        if key not in outputs[stage]:
            raise SweepConfigError(f"stage {stage} has no output {key!r} "
                                   f"(has {sorted(outputs[stage])})")
        return outputs[stage][key]

    whole = REF.fullmatch(value)
    if whole:
        return get(whole.group(1))
    return REF.sub(lambda m: str(get(m.group(1))), value)


def _file_digests(value: Any) -> dict[str, str]:
    """sha256 of every input that names an existing file (a config the stage reads)."""
    found: dict[str, str] = {}
    if isinstance(value, dict):
        for v in value.values():
            found |= _file_digests(v)
    elif isinstance(value, list):
        for v in value:
            found |= _file_digests(v)
    elif isinstance(value, str) and "${" not in value and len(value) < 4096:
        p = Path(value)
        if p.is_file() and p.stat().st_size < 64 << 20:
            found[value] = hashlib.sha256(p.read_bytes()).hexdigest()
    return found


def stage_keys(pipeline: Pipeline) -> list[str]:
    from audiofast.sweep.stages import KINDS, code_version

    keys, previous = [], ""
    for stage in pipeline.stages:
        kind = KINDS[stage.kind]
        read = kind.files(stage.inputs) if kind.files else []
        data = {"previous": previous, "name": stage.name, "kind": stage.kind,
                "inputs": stage.inputs, "files": _file_digests([stage.inputs, read]),
                "code": code_version(kind.code)}
        previous = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()
                                  ).hexdigest()[:16]
        keys.append(previous)
    return keys


def _record(stage_dir: Path) -> dict | None:
    try:
        return json.loads((stage_dir / "stage.json").read_text())
    except (OSError, ValueError):
        return None


def _write_record(stage_dir: Path, record: dict) -> None:
    stage_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".stage.", dir=stage_dir)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=1, default=str)
    os.replace(tmp, stage_dir / "stage.json")


def outputs_present(outputs: dict) -> bool:
    """Every output that is a path (``*_path``, ``out``, ``preset``) still exists."""
    for key, value in outputs.items():
        if isinstance(value, str) and (key in ("out", "preset", "handle") or
                                       key.endswith("_path")) and not Path(value).exists():
            return False
    return True


def run_pipeline(pipeline: Pipeline, from_stage: str | None = None, dry_run: bool = False,
                 echo=print) -> list[StageReport]:
    from audiofast.sweep.stages import KINDS, Context

    names = [s.name for s in pipeline.stages]
    if from_stage is not None and from_stage not in names:
        raise SweepConfigError(f"--from {from_stage}: no such stage (stages: {names})")
    start_at = names.index(from_stage) if from_stage else len(names)
    keys = stage_keys(pipeline)
    outputs: dict[str, dict] = {}
    reports: list[StageReport] = []
    failed = False
    for i, (stage, key) in enumerate(zip(pipeline.stages, keys, strict=True)):
        stage_dir = pipeline.workdir / stage.name
        record = _record(stage_dir)
        done = (record is not None and record.get("status") == "done"
                and record.get("key") == key and outputs_present(record.get("outputs", {})))
        report = StageReport(stage.name, stage.kind, key, "cached")
        reports.append(report)
        if failed:
            report.status = "not run"
            continue
        if done and i < start_at:
            outputs[stage.name] = report.outputs = record["outputs"]
            continue
        if dry_run:
            report.status = "would run"
            outputs[stage.name] = {}
            continue
        resume = (record is not None and record.get("status") == "running"
                  and record.get("key") == key and i < start_at)
        if stage_dir.exists() and not resume:
            shutil.rmtree(stage_dir)  # another key, or re-run asked: start afresh
        _write_record(stage_dir, {"key": key, "kind": stage.kind, "status": "running",
                                  "inputs": stage.inputs})
        echo(f"pipeline: stage {stage.name} ({stage.kind}){' resuming' if resume else ''}")
        began = time.perf_counter()
        try:
            inputs = substitute(stage.inputs, outputs)
            result = KINDS[stage.kind].run(inputs, Context(stage.name, stage_dir,
                                                           pipeline.workdir))
        except Exception as exc:  # the summary says which stage and why; the rest wait
            first = (str(exc).strip().splitlines() or [""])[0]
            known = isinstance(exc, (StageFailed, SweepConfigError))
            report.status = "failed"
            report.error = first if known else f"{type(exc).__name__}: {first}"
            report.traceback = "" if known else traceback.format_exc()
            report.seconds = time.perf_counter() - began
            failed = True
            continue
        report.seconds = time.perf_counter() - began
        report.status, report.outputs = "ran", result
        outputs[stage.name] = result
        _write_record(stage_dir, {"key": key, "kind": stage.kind, "status": "done",
                                  "inputs": stage.inputs, "outputs": result,
                                  "seconds": report.seconds, "finished": time.time()})
    return reports


def summary_table(reports: list[StageReport]) -> str:
    lines = [f"{'stage':<12} {'kind':<22} {'status':<10} {'seconds':>8}  key               "
             "outputs", "-" * 96]
    for r in reports:
        shown = ", ".join(f"{k}={v}" for k, v in r.outputs.items()
                          if not isinstance(v, (dict, list)))
        text = r.error if r.status == "failed" else shown
        lines.append(f"{r.name:<12} {r.kind:<22} {r.status:<10} {r.seconds:8.1f}  {r.key}  "
                     f"{text[:120]}")
    return "\n".join(lines)
