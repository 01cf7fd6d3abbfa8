"""Lane pipelines (audiofast/sweep/pipeline.py): cache keys, --from, --dry-run, bad YAML, and
the real ASR pipeline on whisper-tiny.en (slow)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from audiofast.cli import main
from audiofast.sweep import stages
from audiofast.sweep.params import SweepConfigError
from audiofast.sweep.pipeline import StageFailed, load_pipeline, run_pipeline, stage_keys

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def presets_in_tmp(tmp_path, monkeypatch):
    """Presets a test writes (in this process or its subprocesses) land in its tmp folder."""
    monkeypatch.setenv("AUDIOFAST_PRESETS", str(tmp_path / "presets"))


@pytest.fixture
def sweep_smoke_files(tmp_path) -> dict[str, Path]:
    """A whisper-tiny.en sweep judged on 4 sentences (2 a half) in one voice."""
    texts = tmp_path / "texts.txt"
    texts.write_text("# smoke\nThe birch canoe slid on the smooth planks.\n"
                     "Glue the sheet to the dark blue background.\n"
                     "It's easy to tell the depth of a well.\n"
                     "These days a chicken leg is a rare dish.\n")
    gates = yaml.safe_load((ROOT / "configs" / "gates.yaml").read_text())
    gates["asr"] |= {"texts": str(texts), "voices": ["flite:slt"], "augmentation": None}
    (tmp_path / "gates.yaml").write_text(yaml.safe_dump(gates))
    config = {"lane": "asr", "study": "smoke", "model": "whisper-tiny.en", "trials": 2,
              "out": str(tmp_path / "sweeps"),
              "speed": {"runs": 1, "clips": ["clone-test"], "warmup": False},
              "gate": {"config": str(tmp_path / "gates.yaml"), "threads": 1},
              "space": {"engine": ["fast", "ct2"], "window_pad": [None, 2],
                        "drafter": ["none", "ngram"], "threads": [0, 1]}}
    (tmp_path / "smoke.yaml").write_text(yaml.safe_dump(config))
    return {"config": tmp_path / "smoke.yaml", "gates": tmp_path / "gates.yaml"}


@pytest.fixture
def toy_kinds(tmp_path):
    """Two cheap stage kinds that log every call: ``note`` writes its value to a file in its
    folder (output ``out``); ``fail`` says no."""
    calls = tmp_path / "calls.log"

    @stages.kind("note", ("sweep/params.py",), required=("value",), optional=("after",))
    def note(inputs, ctx):
        with calls.open("a") as f:
            f.write(ctx.name + "\n")
        ctx.dir.mkdir(parents=True, exist_ok=True)
        out = ctx.dir / "note.txt"
        out.write_text(f"{inputs['value']} after {inputs.get('after')}")
        return {"out": str(out), "value": inputs["value"]}

    @stages.kind("fail", ("sweep/params.py",), optional=("after",))
    def fail(inputs, ctx):
        raise StageFailed("the gate said no")

    yield lambda: calls.read_text().split() if calls.exists() else []
    stages.KINDS.pop("note")
    stages.KINDS.pop("fail")


def write(tmp_path: Path, b_value: int = 2, c_kind: str = "note") -> Path:
    spec = {"name": "toy", "workdir": str(tmp_path / "work"), "vars": {"x": 1, "name": "n"},
            "stages": [
                {"name": "a", "kind": "note", "with": {"value": "${x}"}},
                {"name": "b", "kind": "note",
                 "with": {"value": b_value, "after": "${stages.a.out}"}},
                {"name": "c", "kind": c_kind, "with": {"after": "${stages.b.value}-${name}"}
                 | ({"value": 3} if c_kind == "note" else {})},
            ]}
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def ran(toy_kinds, before: int) -> list[str]:
    return toy_kinds()[before:]


def test_cache_keys_skip_rerun_and_from(tmp_path, toy_kinds):
    path = write(tmp_path)
    reports = run_pipeline(load_pipeline(path))
    assert [r.status for r in reports] == ["ran"] * 3 and toy_kinds() == ["a", "b", "c"]
    assert json.loads((tmp_path / "work/b/stage.json").read_text())["status"] == "done"
    assert (tmp_path / "work/b/note.txt").read_text().endswith("a/note.txt")  # reference
    assert (tmp_path / "work/c/note.txt").read_text() == "3 after 2-n"

    n = len(toy_kinds())
    assert [r.status for r in run_pipeline(load_pipeline(path))] == ["cached"] * 3
    assert ran(toy_kinds, n) == []

    # A changed input re-runs its stage and every later one, nothing before.
    path = write(tmp_path, b_value=5)
    n = len(toy_kinds())
    assert [r.status for r in run_pipeline(load_pipeline(path))] == ["cached", "ran", "ran"]
    assert ran(toy_kinds, n) == ["b", "c"]
    assert (tmp_path / "work/c/note.txt").read_text() == "3 after 5-n"

    # --from re-runs the named stage and the ones after it.
    n = len(toy_kinds())
    reports = run_pipeline(load_pipeline(path), from_stage="b")
    assert [r.status for r in reports] == ["cached", "ran", "ran"] and ran(toy_kinds, n) == [
        "b", "c"]

    # A finished stage whose output disappeared runs again (same key: later stages stay).
    os.remove(tmp_path / "work/a/note.txt")
    n = len(toy_kinds())
    assert [r.status for r in run_pipeline(load_pipeline(path))] == ["ran", "cached", "cached"]
    assert ran(toy_kinds, n) == ["a"]


def test_dry_run_runs_nothing(tmp_path, toy_kinds):
    path = write(tmp_path)
    reports = run_pipeline(load_pipeline(path), dry_run=True)
    assert [r.status for r in reports] == ["would run"] * 3 and toy_kinds() == []
    assert not (tmp_path / "work").exists()
    run_pipeline(load_pipeline(path))
    plan = run_pipeline(load_pipeline(path), from_stage="c", dry_run=True)
    assert [r.status for r in plan] == ["cached", "cached", "would run"]
    assert [r.key for r in plan] == stage_keys(load_pipeline(path))  # the run's own keys


def test_code_version_is_in_the_key(tmp_path, toy_kinds, monkeypatch):
    path = write(tmp_path)
    keys = stage_keys(load_pipeline(path))
    monkeypatch.setattr(stages, "code_version", lambda paths: "other-code")
    changed = stage_keys(load_pipeline(path))
    assert all(a != b for a, b in zip(keys, changed, strict=True))


def test_a_failed_stage_stops_the_pipeline(tmp_path, toy_kinds, capsys):
    path = write(tmp_path, c_kind="fail")
    assert main(["pipeline", "run", str(path)]) == 1
    out, err = capsys.readouterr()
    assert [line.split()[2] for line in out.splitlines()[-3:]] == ["ran", "ran", "failed"]
    assert "stage c failed: the gate said no" in err
    assert json.loads((tmp_path / "work/c/stage.json").read_text())["status"] == "running"


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s["stages"][1].update(kind="nope"), "kind='nope'"),
    (lambda s: s["stages"][0]["with"].update(after="${stages.c.out}"), "${stages.c.out}"),
    (lambda s: s["stages"][0]["with"].update(value="${missing}"), "${missing}: no such var"),
    (lambda s: s["stages"][0]["with"].update(colour=1), "a.with.colour: unknown input"),
    (lambda s: s["stages"][1].update(name="a"), "two stages of that name"),
    (lambda s: s.update(extra=1), "toy.yaml.extra: unknown key"),
])
def test_bad_pipeline_yaml_is_one_line(tmp_path, toy_kinds, mutate, message):
    path = write(tmp_path)
    spec = yaml.safe_load(path.read_text())
    mutate(spec)
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SweepConfigError) as err:
        load_pipeline(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_from_an_unknown_stage(tmp_path, toy_kinds):
    with pytest.raises(SystemExit, match="--from z: no such stage"):
        main(["pipeline", "run", str(write(tmp_path)), "--from", "z"])


def test_shipped_pipelines_and_sweeps_load():
    asr = load_pipeline(ROOT / "pipelines" / "asr.yaml")
    assert [s.kind for s in asr.stages] == ["resolve_model", "distill_vocab", "distill_drafter",
                                            "sweep", "confirm", "export_preset"]
    audio = load_pipeline(ROOT / "pipelines" / "audio.yaml")
    assert [s.name for s in audio.stages] == ["teacher", "cfg", "steps", "qad", "gate",
                                              "export"]
    from audiofast.sweep.config import load_sweep_config

    for name in ("asr-base", "audio-teacher"):
        cfg = load_sweep_config(ROOT / "configs" / "sweeps" / f"{name}.yaml")
        assert cfg.trials >= 20 and cfg.space


@pytest.mark.slow
def test_asr_pipeline_tiny_end_to_end(tmp_path, monkeypatch, sweep_smoke_files):
    """whisper-tiny.en through every ASR stage: from scratch, then all skipped, then --from."""
    monkeypatch.setenv("AUDIOFAST_PRESETS", str(tmp_path / "presets"))
    spec = yaml.safe_load((ROOT / "pipelines" / "asr.yaml").read_text())
    spec["workdir"] = str(tmp_path / "work")
    spec["vars"] = {"model": "whisper-tiny.en", "keep": 4000, "threads": 1}
    by_name = {s["name"]: s for s in spec["stages"]}
    by_name["vocab"]["with"] |= {"steps": 0, "sentences": 4}
    by_name["drafter"]["with"] |= {"steps": 1, "sentences": 4, "keep": 2000}
    by_name["sweep"]["with"] |= {"config": str(sweep_smoke_files["config"]), "trials": 2}
    by_name["export"]["with"]["name"] = "tiny-pipeline"
    path = tmp_path / "asr.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))

    first = run_pipeline(load_pipeline(path))
    assert [r.status for r in first] == ["ran"] * 6, [(r.name, r.error) for r in first]
    preset = Path(first[-1].outputs["preset"])
    assert preset.parent == tmp_path / "presets" and yaml.safe_load(preset.read_text())[
        "lane"] == "asr"
    assert "confirmation" in Path(first[-2].outputs["report_path"]).read_text()
    assert [r.status for r in run_pipeline(load_pipeline(path))] == ["cached"] * 6
    again = run_pipeline(load_pipeline(path), from_stage="gate")
    assert [r.status for r in again] == ["cached"] * 4 + ["ran"] * 2
