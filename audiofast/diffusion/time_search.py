"""Sampling-time search: a distilled student's sampler times chosen by the judge.

A 4-step student distilled at every other time of its parent's 8-step schedule inherits where
those times sit. On the proving ground the shifted schedule is ``1, 0.98, 0.89, 0.51, 0``:
three steps above t = 0.5 and one x0 jump across the lower half of the noise range, which is
where the student loses texture. The student predicts a velocity at any t, so its steps can
move without retraining; which times are best is an empirical question the label-free judge
answers (the idea of Align Your Steps, Sabour et al. 2024, with the judge's FAD ratio as the
objective in place of a bound).

Search: coordinate descent over the interior times on a grid (the parent's schedule at
``grid_steps``). Each move shifts one time by one or two grid points and is kept when it lowers the
FAD ratio to the baseline on *calibration* captions (seeds apart from the gate's held-out
ones) while pitch and category accuracy stay within the gate's ratios. Every scored time set
is appended to ``trials.json`` in the workdir as it finishes, so a killed search resumes
where it stopped. The chosen times are then gated like any stage, on the held-out captions.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from audiofast.atomic import staged_directory
from audiofast.diffusion.checkpoint import CONFIG_NAME, SA3Model
from audiofast.diffusion.distill_config import GateSpec
from audiofast.diffusion.generate import latent_lengths
from audiofast.diffusion.sampling import schedule
from audiofast.diffusion.student import StudentSampler

CALIBRATION_SEED = 3000  # captions at this seed, reference clips at +1000, noise at +2000
RECORD_NAME = "time_search.json"


@dataclass(frozen=True)
class Trial:
    """One time set scored on the calibration captions, as ratios to the baseline's."""

    times: tuple[float, ...]
    fad_ratio: float
    pitch_ratio: float
    category_ratio: float

    def allowed(self, gate: GateSpec) -> bool:
        return (self.pitch_ratio >= gate.min_pitch_ratio
                and self.category_ratio >= gate.min_category_ratio)


def time_grid(model: SA3Model, steps: int) -> list[float]:
    """The times a search may pick from: ``model``'s own schedule at ``steps`` steps."""
    from audiofast.diffusion.teacher import CLIP_SECONDS

    cfg = model.config
    lengths = latent_lengths(cfg, CLIP_SECONDS)
    ts = schedule(steps, cfg.diffusion.sampling_shift, seq_len=lengths.content)
    return [round(float(t), 6) for t in ts]


def with_times(model: SA3Model, times: tuple[float, ...]) -> SA3Model:
    """``model`` (in place) sampling at ``times`` with its own sampler."""
    student = model.config.student
    if student is None or student.sampler is None:
        raise ValueError("time search needs a distilled student (its config names a sampler)")
    if not StudentSampler.valid_times(times):
        raise ValueError(f"times must decrease from 1.0 to 0.0, got {list(times)}")
    sampler = StudentSampler(student.sampler.name, tuple(float(t) for t in times))
    model.config = dataclasses.replace(
        model.config, student=dataclasses.replace(student, sampler=sampler))
    return model


class CalibrationJudge:
    """Scores time sets of one student against the baseline on the calibration captions."""

    def __init__(self, student: SA3Model, baseline: SA3Model, gate: GateSpec, clips: int,
                 seed: int = 0):
        from audiofast.diffusion.quality import build_judge
        from audiofast.diffusion.teacher import SynthSet

        self.student, self.seed = student, CALIBRATION_SEED + 2000 + seed
        self.captions = SynthSet.build(clips, seed=CALIBRATION_SEED + seed)
        self.judge = build_judge(SynthSet.build(clips, seed=CALIBRATION_SEED + 1000 + seed))
        self.base = self._score(baseline, steps=gate.baseline_steps, cfg=gate.baseline_cfg,
                                sampler=gate.baseline_sampler)

    def _score(self, model: SA3Model, **settings) -> dict:
        from audiofast.diffusion.stage_gate import generate_clips
        from audiofast.diffusion.teacher import CLIP_SECONDS

        audio, _ = generate_clips(model, self.captions.captions, CLIP_SECONDS, self.seed,
                                  **settings)
        return self.judge.score(audio, self.captions.meta)

    def __call__(self, times: tuple[float, ...]) -> Trial:
        s = self._score(with_times(self.student, times))
        b = self.base
        return Trial(times, s["fad"] / b["fad"],
                     s["pitch_accuracy"] / max(b["pitch_accuracy"], 1e-9),
                     s["category_accuracy"] / max(b["category_accuracy"], 1e-9))


def _neighbours(index: list[int], reach: int = 2) -> list[list[int]]:
    """Each interior grid index moved up to ``reach`` points either way (nearest moves first),
    order kept strict: two points, because one-point moves stall where a single time sits
    between two worse neighbours."""
    out = []
    for distance in range(1, reach + 1):
        for i in range(1, len(index) - 1):
            for step in (-distance, distance):
                moved = index[:i] + [index[i] + step] + index[i + 1:]
                if moved[i - 1] < moved[i] < moved[i + 1]:
                    out.append(moved)
    return out


def search_times(score, grid: list[float], start: tuple[float, ...], gate: GateSpec,
                 workdir: str | Path, max_trials: int = 24, calibration: dict | None = None,
                 progress: bool = True) -> tuple[tuple[float, ...], list[Trial]]:
    """The best allowed time set (lowest FAD ratio) that coordinate descent from ``start``
    (snapped to ``grid``) reaches within ``max_trials`` distinct time sets; ``start`` itself
    when no move helps. ``score(times) -> Trial``. Trials already in ``workdir/trials.json``
    are reused, not rescored (they count towards the budget: a resumed search stops where the
    uninterrupted one would); ``calibration`` names what the scores were measured on, and a
    log measured on something else is refused rather than mixed in."""
    path = Path(workdir) / "trials.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    log = json.loads(path.read_text()) if path.exists() else {"calibration": calibration,
                                                                 "trials": []}
    if log.get("calibration") != calibration:
        raise ValueError(f"{path} was scored on {log.get('calibration')}, not {calibration}: "
                         "remove it or use another --workdir")
    done = {tuple(t["times"]): Trial(tuple(t["times"]), t["fad_ratio"], t["pitch_ratio"],
                                     t["category_ratio"]) for t in log["trials"]}
    trials: list[Trial] = []  # each time set once, in the order the descent met them
    bar = tqdm(total=max_trials, desc="time search", disable=not progress)

    def scored(index: list[int]) -> Trial:
        times = tuple(grid[i] for i in index)
        if times not in done:
            done[times] = score(times)
            tmp = path.with_suffix(".tmp")
            log["trials"] = [dataclasses.asdict(t) for t in done.values()]
            tmp.write_text(json.dumps(log, indent=1))
            tmp.replace(path)
        if done[times] not in trials:
            trials.append(done[times])
            bar.update(1)
            bar.set_postfix(fad_ratio=f"{done[times].fad_ratio:.3f}")
        return done[times]

    index = [min(range(len(grid)), key=lambda i, t=t: abs(grid[i] - t)) for t in start]
    if len(set(index)) != len(index):
        raise ValueError(f"a {len(grid) - 1}-step grid is too coarse for {len(start) - 1} "
                         "steps: use more grid steps")
    best_index, best = index, scored(index)
    improved = True
    while improved and len(trials) < max_trials:
        improved = False
        for candidate in _neighbours(best_index):
            if len(trials) >= max_trials:
                break
            trial = scored(candidate)
            if trial.allowed(gate) and (not best.allowed(gate)
                                        or trial.fad_ratio < best.fad_ratio):
                best_index, best, improved = candidate, trial, True
                break
    bar.close()
    return best.times, trials


def export_with_times(student_dir: str | Path, times: tuple[float, ...], out: str | Path,
                      record: dict) -> Path:
    """A copy of the student folder sampling at ``times`` (its config's sampler times), with
    the search's ``record`` beside it; written whole or not at all."""
    student_dir, out = Path(student_dir), Path(out)
    raw = json.loads((student_dir / CONFIG_NAME).read_text(encoding="utf-8"))
    raw["audiofast"]["sampler"]["times"] = [float(t) for t in times]
    with staged_directory(out) as staging:
        for item in student_dir.iterdir():
            if item.name in (CONFIG_NAME, RECORD_NAME, "gate"):
                continue
            copy = shutil.copytree if item.is_dir() else shutil.copy2
            copy(item, staging / item.name)
        (staging / CONFIG_NAME).write_text(json.dumps(raw, indent=2), encoding="utf-8")
        (staging / RECORD_NAME).write_text(json.dumps(record, indent=2), encoding="utf-8")
    return out
