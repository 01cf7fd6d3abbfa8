"""A bootstrap confidence interval on the FAD *ratio* of a candidate to its baseline.

A FAD of a few hundred clips moves by several percent between draws of the clips, so a point
ratio of 1.08 says little about a 1.1x goal. The interval answers "is the candidate within
1.1x of the baseline, given how many clips we scored?":

- **paired**: candidate clip ``i`` and baseline clip ``i`` come from the same prompt and seed,
  so each bootstrap replicate resamples the same prompt indices for both (prompt difficulty
  cancels in the ratio, as it does in the point estimate);
- the **reference** clips are resampled independently (they are a sample too) and shared by
  both sides within a replicate;
- statistics are sums: each clip's frame count, frame sum and sum of outer products are kept,
  so a replicate's mean and covariance are a weighted sum over clips (clip multiplicities),
  not a recomputation over every frame.

The interval is the percentile interval of the replicates' ratios. Resampling clips with
repetition shrinks a set's spread and raises both FADs a little; the ratio's bias from that is
far smaller than its spread, which is what the interval is for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from audiofast.eval.fad import Stats, frechet_distance


@dataclass(frozen=True)
class ClipMoments:
    """Per-clip frame moments: ``count [N]``, ``total [N, D]``, ``outer [N, D, D]``."""

    count: np.ndarray
    total: np.ndarray
    outer: np.ndarray

    @classmethod
    def of(cls, frames: Sequence[np.ndarray]) -> ClipMoments:
        if len(frames) < 2:
            raise ValueError(f"need at least 2 clips for a FAD interval, got {len(frames)}")
        x = [np.asarray(f, dtype=np.float64) for f in frames]
        dims = {f.shape[1] for f in x if f.ndim == 2}
        if len(dims) != 1 or any(f.ndim != 2 or len(f) == 0 for f in x):
            raise ValueError("every clip needs (frames >= 1, dim) embeddings of one dim")
        return cls(np.array([len(f) for f in x], dtype=np.float64),
                   np.stack([f.sum(0) for f in x]), np.stack([f.T @ f for f in x]))

    def __len__(self) -> int:
        return len(self.count)

    def stats(self, weights: np.ndarray | None = None) -> Stats:
        """Mean and (unbiased) covariance of the frames of clips taken ``weights`` times."""
        w = np.ones(len(self)) if weights is None else np.asarray(weights, dtype=np.float64)
        n = float(w @ self.count)
        mu = (w @ self.total) / n
        second = np.tensordot(w, self.outer, axes=1)
        cov = (second - n * np.outer(mu, mu)) / (n - 1)
        return Stats(mu, cov, int(n))


@dataclass(frozen=True)
class RatioInterval:
    ratio: float  # on all clips
    low: float
    high: float
    level: float
    replicates: int
    candidate_fad: float
    baseline_fad: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def fad_ratio_interval(candidate: ClipMoments, baseline: ClipMoments, reference: ClipMoments,
                       replicates: int = 200, level: float = 0.95,
                       seed: int = 0) -> RatioInterval:
    """``FAD(candidate, reference) / FAD(baseline, reference)`` with a paired bootstrap
    percentile interval (candidate and baseline resampled together, reference apart)."""
    if len(candidate) != len(baseline):
        raise ValueError(f"paired clips: {len(candidate)} candidate vs {len(baseline)} baseline")
    if not 0 < level < 1 or replicates < 10:
        raise ValueError("need 0 < level < 1 and at least 10 replicates")
    ref = reference.stats()
    fad_c, fad_b = frechet_distance(candidate.stats(), ref), frechet_distance(baseline.stats(), ref)
    rng = np.random.default_rng(seed)
    n, m = len(candidate), len(reference)
    ratios = []
    for _ in range(replicates):
        w = np.bincount(rng.integers(0, n, n), minlength=n)
        ref_b = reference.stats(np.bincount(rng.integers(0, m, m), minlength=m))
        b = frechet_distance(baseline.stats(w), ref_b)
        ratios.append(frechet_distance(candidate.stats(w), ref_b) / max(b, 1e-12))
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return RatioInterval(fad_c / max(fad_b, 1e-12), float(low), float(high), level, replicates,
                         fad_c, fad_b)
