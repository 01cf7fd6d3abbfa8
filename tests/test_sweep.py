"""Self-gated sweeps (audiofast/sweep): config checks, the gate's two halves, the conditional
ASR space, reports, presets. The real sweeps are in test_sweep_runs.py."""

from __future__ import annotations

import subprocess
import time

import pytest
from sweep_smoke import AUDIOFAST, ROOT, smoke_config

from audiofast.cli import build_parser, main
from audiofast.sweep.config import load_sweep_config
from audiofast.sweep.params import Domain, SweepConfigError, parse_param


@pytest.fixture(autouse=True)
def presets_in_tmp(tmp_path, monkeypatch):
    """Presets a test writes (in this process or its subprocesses) land in its tmp folder."""
    monkeypatch.setenv("AUDIOFAST_PRESETS", str(tmp_path / "presets"))


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
        else:  # no diet on CTranslate2: it cannot detect the language with one
            assert c["drafter"] == "none" and c["draft_len"] is None and c["vocab_keep"] == 0
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
