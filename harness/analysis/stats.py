"""Multi-seed statistics: is a cell's difference from the baseline real?

One implementation for the CLI, the report and the dashboard.

For each cell: the mean, the sample standard deviation and the 95% confidence
interval (Student t, n - 1 degrees of freedom) of its final value over
seeds. For each cell against a baseline cell: the difference of means, its 95%
CI and a two-sided p-value,

- paired by seed (t-test on the per-seed differences) when both cells ran the
  same seeds and see the same data order. In abl the order of training
  batches depends only on the seed (given the dataset, context and batch
  size), so cells of one grid with the same seed set are paired: pairing
  removes the seed-to-seed variance both cells share;
- otherwise Welch's unequal-variance t-test (Welch-Satterthwaite degrees of
  freedom).

``analyse`` (at the end of this module) is the one verdict engine: the
``abl run`` summary, ``abl compare``, ``abl report`` and the dashboard's
Compare page all call it (through abl.analysis.verdicts), with the same defaults:
paired by seed when the cells share seeds and data order, else Welch; Holm
over the comparisons shown; "too few seeds to decide" below MIN_SEEDS seeds,
with the minimum detectable difference; cells that did not learn are not
ranked. ``compare`` and ``compare_cells`` are thin wrappers over it. The
dashboard's other pages use ``summarize_groups``, ``t_halfwidth``, ``ema``,
``pareto_mask`` and ``downsample``.

numpy + scipy.stats; the frame helpers take pandas objects but do not import
pandas; nothing here knows torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Hashable, Iterable, Mapping, Sequence

import numpy as np

ALPHA = 0.05
CONFIDENCE = 0.95

BETTER, WORSE, SAME, BASELINE = "better", "worse", "not distinguishable", "baseline"


# ---------------------------------------------------------------- the t machinery (arrays broadcast)


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


def holm(p: Any) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (NaN entries are left out and stay NaN)."""
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


def stars(p: float | None) -> str:
    if p is None or not np.isfinite(p):
        return "n/a"
    if p < 0.001:
        return "***"
    if p < 0.01:
        return "**"
    if p < 0.05:
        return "*"
    return "n.s."


# ---------------------------------------------------------------- one cell against a baseline (CLI, report)


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


@dataclass
class Comparison:
    """One cell against the baseline: delta = mean(cell) - mean(baseline)."""

    delta: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    test: str  # "paired t (n=3)", "Welch t", "baseline", or "none"
    verdict: str
    note: str = ""
    df: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _verdict(delta: float, p: float, alpha: float, lower_is_better: bool) -> str:
    if not p < alpha:
        return SAME
    improves = delta < 0 if lower_is_better else delta > 0
    return BETTER if improves else WORSE


def _exact(diff: float) -> tuple[float, float, float, float]:
    """Zero spread: the t statistic is infinite (or 0/0); the difference is exact: (diff, lo, hi, p)."""
    return diff, diff, diff, (1.0 if diff == 0.0 else 0.0)


def paired_test(cell: Mapping[Any, float], base: Mapping[Any, float],
                confidence: float = CONFIDENCE) -> tuple[float, float, float, float, int]:
    """(mean diff, ci_low, ci_high, p, n) of the per-seed differences cell - base over common seeds."""
    r = paired(cell, base, confidence)
    if r["se"] == 0.0:
        return (*_exact(r["diff"]), r["pairs"])
    return r["diff"], r["diff_lo"], r["diff_hi"], r["p"], r["pairs"]


def welch_test(a: Sequence[float], b: Sequence[float],
               confidence: float = CONFIDENCE) -> tuple[float, float, float, float, float]:
    """(mean(a) - mean(b), ci_low, ci_high, p, df): Welch's t-test with Welch-Satterthwaite df."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        sx, sy = x.std(ddof=1), y.std(ddof=1)
    w = welch(x.mean(), sx, len(x), y.mean(), sy, len(y), confidence)
    if float(w["se"]) == 0.0:
        return (*_exact(float(w["diff"])), float(len(x) + len(y) - 2))
    return (float(w["diff"]), float(w["diff_lo"]), float(w["diff_hi"]), float(w["p"]), float(w["dof"]))


def compare(cell: Mapping[Any, float], base: Mapping[Any, float], *, paired: bool | None = None,
            alpha: float = ALPHA, lower_is_better: bool = True, confidence: float = CONFIDENCE) -> Comparison:
    """One cell's per-seed values against the baseline's (both: seed -> value), through ``analyse``.

    ``paired=None`` pairs when both ran exactly the same seeds; ``paired=False``
    when the cells do not share data order. One comparison: no correction.
    """
    cells = [CellInput("cell", "cell", dict(cell), 0), CellInput("base", "base", dict(base), 0 if paired is not False else 1)]
    r = analyse(cells, [("cell", "base")], alpha=alpha, correction=NO_CORRECTION,
                lower_is_better=lower_is_better, confidence=confidence).comparisons[0]
    return Comparison(r.delta, r.ci_low, r.ci_high, r.p_value, r.test, r.verdict, r.note, r.df)


@dataclass
class CellResult:
    key: Hashable
    summary: Summary
    comparison: Comparison


def compare_cells(values: Mapping[Any, Mapping[Any, float]], baseline: Hashable, *,
                  data_keys: Mapping[Any, Hashable] | None = None, alpha: float = ALPHA,
                  lower_is_better: bool = True) -> list[CellResult]:
    """Summaries and comparisons with ``baseline`` for every cell, in the given order (``analyse`` with
    Holm over the comparisons).

    ``values``: cell key -> {seed: final value}. ``data_keys``: cell key ->
    anything identifying its data order apart from the seed (dataset
    fingerprint, context, batch size); cells are paired only when their data
    keys are equal and they ran the same seeds.
    """
    if baseline not in values:
        raise KeyError(f"baseline cell {baseline!r} is not among the cells")
    cells = [CellInput(k, str(k), dict(v), (data_keys or {}).get(k)) for k, v in values.items()]
    an = analyse(cells, against_baseline(list(values), baseline), alpha=alpha, lower_is_better=lower_is_better)
    by_a = {r.a: r for r in an.comparisons}
    out = []
    for key, vals in values.items():
        s = summarize(vals)
        r = by_a.get(key)
        comp = (Comparison(0.0 if s.n else None, None, None, None, BASELINE, BASELINE) if r is None else
                Comparison(r.delta, r.ci_low, r.ci_high, r.p_adjusted, r.test, r.verdict, r.note, r.df))
        out.append(CellResult(key, s, comp))
    return out


def fmt(x: float | None, digits: int = 4) -> str:
    """The one number format of tables (reports and CLI)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{digits}f}"


def fmt_p(p: float | None) -> str:
    if p is None:
        return "-"
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


def seeds_of(rows: Iterable[tuple[Hashable, Hashable, float]]) -> dict[Hashable, dict[Hashable, float]]:
    """Group (cell key, seed, value) rows into cell key -> {seed: value}, keeping first-seen order."""
    out: dict[Hashable, dict[Hashable, float]] = {}
    for key, seed, value in rows:
        out.setdefault(key, {})
        if value is not None:
            out[key][seed] = value
    return out


# ---------------------------------------------------------------- frames and curves (dashboard)


def summarize_groups(df: Any, by: str | list[str], value: str = "value",
                     confidence: float = CONFIDENCE) -> Any:
    """Per group of a DataFrame: n, mean, std, min, max and the t-interval of the mean (ci_lo, ci_hi)."""
    g = df.groupby(by, sort=False, dropna=False)[value]
    out = g.agg(n="count", mean="mean", std="std", min="min", max="max").reset_index()
    hw = t_halfwidth(out["std"], out["n"], confidence)
    out["ci_lo"] = out["mean"] - hw
    out["ci_hi"] = out["mean"] + hw
    return out


def ema(values: Any, weight: float) -> np.ndarray:
    """Debiased exponential moving average (TensorBoard's smoothing), weight in [0, 1)."""
    y = np.asarray(values, dtype=float)
    if weight <= 0 or len(y) == 0:
        return y
    from scipy.signal import lfilter

    finite = np.isfinite(y)
    filled = np.where(finite, y, 0.0)
    num = lfilter([1 - weight], [1, -weight], filled)
    den = lfilter([1 - weight], [1, -weight], finite.astype(float))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def ema_by_group(df: Any, group: str, col: str, weight: float) -> np.ndarray:
    """EMA of ``col`` within each group; ``df`` must be sorted by group then step."""
    if weight <= 0:
        return df[col].to_numpy(dtype=float)
    out = np.empty(len(df))
    values = df[col].to_numpy(dtype=float)
    keys = df[group].to_numpy()
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    ends = np.r_[starts[1:], len(df)]
    for a, b in zip(starts, ends):
        out[a:b] = ema(values[a:b], weight)
    return out


def pareto_mask(x: Any, y: Any, x_better: str = "lower") -> np.ndarray:
    """True for points not dominated by another: y lower is better, x per ``x_better``."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    sx = -x if x_better == "higher" else x
    ok = np.isfinite(sx) & np.isfinite(y)
    mask = np.zeros(len(x), dtype=bool)
    idx = np.where(ok)[0]
    # sweep by cost ascending (ties: better y first); a point is on the front if it beats
    # every cheaper point's y
    order = idx[np.lexsort((y[idx], sx[idx]))]
    best = math.inf
    for i in order:
        if y[i] < best:
            mask[i] = True
            best = y[i]
    return mask


def downsample(df: Any, group: str, max_points: int) -> Any:
    """Keep at most ``max_points`` evenly spaced rows per group (always the first and last)."""
    if df.empty:
        return df
    pos = df.groupby(group, sort=False).cumcount().to_numpy()
    size = df.groupby(group, sort=False)[group].transform("size").to_numpy()
    stride = np.maximum(1, np.ceil(size / max_points)).astype(int)
    keep = (pos % stride == 0) | (pos == size - 1)
    return df[keep]


# ---------------------------------------------------------------- verdict tables (CLI summary, compare, report, dashboard)
#
# One analysis for every table abl shows: per-cell summaries with learning
# health, then any set of comparisons (each cell against a baseline, chosen
# pairs, or every pair of values of one grid axis), tested with the same
# defaults everywhere:
#
# - paired t-test by seed when both cells ran the same seeds on the same data
#   order, else Welch's t-test (or, with ``bootstrap=True``, a percentile
#   bootstrap of the difference of means, resampling seeds, paired or not);
# - Holm's step-down correction over the comparisons shown (Holm 1979), so the
#   family-wise error rate stays at alpha however many comparisons a table has;
# - fewer than MIN_SEEDS seeds on a side: "too few seeds to decide", with the
#   minimum detectable difference at the observed variance;
# - a cell that did not learn (final loss at its data's unigram floor) is
#   never ranked and never compared as a normal result.

MIN_SEEDS = 3
POWER = 0.8
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0

TOO_FEW = "too few seeds to decide"
DID_NOT_LEARN = "did not learn"
HOLM, NO_CORRECTION = "holm", "none"


def power_t(effect: float, se_unit: float, df: float, alpha: float = ALPHA) -> float:
    """Power of a two-sided t-test of a true difference ``effect`` when the standard error is ``se_unit``.

    Exact, from the noncentral t distribution with noncentrality effect / se.
    """
    from scipy import stats as sps

    if not (se_unit > 0 and df > 0):
        return math.nan
    crit = float(sps.t.ppf(1 - alpha / 2, df))
    ncp = abs(effect) / se_unit
    return float(sps.nct.sf(crit, df, ncp) + sps.nct.cdf(-crit, df, ncp))


def min_detectable(se: float | None, df: float | None, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """Smallest true |difference| detected with probability ``power`` at this standard error and df.

    The usual normal-approximation form with t quantiles:
    MDD = (t_{1-alpha/2, df} + t_{power, df}) * se. None without a variance estimate.
    """
    from scipy import stats as sps

    if se is None or df is None or not math.isfinite(se) or not df > 0:
        return None
    return float((sps.t.ppf(1 - alpha / 2, df) + sps.t.ppf(power, df)) * se)


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


@dataclass
class Health:
    """Learning health of one cell over its seeds (from the per-run figures abl.analysis.health records)."""

    runs: int = 0  # completed runs with a health record
    did_not_learn: int = 0  # of them, how many ended at the unigram floor
    floor: float | None = None  # the data's unigram entropy (nats)
    loss_spikes: int = 0  # summed over seeds
    max_loss_spike: float | None = None  # the largest over seeds (nats)

    @property
    def flagged(self) -> bool:
        return self.did_not_learn > 0

    def describe(self) -> str:
        if not self.flagged:
            return ""
        floor = "" if self.floor is None else f" (unigram floor {self.floor:.3f} nats)"
        return f"{DID_NOT_LEARN}: {self.did_not_learn}/{self.runs} seeds{floor}"


@dataclass
class CellInput:
    """What the analysis needs of one cell: per-seed final values and what fixes its data order."""

    key: Hashable
    label: str
    values: dict  # seed -> final value (completed runs)
    data_key: Hashable = None
    health: Health = field(default_factory=Health)
    settings: dict = field(default_factory=dict)  # flattened config (for --by); optional
    statuses: dict = field(default_factory=dict)  # run status -> count (every run of the cell)


@dataclass
class CellRow:
    key: Hashable
    label: str
    n: int
    mean: float | None
    std: float | None
    ci_low: float | None
    ci_high: float | None
    rank: int | None  # 1 = best; None: not ranked (did not learn, or no finished run)
    health: Health
    status: str  # "" or why the cell is not ranked


@dataclass
class ComparisonRow:
    """a against b: delta = mean(a) - mean(b)."""

    a: Hashable
    b: Hashable
    a_label: str
    b_label: str
    n_a: int
    n_b: int
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None  # unadjusted
    p_adjusted: float | None  # after the table's correction
    test: str
    verdict: str
    mdd: float | None = None  # minimum detectable |difference| at the observed variance (power POWER)
    note: str = ""
    df: float | None = None  # degrees of freedom of the t-test

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Analysis:
    cells: list[CellRow]
    comparisons: list[ComparisonRow]
    alpha: float
    correction: str
    bootstrap: bool
    lower_is_better: bool

    @property
    def method(self) -> str:
        """The sentence every table carries: which test and which correction."""
        test = (f"percentile bootstrap of the difference of means ({BOOTSTRAP_RESAMPLES} resamples of the "
                "seeds, paired by seed where possible)" if self.bootstrap else
                "paired t-test by seed when both cells ran the same seeds on the same data order, "
                "else Welch's t-test")
        tested = sum(c.p_value is not None for c in self.comparisons)
        corr = (f"Holm correction over the {tested} comparisons with a p-value shown" if self.correction == HOLM
                else "no multiple-comparison correction")
        return (f"Test: {test}; {corr}; alpha = {self.alpha}; two-sided; "
                f"fewer than {MIN_SEEDS} seeds: {TOO_FEW} (MDD: minimum detectable difference at the "
                f"observed variance, power {POWER:.0%}); cells that did not learn are not ranked or tested.")

    def cell(self, key: Hashable) -> CellRow:
        return next(c for c in self.cells if c.key == key)


def _one_comparison(a: CellInput, b: CellInput, *, bootstrap: bool, confidence: float) -> ComparisonRow:
    ca, cb = summarize(a.values).values, summarize(b.values).values
    row = ComparisonRow(a.key, b.key, a.label, b.label, len(ca), len(cb), None, None, None, None, None,
                        "none", "")
    if not ca or not cb:
        row.verdict, row.note = "no value to compare", "no completed run with a finite value of this metric on one side"
        return row
    row.delta = float(np.mean(list(ca.values())) - np.mean(list(cb.values())))
    same_data = a.data_key == b.data_key
    is_paired = same_data and set(ca) == set(cb)
    if not same_data:
        row.note = "different data order: not paired"
    elif set(ca) != set(cb):
        row.note = "different seeds: not paired"
    se = df = None
    if is_paired and len(ca) >= 2:
        r = paired(ca, cb, confidence)
        se, df = r["se"], float(r["pairs"] - 1)
        if se == 0.0:
            row.delta, row.ci_low, row.ci_high, row.p_value = _exact(r["diff"])
        else:
            row.ci_low, row.ci_high, row.p_value = r["diff_lo"], r["diff_hi"], r["p"]
        row.test = f"paired t (n={r['pairs']})"
    elif len(ca) >= 2 and len(cb) >= 2:
        x, y = list(ca.values()), list(cb.values())
        _, lo, hi, p, df = welch_test(x, y, confidence)
        se = float(np.sqrt(np.var(x, ddof=1) / len(x) + np.var(y, ddof=1) / len(y)))
        row.ci_low, row.ci_high, row.p_value, row.test = lo, hi, p, "Welch t"
    else:
        row.test = "none"
        row.note = (row.note + "; " if row.note else "") + \
            f"one seed on a side (n={len(ca)} vs {len(cb)}): no variance estimate"
    if bootstrap and row.p_value is not None:
        bs = bootstrap_diff(ca, cb, paired=is_paired, confidence=confidence)
        row.ci_low, row.ci_high, row.p_value = bs["diff_lo"], bs["diff_hi"], bs["p"]
        row.test = f"bootstrap ({'paired' if is_paired else 'unpaired'}, n={min(len(ca), len(cb))})"
    row.mdd = min_detectable(se, df)
    row.df = df
    return row


def analyse(cells: Sequence[CellInput], comparisons: Sequence[tuple[Hashable, Hashable]], *,
            alpha: float = ALPHA, correction: str = HOLM, bootstrap: bool = False,
            lower_is_better: bool = True, confidence: float = CONFIDENCE) -> Analysis:
    """Per-cell rows (ranked, learning health) and every requested comparison with its verdict.

    ``comparisons``: (a, b) cell-key pairs, each tested as a - b. Verdicts:
    "did not learn" when either side did; "too few seeds to decide (...)"
    when either side has fewer than MIN_SEEDS seeds; else "better" / "worse"
    (a relative to b) when the corrected p < alpha, "not distinguishable"
    otherwise. The correction runs over every comparison that has a p-value.
    """
    if correction not in (HOLM, NO_CORRECTION):
        raise ValueError(f"unknown correction {correction!r}: {HOLM} or {NO_CORRECTION}")
    by_key = {c.key: c for c in cells}
    rows: list[CellRow] = []
    for c in cells:
        s = summarize(c.values)
        status = c.health.describe() if c.health.flagged else ("no completed run" if s.n == 0 else "")
        rows.append(CellRow(c.key, c.label, s.n, s.mean, s.std, s.ci_low, s.ci_high, None, c.health, status))
    ranked = sorted((r for r in rows if not r.status and r.mean is not None),
                    key=lambda r: float(r.mean or 0.0) * (1 if lower_is_better else -1))
    for i, r in enumerate(ranked, 1):
        r.rank = i
    comps: list[ComparisonRow] = []
    for a, b in comparisons:
        for k in (a, b):
            if k not in by_key:
                raise KeyError(f"cell {k!r} is not among the cells")
        ca, cb = by_key[a], by_key[b]
        if ca.health.flagged or cb.health.flagged:
            who = " and ".join(c.label for c in (ca, cb) if c.health.flagged)
            s_a, s_b = summarize(ca.values), summarize(cb.values)
            delta = None if s_a.mean is None or s_b.mean is None else s_a.mean - s_b.mean
            comps.append(ComparisonRow(a, b, ca.label, cb.label, s_a.n, s_b.n, delta, None, None, None, None,
                                       "none", f"{DID_NOT_LEARN} ({who})",
                                       note="a cell at its unigram floor is not a result to rank"))
            continue
        comps.append(_one_comparison(ca, cb, bootstrap=bootstrap, confidence=confidence))
    ps = np.array([np.nan if c.p_value is None else c.p_value for c in comps], dtype=float)
    adj = holm(ps) if correction == HOLM else ps
    for cr, pa in zip(comps, adj):
        if cr.verdict:  # decided above (did not learn, no runs)
            continue
        cr.p_adjusted = None if not np.isfinite(pa) else float(pa)
        n_min = min(cr.n_a, cr.n_b)
        if n_min < MIN_SEEDS:
            mdd = "no variance estimate" if cr.mdd is None else f"detectable |Δ| ≥ {cr.mdd:.4f} at this variance"
            cr.verdict = f"{TOO_FEW} (n={n_min}; {mdd})"
        elif cr.p_adjusted is None:
            cr.verdict = f"{TOO_FEW} (no test)"
        else:
            cr.verdict = _verdict(cr.delta or 0.0, cr.p_adjusted, alpha, lower_is_better)
    return Analysis(rows, comps, alpha, correction, bootstrap, lower_is_better)


# ---------------------------------------------------------------- which comparisons


def against_baseline(keys: Sequence[Hashable], baseline: Hashable) -> list[tuple[Hashable, Hashable]]:
    """Every other cell against ``baseline``."""
    return [(k, baseline) for k in keys if k != baseline]


def by_axis(cells: Sequence[CellInput], axis: str) -> list[tuple[Hashable, Hashable]]:
    """Every pair of cells that differ in ``axis`` only (e.g. model.ffn: each FFN against each other
    FFN at equal values of every other setting), in cell order."""
    out = []
    for i, a in enumerate(cells):
        for b in cells[i + 1:]:
            if axis not in a.settings or a.settings.get(axis) == b.settings.get(axis):
                continue
            # a setting only one side has (a parameter of a component only it selects) follows from
            # the selectors, which are compared
            shared = set(a.settings) & set(b.settings)
            if all(a.settings[k] == b.settings[k] for k in shared if k != axis):
                out.append((a.key, b.key))
    return out
