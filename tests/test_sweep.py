"""Self-gated sweeps (audiofast/sweep): config checks, the gate's two halves, the conditional
ASR space, reports, presets; slow: a whisper-tiny.en sweep interrupted and resumed, two
workers sharing a real PostgreSQL server while one is SIGKILLed, and the audio lane on a tiny
SA3 checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from audiofast.cli import build_parser, main
from audiofast.sweep.config import load_sweep_config
from audiofast.sweep.params import Domain, SweepConfigError, parse_param

ROOT = Path(__file__).resolve().parents[1]
AUDIOFAST = [sys.executable, "-m", "audiofast.cli"]
SENTENCES = ["The birch canoe slid on the smooth planks.",
             "Glue the sheet to the dark blue background.",
             "It's easy to tell the depth of a well.",
             "These days a chicken leg is a rare dish."]


@pytest.fixture(autouse=True)
def presets_in_tmp(tmp_path, monkeypatch):
    """Presets a test writes (in this process or its subprocesses) land in its tmp folder."""
    monkeypatch.setenv("AUDIOFAST_PRESETS", str(tmp_path / "presets"))


def smoke_config(tmp_path: Path, **changes) -> Path:
    """A whisper-tiny.en sweep judged on 4 sentences (2 a half) in one voice, timed on one
    short real clip."""
    texts = tmp_path / "texts.txt"
    texts.write_text("# smoke\n" + "\n".join(SENTENCES) + "\n")
    gates = yaml.safe_load((ROOT / "configs" / "gates.yaml").read_text())
    gates["asr"] |= {"texts": str(texts), "voices": ["flite:slt"], "augmentation": None}
    (tmp_path / "gates.yaml").write_text(yaml.safe_dump(gates))
    config = {"lane": "asr", "study": "smoke", "model": "whisper-tiny.en", "trials": 2,
              "out": str(tmp_path / "sweeps"), "preset": "smoke",
              "speed": {"runs": 1, "clips": ["clone-test"], "warmup": False},
              "gate": {"config": str(tmp_path / "gates.yaml"), "threads": 1},
              "space": {"engine": ["fast", "ct2"], "window_pad": [None, 2],
                        "drafter": ["none", "ngram"], "draft_len": {"low": 2, "high": 8},
                        "threads": [0, 1]}} | changes
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


# -- checking the YAML ----------------------------------------------------------------------------

def test_param_specs():
    d = Domain("int", low=1, high=32)
    assert parse_param("n", [2, 4], d, "x").choices == (2, 4)
    assert parse_param("n", 3, d, "x").kind == "fixed"
    r = parse_param("n", {"low": 2, "high": 8, "step": 2}, d, "x")
    assert (r.kind, r.low, r.high, r.step) == ("int", 2, 8, 2)
    assert r.contains(4) and not r.contains(5) and not r.contains(10)
    f = parse_param("p", {"low": 0.5, "high": 4, "log": True}, Domain("float", low=0), "x")
    assert f.kind == "float" and f.contains(1.0) and not f.contains(None)


@pytest.mark.parametrize("raw, message", [
    ({"low": 8, "high": 2}, "x: low 8 > high 2"),
    ({"low": 1, "high": 40}, "x.high=40: out of range [1, 32]"),
    ({"low": 1, "high": 8, "step": 3}, "not a multiple of step 3"),
    ({"low": 1, "high": 8, "stride": 1}, "x.stride: unknown range key"),
    ({"low": 1.5, "high": 8}, "x.low=1.5: expected int"),
    ([], "empty list"),
    ([2, 2], "listed twice"),
])
def test_bad_ranges(raw, message):
    with pytest.raises(SweepConfigError) as err:
        parse_param("n", raw, Domain("int", low=1, high=32), "x")
    assert message in str(err.value)


@pytest.mark.parametrize("change, message", [
    ({"colour": "red"}, "smoke.yaml.colour: unknown key"),
    ({"space": {"engine": ["fast"], "beam_width": [1, 2]}},
     "smoke.yaml.space.beam_width: unknown parameter for the asr lane"),
    ({"space": {"window_pad": {"low": 10, "high": 2}}}, "space.window_pad: low 10 > high 2"),
    ({"space": {"engine": ["fast", "onnx"]}}, "space.engine[1]='onnx': choose from"),
    ({"space": {"vocab_keep": [0, 16000]}}, "vocab_keep=16000: no checkpoint for it"),
    ({"space": {"drafter": ["none", "model"]}}, "'model' needs draft_model"),
    ({"speed": {"runs": 0}}, "speed.runs=0: must be >= 1"),
    ({"speed": {"clips": ["nope"]}}, "speed.clips: no real clip 'nope'"),
    ({"trials": "many"}, "trials='many': expected int"),
    ({"heartbeat": {"interval": 10, "grace": 5}}, "grace 5 must exceed interval 10"),
])
def test_bad_sweep_yaml_is_one_line_naming_it(tmp_path, change, message):
    with pytest.raises(SweepConfigError) as err:
        load_sweep_config(smoke_config(tmp_path, **change))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_cli_bad_input_exits_2_before_any_trial(tmp_path):
    bad = smoke_config(tmp_path, space={"beam_width": [1, 2]})
    run = subprocess.run([*AUDIOFAST, "sweep", str(bad)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "audiofast: error: smoke.yaml.space.beam_width: unknown parameter for the asr lane "
        "(known: ['beam_size', 'compute_type', 'draft_len', 'drafter', 'encoder', 'engine', "
        "'ngram_order', 'precision', 'threads', 'vocab_keep', 'window_pad'])"]
    good = smoke_config(tmp_path)
    url = "postgresql+psycopg2://sweeper:hunter2@127.0.0.1:1/studies"
    run = subprocess.run([*AUDIOFAST, "sweep", str(good), "--storage", url],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "storage postgresql+psycopg2://sweeper:***@127.0.0.1:1/studies: "\
        "unreachable" in lines[0] and "hunter2" not in run.stderr
    assert not (tmp_path / "sweeps").exists()  # no study, no trial


def test_gate_halves_are_fixed_and_disjoint():
    from audiofast.eval.datasets import tts_texts
    from audiofast.eval.gate import gate_texts, load_config
    from audiofast.sweep.split import halves, split_texts

    texts = gate_texts(load_config())  # the gate's default sentences, unchanged
    assert texts == tts_texts(ROOT / "evals" / "texts" / "gate_sentences.txt")
    assert len(texts) == 53 and not any(t.startswith("#") for t in texts)
    select, confirm = halves(load_config())
    assert select == texts[0::2] and confirm == texts[1::2]
    assert not set(select) & set(confirm) and len(select) + len(confirm) == 53
    assert split_texts(texts, "odd") == (confirm, select)


def test_trial_spec_round_trips_through_the_judge():
    from audiofast.eval.roundtrip import parse_asr_spec
    from audiofast.sweep.asr_lane import ASRConfig

    spec = ASRConfig("whisper-base", engine="ct2", window_pad=5.0, encoder="auto",
                     beam_size=3, drafter="none", threads=1).spec()
    assert spec == "whisper-base@int8+auto+pad5+beam3"
    parsed = parse_asr_spec(spec)
    assert parsed.options == {"window_pad": 5.0, "beam_size": 3} and parsed.encoder == "auto"
    fast = ASRConfig("whisper-base", drafter="ngram", draft_len=6, threads=2)
    assert fast.spec() == "fast:whisper-base@int8+pad2"  # drafter, threads: timed, not judged
    assert parse_asr_spec("whisper-base+batch8+chunk15").options == {
        "batch_size": 8, "chunk_length": 15.0}


def test_conditional_space_and_default_as_trial_zero(tmp_path):
    import optuna

    from audiofast.sweep.asr_lane import default_config, suggest
    from audiofast.sweep.study import default_params, load_study

    diet = tmp_path / "diet"
    diet.mkdir()
    cfg = load_sweep_config(smoke_config(tmp_path, vocab_models={4000: str(diet)}, space={
        "engine": ["fast", "ct2"], "window_pad": [None, 2], "drafter": ["none", "ngram"],
        "draft_len": {"low": 2, "high": 8}, "ngram_order": {"low": 1, "high": 4},
        "beam_size": [1, 2, 4], "vocab_keep": [0, 4000], "threads": [0, 1]}))
    study = optuna.create_study(directions=["minimize", "minimize"],
                                sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(60):
        c = suggest(study.ask(), cfg.space, cfg.settings)
        seen.add((c["engine"], c["drafter"], c["beam_size"]))
        if c["engine"] == "fast":
            assert c["beam_size"] == 1
            assert (c["draft_len"] is None) == (c["drafter"] == "none")
        else:
            assert c["drafter"] == "none" and c["draft_len"] is None
        assert c["model"] == (str(diet) if c["vocab_keep"] else "whisper-tiny.en")
    assert ("ct2", "none", 4) in seen and ("fast", "ngram", 1) in seen
    # transcribe's defaults are in this space: they compete as the study's first trial
    default = default_config(cfg.settings)
    assert default["window_pad"] == 2.0 and default["threads"] == 0
    params = default_params(cfg)
    assert params is not None and params["window_pad"] == 2.0
    created = load_study(cfg, f"sqlite:///{tmp_path / 'study.db'}")
    first = created.get_trials()[0]
    assert first.state.name == "WAITING" and first.user_attrs == {"default": True}
    fixed = load_sweep_config(smoke_config(tmp_path, space={"threads": [1]}))
    assert default_params(fixed) is None  # measured apart instead


def test_report_pareto_budgets_and_plot(tmp_path):
    import optuna
    from optuna.distributions import CategoricalDistribution

    from audiofast.sweep import report
    from audiofast.sweep.asr_lane import default_config

    cfg = load_sweep_config(smoke_config(tmp_path, budgets=[0.0, 0.01]))
    study = optuna.create_study(directions=["minimize", "minimize"])
    base = default_config(cfg.settings)
    points = [(5.0, 0.0, True), (3.0, 0.002, True), (2.0, 0.02, True), (1.0, 0.0, False),
              (4.0, 0.001, True)]
    for i, (seconds, quality, ok) in enumerate(points):
        study.add_trial(optuna.trial.create_trial(
            values=[seconds, quality], params={"window_pad": float(i)},
            distributions={"window_pad": CategoricalDistribution([float(j) for j in range(5)])},
            user_attrs={"config": base | {"window_pad": float(i)}, "default": i == 0,
                        "result": {"checks": [], "spec": f"s{i}"}},
            system_attrs={"constraints:gate": 0.0 if ok else 0.5}))
    summary = report.summarize(cfg, study, "sqlite:///x.db")
    assert summary["pareto"] == [2, 1, 4, 0]  # trial 3 is fastest but gated out
    assert [b["trial"] for b in summary["budgets"]] == [0, 1]  # 0.02 is over 0.01
    assert summary["chosen"] == 2  # fastest feasible (no budget set)
    summary["confirm"] = {"passed": False, "checks": [], "on": "the odd half + real"}
    paths = report.write(cfg, summary, tmp_path / "report")
    text = paths["markdown"].read_text()
    assert "| selection |" in text and "| confirmation | the odd half + real | FAIL" in text
    assert paths["png"].read_bytes()[:4] == b"\x89PNG"


def test_preset_sets_transcribe_defaults_only(tmp_path, monkeypatch):
    from audiofast.sweep.preset import apply_preset, write_preset

    monkeypatch.setenv("AUDIOFAST_PRESETS", str(tmp_path))
    config = {"model": "whisper-tiny.en", "engine": "fast", "window_pad": 5.0,
              "precision": "int8", "drafter": "ngram", "draft_len": 6, "ngram_order": 3,
              "encoder": "ct2", "beam_size": 1, "threads": 1}
    path = write_preset("quick", "asr", config, {"study": "s", "trial": 3, "confirmed": True})
    assert path == tmp_path / "quick.yaml"
    args = build_parser().parse_args(["transcribe", "a.wav", "--preset", "quick",
                                      "--threads", "2"])
    extra = apply_preset(args, args.preset_defaults, args.preset, "asr")
    assert (args.model, args.engine, args.window_pad, args.drafter) == (
        "whisper-tiny.en", "fast", 5.0, "ngram")
    assert args.threads == 2  # given on the command line: kept
    assert extra == {"draft_len": 6, "ngram_order": 3}
    with pytest.raises(SystemExit, match="no preset 'nope'"):
        main(["transcribe", "a.wav", "--preset", "nope"])


def test_unreachable_storage_names_it():
    from audiofast.sweep.storage import open_storage

    start = time.monotonic()
    with pytest.raises(SweepConfigError, match=r"storage postgresql://u:\*\*\*@127.0.0.1:1/d"):
        open_storage("postgresql://u:pw@127.0.0.1:1/d")
    assert time.monotonic() - start < 30


# -- real runs ------------------------------------------------------------------------------------

def _trials(url: str, study: str):
    import optuna

    from audiofast.sweep.storage import open_storage

    return optuna.load_study(study_name=study, storage=open_storage(url)).get_trials()


def _interruptible() -> None:
    """Ctrl-C reaches the child even when this test runs in the background (a shell then
    starts it with SIGINT ignored, and Python keeps it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


@pytest.mark.slow
def test_asr_sweep_interrupted_resumed_and_preset(tmp_path, monkeypatch):
    """Ctrl-C mid-trial marks it failed; the same command resumes to 2 complete trials and
    writes the report, the plot and a preset that transcribe accepts."""
    env = os.environ | {"AUDIOFAST_PRESETS": str(tmp_path / "presets")}
    config = smoke_config(tmp_path)
    url = f"sqlite:///{tmp_path / 'sweeps' / 'smoke' / 'study.db'}"
    proc = subprocess.Popen([*AUDIOFAST, "sweep", str(config)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_interruptible)
    db = tmp_path / "sweeps" / "smoke" / "study.db"  # the sweep creates it, not this test
    running = _wait_for(lambda: db.exists() and _safe(lambda: [
        t for t in _trials(url, "smoke") if t.state.name == "RUNNING"
        and "worker" in t.user_attrs]), 180, "a running trial")[0]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "rerun the same command to resume" in err
    states = {t.number: t.state.name for t in _trials(url, "smoke")}
    assert states[running.number] == "FAIL"

    run = subprocess.run([*AUDIOFAST, "sweep", str(config)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    trials = _trials(url, "smoke")
    assert sum(t.state.name == "COMPLETE" for t in trials) == 2
    assert next(t for t in trials if t.number == running.number).state.name == "FAIL"
    out = tmp_path / "sweeps" / "smoke"
    text = (out / "report.md").read_text()
    assert "| confirmation |" in text and "Speed ratio (default / chosen)" in text
    assert f"| {running.number} | fail |" in text
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
        proc = subprocess.Popen([*AUDIOFAST, "sweep", str(config), "--storage", pg.url,
                                 "--workers", "2"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)

        def victim():
            trials = _trials(pg.url, "smoke")
            done = [t for t in trials if t.state.name == "COMPLETE"]
            busy = [t for t in trials if t.state.name == "RUNNING" and "worker" in t.user_attrs]
            return (busy[0], done) if busy and done else None

        killed, done = _wait_for(
            lambda: _safe(victim), 300, "a running trial after a finished one")
        pid = int(killed.user_attrs["worker"].rsplit(":", 1)[1])
        assert pid != proc.pid
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=400)
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
