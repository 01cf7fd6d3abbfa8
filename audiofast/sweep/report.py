"""What a sweep found: the trials, the Pareto front of the feasible ones, the best configuration
per quality budget, the chosen one with both verdicts, as JSON, markdown and a PNG of the
front (speed vs quality; gated-out trials drawn apart, the default configuration marked)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from audiofast.sweep.config import SweepConfig

LANE_QUALITY = {  # axis label, display scale, display unit
    "asr": ("TTS WER delta vs baseline, selection half (points)", 100.0, "pts"),
    "audio": ("FAD ratio vs baseline", 1.0, ""),
}


def collect(study) -> list[dict]:
    """One row per trial: its state, configuration, objectives and gate result."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        row = {"number": t.number, "state": t.state.name, "config": t.user_attrs.get("config"),
               "worker": t.user_attrs.get("worker"), "error": t.user_attrs.get("error"),
               "retry_of": t.system_attrs.get("failed_trial")}
        if t.state.name == "COMPLETE" and t.values is not None:
            row["seconds"], row["quality"] = t.values
            row["feasible"] = all(v <= 0 for v in t.constraints.values())
            row |= {k: v for k, v in t.user_attrs.get("result", {}).items()
                    if k in ("checks", "runs", "spec", "label", "details")}
        rows.append(row)
    return rows


def feasible(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["state"] == "COMPLETE" and r.get("feasible")]


def pareto_front(rows: list[dict]) -> list[dict]:
    """Feasible trials no other feasible trial beats on both objectives, fastest first."""
    ok = feasible(rows)
    front = [r for r in ok if not any(
        o["seconds"] <= r["seconds"] and o["quality"] <= r["quality"]
        and (o["seconds"] < r["seconds"] or o["quality"] < r["quality"]) for o in ok)]
    return sorted(front, key=lambda r: (r["seconds"], r["quality"]))


def best_within(rows: list[dict], budget: float | None) -> dict | None:
    """The fastest feasible trial whose quality loss is at most ``budget`` (None: any)."""
    ok = [r for r in feasible(rows) if budget is None or r["quality"] <= budget + 1e-12]
    return min(ok, key=lambda r: (r["seconds"], r["quality"]), default=None)


def summarize(cfg: SweepConfig, study, storage: str) -> dict:
    rows = collect(study)
    from audiofast.sweep.storage import redact

    return {"study": cfg.study, "lane": cfg.lane, "storage": redact(storage),
            "config": str(cfg.path), "trials": rows,
            "pareto": [r["number"] for r in pareto_front(rows)],
            "budgets": [{"budget": b, "trial": (best_within(rows, b) or {}).get("number")}
                        for b in cfg.budgets],
            "chosen": (best_within(rows, cfg.choose_budget) or {}).get("number"),
            "space": {name: p.describe() for name, p in cfg.space.items()}}


def _row(summary: dict, number: int | None) -> dict | None:
    return next((r for r in summary["trials"] if r["number"] == number), None)


def _checks(checks: list[dict]) -> str:
    def value(c):
        return str(c["value"]) if isinstance(c["value"], bool) else f"{c['value']:+.4f}"

    return "; ".join(f"{c['name']} {value(c)} (limit {c['limit']}) "
                     f"{'ok' if c['passed'] else 'FAIL'}" for c in checks)


def markdown(cfg: SweepConfig, summary: dict) -> str:
    label_of = cfg.lane_module().label
    axis, scale, unit = LANE_QUALITY[cfg.lane]
    rows = summary["trials"]
    done = [r for r in rows if r["state"] == "COMPLETE"]
    default = summary.get("default")
    base_s = default["speed"] if default else None

    def speedup(seconds: float) -> str:
        return f"{base_s / seconds:.2f}x" if base_s else "-"

    def q(value: float) -> str:
        return f"{value * scale:+.3f}{(' ' + unit) if unit else ''}"

    out = [f"# Sweep `{summary['study']}` ({cfg.lane} lane)", "",
           f"{len(done)} complete trials ({len(done) - len(feasible(rows))} gated out on the "
           f"selection half), {len(rows) - len(done)} failed, interrupted or running. "
           f"Config `{summary['config']}`, storage `{summary['storage']}`.", "",
           f"Objectives (both minimised): seconds (speed) and quality = {axis}.", "",
           "![Pareto front](pareto.png)", "", "## Search space", "",
           "| parameter | values |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in summary["space"].items()]
    out += ["", "## Pareto front (feasible trials)", "",
            "| trial | configuration | seconds | vs default | quality |", "|---|---|---|---|---|"]
    if default:
        which = f"default (trial {default['trial']})" if "trial" in default else "default"
        out.append(f"| {which} | {label_of(default['config'])} | {default['speed']:.3f} | 1.00x "
                   f"| {q(default['quality'])} |")
    for n in summary["pareto"]:
        r = _row(summary, n)
        out.append(f"| {n} | {label_of(r['config'])} | {r['seconds']:.3f} | "
                   f"{speedup(r['seconds'])} | {q(r['quality'])} |")
    if summary["budgets"]:
        out += ["", "## Best configuration per quality budget", "",
                "| quality budget | trial | configuration | seconds | vs default | quality |",
                "|---|---|---|---|---|---|"]
        for b in summary["budgets"]:
            r = _row(summary, b["trial"])
            out.append(f"| <= {q(b['budget'])} | " + (
                f"{r['number']} | {label_of(r['config'])} | {r['seconds']:.3f} | "
                f"{speedup(r['seconds'])} | {q(r['quality'])} |" if r else "none | | | | |"))
    out += ["", "## Chosen configuration", ""]
    chosen = _row(summary, summary["chosen"])
    if chosen is None:
        out.append("No feasible trial: nothing is chosen and no preset is written.")
    else:
        out += _chosen_section(summary, chosen, label_of, speedup, q)
    out += ["", "## All trials", "", "| trial | state | configuration | seconds | quality | gate |",
            "|---|---|---|---|---|---|"]
    for r in rows:
        label = label_of(r["config"]) if r.get("config") else "-"
        if r["state"] == "COMPLETE":
            out.append(f"| {r['number']} | complete | {label} | {r['seconds']:.3f} | "
                       f"{q(r['quality'])} | {'pass' if r['feasible'] else 'FAIL'} |")
        else:
            note = f" (retry of {r['retry_of']})" if r.get("retry_of") is not None else ""
            out.append(f"| {r['number']} | {r['state'].lower()}{note} | {label} | | | "
                       f"{(r.get('error') or '')[:80]} |")
    return "\n".join(out) + "\n"


def _chosen_section(summary, chosen, label_of, speedup, q) -> list[str]:
    default = summary.get("default") or {}
    out = []
    if chosen["number"] == default.get("trial"):
        out += ["The default configuration is the fastest feasible one: keep it.", ""]
    elif default and default.get("passed") and default["speed"] < chosen["seconds"]:
        out += ["Note: the default configuration (measured apart, outside the space) was "
                "faster than every feasible trial.", ""]
    out += [f"Trial {chosen['number']}: **{label_of(chosen['config'])}** "
           f"({chosen['seconds']:.3f} s, {speedup(chosen['seconds'])} the default's speed, "
           f"quality {q(chosen['quality'])}); judge spec `{chosen.get('spec', '-')}`.", "",
           "| verdict | on | result | checks |", "|---|---|---|---|",
           f"| selection | the half the search saw | {'PASS' if chosen['feasible'] else 'FAIL'} "
           f"| {_checks(chosen.get('checks', []))} |"]
    confirm = summary.get("confirm")
    if confirm:
        out.append(f"| confirmation | {confirm['on']} | {'PASS' if confirm['passed'] else 'FAIL'}"
                   f" | {_checks(confirm['checks'])} |")
    else:
        out.append("| confirmation | held-back half | not run | |")
    compare = summary.get("compare")
    if compare:
        out += ["", f"Side by side on {compare['on']} (timed interleaved, median of "
                f"{compare['runs']}):", "", f"| configuration | seconds | {compare['metric']} |",
                "|---|---|---|"]
        for role in ("default", "chosen"):
            c = compare[role]
            out.append(f"| {role}: {label_of(c['config'])} | {c['seconds']:.3f} | "
                       f"{c['quality_text']} |")
        out += ["", f"Speed ratio (default / chosen): **{compare['speed_ratio']:.2f}x**."]
    if summary.get("preset"):
        out += ["", f"Preset: `{summary['preset']}`."]
    return out


def plot(cfg: SweepConfig, summary: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axis, scale, _ = LANE_QUALITY[cfg.lane]
    rows = [r for r in summary["trials"] if r["state"] == "COMPLETE"]
    ok = [r for r in rows if r["feasible"]]
    bad = [r for r in rows if not r["feasible"]]
    fig, (ax, side) = plt.subplots(1, 2, figsize=(10, 4.8), width_ratios=(3, 1), sharey=False)
    ax.scatter([r["seconds"] for r in ok], [r["quality"] * scale for r in ok], c="tab:blue",
               label="passed the gate", zorder=3)
    front = [_row(summary, n) for n in summary["pareto"]]
    if front:
        ax.step([r["seconds"] for r in front], [r["quality"] * scale for r in front],
                where="post", c="tab:blue", alpha=0.5, label="Pareto front")
    default = summary.get("default")
    if default:
        ax.scatter([default["speed"]], [default["quality"] * scale], marker="*", s=220,
                   c="black", label="default configuration", zorder=4)
    chosen = _row(summary, summary["chosen"])
    if chosen:
        ax.scatter([chosen["seconds"]], [chosen["quality"] * scale], s=160, facecolors="none",
                   edgecolors="tab:green", linewidths=2, label="chosen", zorder=5)
    for r in ok:
        ax.annotate(str(r["number"]), (r["seconds"], r["quality"] * scale), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    limit = summary.get("quality_limit")
    for panel in (ax, side) if limit is not None else ():
        panel.axhline(limit * scale, ls="--", c="grey", lw=1)
    if limit is not None:
        ax.plot([], [], ls="--", c="grey", lw=1, label="gate limit")
    ax.set_xlabel("seconds (lower is faster)")
    ax.set_ylabel(axis)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax.set_title("feasible trials")
    # Gated-out trials on their own panel: their quality is not comparable to a pass.
    side.scatter([r["seconds"] for r in bad], [r["quality"] * scale for r in bad], marker="x",
                 c="tab:red")
    for r in bad:
        side.annotate(str(r["number"]), (r["seconds"], r["quality"] * scale), fontsize=7,
                      xytext=(3, 3), textcoords="offset points")
    side.set_title(f"gated out ({len(bad)})")
    if not bad:
        side.set_xticks([])
    side.set_xlabel("seconds")
    side.grid(alpha=0.3)
    fig.suptitle(f"sweep {summary['study']}: speed vs quality")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write(cfg: SweepConfig, summary: dict, out_dir: Path) -> dict[str, Path]:
    """``sweep.json``, ``report.md`` and ``pareto.png`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "sweep.json", "markdown": out_dir / "report.md",
             "png": out_dir / "pareto.png"}
    paths["json"].write_text(json.dumps(summary, indent=1, default=_jsonable))
    paths["markdown"].write_text(markdown(cfg, summary))
    plot(cfg, summary, paths["png"])
    return paths


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)
