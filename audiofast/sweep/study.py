"""Running a sweep's trials: one study, any number of workers, resumable.

``--trials N`` is the number of finished (complete) trials the study should hold, whoever ran
them: a rerun after Ctrl-C or a kill continues to N, and K workers (``--workers K`` here, or
the same command on other machines with one PostgreSQL URL) share the count. A worker starts
a trial only while finished + running trials are below N; when the rest are running elsewhere
it waits, and if one of those workers died its trial goes stale, is failed and queued again
(storage.py), and the waiting worker runs it.

Each trial: the lane suggests a configuration, the lane evaluates it (gate on the selection
half + timing), the gate's verdict becomes an Optuna constraint (infeasible when it fails)
and the two objectives (seconds, quality loss) are returned. Ctrl-C or SIGTERM fails the
running trial (Optuna records the interrupt) and stops the worker.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

from audiofast.sweep.config import SweepConfig
from audiofast.sweep.params import SweepConfigError
from audiofast.sweep.storage import open_storage, redact

log = logging.getLogger(__name__)

OBJECTIVES = ("seconds", "quality_loss")
MAX_FAILURES_IN_A_ROW = 3


class SweepError(RuntimeError):
    """The sweep cannot go on (trials keep failing, workers all died)."""


def load_study(cfg: SweepConfig, url: str, worker: int = 0, create: bool = True):
    """The study ``cfg.study`` in ``url``, created if missing; one made with another space or
    other lane settings is refused (its trials would not be comparable)."""
    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    storage = open_storage(url, cfg.heartbeat_interval, cfg.grace_period)
    sampler = make_sampler(cfg, worker)
    try:
        study = optuna.create_study(study_name=cfg.study, storage=storage, sampler=sampler,
                                    directions=["minimize", "minimize"], load_if_exists=create)
    except Exception as exc:
        raise SweepConfigError(f"storage {redact(url)}: cannot open study {cfg.study!r}: "
                               f"{' '.join(str(exc).split())[:200]}") from None
    attrs = study.user_attrs
    if "fingerprint" not in attrs:
        study.set_user_attr("fingerprint", cfg.fingerprint())
        study.set_user_attr("lane", cfg.lane)
        study.set_user_attr("objectives", list(OBJECTIVES))
        params = default_params(cfg)
        if params is not None:  # the default configuration competes as trial 0
            study.enqueue_trial(params, user_attrs={"default": True}, skip_if_exists=True)
    elif attrs["fingerprint"] != cfg.fingerprint():
        raise SweepConfigError(
            f"study {cfg.study!r} in {redact(url)} was made with another space or lane "
            "settings: pass --study NEW (or delete the old study)")
    return study


class _Recorder:
    """A stand-in trial answering every question with the default configuration's value."""

    def __init__(self, values: dict):
        self.values, self.asked = values, {}

    def _ask(self, name: str, *_, **__):
        self.asked[name] = self.values.get(name)
        return self.asked[name]

    suggest_categorical = suggest_int = suggest_float = _ask


def default_params(cfg: SweepConfig) -> dict | None:
    """The trial parameters that reproduce the lane's default configuration, or None when
    the space cannot express it (then it is measured apart, outside the search)."""
    module = cfg.lane_module()
    default = module.default_config(cfg.settings)
    recorder = _Recorder(default)
    try:
        config = module.suggest(recorder, cfg.space, cfg.settings)
    except (KeyError, TypeError, ValueError):
        return None
    if config != default or not all(cfg.space[k].contains(v) for k, v in recorder.asked.items()):
        return None
    return recorder.asked


def make_sampler(cfg: SweepConfig, worker: int = 0):
    import optuna

    seed = cfg.seed + 1009 * worker  # workers must not draw the same start-up trials
    if cfg.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if cfg.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, cfg.trials // 4))
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                      constant_liar=True,
                                      n_startup_trials=max(2, min(8, cfg.trials // 3)))


def make_objective(cfg: SweepConfig):
    module = cfg.lane_module()
    who = f"{socket.gethostname()}:{os.getpid()}"

    def objective(trial) -> tuple[float, float]:
        trial.set_user_attr("worker", who)
        config = module.suggest(trial, cfg.space, cfg.settings)
        trial.set_user_attr("config", config)
        try:
            result = module.evaluate(config, cfg.settings)
        except Exception as exc:
            trial.set_user_attr("error", f"{type(exc).__name__}: {exc}"[:500])
            raise
        _check_interrupted()  # a Ctrl-C Python dropped during the trial still fails it
        trial.set_user_attr("result", {k: v for k, v in result.items()
                                       if k not in ("speed", "quality")})
        trial.set_constraint("gate", result["violation"])
        return result["speed"], result["quality"]

    return objective


def counts(study) -> dict[str, int]:
    out = {"COMPLETE": 0, "RUNNING": 0, "WAITING": 0, "FAIL": 0, "PRUNED": 0}
    for t in study.get_trials(deepcopy=False):
        out[t.state.name] = out.get(t.state.name, 0) + 1
    return out


def run_worker(cfg: SweepConfig, url: str, target: int, worker: int = 0,
               show: bool = True) -> int:
    """Run trials until the study holds ``target`` complete ones; returns how many ran here."""
    from tqdm.auto import tqdm

    # Imported before any trial runs: a Ctrl-C landing inside exec() - which builds every
    # dataclass's methods at import time - makes CPython 3.11 exit by SIGINT after the sweep
    # handled it (exit -2 instead of 130: a CI run hit it in the gate's first import).
    import audiofast.eval.gate  # noqa: F401

    study = load_study(cfg, url, worker)
    objective = make_objective(cfg)
    bar = tqdm(total=target, initial=min(counts(study)["COMPLETE"], target), desc="trials",
               unit="trial", disable=not show, dynamic_ncols=True)
    with _interrupts():
        try:
            return _loop(cfg, study, objective, target, bar, show)
        finally:
            bar.close()


def _loop(cfg: SweepConfig, study, objective, target: int, bar, show: bool) -> int:
    import optuna

    finished: list = []
    ran = failures = 0
    while True:
        _check_interrupted()
        optuna.storages.fail_stale_trials(study)
        n = counts(study)
        bar.n = min(n["COMPLETE"], target)
        bar.refresh()
        if n["COMPLETE"] >= target:
            _settle(study, cfg)
            return ran
        if n["COMPLETE"] + n["RUNNING"] >= target and not n["WAITING"]:
            time.sleep(min(cfg.heartbeat_interval, 5))  # the last ones run elsewhere
            continue
        study.optimize(objective, n_trials=1, catch=(Exception,), gc_after_trial=True,
                       callbacks=[lambda _s, t: finished.append(t)])
        ran += 1
        trial = finished[-1]
        if show:
            bar.write(_line(cfg, trial))
        else:
            log.info(_line(cfg, trial))
        failures = failures + 1 if trial.state.name == "FAIL" else 0
        if failures >= MAX_FAILURES_IN_A_ROW:
            raise SweepError(f"{failures} trials in a row failed; last: "
                             f"{trial.user_attrs.get('error', 'see the log')}")


def _settle(study, cfg: SweepConfig) -> None:
    """Before leaving a finished study, give running trials of other workers one grace
    period: a dead worker's trial then ends failed instead of running forever."""
    import optuna

    deadline = time.monotonic() + cfg.grace_period + cfg.heartbeat_interval
    while counts(study)["RUNNING"] and time.monotonic() < deadline:
        time.sleep(min(cfg.heartbeat_interval, 2))
        optuna.storages.fail_stale_trials(study)


def _line(cfg: SweepConfig, trial) -> str:
    config = trial.user_attrs.get("config")
    label = cfg.lane_module().label(config) if config else "?"
    if trial.state.name != "COMPLETE":
        return f"trial {trial.number}: {label}: {trial.state.name} " \
               f"{trial.user_attrs.get('error', '')}".rstrip()
    seconds, quality = trial.values
    ok = all(v <= 0 for v in trial.constraints.values())
    return (f"trial {trial.number}: {label}: {seconds:.2f} s, quality {quality:+.4f}, "
            f"gate {'pass' if ok else 'FAIL'}")


_STOP = threading.Event()


@contextlib.contextmanager
def _interrupts():
    """Ctrl-C and SIGTERM (a scheduler stopping the job) raise KeyboardInterrupt and are
    remembered: Python drops the exception when the signal lands in a garbage-collector
    callback, so the objective checks the flag too and the trial still ends failed."""
    def handler(signum, frame):
        _STOP.set()
        raise KeyboardInterrupt(f"signal {signum}")

    _STOP.clear()
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup: stay ignored
                previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _check_interrupted() -> None:
    if _STOP.is_set():
        raise KeyboardInterrupt("interrupted")


def run_workers(cfg: SweepConfig, url: str, target: int, workers: int,
                overrides: dict | None = None) -> None:
    """``workers`` processes on the same study (``python -m audiofast.sweep.worker``); the
    progress bar follows the study. A worker that dies leaves its trial to the others."""
    from tqdm.auto import tqdm

    load_study(cfg, url)  # created once here, so workers do not race to create it
    spec = cfg.run_dir / "worker-config.json"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(json.dumps({"path": str(cfg.path), "overrides": overrides or {}}))
    procs = []
    for i in range(workers):
        sink = open(cfg.run_dir / f"worker-{i}.log", "ab")  # noqa: SIM115 (closed below)
        cmd = [sys.executable, "-m", "audiofast.sweep.worker", str(spec), "--storage", url,
               "--study", cfg.study, "--trials", str(target), "--index", str(i)]
        procs.append((subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT), sink))
    bar = tqdm(total=target, desc=f"trials ({workers} workers)", unit="trial")
    study = load_study(cfg, url)
    try:
        while any(p.poll() is None for p, _ in procs):
            bar.n = min(counts(study)["COMPLETE"], target)
            bar.refresh()
            time.sleep(2)
    except KeyboardInterrupt:
        for p, _ in procs:  # they got the terminal's SIGINT too: let them record it
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.terminate()  # SIGTERM fails their trial as Ctrl-C would
                p.wait()
        raise
    finally:
        bar.n = min(counts(study)["COMPLETE"], target)
        bar.close()
        for _, sink in procs:
            sink.close()
    for i, (p, _) in enumerate(procs):
        if p.returncode:
            log.warning("audiofast: sweep worker %d (pid %d) exited with %d; log: %s", i, p.pid,
                        p.returncode, cfg.run_dir / f"worker-{i}.log")
    done = counts(study)["COMPLETE"]
    if done < target:
        raise SweepError(f"the workers stopped at {done}/{target} complete trials "
                         f"(logs in {cfg.run_dir}); rerun the same command to resume")


def worker_main(argv: list[str] | None = None) -> int:
    import argparse

    from audiofast.sweep.config import load_sweep_config

    p = argparse.ArgumentParser(prog="audiofast.sweep.worker")
    p.add_argument("spec", type=Path)
    p.add_argument("--storage", required=True)
    p.add_argument("--study", required=True)
    p.add_argument("--trials", type=int, required=True)
    p.add_argument("--index", type=int, default=0)
    args = p.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    cfg = load_sweep_config(spec["path"], spec["overrides"])
    cfg.study = args.study
    try:
        run_worker(cfg, args.storage, args.trials, args.index, show=False)
    except KeyboardInterrupt:
        return 130
    return 0
