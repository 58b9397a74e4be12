"""Seeds until decided: a group-sequential paired t-test whose error rate holds under repeated looks.

Adding seeds to a comparison until its t-test says "better" and stopping there
inflates the false-positive rate far above alpha: each look is another chance
to cross the line by noise (Armitage, McPherson and Rowe 1969, "Repeated
significance tests on accumulating data", JRSS A 132(2):235-244). A
group-sequential design fixes in advance the looks (seed counts n_1 < ... <
n_K) and spends alpha over them so that the probability of ever rejecting a
true null, over all K looks together, is alpha:

- the spending function is Lan and DeMets' O'Brien-Fleming type (Lan & DeMets
  1983, "Discrete sequential boundaries for clinical trials", Biometrika
  70(3):659-663, eq. 2; after O'Brien & Fleming 1979, Biometrics
  35(3):549-556): alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)) at information
  fraction t = n_k / n_K. It spends almost nothing early, so the last look's
  bound is close to the fixed design's and a design needs only a few more seeds
  at most than a fixed one of the same power;
- the bounds are on the paired t statistic of the per-seed differences. Under
  the null (differences i.i.d. normal with mean 0) the joint law of the t
  statistics at the looks does not depend on the unknown variance (t is scale
  free), so it is simulated once with standard normal differences, and each
  look's bound c_k is the quantile that makes P(|t_j| > c_j for some j <= k)
  equal alpha(n_k / n_K) (Monte Carlo calibration; ``SIMULATIONS`` paths, a
  fixed generator seed, so a plan is the same on every machine). A look whose
  alpha increment is below what the simulation resolves gets an infinite bound:
  that look cannot reject, which only makes the test conservative;
- several comparisons at once share alpha by Bonferroni (alpha / m each), which
  holds the family-wise rate under any dependence and any stopping of some of
  them; the fixed-seed verdicts use Holm, which is not valid across looks.

The decision at a look: "better"/"worse" (a relative to b, lower is better for
a loss) when |t| exceeds that look's bound; at the last look without crossing,
"not distinguishable" (the budget is spent); before it, "continue".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np

from .stats.power import MIN_SEEDS, POWER, seeds_needed
from .stats.ttest import ALPHA

SIMULATIONS = 200_000
CALIBRATION_SEED = 20_240_501
CONTINUE, BETTER, WORSE, SAME = "continue", "better", "worse", "not distinguishable"


class SequentialPlanError(ValueError):
    """Looks that cannot make a design (fewer than MIN_SEEDS, not increasing)."""


@dataclass(frozen=True)
class SequentialPlan:
    """A group-sequential design: the planned looks (seed counts), their bounds on |t|, and alpha spent."""

    alpha: float
    looks: tuple[int, ...]  # seed counts at which the comparison is looked at, increasing
    bounds: tuple[float, ...]  # |t| above which a look decides (inf: this look cannot decide)
    spent: tuple[float, ...]  # cumulative alpha spent by each look (the spending function's value)

    @property
    def max_seeds(self) -> int:
        return self.looks[-1]

    def look_index(self, n: int) -> int | None:
        """Which planned look ``n`` seeds are (None when n is not one of them)."""
        return self.looks.index(n) if n in self.looks else None

    def next_look(self, n: int) -> int | None:
        """The first planned seed count above ``n`` (None when n is at or past the last look)."""
        return next((k for k in self.looks if k > n), None)

    def describe(self) -> str:
        shown = ", ".join(f"{n}: {'-' if math.isinf(c) else f'{c:.2f}'}" for n, c in zip(self.looks, self.bounds))
        return (f"group-sequential paired t, O'Brien-Fleming alpha spending (Lan-DeMets), alpha {self.alpha:g} "
                f"over {len(self.looks)} looks; |t| bounds by seeds: {shown}")


def obrien_fleming_spent(fraction: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming-type spending: alpha spent by information fraction ``fraction`` in (0, 1]."""
    from scipy.stats import norm

    if fraction <= 0:
        return 0.0
    return float(2.0 - 2.0 * norm.cdf(norm.ppf(1 - alpha / 2) / math.sqrt(min(1.0, fraction))))


def _t_paths(diffs: np.ndarray, looks: Sequence[int]) -> np.ndarray:
    """|t| of the mean of the first n differences, for each path (rows) and each look n: [paths, looks]."""
    out = np.empty((diffs.shape[0], len(looks)))
    for j, n in enumerate(looks):
        d = diffs[:, :n]
        sd = d.std(axis=1, ddof=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[:, j] = np.abs(d.mean(axis=1)) / (sd / math.sqrt(n))
    return np.nan_to_num(out, nan=0.0, posinf=np.inf)


@lru_cache(maxsize=64)
def plan(looks: tuple[int, ...], alpha: float = ALPHA, simulations: int = SIMULATIONS) -> SequentialPlan:
    """The design for these looks (seed counts, increasing, the first >= MIN_SEEDS) at family level ``alpha``."""
    looks = tuple(int(n) for n in looks)
    if not looks or looks[0] < MIN_SEEDS or any(b <= a for a, b in zip(looks, looks[1:])):
        raise SequentialPlanError(f"looks must be increasing seed counts from at least {MIN_SEEDS}, got {looks}")
    if not 0 < alpha < 1:
        raise SequentialPlanError(f"alpha must be in (0, 1), got {alpha}")
    rng = np.random.default_rng(CALIBRATION_SEED)
    t = _t_paths(rng.standard_normal((simulations, looks[-1])), looks)
    alive = np.ones(simulations, dtype=bool)
    bounds, spent = [], []
    rejected = 0
    for j, n in enumerate(looks):
        target = obrien_fleming_spent(n / looks[-1], alpha)
        spent.append(target)
        # reject the most extreme of the paths still running until the cumulative rate reaches the target
        extra = int(math.floor(target * simulations)) - rejected
        live = np.sort(t[alive, j])[::-1]
        if extra <= 0 or live.size == 0:
            bounds.append(math.inf)
            continue
        extra = min(extra, live.size)
        # the bound sits between the last path rejected and the first kept
        c = float(live[extra]) if extra < live.size else 0.0
        c = 0.5 * (c + float(live[extra - 1]))
        bounds.append(c)
        newly = alive & (t[:, j] > c)
        rejected += int(newly.sum())
        alive &= ~newly
    return SequentialPlan(alpha, looks, tuple(bounds), tuple(spent))


def looks_for(max_seeds: int, first: int = MIN_SEEDS, step: int = 1) -> tuple[int, ...]:
    """Looks every ``step`` seeds from ``first`` up to ``max_seeds`` (the last look is always max_seeds)."""
    if max_seeds < first:
        raise SequentialPlanError(f"a budget of {max_seeds} seeds is below the first look ({first})")
    out = list(range(first, max_seeds + 1, max(1, step)))
    if out[-1] != max_seeds:
        out.append(max_seeds)
    return tuple(out)


@dataclass
class Look:
    """One comparison at one look: its paired t, the look's bound, and the decision."""

    seeds: int
    delta: float  # mean of a - b over the paired seeds
    t: float
    bound: float
    decision: str  # CONTINUE, BETTER, WORSE, SAME (budget spent without crossing)
    alpha: float  # the level this comparison is held to (the family's alpha / comparisons)

    def sentence(self) -> str:
        if self.decision == CONTINUE:
            return (f"undecided at {self.seeds} seeds (|t| {abs(self.t):.2f} below the look's bound "
                    f"{self.bound:.2f}): add seeds")
        if self.decision == SAME:
            return (f"not distinguishable at the budget of {self.seeds} seeds (|t| {abs(self.t):.2f} below "
                    f"the last bound {self.bound:.2f})")
        return f"{self.decision} at {self.seeds} seeds (|t| {abs(self.t):.2f} above the look's bound {self.bound:.2f})"


def decide(a: Mapping[object, float], b: Mapping[object, float], design: SequentialPlan, *,
           lower_is_better: bool = True) -> Look:
    """The decision on a - b at a planned look: paired by the seeds both have, which must be a planned look's count.

    A seed count between looks is looked at as the last planned look below it
    (the extra seeds are not wasted: they are used at the next planned look).
    """
    keys = sorted(set(a) & set(b), key=str)
    ok = [k for k in keys if math.isfinite(float(a[k])) and math.isfinite(float(b[k]))]
    n_all = len(ok)
    planned = [n for n in design.looks if n <= n_all]
    if not planned:
        raise SequentialPlanError(f"{n_all} paired seeds: below the first look ({design.looks[0]})")
    n = planned[-1]
    d = np.array([float(a[k]) - float(b[k]) for k in ok[:n]], dtype=float)
    j = design.looks.index(n)
    sd = float(d.std(ddof=1))
    delta = float(d.mean())
    t = math.copysign(math.inf, delta) if sd == 0 and delta != 0 else (0.0 if sd == 0 else delta / (sd / math.sqrt(n)))
    bound = design.bounds[j]
    if abs(t) > bound:
        improves = delta < 0 if lower_is_better else delta > 0
        decision = BETTER if improves else WORSE
    else:
        decision = SAME if j == len(design.looks) - 1 else CONTINUE
    return Look(n, delta, t, bound, decision, design.alpha)


def family_plan(comparisons: int, max_seeds: int, *, alpha: float = ALPHA, first: int = MIN_SEEDS,
                step: int = 1) -> SequentialPlan:
    """The plan each of ``comparisons`` comparisons is held to: alpha / comparisons (Bonferroni), looks every
    ``step`` seeds from ``first`` to ``max_seeds``."""
    return plan(looks_for(max_seeds, first, step), alpha / max(1, comparisons))


@dataclass
class OperatingCharacteristics:
    """Simulated behaviour of a plan at a true standardised effect (mean difference / sd of differences)."""

    effect: float
    reject: float  # probability of deciding (either sign) by the last look
    expected_seeds: float  # mean seeds used (stopping at the first crossing)
    fixed_seeds: int | None  # the fixed design's seeds for the same power at the plan's alpha (None: effect 0)


def operating_characteristics(design: SequentialPlan, effect: float, *, paths: int = 20_000,
                              seed: int = 1, power: float = POWER) -> OperatingCharacteristics:
    """Power and expected seeds of ``design`` at a standardised effect, by simulation (normal differences)."""
    rng = np.random.default_rng(seed)
    t = _t_paths(rng.standard_normal((paths, design.max_seeds)) + effect, design.looks)
    crossed = t > np.asarray(design.bounds)[None, :]
    any_cross = crossed.any(axis=1)
    first = np.where(any_cross, crossed.argmax(axis=1), len(design.looks) - 1)
    used = np.asarray(design.looks)[first]
    fixed = seeds_needed(1.0, effect, alpha=design.alpha, power=power) if effect else None
    return OperatingCharacteristics(effect, float(any_cross.mean()), float(used.mean()), fixed)
