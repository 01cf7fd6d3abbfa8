"""Real sweeps: a whisper-tiny.en sweep interrupted and resumed, two workers sharing a real
PostgreSQL server while one is SIGKILLed, and the audio lane on a tiny SA3 checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from sweep_smoke import AUDIOFAST, smoke_config

from audiofast.sweep.config import load_sweep_config


@pytest.fixture(autouse=True)
def presets_in_tmp(tmp_path, monkeypatch):
    """Presets a test writes (in this process or its subprocesses) land in its tmp folder."""
    monkeypatch.setenv("AUDIOFAST_PRESETS", str(tmp_path / "presets"))


# -- real runs ------------------------------------------------------------------------------------

def _trials(url: str, study: str):
    import optuna

    from audiofast.sweep.storage import open_storage

    return optuna.load_study(study_name=study, storage=open_storage(url)).get_trials()


def _interruptible() -> None:
    """Ctrl-C reaches the child even when this test runs in the background (a shell then
    starts it with SIGINT ignored, and Python keeps it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(predicate, timeout: float, what: str, proc=None, log: Path | None = None):
    """Poll ``predicate`` until it is truthy; fail at once (with the sweep's stderr) when the
    sweep process ``proc`` exits first, instead of waiting out the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log else ""
            pytest.fail(f"the sweep exited ({proc.returncode}) before {what}:\n{tail}")
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def _running_trials(db: Path) -> list[int]:
    """Numbers of the trials a worker has started, read from the study's SQLite file without
    Optuna: opening an RDB storage creates its tables, which would race the sweep doing so."""
    import sqlite3

    if not db.exists():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            rows = con.execute(
                "SELECT t.number FROM trials t JOIN trial_user_attributes a "
                "ON a.trial_id = t.trial_id WHERE t.state = 'RUNNING' AND a.key = 'worker'")
            return [number for (number,) in rows]
    except sqlite3.OperationalError:  # tables not created yet, or locked just then
        return []


@pytest.mark.slow
def test_asr_sweep_interrupted_resumed_and_preset(tmp_path, monkeypatch):
    """Ctrl-C mid-trial marks it failed; the same command resumes to 2 complete trials and
    writes the report, the plot and a preset that transcribe accepts."""
    env = os.environ | {"AUDIOFAST_PRESETS": str(tmp_path / "presets")}
    config = smoke_config(tmp_path)
    url = f"sqlite:///{tmp_path / 'sweeps' / 'smoke' / 'study.db'}"
    log = tmp_path / "sweep.log"  # a file, not a pipe nobody reads while the sweep runs
    with log.open("w") as sink:
        proc = subprocess.Popen([*AUDIOFAST, "sweep", str(config)], env=env, stdout=sink,
                                stderr=subprocess.STDOUT, text=True, preexec_fn=_interruptible)
    db = tmp_path / "sweeps" / "smoke" / "study.db"  # the sweep creates it, not this test
    running = _wait_for(lambda: _running_trials(db), 600, "a running trial", proc, log)[0]
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    err = log.read_text()
    assert proc.returncode == 130, err[-2000:]
    assert "rerun the same command to resume" in err
    states = {t.number: t.state.name for t in _trials(url, "smoke")}
    assert states[running] == "FAIL"

    run = subprocess.run([*AUDIOFAST, "sweep", str(config)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    trials = _trials(url, "smoke")
    assert sum(t.state.name == "COMPLETE" for t in trials) == 2
    assert next(t for t in trials if t.number == running).state.name == "FAIL"
    out = tmp_path / "sweeps" / "smoke"
    text = (out / "report.md").read_text()
    assert "| confirmation |" in text and "Speed ratio (default / chosen)" in text
    assert f"| {running} | fail |" in text
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    preset = tmp_path / "presets" / "smoke.yaml"
    assert yaml.safe_load(preset.read_text())["source"]["confirmed"] is True
    from audiofast.eval.datasets import real_speech_clips

    clip = next(c.audio for c in real_speech_clips() if c.name == "clone-test")
    run = subprocess.run([*AUDIOFAST, "transcribe", str(clip), "--preset", str(preset)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip(), run.stderr[-2000:]


@pytest.mark.slow
def test_postgres_two_workers_one_sigkilled(tmp_path):
    """Two worker processes on one study in a real PostgreSQL server; one is SIGKILLed
    mid-trial: its trial ends failed (heartbeat), the other completes the study, and no
    finished trial is lost."""
    from audiofast.sweep.postgres import PostgresUnavailable, TempPostgres

    try:
        pg = TempPostgres().start()
    except PostgresUnavailable as exc:
        pytest.skip(f"PostgreSQL server binaries are not installed: {exc}")
    try:
        config = smoke_config(tmp_path, trials=4, heartbeat={"interval": 1, "grace": 5})
        from audiofast.sweep.storage import open_storage

        open_storage(pg.url)  # the tables exist before this test starts reading them
        env = os.environ | {"AUDIOFAST_PRESETS": str(tmp_path / "presets")}
        log = tmp_path / "sweep.log"
        with log.open("w") as sink:
            proc = subprocess.Popen([*AUDIOFAST, "sweep", str(config), "--storage", pg.url,
                                     "--workers", "2"], stdout=sink,
                                    stderr=subprocess.STDOUT, text=True, env=env)

        def victim():
            trials = _trials(pg.url, "smoke")
            done = [t for t in trials if t.state.name == "COMPLETE"]
            busy = [t for t in trials if t.state.name == "RUNNING" and "worker" in t.user_attrs]
            return (busy[0], done) if busy and done else None

        killed = None
        for _ in range(20):  # freeze the worker, then look: a trial cannot finish in between
            busy, _ = _wait_for(
                lambda: _safe(victim), 600, "a running trial after a finished one", proc, log)
            pid = int(busy.user_attrs["worker"].rsplit(":", 1)[1])
            assert pid != proc.pid
            os.kill(pid, signal.SIGSTOP)
            trials = _trials(pg.url, "smoke")
            # ... with its parameters drawn (frozen before that, its retry has none to copy)
            running = [t for t in trials if t.state.name == "RUNNING" and t.params
                       and t.user_attrs.get("worker", "").endswith(f":{pid}")]
            if running:
                killed, done = running[0], [t for t in trials if t.state.name == "COMPLETE"]
                os.kill(pid, signal.SIGKILL)
                break
            os.kill(pid, signal.SIGCONT)  # between trials or draws: let it go on, look again
        assert killed is not None, "no worker was caught mid-trial"
        proc.wait(timeout=400)
        out = err = log.read_text()
        assert proc.returncode == 0, err[-3000:]
        assert f"pid {pid}) exited with -9" in err
        after = {t.number: t for t in _trials(pg.url, "smoke")}
        assert after[killed.number].state.name == "FAIL"
        retries = [t for t in after.values() if t.system_attrs.get("failed_trial") ==
                   killed.number]  # failed by the heartbeat check, its parameters queued again
        assert len(retries) == 1 and retries[0].params == killed.params
        for t in done:  # finished before the kill: still there, unchanged
            assert after[t.number].state.name == "COMPLETE" and after[t.number].values == \
                t.values
        assert sum(t.state.name == "COMPLETE" for t in after.values()) >= 4
        workers = {t.user_attrs["worker"] for t in after.values() if t.state.name == "COMPLETE"}
        assert len(workers) >= 1 and "report:" in out
    finally:
        pg.stop()


def _safe(fn):
    """None while the study does not exist yet (the sweep creates it)."""
    try:
        return fn()
    except Exception:
        return None


@pytest.mark.slow
def test_audio_sweep_on_a_tiny_checkpoint(tmp_path, monkeypatch, one_torch_thread):
    from audiofast.diffusion.synthetic import write_synthetic_checkpoint
    from audiofast.diffusion.teacher import TeacherSize, teacher_config
    from audiofast.sweep.runner import finish, search, storage_url

    monkeypatch.setenv("AUDIOFAST_PRESETS", str(tmp_path / "presets"))
    tiny = TeacherSize(dit_width=64, dit_depth=2, dit_heads=2, memory_tokens=2)
    teacher = write_synthetic_checkpoint(tmp_path / "teacher", teacher_config(tiny))
    spec = {"lane": "audio", "study": "audio", "students": {"teacher": str(teacher)},
            "baseline": str(teacher), "trials": 2, "out": str(tmp_path / "sweeps"),
            "gate": {"clips": 4, "baseline_steps": 4, "baseline_cfg": 3.0},
            "judge": {"train_clips": 16, "steps": 2},
            "space": {"steps": {"low": 1, "high": 4}, "sampler": ["pingpong", "euler"],
                      "cfg_scale": {"low": 1.0, "high": 5.0, "step": 1.0},
                      "quantization": ["none", "int8"]}}
    (tmp_path / "audio.yaml").write_text(yaml.safe_dump(spec))
    cfg = load_sweep_config(tmp_path / "audio.yaml")
    url = storage_url(cfg)
    search(cfg, url, show=False)
    summary = finish(cfg, url, preset="tiny-audio")
    default = summary["default"]
    assert default["trial"] == 0 and default["quality"] == pytest.approx(1.0)  # = baseline
    assert all(r["state"] == "COMPLETE" for r in summary["trials"])
    assert summary["confirm"]["on"].startswith("captions and noise at seed 1")
    if summary["confirm"]["passed"]:
        preset = yaml.safe_load(Path(summary["preset"]).read_text())
        assert preset["lane"] == "audio" and preset["model"] == str(teacher)
    assert "fad_ratio" in Path(summary["paths"]["markdown"]).read_text()
