"""Power of a t-test, the minimum detectable difference, and the seeds a grid needs.

The power of a two-sided t-test comes from the noncentral t distribution
(exact for the t-test); MIN_SEEDS is the fewest seeds per cell a verdict is
given on.
"""

from __future__ import annotations

import math

from .ttest import ALPHA

MIN_SEEDS = 3
POWER = 0.8


def power_t(effect: float, se_unit: float, df: float, alpha: float = ALPHA) -> float:
    """Power of a two-sided t-test of a true difference ``effect`` when the standard error is ``se_unit``.

    Exact, from the noncentral t distribution with noncentrality effect / se.
    """
    from scipy import stats as sps

    if not (se_unit > 0 and df > 0):
        return math.nan
    crit = float(sps.t.ppf(1 - alpha / 2, df))
    ncp = abs(effect) / se_unit
    # the lower tail as the upper tail of the mirrored distribution: scipy's nct.cdf(-crit) returns NaN
    # where the value underflows (ncp of about 7 and more), nct.sf does not
    return float(sps.nct.sf(crit, df, ncp) + sps.nct.sf(crit, df, -ncp))


def min_detectable(se: float | None, df: float | None, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """Smallest true |difference| a two-sided t-test at level ``alpha`` detects with probability ``power``,
    at this standard error and df. Exact: the root of ``power_t`` (the noncentral t, scipy), bracketed by the
    usual approximation (t_{1-alpha/2, df} + t_{power, df}) * se, which it slightly exceeds at small df. For
    a paired test this is statsmodels' ``TTestPower().solve_power`` times the sd of the differences.
    ``alpha`` is the level the verdict uses (Holm's step level: abl.analysis.stats.corrections.verdict_level).
    None without a variance estimate."""
    from scipy import stats as sps
    from scipy.optimize import brentq

    if se is None or df is None or not math.isfinite(se) or not df > 0 or not 0 < alpha < 1:
        return None
    if se == 0:
        return 0.0
    approx = float((sps.t.ppf(1 - alpha / 2, df) + sps.t.ppf(power, df)) * se)
    lo, hi = approx / 2, approx * 2
    while power_t(hi, se, df, alpha) < power and hi < approx * 1e6:
        hi *= 2
    return float(brentq(lambda x: power_t(x, se, df, alpha) - power, lo, hi, xtol=1e-12 * approx))


def seeds_needed(sd: float, effect: float, *, paired: bool = True, alpha: float = ALPHA, power: float = POWER,
                 comparisons: int = 1, max_seeds: int = 10_000) -> int | None:
    """Seeds per cell for a two-sided t-test to detect ``effect`` with probability ``power``.

    ``sd``: the standard deviation of the per-seed differences (paired) or of
    one cell's values (Welch, equal sizes and spreads: se = sd * sqrt(2 / n),
    df = 2n - 2). With ``comparisons`` = m > 1 the test runs at alpha / m,
    the strictest step of Holm's correction, so the figure holds for every
    comparison of the family. Power from the noncentral t (exact for the
    t-test). None if even ``max_seeds`` is not enough or sd is not usable.
    """
    if not (sd >= 0 and math.isfinite(sd)) or effect == 0:
        return None
    if sd == 0:
        return MIN_SEEDS
    a = alpha / max(1, comparisons)
    for n in range(2, max_seeds + 1):
        se, df = (sd / math.sqrt(n), n - 1) if paired else (sd * math.sqrt(2 / n), 2 * n - 2)
        if power_t(effect, se, df, a) >= power:
            return max(n, MIN_SEEDS)
    return None
