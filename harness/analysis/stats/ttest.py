"""Student t intervals and the two t-tests of a difference of means: paired by seed, and Welch's.

A cell's summary is its mean over seeds with the 95% t-interval (n - 1 degrees
of freedom). Two cells are compared with a paired t-test on the per-seed
differences when they share seeds and data order (pairing removes the
seed-to-seed variance both share), else with Welch's unequal-variance t-test
(Welch 1947, "The generalization of 'Student's' problem when several different
population variances are involved", Biometrika 34(1-2)), its degrees of
freedom by the Welch-Satterthwaite equation (Satterthwaite 1946, Biometrics
Bulletin 2(6)). numpy + scipy.stats; the arrays broadcast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

ALPHA = 0.05
CONFIDENCE = 0.95


def t_halfwidth(std: Any, n: Any, confidence: float = CONFIDENCE) -> np.ndarray:
    """Half-width of the ``confidence`` t-interval of a mean from its sample std and count (NaN if n < 2)."""
    from scipy import stats as sps

    std = np.asarray(std, dtype=float)
    n = np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = sps.t.ppf(0.5 + confidence / 2, np.where(n >= 2, n - 1, np.nan))
        return np.where(n >= 2, q * std / np.sqrt(n), np.nan)


def _t_test(diff: Any, se: Any, df: Any, confidence: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(t, two-sided p, CI half-width) of ``diff`` with standard error ``se``; NaN where se or df is not > 0."""
    from scipy import stats as sps

    diff, se, df = (np.asarray(a, dtype=float) for a in (diff, se, df))
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = (se > 0) & (df > 0)
        t = np.where(ok, diff / se, np.nan)
        p = np.where(ok, 2 * sps.t.sf(np.abs(t), df), np.nan)
        hw = np.where(ok, sps.t.ppf(0.5 + confidence / 2, df) * se, np.nan)
    return t, p, hw


def welch(m1: Any, s1: Any, n1: Any, m2: Any, s2: Any, n2: Any,
          confidence: float = CONFIDENCE) -> dict[str, np.ndarray]:
    """Welch's t-test of mean1 - mean2 from summary statistics (means, sample stds, counts; arrays broadcast).

    Returns the difference, its CI, t, the Welch-Satterthwaite degrees of
    freedom, the two-sided p-value and the standard error; NaN where either
    side has n < 2 or both have zero spread.
    """
    m1, s1, n1, m2, s2, n2 = (np.asarray(a, dtype=float) for a in (m1, s1, n1, m2, s2, n2))
    with np.errstate(invalid="ignore", divide="ignore"):
        v1, v2 = s1 ** 2 / n1, s2 ** 2 / n2
        se = np.sqrt(v1 + v2)
        dof = (v1 + v2) ** 2 / (v1 ** 2 / (n1 - 1) + v2 ** 2 / (n2 - 1))
        ok = (n1 >= 2) & (n2 >= 2) & (se > 0)
        dof = np.where(ok, dof, np.nan)
    diff = m1 - m2
    t, p, hw = _t_test(diff, se, dof, confidence)
    return {"diff": diff, "diff_lo": diff - hw, "diff_hi": diff + hw, "t": t, "dof": dof, "p": p, "se": se}


def paired(a: Mapping[Any, float], b: Mapping[Any, float],
           confidence: float = CONFIDENCE) -> dict[str, Any]:
    """Paired t-test of a - b over the keys (seeds) both have: difference, its CI, t, p, pairs, se.

    In abl two cells run with the same seed see the same training batches in
    the same order, so their per-seed differences cancel the variance the
    seed causes in both. NaN with fewer than 2 pairs or no spread.
    """
    keys = sorted(set(a) & set(b), key=str)
    d = np.array([a[k] - b[k] for k in keys], dtype=float)
    n = len(d)
    diff = float(d.mean()) if n else math.nan
    se = float(d.std(ddof=1) / math.sqrt(n)) if n >= 2 else math.nan
    t, p, hw = _t_test(diff, se, n - 1, confidence)
    return {"diff": diff, "diff_lo": float(diff - hw), "diff_hi": float(diff + hw), "t": float(t),
            "p": float(p), "pairs": n, "se": se}


@dataclass
class Summary:
    """Final-metric statistics of one cell over its seeds."""

    n: int
    mean: float | None
    std: float | None  # sample std (ddof=1); None when n < 2
    ci_low: float | None  # 95% t-interval of the mean; None when n < 2
    ci_high: float | None
    values: dict = field(default_factory=dict)  # seed -> value

    @property
    def ci_halfwidth(self) -> float | None:
        return None if self.ci_high is None or self.mean is None else self.ci_high - self.mean


def summarize(values: Mapping[Any, float] | Sequence[float], confidence: float = CONFIDENCE) -> Summary:
    """Mean, sample std and t-based CI of the mean. ``values``: seed -> value, or a list.

    Non-finite values (a diverged run that still logged a loss) are dropped.
    """
    vals = dict(values) if isinstance(values, Mapping) else dict(enumerate(values))
    vals = {k: float(v) for k, v in vals.items() if v is not None and math.isfinite(float(v))}
    x = np.array(list(vals.values()), dtype=float)
    n = len(x)
    if n == 0:
        return Summary(0, None, None, None, None, vals)
    mean = float(x.mean())
    if n < 2:
        return Summary(1, mean, None, None, None, vals)
    std = float(x.std(ddof=1))
    half = float(t_halfwidth(std, n, confidence))
    return Summary(n, mean, std, mean - half, mean + half, vals)


def exact_difference(diff: float) -> tuple[float, float, float, float]:
    """Zero spread: the t statistic is infinite (or 0/0); the difference is exact: (diff, lo, hi, p)."""
    return diff, diff, diff, (1.0 if diff == 0.0 else 0.0)


def paired_test(cell: Mapping[Any, float], base: Mapping[Any, float],
                confidence: float = CONFIDENCE) -> tuple[float, float, float, float, int]:
    """(mean diff, ci_low, ci_high, p, n) of the per-seed differences cell - base over common seeds."""
    r = paired(cell, base, confidence)
    if r["se"] == 0.0:
        return (*exact_difference(r["diff"]), r["pairs"])
    return r["diff"], r["diff_lo"], r["diff_hi"], r["p"], r["pairs"]


def welch_test(a: Sequence[float], b: Sequence[float],
               confidence: float = CONFIDENCE) -> tuple[float, float, float, float, float]:
    """(mean(a) - mean(b), ci_low, ci_high, p, df): Welch's t-test with Welch-Satterthwaite df."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        sx, sy = x.std(ddof=1), y.std(ddof=1)
    w = welch(x.mean(), sx, len(x), y.mean(), sy, len(y), confidence)
    if float(w["se"]) == 0.0:
        return (*exact_difference(float(w["diff"])), float(len(x) + len(y) - 2))
    return (float(w["diff"]), float(w["diff_lo"]), float(w["diff_hi"]), float(w["p"]), float(w["dof"]))
