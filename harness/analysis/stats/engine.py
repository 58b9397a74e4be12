"""The verdict engine: per-cell rows with learning health, any set of comparisons, one verdict vocabulary.

One analysis for every table abl shows: per-cell summaries with learning
health, then any set of comparisons (each cell against a baseline, chosen
pairs, or every pair of values of one grid axis), tested with the same
defaults everywhere:

- paired t-test by seed when both cells ran the same seeds on the same data
  order, else Welch's t-test (or, with ``bootstrap=True``, a percentile
  bootstrap of the difference of means, resampling seeds, paired or not);
- Holm's step-down correction over the comparisons shown (Holm 1979), so the
  family-wise error rate stays at alpha however many comparisons a table has;
- fewer than MIN_SEEDS seeds on a side: "too few seeds to decide", with the
  minimum detectable difference at the observed variance;
- a cell that did not learn (final loss at its data's unigram floor) is
  never ranked and never compared as a normal result.

``compare`` and ``compare_cells`` (one cell, or every cell, against a
baseline) are thin wrappers over ``analyse``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from .bootstrap import BOOTSTRAP_RESAMPLES, bootstrap_diff
from .corrections import HOLM, NO_CORRECTION, holm
from .power import MIN_SEEDS, POWER, min_detectable
from .ttest import ALPHA, CONFIDENCE, Summary, _exact, paired, summarize, welch_test

BETTER, WORSE, SAME, BASELINE = "better", "worse", "not distinguishable", "baseline"
TOO_FEW = "too few seeds to decide"
DID_NOT_LEARN = "did not learn"


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


def _verdict(delta: float, p: float, alpha: float, lower_is_better: bool) -> str:
    if not p < alpha:
        return SAME
    improves = delta < 0 if lower_is_better else delta > 0
    return BETTER if improves else WORSE


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


# ---------------------------------------------------------------- one cell against a baseline (CLI, report)


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
