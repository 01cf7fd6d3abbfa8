"""A whole sweep as ``audiofast sweep`` runs it: search, then finish (the default point, the
chosen configuration, its held-back verdict and the side-by-side comparison, the report, the
preset). Pipelines call the two halves as separate stages."""

from __future__ import annotations

from audiofast.sweep.config import SweepConfig
from audiofast.sweep.storage import default_url


def storage_url(cfg: SweepConfig, storage: str | None = None) -> str:
    return storage or cfg.storage or default_url(cfg.run_dir)


def search(cfg: SweepConfig, url: str, trials: int | None = None, workers: int | None = None,
           overrides: dict | None = None, show: bool = True) -> None:
    """Run trials until the study holds ``trials`` complete ones (here, or in ``workers``
    processes); Ctrl-C fails the running trial and raises KeyboardInterrupt."""
    from audiofast.sweep.study import run_worker, run_workers

    trials = trials or cfg.trials
    workers = workers or cfg.workers
    if workers > 1:
        run_workers(cfg, url, trials, workers, overrides)
    else:
        run_worker(cfg, url, trials, show=show)


def finish(cfg: SweepConfig, url: str, confirm: bool = True, preset: str | None = None
           ) -> dict:
    """Report on the study (and confirm, compare, write the preset): returns the summary,
    with ``paths`` of the written files."""
    from audiofast.sweep import confirm as confirm_mod
    from audiofast.sweep import report
    from audiofast.sweep.preset import write_preset
    from audiofast.sweep.study import load_study

    study = load_study(cfg, url)
    default = confirm_mod.default_point(cfg, study)
    summary = report.summarize(cfg, study, url) | {
        "default": default, "quality_limit": cfg.lane_module().quality_limit(cfg.settings)}
    chosen = next((r for r in summary["trials"] if r["number"] == summary["chosen"]), None)
    if chosen is not None and confirm:
        summary["confirm"] = confirm_mod.confirm(cfg, study, chosen)
        summary["compare"] = confirm_mod.compare(cfg, study, default, chosen)
    if chosen is not None and preset and summary.get("confirm", {}).get("passed"):
        source = {"study": cfg.study, "trial": chosen["number"], "config": str(cfg.path),
                  "confirmed": True, "speed_ratio": round(summary["compare"]["speed_ratio"], 3)}
        summary["preset"] = str(write_preset(preset, cfg.lane, chosen["config"], source))
    summary["paths"] = {k: str(v) for k, v in report.write(cfg, summary, cfg.run_dir).items()}
    return summary


def progress(cfg: SweepConfig, url: str) -> str:
    from audiofast.sweep.study import counts, load_study

    n = counts(load_study(cfg, url))
    return (f"{n['COMPLETE']} complete, {n['FAIL']} failed, {n['RUNNING']} running "
            f"({cfg.study} in {url if url.startswith('sqlite') else 'the shared storage'})")
