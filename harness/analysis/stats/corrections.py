"""Multiple-comparison corrections over a table's comparisons, and the level each verdict is decided at."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .bootstrap import bootstrap_diff
from .ttest import summarize

HOLM, NO_CORRECTION = "holm", "none"


def holm(p: Any) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (NaN entries are left out and stay NaN).

    Holm 1979, "A simple sequentially rejective multiple test procedure",
    Scandinavian Journal of Statistics 6(2): the i-th smallest of m p-values
    is multiplied by m - i + 1, capped at 1 and made monotone, which keeps the
    family-wise error rate at alpha.
    """
    p = np.asarray(p, dtype=float)
    out = np.full_like(p, np.nan)
    idx = np.where(~np.isnan(p))[0]
    if len(idx) == 0:
        return out
    order = idx[np.argsort(p[idx])]
    m = len(order)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def holm_interval(cr: Any, by_key: Mapping, alpha: float, bootstrap: bool) -> None:
    """The interval at the level Holm's procedure tested ``cr`` at (Holm 1979): alpha_i = alpha * p / p_Holm.

    Without the monotonicity step p_Holm = (m - i + 1) p, so alpha_i = alpha / (m - i + 1), Holm's own
    step level; with it, alpha_i is smaller still. Either way the interval excludes 0 iff p < alpha_i iff
    p_Holm < alpha: the interval and the verdict cannot disagree."""
    p, pa = cr.p_value, cr.p_adjusted
    if p is None or pa is None or cr.ci_low is None or not p > 0 or not pa > 0:
        return
    level = alpha * p / pa
    if bootstrap:
        a, b = by_key[cr.a], by_key[cr.b]
        ca, cb = summarize(a.values).values, summarize(b.values).values
        is_paired = a.data_key == b.data_key and set(ca) == set(cb)
        bs = bootstrap_diff(ca, cb, paired=is_paired, confidence=1 - level)
        cr.ci_low, cr.ci_high = bs["diff_lo"], bs["diff_hi"]
    elif cr.se and cr.df:
        from scipy import stats as sps

        hw = float(sps.t.ppf(1 - level / 2, cr.df)) * cr.se
        cr.ci_low, cr.ci_high = (cr.delta or 0.0) - hw, (cr.delta or 0.0) + hw
    else:
        return
    cr.ci_level = 1 - level


def verdict_level(cr: Any, alpha: float) -> float:
    """The level a row's verdict is decided at: with Holm, the level Holm's step tested it at,
    alpha * p / p_Holm (Holm 1979; between alpha / m and alpha), which is also its interval's level; alpha
    when the p-values are not adjusted (or the p-value is 0: an exact difference)."""
    p, pa = cr.p_value, cr.p_adjusted
    if p is None or pa is None or not p > 0 or not pa > 0:
        return alpha
    return min(alpha, alpha * p / pa)
