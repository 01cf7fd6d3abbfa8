"""``audiofast sweep`` and ``audiofast pipeline run``: thin shells over :mod:`audiofast.sweep`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def add_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", help="self-gated speed/quality search over a lane's configurations",
        description="Search configs/sweeps/NAME.yaml with Optuna (speed and quality "
        "objectives); every trial is judged by the gate on one half of its sentences (a failed "
        "gate: infeasible), the chosen configuration is confirmed on the other half plus the "
        "real recordings, then a report, a Pareto plot and a preset are written. Resumable: "
        "rerun the same command after Ctrl-C or a kill.")
    p.add_argument("config", type=Path, help="sweep YAML (configs/sweeps/*.yaml)")
    p.add_argument("--trials", type=int, default=None,
                   help="complete trials the study should hold (default: the YAML's)")
    p.add_argument("--storage", default=None,
                   help="SQLAlchemy URL of the study (default: SQLite beside the report; "
                   "postgresql://user@host/db to share one study between machines)")
    p.add_argument("--study", default=None, help="study name (default: the YAML's)")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes on this machine (default: the YAML's, else 1)")
    p.add_argument("--out", type=Path, default=None,
                   help="report folder parent (default: the YAML's out, runs/sweeps)")
    p.add_argument("--preset", default=None,
                   help="write the confirmed choice as configs/presets/NAME.yaml (default: "
                   "the YAML's preset)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--worker-only", action="store_true",
                      help="only run trials (another machine's command writes the report)")
    mode.add_argument("--report-only", action="store_true",
                      help="only write the report (and confirm, and the preset) of the study")
    p.add_argument("--no-confirm", action="store_true",
                   help="skip the held-back verdict and comparison (no preset then)")
    p.set_defaults(run=_run_sweep)


def _load(args: argparse.Namespace):
    from audiofast.sweep.config import load_sweep_config
    from audiofast.sweep.params import SweepConfigError
    from audiofast.sweep.runner import storage_url
    from audiofast.sweep.study import load_study

    try:
        cfg = load_sweep_config(args.config)
        if args.study:
            cfg.study = args.study
        if args.out:
            cfg.out = args.out
        for name in ("trials", "workers"):
            value = getattr(args, name)
            if value is not None and value < 1:
                raise SweepConfigError(f"--{name} {value}: must be >= 1")
        url = storage_url(cfg, args.storage)
        load_study(cfg, url)  # unreachable storage, foreign study: one line, before any trial
    except SweepConfigError as e:
        raise SystemExit(f"audiofast: error: {e}") from None
    return cfg, url


def _run_sweep(args: argparse.Namespace) -> int:
    from audiofast.sweep.runner import finish, progress, search
    from audiofast.sweep.study import SweepError

    cfg, url = _load(args)
    if not args.report_only:
        try:
            search(cfg, url, args.trials, args.workers)
        except KeyboardInterrupt:
            print(f"\naudiofast: sweep interrupted: {progress(cfg, url)}; the running trial is "
                  "marked failed; rerun the same command to resume", file=sys.stderr)
            return 130
        except SweepError as e:
            print(f"audiofast: error: {e}", file=sys.stderr)
            return 1
    if args.worker_only:
        print(f"audiofast: worker done: {progress(cfg, url)}")
        return 0
    summary = finish(cfg, url, confirm=not args.no_confirm, preset=args.preset or cfg.preset)
    _print_summary(summary)
    return 0 if summary["chosen"] is not None else 1


def _print_summary(summary: dict) -> None:
    chosen = next((r for r in summary["trials"] if r["number"] == summary["chosen"]), None)
    if chosen is None:
        print("audiofast: no trial passed the gate on the selection half")
    else:
        line = f"chosen: trial {chosen['number']} ({chosen['seconds']:.3f} s"
        compare = summary.get("compare")
        if compare:
            line += f", {compare['speed_ratio']:.2f}x the default's speed side by side"
        confirm = summary.get("confirm")
        if confirm:
            line += f"; held-back verdict {'PASS' if confirm['passed'] else 'FAIL'}"
        print(line + ")")
    if summary.get("preset"):
        print(f"preset: {summary['preset']}")
    print(f"report: {summary['paths']['markdown']}")
    print(f"plot: {summary['paths']['png']}")


def add_pipeline(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pipeline", help="run a lane's stages in order, each cached")
    pp = p.add_subparsers(dest="pipeline_command", required=True)
    r = pp.add_parser("run", help="run pipelines/NAME.yaml (finished stages are skipped)",
                      description="Each stage is cached by a hash of its inputs, its code and "
                      "the stages before it: a re-run skips finished work, a changed input "
                      "re-runs its stage and the ones after it.")
    r.add_argument("pipeline", type=Path, help="pipeline YAML (pipelines/asr.yaml)")
    r.add_argument("--from", dest="from_stage", default=None, metavar="STAGE",
                   help="re-run STAGE and every stage after it")
    r.add_argument("--dry-run", action="store_true",
                   help="print which stages would run, run nothing")
    r.add_argument("--workdir", type=Path, default=None,
                   help="stage folders (default: the YAML's workdir)")
    r.set_defaults(run=_run_pipeline)


def _run_pipeline(args: argparse.Namespace) -> int:
    from audiofast.sweep.params import SweepConfigError
    from audiofast.sweep.pipeline import load_pipeline, run_pipeline, summary_table

    try:
        pipeline = load_pipeline(args.pipeline, args.workdir)
        reports = run_pipeline(pipeline, args.from_stage, args.dry_run)
    except SweepConfigError as e:
        raise SystemExit(f"audiofast: error: {e}") from None
    except KeyboardInterrupt:
        print("\naudiofast: pipeline interrupted; rerun to resume the stage", file=sys.stderr)
        return 130
    print(f"\npipeline {pipeline.name} ({pipeline.workdir}){' (dry run)' if args.dry_run else ''}")
    print(summary_table(reports))
    failed = [r for r in reports if r.status == "failed"]
    if failed and (args.debug or os.environ.get("AUDIOFAST_DEBUG") == "1"):
        print(failed[0].traceback, file=sys.stderr)
    if failed:
        print(f"audiofast: stage {failed[0].name} failed: {failed[0].error}", file=sys.stderr)
        return 1
    return 0
