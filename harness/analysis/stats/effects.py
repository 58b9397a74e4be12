"""Main effects per axis of a product grid: what does swapping X do, pooled over everything else?

For a grid that crosses axes (model.norm × model.block, say), the question
"which norm is best" is the norm's main effect: every seed of every block
layout is evidence. Each axis is fitted with an ordinary least-squares model
(statsmodels) of the final value on the axis, the grid's other axes and the
seed as blocking factors,

    value ~ C(axis) + C(other axis) + ... + C(seed),

which pairs the cells by seed (the seed's shared data order is a block) and
by the other axes' levels, as a randomized complete block design does
(Montgomery, "Design and Analysis of Experiments", 8th ed. 2013, ch. 4 and
5). The levels of the axis are compared pairwise by t-tests of the model's
contrasts, Holm-adjusted over the pairs (Holm 1979), with intervals at the
level each Holm step tested (``corrections.holm_interval``), so the verdict and
the interval never disagree. Each level's figure is its least-squares mean:
the model's prediction averaged over a balanced grid of the other factors.

An interaction of the axis with another axis (does the norm's effect depend
on the block layout?) is the F-test of adding C(axis):C(other) to the model
(a nested-model F-test, ``statsmodels.stats.anova.anova_lm``); when it is
significant the headline says so, since a main effect then averages effects
that differ.

A verdict needs, for each level, at least MIN_SEEDS observations (seeds ×
cells of the other axes) and at least MIN_SEEDS - 1 residual degrees of
freedom (what a 3-seed paired t-test has); else "too few seeds to decide".
Cells that did not learn are left out of the model (they are not results).
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

import numpy as np

from .corrections import holm, holm_interval, verdict_level
from .engine import BETTER, SAME, TOO_FEW, WORSE, CellInput, ComparisonRow, letters
from .power import MIN_SEEDS, POWER, min_detectable, power_t
from .ttest import ALPHA


@dataclass
class LevelRow:
    level: str
    mean: float  # least-squares mean (the model's prediction, averaged over the other factors)
    n: int  # observations (runs) at this level in the model
    rank: int = 0  # 1 + the levels distinguishably better; 0 when untested (see ``unranked``)
    group: str = ""  # compact letter display over the levels
    tied: bool = False
    unranked: str = ""  # why the level has no rank ("untested (n=2)"); "" when ranked

    @property
    def rank_text(self) -> str:
        """"1=" for a tie, with the letters ("1= (ab)"); the reason when the level was not tested."""
        if self.unranked or not self.rank:
            return self.unranked or "-"
        return f"{self.rank}{'=' if self.tied else ''}" + (f" ({self.group})" if self.group else "")


@dataclass
class Interaction:
    other: str
    f: float
    df_num: float
    df_den: float
    p: float


@dataclass
class AxisEffect:
    """One swept axis's main effect: its levels best first, the pairwise contrasts, interactions."""

    axis: str
    levels: list[LevelRow]
    contrasts: list[ComparisonRow]  # a - b for every pair of levels, Holm over the pairs
    interactions: list[Interaction] = field(default_factory=list)
    blocks: list[str] = field(default_factory=list)  # the other factors of the model
    df_resid: float | None = None
    sigma: float | None = None  # the model's residual standard deviation
    seeds: int = 0  # distinct seeds among the runs modelled
    n_params: int = 0  # parameters of the additive model (its rank)
    left_out: list[str] = field(default_factory=list)  # cells not in the model (did not learn, no value)
    note: str = ""
    lower_is_better: bool = True
    alpha: float = ALPHA
    # the one model whose verdicts answer this axis's question, in one line: "pooled over model.block, paired
    # by seed (...)" for a factorial grid, "paired t across seeds ..." for a one-axis grid
    # (abl.analysis.verdicts.axis_effects chooses by the design)
    model: str = ""
    # "factorial": other swept axes are blocks of the model; "one-axis": the levels are the cells
    design: str = ""

    @property
    def best(self) -> LevelRow | None:
        return self.levels[0] if self.levels else None

    def headline(self) -> ComparisonRow | None:
        """The best level against the runner-up (the contrast that says whether 'best' is real)."""
        if len(self.levels) < 2:
            return None
        a, b = self.levels[0].level, self.levels[1].level
        return next((c for c in self.contrasts if {c.a, c.b} == {a, b}), None)

    def verdict(self) -> str:
        """The axis's answer in the tables' words: best level and whether it beats the runner-up."""
        h = self.headline()
        if h is None or self.best is None:
            return self.note or "no comparison"
        if h.verdict.startswith(TOO_FEW):
            return h.verdict
        best_is_a = h.a == self.best.level
        if h.verdict in (BETTER, WORSE):
            return f"{self.best.level} is {BETTER} than {self.levels[1].level}"
        return (f"{SAME}: {self.best.level} and {self.levels[1].level}" if best_is_a or h.verdict == SAME
                else h.verdict)

    def interaction_text(self) -> str:
        hits = [i for i in self.interactions if i.p < self.alpha]
        if not hits:
            return ""
        return "; ".join(f"its effect depends on {i.other} (interaction F({i.df_num:g}, {i.df_den:g}) = "
                         f"{i.f:.2f}, p {i.p:.3g}): read the cell table too" for i in hits)


def _name(i: int) -> str:
    return f"f{i}"


def main_effects(cells: Sequence[CellInput], axes: Sequence[str], *, alpha: float = ALPHA,
                 lower_is_better: bool = True) -> list[AxisEffect]:
    """The main effect of every axis in ``axes`` (config paths; each cell's ``settings`` holds its level)
    that has at least two levels among the cells that learned; [] when fewer than one such axis."""
    df, axes, left_out = _frame(cells, axes)
    return [_one_axis(df, axes, i, alpha=alpha, lower_is_better=lower_is_better, left_out=left_out)
            for i in range(len(axes))]


def _frame(cells: Sequence[CellInput], axes: Sequence[str]) -> tuple[Any, list[str], list[str]]:
    """One row per run of the cells that learned (factor columns f0, f1, ..., seed, y, data), the axes that
    vary among them (an axis that maps one to one onto an earlier one is the same factor), the left out."""
    import pandas as pd

    used = [c for c in cells if not c.health.flagged and c.values]
    left_out = [c.label for c in cells if c not in used]
    axes = [a for a in axes if len({c.settings.get(a) for c in used}) > 1]
    if not axes:
        return pd.DataFrame(), [], left_out
    rows = []
    for c in used:
        for seed, v in c.values.items():
            rows.append({**{_name(i): str(c.settings.get(a)) for i, a in enumerate(axes)},
                         "seed": str(seed), "y": float(v), "data": str(c.data_key)})
    df = pd.DataFrame(rows)
    keep: list[int] = []
    for i, a in enumerate(axes):
        col = _name(i)
        if not any(df.groupby(col)[_name(j)].nunique().max() == 1 and
                   df.groupby(_name(j))[col].nunique().max() == 1 for j in keep):
            keep.append(i)
    df = df[[_name(i) for i in keep] + ["seed", "y", "data"]].rename(
        columns={_name(i): _name(n) for n, i in enumerate(keep)})
    return df, [axes[i] for i in keep], left_out


def _fit(df: Any, terms: Sequence[str]) -> Any:
    import statsmodels.formula.api as smf

    with warnings.catch_warnings():  # rank deficiency is checked by the callers, not printed
        warnings.simplefilter("ignore")
        return smf.ols("y ~ " + " + ".join(f"C({t})" for t in terms), data=df).fit()


def _deficient(res: Any) -> bool:
    return bool(np.linalg.matrix_rank(res.model.exog) < res.model.exog.shape[1])


def _model(df: Any, n_axes: int, i: int) -> tuple[Any, list[str], bool]:
    """Axis i's additive model (the other varying axes and the seed as blocks): the fit, its blocks and
    whether the seed had to leave the blocks (the levels ran different seeds)."""
    me = _name(i)
    others = [_name(j) for j in range(n_axes) if j != i and df[_name(j)].nunique() > 1]
    blocks = others + (["seed"] if df["seed"].nunique() > 1 else [])
    res = _fit(df, [me, *blocks])
    unpaired = _deficient(res) and "seed" in blocks
    if unpaired:
        blocks = [b for b in blocks if b != "seed"]
        res = _fit(df, [me, *blocks])
    return res, blocks, unpaired


def _contrast(names: Sequence[str], me: str, a: str, b: str) -> np.ndarray:
    """The coefficient vector of level a minus level b of factor ``me`` (treatment coding)."""
    vec = np.zeros(len(names))
    for lv, sign in ((a, 1.0), (b, -1.0)):
        col = f"C({me})[T.{lv}]"
        if col in names:
            vec[names.index(col)] += sign
    return vec


@dataclass
class DesignPower:
    """What a design can decide on one axis: ``sigmas``, the smallest true difference (in residual standard
    deviations) detected with the stated power for every pair of levels that can get a verdict (None: no
    pair can); ``short``, the levels with fewer than MIN_SEEDS runs, whose pairs read "too few seeds"."""

    sigmas: float | None
    short: list[str] = field(default_factory=list)


def detectable_by_design(cells: Sequence[CellInput], axes: Sequence[str], *, alpha: float = ALPHA,
                         power: float = POWER) -> dict[str, DesignPower]:
    """Before any run: per axis, the smallest true difference between two of its levels, in residual
    standard deviations (sigma), that the design detects with probability ``power`` for every pair of
    levels that can get a verdict, each pair tested at alpha / m (m: the pairs that can get a verdict, the
    family Holm runs over; its strictest step). For a factorial design the test is the pooled model's
    contrast; for a one-axis design it is each pair's own test, as the verdicts are (the paired t by seed,
    whose differences have sd sigma * sqrt(2); the two-sample t where the seeds differ). Exact
    power of the model's contrast t-test from the noncentral t (``power_t``); the standard error of a
    contrast depends only on the design, se = sigma * sqrt(c' (X'X)^-1 c). A pair gets no verdict when one
    of its levels has fewer than MIN_SEEDS runs, and no pair does when the model has fewer than
    MIN_SEEDS - 1 residual degrees of freedom. The cells' values are not read: only their settings and seeds."""
    rng = np.random.default_rng(0)
    cells = [CellInput(c.key, c.label, {s: float(rng.normal()) for s in c.values}, c.data_key,
                       settings=c.settings) for c in cells]
    df, kept, _ = _frame(cells, axes)
    out = {a: DesignPower(None) for a in axes}
    for i, axis in enumerate(kept):
        res, blocks, _ = _model(df, len(kept), i)
        me, counts = _name(i), df[_name(i)].value_counts().to_dict()
        out[axis].short = [_levels_of(lv) for lv, n in counts.items() if n < MIN_SEEDS]
        # the pairs that can get a verdict: Holm runs over them alone (engine.analyse, _one_axis)
        pairs = [(a, b) for a, b in itertools.combinations(sorted(counts), 2) if min(counts[a], counts[b]) >= MIN_SEEDS]
        if not [b for b in blocks if b != "seed"]:
            # one axis: each pair of levels is answered by its two cells' own test (abl.analysis.verdicts.
            # paired_answer), paired t by seed (the difference of two runs has sd sigma * sqrt(2) under the
            # additive model) or, where the seeds differ, the two-sample t
            seeds = {lv: set(df.loc[df[me] == lv, "seed"]) for lv in counts}
            if not pairs:
                out[axis].short = [_levels_of(lv) for lv in counts]
                continue
            for a, b in pairs:
                if seeds[a] == seeds[b]:
                    n = len(seeds[a])
                    se, d = math.sqrt(2 / n), float(n - 1)
                else:
                    se, d = math.sqrt(1 / counts[a] + 1 / counts[b]), float(counts[a] + counts[b] - 2)
                k = min_detectable(se, d, alpha / len(pairs), power)
                out[axis].sigmas = max(out[axis].sigmas or 0.0, k or 0.0)
            continue
        if _deficient(res) or not res.df_resid >= MIN_SEEDS - 1 or not pairs:
            out[axis].short = [_levels_of(lv) for lv in counts]
            continue
        names, cov = list(res.params.index), np.asarray(res.normalized_cov_params)
        df_r, a_m = float(res.df_resid), alpha / len(pairs)
        for a, b in pairs:
            vec = _contrast(names, me, a, b)
            se = float(np.sqrt(vec @ cov @ vec))
            k = min_detectable(se, df_r, a_m, power)  # exact: the noncentral t's root (power.min_detectable)
            out[axis].sigmas = max(out[axis].sigmas or 0.0, k or 0.0)
    return out


def _levels_of(raw: str) -> str:
    """A stored setting (JSON text) as a level name: "rmsnorm", not "\"rmsnorm\""."""
    import json

    try:
        v = json.loads(raw)
    except (ValueError, TypeError):
        return raw
    return v if isinstance(v, str) else json.dumps(v)


def _one_axis(df: Any, axes: Sequence[str], i: int, *, alpha: float, lower_is_better: bool,
              left_out: list[str]) -> AxisEffect:
    import pandas as pd

    me = _name(i)
    res, blocks, unpaired = _model(df, len(axes), i)
    effect = AxisEffect(axes[i], [], [], blocks=[axes[int(b[1:])] if b != "seed" else "seed" for b in blocks],
                        left_out=left_out, lower_is_better=lower_is_better, alpha=alpha)
    others = [b for b in effect.blocks if b != "seed"]
    effect.design = "factorial" if others else "one-axis"
    effect.model = (f"pooled over {', '.join(others) or 'nothing'}"
                    + (", paired by seed" if "seed" in effect.blocks else ", not paired by seed")
                    + ": OLS with " + " and ".join([*others, *(["seed"] if "seed" in effect.blocks else [])])
                    + " as blocks, Holm over the level pairs")
    if df["data"].nunique() > 1:
        effect.note = "the cells differ in data order (dataset, context or batch size): seeds are not shared blocks"
    if unpaired:  # seeds not shared across the levels: no pairing by seed
        effect.note = "; ".join(x for x in (effect.note, "the levels ran different seeds: not paired by seed") if x)
    effect.df_resid = float(res.df_resid)
    effect.seeds, effect.n_params = int(df["seed"].nunique()), int(res.df_model) + 1
    effect.sigma = float(np.sqrt(res.scale)) if res.df_resid > 0 else None
    if not res.df_resid > 0:
        effect.note = "; ".join(x for x in (effect.note, "one run per cell and seed: no residual variance to "
                                            "test against (run at least 2 seeds)") if x)
        return effect
    if _deficient(res):
        effect.note = (f"{axes[i]} is confounded with the other factors ({', '.join(effect.blocks)}): "
                       "its effect cannot be separated")
        return effect
    levels = list(dict.fromkeys(df[me]))
    # least-squares means: predictions over the full crossing of the blocks' levels, averaged
    grid = pd.DataFrame(list(itertools.product(*[sorted(df[b].unique()) for b in blocks])) or [()],
                        columns=blocks)
    lsm = {}
    for lv in levels:
        g = grid.copy()
        g[me] = lv
        lsm[lv] = float(np.mean(res.predict(g)))
    counts = df[me].value_counts().to_dict()
    order = sorted(levels, key=lambda lv: lsm[lv] * (1 if lower_is_better else -1))
    # a verdict per contrast: both levels with MIN_SEEDS runs, and the residual df a 3-seed t-test has
    df_ok = res.df_resid >= MIN_SEEDS - 1
    # every pair of levels: the difference of their coefficients (treatment coding), a t-test of the contrast
    names = list(res.params.index)
    comps, pairs = [], []
    for a, b in itertools.combinations(order, 2):
        t = res.t_test(_contrast(names, me, a, b))
        delta, se = float(np.squeeze(t.effect)), float(np.squeeze(t.sd))
        p = float(np.squeeze(t.pvalue))
        lo, hi = (float(x) for x in np.squeeze(t.conf_int(alpha=alpha)))
        row = ComparisonRow(_levels_of(a), _levels_of(b), _levels_of(a), _levels_of(b), int(counts[a]),
                            int(counts[b]), delta, lo, hi, p if math.isfinite(p) else None, None,
                            f"OLS contrast (df={res.df_resid:g})", "", df=float(res.df_resid),
                            se=se if math.isfinite(se) else None, ci_level=1 - alpha, ci_raw_low=lo, ci_raw_high=hi)
        enough = df_ok and min(counts[a], counts[b]) >= MIN_SEEDS
        comps.append((row, enough))
        pairs.append((a, b))
    # Holm over the pairs that can get a verdict (as the cell tables do: abl.analysis.stats.engine.analyse)
    adj = holm(np.array([c.p_value if enough and c.p_value is not None else np.nan for c, enough in comps],
                        dtype=float))
    apart = set()
    for (a, b), (c, enough), pa in zip(pairs, comps, adj):
        if not enough:
            c.ci_low = c.ci_high = c.ci_level = None  # no verdict: no adjusted interval (the raw one stays)
            c.verdict = (f"{TOO_FEW} (n={min(counts[a], counts[b])} runs; at least {MIN_SEEDS} runs per "
                         f"level and {MIN_SEEDS - 1} residual degrees of freedom give a verdict)")
            continue
        c.p_adjusted = float(pa) if np.isfinite(pa) else None
        holm_interval(c, {}, alpha, bootstrap=False)
        c.level = verdict_level(c, alpha)
        c.mdd = min_detectable(c.se, c.df, c.level)  # at the level the verdict uses
        if c.p_adjusted is None:
            c.verdict = f"{TOO_FEW} (no test)"
        elif c.p_adjusted < alpha:
            improves = (c.delta or 0.0) < 0 if lower_is_better else (c.delta or 0.0) > 0
            c.verdict = BETTER if improves else WORSE
            apart.add((order.index(a), order.index(b)))
        else:
            c.verdict = SAME
    rows = [LevelRow(_levels_of(lv), lsm[lv], int(counts[lv])) for lv in order]
    for j, r in enumerate(rows):
        r.rank = 1 + sum((k, j) in apart for k in range(j))
    for r, g in zip(rows, letters(len(rows), apart)):
        r.group = g
    for r in rows:  # a level no verdict can be drawn on is not ranked (it would read as tied for best)
        if not df_ok or r.n < MIN_SEEDS:
            r.rank, r.group, r.unranked = 0, "", f"untested (n={r.n} runs)"
    for r in rows:
        r.tied = bool(r.rank) and sum(o.rank == r.rank for o in rows) > 1
    effect.levels, effect.contrasts = rows, [c for c, _ in comps]
    effect.interactions = _interactions(df, me, blocks, [b for b in blocks if b != "seed"], res, axes)
    return effect


def _interactions(df: Any, me: str, blocks: list[str], others: list[str], res: Any,
                  axes: Sequence[str]) -> list[Interaction]:
    """The F-test of C(axis):C(other) added to the additive model, for each other axis (when the data
    leave residual degrees of freedom for it)."""
    import statsmodels.formula.api as smf
    from statsmodels.stats.anova import anova_lm

    out = []
    for o in others:
        with warnings.catch_warnings():  # an incomplete grid (excluded cells) leaves interaction columns empty:
            warnings.simplefilter("ignore")  # statsmodels counts the rank, so the F-test's df stay right
            full = smf.ols("y ~ " + " + ".join(f"C({t})" for t in [me, *blocks]) + f" + C({me}):C({o})",
                           data=df).fit()
        # no residual variance left (synthetic values: every seed moves every cell alike): F is undefined
        if full.df_resid < 1 or full.df_model <= res.df_model or not full.ssr > 1e-12 * full.centered_tss:
            continue
        with np.errstate(invalid="ignore", divide="ignore"):
            table = anova_lm(res, full)
        f, p = float(table["F"].iloc[1]), float(table["Pr(>F)"].iloc[1])
        if math.isfinite(f) and math.isfinite(p):
            out.append(Interaction(axes[int(o[1:])], f, float(table["df_diff"].iloc[1]), float(full.df_resid), p))
    return out


def seeds_for_axis(e: AxisEffect, effect: float, *, power: float = POWER, max_seeds: int = 200) -> int | None:
    """Seeds for the main-effect contrast between the two least-run levels of ``e``'s axis to detect a true
    difference ``effect`` with probability ``power`` at the model's residual sd, tested at alpha / m for
    the m pairs of levels (Holm's strictest step). Each level's runs and the residual df grow in
    proportion to the seeds (same grid); power from the noncentral t (``power_t``). A one-axis grid answered
    by each pair's paired t (abl.analysis.verdicts.paired_answer): that test, se = sigma * sqrt(2 / k), k - 1
    df. None without a residual sd or beyond ``max_seeds``."""
    if not e.sigma or not e.seeds or len(e.levels) < 2 or effect == 0:
        return None
    runs = sorted(lv.n / e.seeds for lv in e.levels)[:2]  # runs per seed of the two sparsest levels
    total = sum(lv.n for lv in e.levels) / e.seeds
    m = len(e.levels) * (len(e.levels) - 1) // 2
    if e.design == "one-axis" and e.model.startswith("paired t"):  # each pair's own paired t (verdicts.paired_answer)
        for k in range(MIN_SEEDS, max_seeds + 1):
            if power_t(effect, e.sigma * math.sqrt(2 / k), k - 1, e.alpha / m) >= power:
                return k
        return None
    for k in range(2, max_seeds + 1):
        df = total * k - (e.n_params - e.seeds + k)  # the seed block has k levels
        se = e.sigma * math.sqrt(1 / (runs[0] * k) + 1 / (runs[1] * k))
        if df > 0 and runs[0] * k >= MIN_SEEDS and power_t(effect, se, df, e.alpha / m) >= power:
            return k
    return None


def axis_levels(cells: Sequence[CellInput], axis: str) -> dict[Hashable, str]:
    """cell key -> its level of ``axis`` (as a level name)."""
    return {c.key: _levels_of(str(c.settings.get(axis))) for c in cells}
