"""The bootstrap interval on the FAD ratio (audiofast.eval.fad_interval) and the stage gate's
decision on it."""

from __future__ import annotations

import numpy as np
import pytest

from audiofast.diffusion.distill_config import GateSpec, StageConfig, StageConfigError
from audiofast.diffusion.stage_gate import fad_checks
from audiofast.eval.fad import Stats, frechet_distance
from audiofast.eval.fad_interval import ClipMoments, RatioInterval, fad_ratio_interval
from audiofast.eval.gate import Verdict

DIM = 8


def clips(n: int, seed: int, shift: float = 0.0, scale: float = 1.0) -> list[np.ndarray]:
    """``n`` clips of 5-20 frames each; each clip has its own offset (prompt-like clusters)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        center = rng.normal(size=DIM)
        out.append(center + shift + scale * rng.normal(size=(int(rng.integers(5, 21)), DIM)))
    return out


def test_moments_give_the_statistics_of_the_frames_they_summarize():
    frames = clips(12, seed=0)
    stats = ClipMoments.of(frames).stats()
    direct = Stats.of(np.concatenate(frames))
    np.testing.assert_allclose(stats.mu, direct.mu, atol=1e-10)
    np.testing.assert_allclose(stats.cov, direct.cov, atol=1e-10)
    assert stats.n == direct.n


def test_weights_count_a_clip_as_many_times_as_it_was_drawn():
    frames = clips(6, seed=1)
    weights = np.array([0, 2, 1, 0, 3, 0])
    repeated = [f for f, w in zip(frames, weights, strict=True) for _ in range(w)]
    stats = ClipMoments.of(frames).stats(weights)
    direct = Stats.of(np.concatenate(repeated))
    np.testing.assert_allclose(stats.mu, direct.mu, atol=1e-10)
    np.testing.assert_allclose(stats.cov, direct.cov, atol=1e-10)


def test_interval_brackets_one_for_an_equal_candidate_and_excludes_it_for_a_worse_one():
    ref = ClipMoments.of(clips(120, seed=10))
    base = ClipMoments.of(clips(120, seed=11, shift=0.5))
    same = fad_ratio_interval(ClipMoments.of(clips(120, seed=12, shift=0.5)), base, ref,
                              replicates=100)
    worse = fad_ratio_interval(ClipMoments.of(clips(120, seed=11, shift=0.8)), base, ref,
                               replicates=100)
    assert same.low < 1.0 < same.high
    assert worse.low > 1.0 and worse.ratio > same.ratio
    assert same.low <= same.ratio <= same.high
    full = frechet_distance(base.stats(), ref.stats())
    assert same.baseline_fad == pytest.approx(full)


def test_more_clips_narrow_the_interval():
    def width(n: int) -> float:
        # candidate and baseline equally far from the reference, as distilled students are
        r = fad_ratio_interval(ClipMoments.of(clips(n, seed=21, shift=0.5)),
                               ClipMoments.of(clips(n, seed=22, shift=0.5)),
                               ClipMoments.of(clips(n, seed=23)), replicates=100)
        return r.high - r.low

    assert width(160) < 0.7 * width(30)


def test_bad_inputs_are_one_line_errors():
    one = ClipMoments.of(clips(4, seed=0))
    with pytest.raises(ValueError, match="paired clips"):
        fad_ratio_interval(one, ClipMoments.of(clips(5, seed=1)), one)
    with pytest.raises(ValueError, match="at least 2 clips"):
        ClipMoments.of(clips(1, seed=0))
    with pytest.raises(ValueError, match="one dim"):
        ClipMoments.of([np.zeros((3, 4)), np.zeros((3, 5))])


@pytest.mark.parametrize(("ratio", "high", "passed"), [
    (1.05, 1.15, True),   # resolved under the goal
    (1.05, 1.30, False),  # point under the goal, interval too wide: unresolved
    (1.15, 1.19, False),  # point over the goal
])
def test_gate_decides_on_point_and_interval(ratio, high, passed):
    verdict = Verdict("audio", "c", "b", passed=False)
    fad_checks(verdict, RatioInterval(ratio, ratio - 0.1, high, 0.95, 200, 10.0, 10.0 / ratio),
               GateSpec())
    assert all(c["passed"] for c in verdict.checks) is passed
    assert verdict.details["fad_ratio_interval"]["high"] == high


def test_gate_interval_settings_are_checked():
    with pytest.raises(StageConfigError, match="interval_level"):
        StageConfig.from_dict({"stage": "cfg", "gate": {"interval_level": 1.5}})
    with pytest.raises(StageConfigError, match="max_fad_ratio_upper"):
        StageConfig.from_dict({"stage": "cfg", "gate": {"max_fad_ratio_upper": 1.0}})
