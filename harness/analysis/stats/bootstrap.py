"""A percentile bootstrap of a difference of means, for cells whose values are not normal."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .ttest import CONFIDENCE

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def bootstrap_diff(a: Mapping[Any, float], b: Mapping[Any, float], *, paired: bool,
                   confidence: float = CONFIDENCE, resamples: int = BOOTSTRAP_RESAMPLES,
                   seed: int = BOOTSTRAP_SEED) -> dict[str, float]:
    """Percentile bootstrap of mean(a) - mean(b) (Efron & Tibshirani 1993, ch. 13), for non-normal cells.

    Paired: resample the seeds both ran and average their differences;
    otherwise resample each cell's seeds independently. The p-value inverts
    the percentile interval: twice the smaller tail share of the bootstrap
    differences at 0 (the smallest alpha whose interval excludes 0). The
    generator is seeded, so every table that asks gets the same numbers.
    """
    rng = np.random.default_rng(seed)
    if paired:
        keys = sorted(set(a) & set(b), key=str)
        d = np.array([a[k] - b[k] for k in keys], dtype=float)
        idx = rng.integers(0, len(d), (resamples, len(d)))
        boot = d[idx].mean(axis=1)
        diff = float(d.mean())
    else:
        x, y = np.array(list(a.values()), dtype=float), np.array(list(b.values()), dtype=float)
        boot = (x[rng.integers(0, len(x), (resamples, len(x)))].mean(axis=1)
                - y[rng.integers(0, len(y), (resamples, len(y)))].mean(axis=1))
        diff = float(x.mean() - y.mean())
    lo, hi = np.quantile(boot, [(1 - confidence) / 2, (1 + confidence) / 2])
    p = float(min(1.0, 2 * min(np.mean(boot <= 0), np.mean(boot >= 0))))
    return {"diff": diff, "diff_lo": float(lo), "diff_hi": float(hi), "p": p}
