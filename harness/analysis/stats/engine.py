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
- intervals adjusted the same way as the verdicts: with Holm, each
  comparison's interval is the t-interval (or bootstrap percentile interval)
  at the level Holm's step tested it at, alpha * p / p_Holm, so an interval
  excludes 0 exactly when the verdict is "better" or "worse"; without a
  correction both are raw, and ``Analysis.interval`` names which;
- fewer than MIN_SEEDS seeds on a side: "too few seeds to decide", and no
  minimum detectable difference (a variance from 1 or 2 degrees of freedom
  gives none worth printing);
- ranks are tie groups: a cell's rank is 1 + the number of cells
  distinguishably better than it (every pair tested, Holm over the pairs),
  and ``CellRow.group`` is its compact letter display (Piepho 2004): cells
  that share a letter are not distinguishable;
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
from .corrections import HOLM, NO_CORRECTION, holm, holm_interval, verdict_level
from .power import MIN_SEEDS, POWER, min_detectable
from .ttest import ALPHA, CONFIDENCE, Summary, exact_difference, paired, summarize, welch_test

BETTER, WORSE, SAME, BASELINE = "better", "worse", "not distinguishable", "baseline"
TOO_FEW = "too few seeds to decide"
DID_NOT_LEARN = "did not learn"
# a per-cell test shown beside the answer another model gives to the same question (abl.analysis.verdicts.reconcile):
# its figures are shown under their own name, its words are never a second verdict
DIAGNOSTIC = "diagnostic"
VERDICT, DIAGNOSTIC_ROLE = "verdict", "diagnostic"  # ComparisonRow.role
UNTESTED = "untested"  # CellRow.unranked: too few seeds for a test, so no rank


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
    varied: dict = field(default_factory=dict)  # the grid's record of its swept settings (grid_varied); optional


@dataclass
class CellRow:
    key: Hashable
    label: str
    n: int
    mean: float | None
    std: float | None
    ci_low: float | None
    ci_high: float | None
    rank: int | None  # 1 + the cells distinguishably better; None: not ranked (did not learn, no finished run)
    health: Health
    status: str  # "" or why the cell is not ranked
    group: str = ""  # compact letter display: cells sharing a letter are not distinguishable
    tied: bool = False  # another ranked cell has the same rank
    position: int | None = None  # 1-based place in the order of means, best first (ranked cells only)
    # why a cell with results has no rank, in a few words ("" when ranked, or not ranked for ``status``):
    # "untested (n=2)": fewer than MIN_SEEDS seeds, so no pair with it was tested; "per axis": a factorial
    # grid's answer is each axis's levels (abl.analysis.verdicts.reconcile), cells are not ranked
    unranked: str = ""

    @property
    def order_key(self) -> tuple:
        """Best first: ranked cells in the order of their means (ties stay together), then the others."""
        return (self.rank is None, self.position or 0)

    @property
    def rank_text(self) -> str:
        """The rank as every table prints it: "1=" for a tie, with the letters: "1= (ab)"."""
        if self.rank is None:
            return self.unranked or "-"
        return f"{self.rank}{'=' if self.tied else ''}" + (f" ({self.group})" if self.group else "")


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
    se: float | None = None  # standard error of delta (t-tests)
    ci_level: float | None = None  # confidence of [ci_low, ci_high]: 1 - alpha * p / p_adjusted under Holm
    ci_raw_low: float | None = None  # the unadjusted interval at the table's confidence
    ci_raw_high: float | None = None
    # the significance level the verdict, the interval and the MDD use: Holm's step level alpha * p / p_Holm
    # (alpha without a correction); None when the row has no verdict (too few seeds, no test)
    level: float | None = None
    # "verdict": this row is the answer to its question; "diagnostic": another model answers the question
    # (a factorial grid's per-axis model), this row's figures are shown under its test's name, never as a
    # second verdict (its ``verdict`` then starts with DIAGNOSTIC)
    role: str = "verdict"
    # the model that gave the verdict, in one line ("paired t across seeds, Holm over the 3 pairs"; for a
    # diagnostic row, the model whose verdict answers the question)
    model: str = ""

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
    # what Holm corrected over when it is not this table's own rows ("" when it is): a one-axis grid's rows
    # take the axis's answer, Holm over every pair of its levels (abl.analysis.verdicts.reconcile)
    holm_over: str = ""

    @property
    def method(self) -> str:
        """The sentence every table's legend carries: which test, which correction, and the rules every row
        follows (a test renders the tables and checks each row against them: tests/test_one_answer.py)."""
        test = (f"percentile bootstrap of the difference of means ({BOOTSTRAP_RESAMPLES} resamples of the "
                "seeds, paired by seed where possible)" if self.bootstrap else
                "paired t-test by seed when both cells ran the same seeds on the same data order, "
                "else Welch's t-test")
        tested = sum(c.p_adjusted is not None for c in self.comparisons)
        if self.correction != HOLM:
            corr = "no multiple-comparison correction"
        elif self.holm_over:
            corr = f"Holm correction over {self.holm_over}"
        elif not any(c.p_value is not None for c in self.comparisons):
            corr = "no comparison has a p-value, so none is corrected (Holm)"
        else:
            corr = (f"Holm correction over the {tested} comparison{'s' if tested != 1 else ''} that can be "
                    "decided")
        adj = "p (Holm)" if self.correction == HOLM else "p"
        return (f"Test: {test}; {corr}; alpha = {self.alpha}; two-sided. Verdict: better or worse when "
                f"{adj} < {self.alpha} with at least {MIN_SEEDS} seeds per cell, else {SAME}; intervals of Δ: "
                f"{self.interval}; fewer than {MIN_SEEDS} seeds on a side: {TOO_FEW}, with no adjusted p, no "
                f"interval and no MDD (its p is unadjusted and decides nothing); MDD: the smallest true |Δ| the "
                f"row's test detects with power {POWER:.0%} at the verdict's level; {DIAGNOSTIC}: a per-cell "
                "test shown beside the answer another model gives (no verdict of its own); rank: 1 + the cells "
                f"distinguishably better (every pair of cells with {MIN_SEEDS}+ seeds tested, Holm), = marks a "
                f"tie, cells sharing a letter are not distinguishable, {UNTESTED}: too few seeds for a rank, "
                "per axis: a factorial grid ranks each axis's levels, not its cells; "
                "cells that did not learn are not ranked or tested.")

    @property
    def interval(self) -> str:
        """Which intervals of the differences the table shows: adjusted like the verdicts, or raw."""
        if self.correction == HOLM:
            return ("Holm-adjusted (at the level Holm's step tested the row, alpha × p / p_Holm: on a row with a "
                    "verdict it excludes 0 exactly when the verdict is better or worse)")
        return "unadjusted 95% (excludes 0 exactly when the verdict is better or worse)"

    @property
    def interval_header(self) -> str:
        return "CI (Holm-adj.)" if self.correction == HOLM else "95% CI"

    def cell(self, key: Hashable) -> CellRow:
        return next(c for c in self.cells if c.key == key)


# a comparison of cells scored on different validation targets (abl.analysis.verdicts.flag_different_targets)
NOT_COMPARABLE = "not comparable"
VERDICT_WORDS = (BASELINE, BETTER, WORSE, SAME, TOO_FEW, DID_NOT_LEARN, NOT_COMPARABLE, "no value to compare",
                 DIAGNOSTIC)


def verdict_word(verdict: str | None) -> str:
    """The verdict's leading words, without its parenthesis ("too few seeds to decide (n=2; ...)" ->
    "too few seeds to decide"): what a chart's colour and marker say, in the tables' words."""
    if not verdict:
        return "no value to compare"
    return next((w for w in VERDICT_WORDS if verdict.startswith(w)), verdict.split(" (")[0])


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
            row.delta, row.ci_low, row.ci_high, row.p_value = exact_difference(r["diff"])
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
    row.df, row.se = df, se
    row.ci_raw_low, row.ci_raw_high = row.ci_low, row.ci_high
    if row.ci_low is not None:
        row.ci_level = confidence
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
    # ranks only where a test stands behind them: cells with MIN_SEEDS seeds, at least two of them
    results = [r for r in rows if not r.status and r.mean is not None]
    testable = [r for r in results if r.n >= MIN_SEEDS]
    if len(testable) < 2:
        testable = []
    for r in results:
        if r not in testable:
            r.unranked = (f"{UNTESTED} (n={r.n})" if r.n < MIN_SEEDS else
                          f"{UNTESTED} (the only cell with {MIN_SEEDS}+ seeds)")
    ranked = sorted(testable, key=lambda r: float(r.mean or 0.0) * (1 if lower_is_better else -1))
    _tie_groups(ranked, by_key, alpha=alpha, correction=correction, bootstrap=bootstrap, confidence=confidence)
    order_by_mean(rows, lower_is_better)
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
    # the family Holm corrects over: the comparisons that can get a verdict (a p-value and MIN_SEEDS seeds a
    # side); a test no verdict is drawn from needs no share of alpha
    decidable = [not c.verdict and c.p_value is not None and min(c.n_a, c.n_b) >= MIN_SEEDS for c in comps]
    ps = np.array([c.p_value if ok else np.nan for c, ok in zip(comps, decidable)], dtype=float)
    adj = holm(ps) if correction == HOLM else ps
    for cr, pa, ok in zip(comps, adj, decidable):
        if cr.verdict:  # decided above (did not learn, no runs)
            continue
        n_min = min(cr.n_a, cr.n_b)
        if not ok:  # no verdict: no adjusted p, no adjusted interval, no MDD (the raw interval stays in ci_raw_*)
            cr.ci_low = cr.ci_high = cr.ci_level = None
            cr.verdict = (f"{TOO_FEW} (n={n_min}; at least {MIN_SEEDS} seeds per cell give a verdict)"
                          if n_min < MIN_SEEDS else f"{TOO_FEW} (no test)")
            continue
        cr.p_adjusted = float(pa)
        if correction == HOLM:
            holm_interval(cr, by_key, alpha, bootstrap)
        cr.level = verdict_level(cr, alpha)
        cr.mdd = min_detectable(cr.se, cr.df, cr.level)
        cr.verdict = _verdict(cr.delta or 0.0, cr.p_adjusted, alpha, lower_is_better)
    return Analysis(rows, comps, alpha, correction, bootstrap, lower_is_better)


def order_by_mean(rows: Sequence[CellRow], lower_is_better: bool) -> None:
    """Positions for the tables' order (``CellRow.order_key``): ranked cells first in the order of their means,
    then the cells with results but no rank, in the order of theirs."""
    sign = 1 if lower_is_better else -1
    ranked = sorted((r for r in rows if r.rank is not None), key=lambda r: sign * float(r.mean or 0.0))
    rest = sorted((r for r in rows if r.rank is None and r.mean is not None and not r.status),
                  key=lambda r: sign * float(r.mean or 0.0))
    for i, r in enumerate([*ranked, *rest], 1):
        r.position = i


def _tie_groups(ranked: list[CellRow], by_key: Mapping, *, alpha: float, correction: str, bootstrap: bool,
                confidence: float) -> None:
    """Ranks as tie groups over ``ranked`` (best first; every one of them has MIN_SEEDS seeds): every pair
    tested as the tables test it (Holm over the pairs); distinguishable = corrected p < alpha.

    rank = 1 + the number of cells distinguishably better; ``group``: the compact letter display of the
    ordered means (Piepho 2004, "An algorithm for a letter-based representation of all-pairwise
    comparisons", J. Computational and Graphical Statistics 13(2)): each maximal run of consecutive cells
    with no distinguishable pair gets a letter."""
    k = len(ranked)
    pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
    comps = [_one_comparison(by_key[ranked[i].key], by_key[ranked[j].key], bootstrap=bootstrap,
                             confidence=confidence) for i, j in pairs]
    ps = np.array([np.nan if c.p_value is None else c.p_value for c in comps], dtype=float)
    adj = holm(ps) if correction == HOLM else ps
    apart = {(i, j) for (i, j), pa in zip(pairs, adj) if np.isfinite(pa) and pa < alpha}
    for j, r in enumerate(ranked):
        r.rank = 1 + sum((i, j) in apart for i in range(j))
        r.position = j + 1
    for r in ranked:
        r.tied = sum(o.rank == r.rank for o in ranked) > 1
    for r, g in zip(ranked, letters(k, apart)):
        r.group = g


def letters(k: int, apart: set[tuple[int, int]]) -> list[str]:
    """The compact letter display of ``k`` items in order of their means (best first), given the pairs
    (i, j), i < j, that are distinguishable: items that share a letter are not distinguishable, and every
    pair that is not distinguishable shares one. Piepho's insert-absorb algorithm (Piepho 2004): start
    from one group of all items; for each distinguishable pair split every group holding both into one
    without i and one without j; drop groups inside others. Letters follow the groups' best items. ""
    for every item when there is a single group (the letters would say nothing the rank does not)."""
    groups: list[frozenset[int]] = [frozenset(range(k))]
    for i, j in sorted(apart):
        split = []
        for g in groups:
            split += [g - {i}, g - {j}] if i in g and j in g else [g]
        groups = [g for g in dict.fromkeys(split) if g and not any(g < h for h in split)]
    out = [""] * k
    if len(groups) < 2:
        return out
    abc = "abcdefghijklmnopqrstuvwxyz"
    for n, g in enumerate(sorted(groups, key=lambda g: sorted(g))):
        for x in g:
            out[x] += abc[n % 26]
    return out


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
