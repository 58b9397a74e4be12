"""Does a tiny-scale answer hold at scale: per pair of variants, the ordering along a ladder of model sizes.

A ranking measured at one small size predicts the winner at a larger one only
part of the time (Magnusson et al. 2025, "DataDecide: How to Predict Best
Pretraining Data with Small Experiments", arXiv:2504.11393: about 80% at 1B
from the small sizes). So for each pair of variants trained at several sizes
(a ladder: each size trained on its own token budget, several seeds each)
this module reports:

- the ordering at each size with its verdict: the paired t-test by seed at
  that size (abl.analysis.stats.engine.compare);
- a loss-against-compute fit per variant, the power law L(C) = exp(a) * C^-b
  (Kaplan et al. 2020, "Scaling Laws for Neural Language Models",
  arXiv:2001.08361, eq. 1.3: L(C) = (C_c / C)^alpha_C), least squares in log-log
  on the per-seed points; the saturating Chinchilla form (abl.analysis.scaling)
  needs more sizes than a ladder of three or four has degrees of freedom for;
- the compute at which the two fits cross, log C* = (a_1 - a_2) / (b_1 - b_2),
  with a percentile bootstrap interval (seeds resampled within each size,
  jointly across the variants when they share seeds, so the pairing is kept:
  Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13), and
  the predicted difference at a compute the user names, with its interval;
- rank agreement across all variants between the smallest and the largest
  size: Kendall's tau of the mean losses, with the same bootstrap interval.

The verdict words, per pair:
- "holds across sizes": the paired test decides the same direction at every
  size (an intersection-union test: each size at alpha gives level alpha for
  the conjunction; Berger 1982, "Multiparameter hypothesis testing and
  acceptance sampling", Technometrics 24(4):295-300) and the fits cross in
  range in at most alpha of the bootstrap resamples;
- "flips near X FLOPs": the test decides opposite directions at two sizes
  (again an intersection-union test), X the crossing of the fits;
- "undetermined": anything else (a size undecided, too few seeds), with why.
"No crossing in range" says that the fits do not cross between the smallest
and the largest compute measured (the point estimate and at least 1 - alpha of
the resamples).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Hashable, Mapping, Sequence

import numpy as np

from ..contracts.status import COMPLETED
from .stats.engine import BETTER, WORSE, Comparison, compare
from .stats.ttest import ALPHA

HOLDS, FLIPS, UNDETERMINED = "holds across sizes", "flips near", "undetermined"
RESAMPLES = 2000

# variant -> size -> (that variant's training compute at that size in FLOPs, {seed: final loss}); variants of
# one size may differ in compute (a GLU FFN has more parameters than a dense one at the same width)
LadderLosses = Mapping[Hashable, Mapping[Hashable, tuple[float, Mapping[Hashable, float]]]]


class LadderError(ValueError):
    """A ladder that cannot be analysed (fewer than two sizes, a variant missing a size)."""


@dataclass
class PowerLaw:
    """L(C) = exp(log_a) * C ** -b, fitted in log-log."""

    log_a: float
    b: float

    def predict(self, compute: float | np.ndarray) -> np.ndarray:
        return np.exp(self.log_a - self.b * np.log(np.asarray(compute, dtype=float)))


def fit_power_law(compute: Sequence[float], loss: Sequence[float]) -> PowerLaw:
    """Least squares of log L on log C (scipy.stats.linregress); at least two distinct computes."""
    from scipy.stats import linregress

    c, y = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    ok = np.isfinite(c) & np.isfinite(y) & (c > 0) & (y > 0)
    if len(set(c[ok].tolist())) < 2:
        raise LadderError("a power-law fit needs finite positive losses at two or more sizes")
    r = linregress(np.log(c[ok]), np.log(y[ok]))
    return PowerLaw(float(r.intercept), float(-r.slope))


def crossing(f1: PowerLaw, f2: PowerLaw) -> float | None:
    """The compute where the two fits are equal (None when parallel)."""
    db = f1.b - f2.b
    if db == 0:
        return None
    log_c = (f1.log_a - f2.log_a) / db
    return float(math.exp(log_c)) if -700 < log_c < 700 else None


@dataclass
class SizeVerdict:
    size: Hashable
    compute: float  # the pair's mean compute at this size (FLOPs)
    comparison: Comparison  # a - b at this size, paired by seed


@dataclass
class LadderPair:
    """One pair of variants along the ladder: a - b (lower is better)."""

    a: Hashable
    b: Hashable
    sizes: list[SizeVerdict]
    crossing: float | None  # FLOPs where the fits cross (point estimate), None when parallel
    crossing_interval: tuple[float, float] | None  # percentile interval of the crossings in range
    crossing_in_range: float  # fraction of bootstrap resamples whose fits cross within the measured range
    in_range: bool  # the point estimate lies within [smallest, largest] compute
    target: float | None = None  # the compute the user named
    predicted_delta: float | None = None  # fit a - fit b at the target
    predicted_interval: tuple[float, float] | None = None
    verdict: str = UNDETERMINED
    reason: str = ""

    def sentence(self) -> str:
        per = "; ".join(f"{c.size} ({c.compute:.3g} FLOPs): {c.comparison.verdict}" for c in self.sizes)
        if self.verdict == FLIPS and self.crossing is not None and self.in_range:
            head = f"{self.a} vs {self.b}: flips near {self.crossing:.3g} FLOPs"
            if self.crossing_interval:
                head += f" (interval {self.crossing_interval[0]:.3g} to {self.crossing_interval[1]:.3g})"
        elif self.verdict == FLIPS:
            head = f"{self.a} vs {self.b}: flips between the sizes measured"
        else:
            head = f"{self.a} vs {self.b}: {self.verdict}"
        cross = ("no crossing in range" if not self.in_range or self.crossing is None
                 else f"the fits cross at {self.crossing:.3g} FLOPs")
        out = f"{head} ({per}); {cross}"
        if self.reason:
            out += f"; {self.reason}"
        if self.target is not None and self.predicted_delta is not None:
            lo, hi = self.predicted_interval or (math.nan, math.nan)
            out += (f"; predicted difference at {self.target:.3g} FLOPs {self.predicted_delta:+.4f} "
                    f"[{lo:+.4f}, {hi:+.4f}]")
        return out


@dataclass
class LadderResult:
    variants: list[Hashable]
    sizes: list[Hashable]  # smallest compute first
    computes: tuple[float, float]  # the smallest and largest compute measured: the range
    fits: dict[Hashable, PowerLaw]
    pairs: list[LadderPair]
    rank_agreement: float | None  # Kendall's tau, smallest vs largest size, None with fewer than 3 variants
    rank_interval: tuple[float, float] | None
    alpha: float = ALPHA
    notes: list[str] = field(default_factory=list)


def _check(losses: LadderLosses) -> tuple[list[Hashable], list[Hashable]]:
    variants = list(losses)
    if len(variants) < 2:
        raise LadderError("a ladder needs two or more variants to compare")
    sizes = list(dict.fromkeys(s for v in variants for s in losses[v]))
    if len(sizes) < 2:
        raise LadderError("a ladder needs two or more sizes")
    for v in variants:
        missing = [s for s in sizes if s not in losses[v]]
        if missing:
            raise LadderError(f"variant {v!r} has no runs at size {', '.join(str(s) for s in missing)}")
    mean_compute = {s: float(np.mean([losses[v][s][0] for v in variants])) for s in sizes}
    return variants, sorted(sizes, key=lambda s: mean_compute[s])


Points = dict[Hashable, tuple[float, dict[Hashable, float]]]


def _points(losses: LadderLosses, v: Hashable) -> Points:
    out: Points = {}
    for size, (compute, seeds) in losses[v].items():
        if not (compute and math.isfinite(float(compute)) and compute > 0):
            raise LadderError(f"variant {v!r} at size {size}: no positive training compute")
        out[size] = (float(compute), {s: float(x) for s, x in seeds.items()
                                      if x is not None and math.isfinite(float(x))})
    return out


def _fit(points: Points) -> PowerLaw:
    cs = [c for c, seeds in points.values() for _ in seeds]
    ys = [x for _, seeds in points.values() for x in seeds.values()]
    return fit_power_law(cs, ys)


def _resample(data: dict[Hashable, Points], sizes: list[Hashable], rng: np.random.Generator) -> dict[Hashable, Points]:
    """One bootstrap ladder: at each size, seeds drawn with replacement, the same draw for every variant that
    ran those seeds (pairing kept); a variant with other seeds draws its own."""
    out: dict[Hashable, Points] = {v: {} for v in data}
    for size in sizes:
        shared = sorted(set.intersection(*(set(data[v][size][1]) for v in data)), key=str)
        draw = list(rng.choice(len(shared), size=len(shared))) if shared else []
        for v in data:
            compute, seeds = data[v][size]
            if shared and set(seeds) == set(shared):
                keys = [shared[i] for i in draw]
            else:
                own = sorted(seeds, key=str)
                keys = [own[i] for i in rng.choice(len(own), size=len(own))] if own else []
            out[v][size] = (compute, {j: seeds[k] for j, k in enumerate(keys)})
    return out


def _means(points: dict[Hashable, Points], variants: list[Hashable], size: Hashable) -> list[float]:
    return [float(np.mean(list(points[v][size][1].values()))) for v in variants]


def analyse_ladder(losses: LadderLosses, *, target: float | None = None, alpha: float = ALPHA,
                   resamples: int = RESAMPLES, seed: int = 0) -> LadderResult:
    """Per pair of variants: the verdict at each size, where the loss-compute fits cross, and whether the
    ordering holds across sizes. ``losses``: variant -> size -> (compute in FLOPs, {seed: final loss})."""
    from scipy.stats import kendalltau

    variants, sizes = _check(losses)
    data = {v: _points(losses, v) for v in variants}
    fits = {v: _fit(data[v]) for v in variants}
    every = [c for v in variants for c, _ in data[v].values()]
    span = (min(every), max(every))
    rng = np.random.default_rng(seed)
    boots: list[dict[Hashable, PowerLaw]] = []
    taus: list[float] = []
    for _ in range(resamples):
        sample = _resample(data, sizes, rng)
        try:
            boots.append({v: _fit(sample[v]) for v in variants})
        except LadderError:
            continue
        if len(variants) >= 3:
            tau = kendalltau(_means(sample, variants, sizes[0]), _means(sample, variants, sizes[-1])).statistic
            if math.isfinite(tau):
                taus.append(float(tau))
    pairs = [_pair(a, b, data, sizes, span, fits, boots, target, alpha)
             for a, b in itertools.combinations(variants, 2)]
    tau_point = tau_iv = None
    notes = []
    if len(variants) >= 3:
        tau_point = float(kendalltau(_means(data, variants, sizes[0]), _means(data, variants, sizes[-1])).statistic)
        if taus:
            tau_iv = (float(np.quantile(taus, alpha / 2)), float(np.quantile(taus, 1 - alpha / 2)))
    if len(boots) < resamples:
        notes.append(f"{resamples - len(boots)} of {resamples} bootstrap resamples could not be fitted")
    return LadderResult(variants, sizes, span, fits, pairs, tau_point, tau_iv, alpha, notes)


def _pair(a, b, data, sizes, span, fits, boots, target, alpha) -> LadderPair:
    verdicts = [SizeVerdict(s, 0.5 * (data[a][s][0] + data[b][s][0]),
                            compare(data[a][s][1], data[b][s][1], alpha=alpha)) for s in sizes]
    lo_c, hi_c = span
    x = crossing(fits[a], fits[b])
    in_range = x is not None and lo_c <= x <= hi_c
    xs = [crossing(f[a], f[b]) for f in boots]
    inside = [c for c in xs if c is not None and lo_c <= c <= hi_c]
    frac = len(inside) / len(xs) if xs else math.nan
    interval = ((float(np.quantile(inside, alpha / 2)), float(np.quantile(inside, 1 - alpha / 2)))
                if inside and in_range else None)
    pair = LadderPair(a, b, verdicts, x, interval, frac, in_range)
    if target is not None:
        pair.target = float(target)
        pair.predicted_delta = float(fits[a].predict(target) - fits[b].predict(target))
        deltas = [float(f[a].predict(target) - f[b].predict(target)) for f in boots]
        if deltas:
            pair.predicted_interval = (float(np.quantile(deltas, alpha / 2)), float(np.quantile(deltas, 1 - alpha / 2)))
    words = [v.comparison.verdict for v in verdicts]
    decided = [w in (BETTER, WORSE) for w in words]
    if all(decided) and len(set(words)) == 1:
        if frac <= alpha and not in_range:
            pair.verdict = HOLDS
        else:
            pair.verdict = UNDETERMINED
            pair.reason = (f"every size decides {words[0]}, but the fits cross within the measured range in "
                           f"{frac:.0%} of the resamples")
    elif BETTER in words and WORSE in words:
        pair.verdict = FLIPS
        if not in_range:
            pair.reason = "the per-size verdicts flip, but the fits' crossing lies outside the measured range"
    else:
        pair.verdict = UNDETERMINED
        undecided = [str(v.size) for v, ok in zip(verdicts, decided) if not ok]
        pair.reason = f"not decided at size {', '.join(undecided)}" if undecided else "per-size verdicts disagree"
    return pair


def size_label(settings: Mapping[str, object], size_paths: Sequence[str]) -> str:
    return " ".join(f"{p.split('.')[-1]}={settings.get(p)}" for p in size_paths)


def ladder_of_runs(runs: Sequence[object], metric: str, size_paths: Sequence[str],
                   compute_metric: str = "flops") -> LadderLosses:
    """The ladder in stored runs (abl.store.reader.StoredRun: ``status``, ``seed``, ``settings``,
    ``grid_varied``, ``final``): a size is the runs' values at ``size_paths``; a variant, their values at
    the other swept paths; a run's compute its recorded training FLOPs (``compute_metric``; without it, its
    FLOPs per step, counted or else predicted, times its steps). Completed runs
    with a finite value only; a variant's compute at a size is the median over its seeds."""
    raw: dict[str, dict[str, tuple[list[float], dict]]] = {}
    for r in runs:
        if getattr(r, "status", None) != COMPLETED:
            continue
        final = getattr(r, "final", {}) or {}
        loss, compute = final.get(metric), final.get(compute_metric)
        if compute is None:  # the step's FLOPs (counted, else predicted) times the steps trained
            per_step = final.get("flops_per_step_measured") or final.get("flops_per_step_predicted")
            steps = ((getattr(r, "config", {}) or {}).get("train") or {}).get("steps")
            compute = float(per_step) * int(steps) if per_step and steps else None
        if loss is None or compute is None or not math.isfinite(float(loss)):
            continue
        settings = getattr(r, "settings", {}) or {}
        varied = getattr(r, "grid_varied", {}) or {}
        variant = " ".join(f"{p.split('.')[-1]}={v}" for p, v in varied.items() if p not in size_paths) or "base"
        size = size_label(settings, size_paths)
        computes, seeds = raw.setdefault(variant, {}).setdefault(size, ([], {}))
        computes.append(float(compute))
        seeds[getattr(r, "seed")] = float(loss)
    return {v: {s: (float(np.median(c)), seeds) for s, (c, seeds) in by_size.items()} for v, by_size in raw.items()}


# ---------------------------------------------------------------- probes beside the ladder


@dataclass
class ProbeAgreement:
    """Does ``probe`` measured at ``size`` rank the variants as ``target`` (the loss) does at the largest size?

    ``tau``: Kendall's tau between the variants' mean probe values at ``size`` (oriented so that better comes
    first, whichever way the probe points) and their mean loss at the largest size; ``interval``: its
    percentile bootstrap interval (seeds resampled within each size, the same draw for every variant that
    ran those seeds, so pairs stay paired); ``n``: the variants ranked."""

    probe: str
    size: Hashable
    target: str
    largest: Hashable
    tau: float
    interval: tuple[float, float] | None
    n: int

    def sentence(self) -> str:
        iv = "" if self.interval is None else f" [{self.interval[0]:+.2f}, {self.interval[1]:+.2f}]"
        if self.interval is not None and self.interval[0] > 0:
            word = "ranks them as the largest size does"
        elif self.interval is not None and self.interval[1] < 0:
            word = "ranks them against the largest size's order"
        else:
            word = "agreement undetermined"
        return (f"{self.probe} at {self.size} against {self.target} at {self.largest}: Kendall's tau "
                f"{self.tau:+.2f}{iv} over {self.n} variants: {word}")


def probe_agreement(losses: LadderLosses, probes: Mapping[str, LadderLosses], *, target: str = "val_loss",
                    lower_is_better: Mapping[str, bool] | None = None, alpha: float = ALPHA,
                    resamples: int = RESAMPLES, seed: int = 0) -> list[ProbeAgreement]:
    """For each probe metric (``probes``: metric -> the same layout as ``losses``, from the same runs) and
    each size it was measured at: how well it ranks the variants as the loss at the largest size does.

    The question a probe beside a ladder answers: can a cheap measurement at a small size (a capability
    probe's accuracy, or the small size's own loss, which is included as the reference) stand in for the
    largest size's loss (DataDecide, Magnusson et al. 2025, arXiv:2504.11393, sec. 3, ranks small-scale
    proxies the same way: by agreement with the large-scale order). Variants missing a probe at a size are
    left out of that size's tau; fewer than two variants give no row."""
    from scipy.stats import kendalltau

    lower = dict(lower_is_better or {})
    variants, sizes = _check(losses)
    largest = sizes[-1]
    loss_data = {v: _points(losses, v) for v in variants}
    rows: list[ProbeAgreement] = []
    sources: list[tuple[str, Mapping[Hashable, Points], bool]] = [(target, loss_data, True)]
    for name, table in probes.items():
        sources.append((name, {v: _points(table, v) for v in variants if v in table}, lower.get(name, False)))
    rng = np.random.default_rng(seed)
    for name, data, low in sources:
        for size in sizes:
            if name == target and size == largest:
                continue  # the largest size's loss against itself
            have = [v for v in variants if v in data and size in data[v] and data[v][size][1]]
            if len(have) < 2:
                continue
            sign = 1.0 if low else -1.0  # oriented: lower = better, like the loss

            point = float(kendalltau([sign * float(np.mean(list(data[v][size][1].values()))) for v in have],
                                     [float(np.mean(list(loss_data[v][largest][1].values()))) for v in have]).statistic)
            if not math.isfinite(point):
                continue
            taus = []
            for _ in range(resamples):
                picks = _joint_draw(data, loss_data, have, size, largest, rng)
                x = [sign * float(np.mean([data[v][size][1][k] for k in picks[(v, "p")]])) for v in have]
                y = [float(np.mean([loss_data[v][largest][1][k] for k in picks[(v, "l")]])) for v in have]
                t = float(kendalltau(x, y).statistic)
                if math.isfinite(t):
                    taus.append(t)
            iv = (float(np.quantile(taus, alpha / 2)), float(np.quantile(taus, 1 - alpha / 2))) if taus else None
            rows.append(ProbeAgreement(name, size, target, largest, point, iv, len(have)))
    return rows


def _joint_draw(probe: Mapping[Hashable, Points], loss: Mapping[Hashable, Points], have: list[Hashable],
                size: Hashable, largest: Hashable, rng: np.random.Generator) -> dict[tuple, list]:
    """One bootstrap draw of seeds for every variant's probe values at ``size`` and loss values at
    ``largest``: one draw per size, shared by every variant that ran the same seeds (pairing kept) and by
    both metrics when ``size`` is ``largest`` (the same runs); a variant with other seeds draws its own."""
    seeds_at = {("p", v): probe[v][size][1] for v in have} | {("l", v): loss[v][largest][1] for v in have}
    groups: dict[Hashable, list[tuple[str, Hashable]]] = {}
    for kind, v in seeds_at:
        groups.setdefault(size if kind == "p" else largest, []).append((kind, v))
    out: dict[tuple, list] = {}
    for members in groups.values():
        shared = sorted(set.intersection(*(set(seeds_at[m]) for m in members)), key=str)
        draw = [shared[i] for i in rng.choice(len(shared), size=len(shared))] if shared else None
        for kind, v in members:
            own = sorted(seeds_at[(kind, v)], key=str)
            keys = draw if draw is not None and len(shared) == len(own) else \
                [own[i] for i in rng.choice(len(own), size=len(own))]
            out[(v, kind)] = keys
    return out
