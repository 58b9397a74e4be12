"""Multi-seed statistics: is a cell's difference from the baseline real?

For each cell: the mean, the sample standard deviation and the 95% confidence
interval (Student t, n - 1 degrees of freedom) of its final val_loss over
seeds. For each cell against a baseline cell: the difference of means, its 95%
CI and a two-sided p-value,

- paired by seed (t-test on the per-seed differences) when both cells ran the
  same seeds and see the same data order. In abl the order of training
  batches depends only on the seed (given the dataset, context and batch
  size), so cells of one grid with the same seed set are paired: pairing
  removes the seed-to-seed variance both cells share;
- otherwise Welch's unequal-variance t-test (Welch-Satterthwaite degrees of
  freedom).

The verdict is "better" / "worse" (lower loss is better) only when p < alpha;
otherwise "not distinguishable from baseline". With fewer than 2 values on a
side there is no test and the verdict says so.

Pure numpy + scipy.stats (for the t distribution); nothing here knows torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Hashable, Iterable, Mapping, Sequence

import numpy as np

ALPHA = 0.05
CONFIDENCE = 0.95

BETTER, WORSE, SAME, BASELINE = "better", "worse", "not distinguishable from baseline", "baseline"


def _t_quantile(q: float, df: float) -> float:
    from scipy import stats

    return float(stats.t.ppf(q, df))


def _t_two_sided_p(t: float, df: float) -> float:
    from scipy import stats

    return float(2 * stats.t.sf(abs(t), df))


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


def summarize(values: Mapping[Hashable, float] | Sequence[float], confidence: float = CONFIDENCE) -> Summary:
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
    half = _t_quantile(0.5 + confidence / 2, n - 1) * std / math.sqrt(n)
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


def paired_test(cell: Mapping[Hashable, float], base: Mapping[Hashable, float],
                confidence: float = CONFIDENCE) -> tuple[float, float, float, float, int]:
    """(mean diff, ci_low, ci_high, p, n) of the per-seed differences cell - base over common seeds."""
    seeds = sorted(set(cell) & set(base), key=str)
    d = np.array([cell[s] - base[s] for s in seeds], dtype=float)
    n = len(d)
    mean = float(d.mean())
    sd = float(d.std(ddof=1))
    if sd == 0.0:  # identical differences: the t statistic is infinite (or 0/0)
        p = 1.0 if mean == 0.0 else 0.0
        return mean, mean, mean, p, n
    se = sd / math.sqrt(n)
    half = _t_quantile(0.5 + confidence / 2, n - 1) * se
    return mean, mean - half, mean + half, _t_two_sided_p(mean / se, n - 1), n


def welch_test(a: Sequence[float], b: Sequence[float],
               confidence: float = CONFIDENCE) -> tuple[float, float, float, float, float]:
    """(mean(a) - mean(b), ci_low, ci_high, p, df): Welch's t-test with Welch-Satterthwaite df."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    diff = float(x.mean() - y.mean())
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    se2 = vx + vy
    if se2 == 0.0:
        p = 1.0 if diff == 0.0 else 0.0
        return diff, diff, diff, p, float(len(x) + len(y) - 2)
    df = float(se2 ** 2 / (vx ** 2 / (len(x) - 1) + vy ** 2 / (len(y) - 1)))
    se = math.sqrt(se2)
    half = _t_quantile(0.5 + confidence / 2, df) * se
    return diff, diff - half, diff + half, _t_two_sided_p(diff / se, df), df


def compare(cell: Mapping[Hashable, float], base: Mapping[Hashable, float], *, paired: bool | None = None,
            alpha: float = ALPHA, lower_is_better: bool = True, confidence: float = CONFIDENCE) -> Comparison:
    """Compare a cell's per-seed values with the baseline's (both: seed -> value).

    ``paired=None`` pairs when both ran exactly the same seeds (the caller
    passes ``paired=False`` when the cells do not share data order).
    """
    c = summarize(cell).values
    b = summarize(base).values
    if not c or not b:
        return Comparison(None, None, None, None, "none", f"{SAME} (no finished runs)",
                          note="no finished runs on one side")
    delta = float(np.mean(list(c.values())) - np.mean(list(b.values())))
    if paired is None:
        paired = set(c) == set(b)
    if paired and len(set(c) & set(b)) >= 2:
        d, lo, hi, p, n = paired_test(c, b, confidence)
        test, df, note = f"paired t (n={n})", float(n - 1), ""
        if set(c) != set(b):
            note = f"paired over the {n} common seeds"
    elif len(c) >= 2 and len(b) >= 2:
        _, lo, hi, p, df = welch_test(list(c.values()), list(b.values()), confidence)
        test, note = "Welch t", ""
    else:
        n_min = min(len(c), len(b))
        return Comparison(delta, None, None, None, "none", f"{SAME} (n={n_min}: no test)",
                          note=f"n<2 on one side (cell n={len(c)}, baseline n={len(b)}): "
                               "run more seeds for a test")
    return Comparison(delta, lo, hi, p, test, _verdict(delta, p, alpha, lower_is_better), note, df)


@dataclass
class CellResult:
    key: Hashable
    summary: Summary
    comparison: Comparison


def compare_cells(values: Mapping[Hashable, Mapping[Hashable, float]], baseline: Hashable, *,
                  data_keys: Mapping[Hashable, Hashable] | None = None, alpha: float = ALPHA,
                  lower_is_better: bool = True) -> list[CellResult]:
    """Summaries and comparisons for every cell, in the given order.

    ``values``: cell key -> {seed: final value}. ``data_keys``: cell key ->
    anything identifying its data order apart from the seed (dataset
    fingerprint, context, batch size); cells are paired only when their data
    keys are equal and they ran the same seeds.
    """
    if baseline not in values:
        raise KeyError(f"baseline cell {baseline!r} is not among the cells")
    out = []
    base = values[baseline]
    for key, vals in values.items():
        s = summarize(vals)
        if key == baseline:
            out.append(CellResult(key, s, Comparison(0.0 if s.n else None, None, None, None, BASELINE,
                                                     BASELINE)))
            continue
        same_data = data_keys is None or data_keys.get(key) == data_keys.get(baseline)
        comp = compare(vals, base, paired=None if same_data else False, alpha=alpha,
                       lower_is_better=lower_is_better)
        if not same_data:
            comp.note = (comp.note + "; " if comp.note else "") + "different data order: not paired"
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
