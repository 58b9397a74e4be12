"""One answer per question: which model's verdict answers a comparison, and the per-cell rows made to agree.

For each question a user asks of a grid (an axis's levels, or named pairs) there is one verdict, from one
model named on its line, chosen by the grid's design:

- a factorial grid's axis: its main effect, pooled over the other axes and paired by seed (the OLS model of
  abl.analysis.stats.effects); the per-cell comparisons are diagnostics beside it, never a second verdict;
- a one-axis grid's pair of levels: the two cells' own paired t across seeds (Welch where the seeds differ),
  Holm over the level pairs (``paired_answer``); the per-cell rows against a baseline show those verdicts
  (the baseline is a display choice, the axis is the question);
- named pairs (``--pairs``): each pair's own test, Holm over the pairs named;
- a ladder's size axis (abl.grid.ladder: a tied outer axis) is no question asked ("the bigger model has the
  lower loss"): it stays a block of the model, and its line names the sizes run, with no verdict
  (``size_axes``, ``sizes_run``); ``abl ladder`` asks whether the variants' ordering holds across them.

``reconcile`` applies the rule to a per-cell analysis; ``to_best`` gives a level's contrast with the best
level (a forest plot's row). abl.analysis.verdicts renders every table from them.
"""

from __future__ import annotations

from typing import Sequence

from . import stats
from .stats.engine import order_by_mean


def paired_answer(cells: Sequence[stats.CellInput], e: stats.AxisEffect) -> stats.AxisEffect | None:
    """A one-axis grid's answer: every pair of its levels (one cell each) by the per-cell test, paired t across
    seeds (Welch where the seeds or the data order differ), Holm over the pairs that can be decided, ranks
    and letters from those tests (abl.analysis.stats.analyse over every pair of the cells). None when a level
    is not one cell (then the pooled model stays the answer)."""
    from dataclasses import replace

    used = [c for c in cells if not c.health.flagged and c.values]
    level = {c.key: _level(c, e.axis) for c in used}
    if len(set(level.values())) != len(used) or len(used) < 2:
        return None
    an = stats.analyse(used, [], alpha=e.alpha, lower_is_better=e.lower_is_better)
    best_first = sorted(an.cells, key=lambda r: (r.order_key, float(r.mean or 0.0) * (1 if e.lower_is_better
                                                                                     else -1)))
    an = stats.analyse(used, [(a.key, b.key) for i, a in enumerate(best_first) for b in best_first[i + 1:]],
                       alpha=e.alpha, lower_is_better=e.lower_is_better)
    contrasts = [replace(c, a=level[c.a], b=level[c.b], a_label=level[c.a], b_label=level[c.b])
                 for c in an.comparisons]
    tests = {c.test.split(" (")[0] for c in contrasts if c.test != "none"}
    how = ("paired t across seeds" if tests == {"paired t"} else
           "Welch t (the levels ran different seeds)" if tests == {"Welch t"} else
           "paired t across seeds, Welch t where the seeds differ")
    decided = sum(c.p_adjusted is not None for c in contrasts)
    out = replace(e, levels=[stats.LevelRow(level[r.key], float(r.mean or 0.0), r.n, r.rank or 0, r.group, r.tied,
                                            r.unranked if r.rank is None else "") for r in best_first],
                  contrasts=contrasts, interactions=[], blocks=["seed"] if tests == {"paired t"} else [],
                  model=f"{how}, each pair of levels on its own; " + (
                      f"Holm over the {decided} pair{'s' if decided != 1 else ''} that can be decided" if decided
                      else f"no pair can be decided yet (fewer than {stats.MIN_SEEDS} seeds a side)"))
    for c in out.contrasts:
        c.model = out.model
    return out


def _level(c: stats.CellInput, axis: str) -> str:
    from .stats.effects import axis_levels

    return axis_levels([c], axis)[c.key]


def reconcile(cells: Sequence[stats.CellInput], analysis: stats.Analysis,
              effects: Sequence[stats.AxisEffect]) -> None:
    """One verdict per pair: the per-cell ``analysis`` (each cell against the baseline, or ``--by``) made to
    agree with the per-axis answers ``effects`` of the same runs.

    - One-axis grid (its answer is the per-cell test of each pair of levels, ``paired_answer``): a row whose
      two cells are a pair of the axis's levels takes that answer's figures and verdict (Holm over the
      axis's level pairs: the baseline is a display choice, the question is the axis), and the cells take
      its ranks.
    - Factorial grid (each axis answered by the model pooled over the other axes): the per-cell rows are
      diagnostics, their figures under their test's name and no verdict of their own (``role`` "diagnostic",
      ``verdict`` starting with DIAGNOSTIC), and the cells are not ranked (the levels are).
    Every row gets ``model``, the one-line name of the model whose verdict answers it."""
    from dataclasses import fields

    own = ("paired t across seeds (Welch where the seeds differ), Holm over the "
           f"{sum(c.p_adjusted is not None for c in analysis.comparisons)} comparisons that can be decided")
    for c in analysis.comparisons:
        c.model = own
    done = [e for e in effects if e.contrasts]
    factorial = [e for e in done if e.design == "factorial" or not _levels_are_cells(cells, e.axis)]
    if factorial:  # the axes are the questions (a factorial grid, or axes nested in a level of another)
        answer = "; ".join(f"{e.axis}: {e.model}" for e in factorial)
        for c in analysis.comparisons:
            word = stats.verdict_word(c.verdict)
            if word in (stats.BETTER, stats.WORSE, stats.SAME, stats.TOO_FEW):  # not "did not learn" or
                c.role, c.model = stats.DIAGNOSTIC_ROLE, answer                   # "not comparable": facts stay
                if c.p_adjusted is not None:  # "too few seeds to decide" stays: it is no verdict either
                    c.verdict = f"{stats.DIAGNOSTIC} (no verdict: the per-axis model answers)"
        for r in analysis.cells:
            if r.rank is not None or r.unranked:
                r.rank, r.group, r.tied, r.unranked = None, "", False, "per axis"
        order_by_mean(analysis.cells, analysis.lower_is_better)
        return
    by_key = {c.key: c for c in cells}
    copied = [f.name for f in fields(stats.ComparisonRow) if f.name not in ("a", "b", "a_label", "b_label",
                                                                            "n_a", "n_b", "note")]
    for e in done:
        level = {c.key: _level(c, e.axis) for c in cells if e.axis in c.settings}
        pairs = {(x.a, x.b): x for x in e.contrasts}  # each level is one cell here (_levels_are_cells)
        for c in analysis.comparisons:
            la, lb = level.get(c.a), level.get(c.b)
            if c.a not in by_key or c.b not in by_key or stats.verdict_word(c.verdict) in (
                    stats.DID_NOT_LEARN, stats.NOT_COMPARABLE):
                continue
            x, sign = (pairs[(la, lb)], 1) if (la, lb) in pairs else (pairs.get((lb, la)), -1)
            if x is None:
                continue
            for name in copied:
                setattr(c, name, getattr(x, name))
            if sign == -1:
                flip = (lambda v: None if v is None else -v)
                c.delta, c.ci_low, c.ci_high = flip(x.delta), flip(x.ci_high), flip(x.ci_low)
                c.ci_raw_low, c.ci_raw_high = flip(x.ci_raw_high), flip(x.ci_raw_low)
                if x.verdict in (stats.BETTER, stats.WORSE):
                    c.verdict = stats.WORSE if x.verdict == stats.BETTER else stats.BETTER
        if any(level.get(c.a) is not None and level.get(c.b) is not None for c in analysis.comparisons):
            n = sum(x.p_adjusted is not None for x in e.contrasts)
            analysis.holm_over = (f"the {n} pair{'s' if n != 1 else ''} of {e.axis}'s levels that can be decided "
                                  "(the axis is the question; the baseline only picks the rows shown)")
        rank = {lv.level: lv for lv in e.levels}
        for r in analysis.cells:
            lv = rank.get(level.get(r.key, ""))
            if lv is not None and not r.status:
                r.rank = lv.rank or None
                r.group, r.tied, r.unranked = lv.group, lv.tied, lv.unranked
        order_by_mean(analysis.cells, analysis.lower_is_better)


def to_best(e: stats.AxisEffect, level: str) -> stats.ComparisonRow | None:
    """The contrast of ``level`` against the axis's best level, oriented level − best (Δ, its interval at the
    verdict's level, p (Holm), MDD, verdict: "worse" when the level is distinguishably worse); None for the
    best level itself or when the pair was not tested."""
    from dataclasses import replace

    best = e.best
    if best is None or level == best.level:
        return None
    c = next((c for c in e.contrasts if {str(c.a), str(c.b)} == {str(level), str(best.level)}), None)
    if c is None or str(c.a) == str(level):
        return c
    flip = (lambda v: None if v is None else -v)  # noqa: E731
    word = {stats.BETTER: stats.WORSE, stats.WORSE: stats.BETTER}.get(c.verdict, c.verdict)
    return replace(c, a=c.b, b=c.a, a_label=c.b_label, b_label=c.a_label, n_a=c.n_b, n_b=c.n_a,
                   delta=flip(c.delta), ci_low=flip(c.ci_high), ci_high=flip(c.ci_low),
                   ci_raw_low=flip(c.ci_raw_high), ci_raw_high=flip(c.ci_raw_low), verdict=word)


def size_axes(cells: Sequence[stats.CellInput], paths: Sequence[str]) -> list[str]:
    """The size axes among ``paths``: a ladder's tied outer axis (abl.grid.ladder). The grid records it as
    the first of its paths, the size key that differs at every size, and records every size key among a
    cell's swept settings (``varied``): a path with a recorded swept setting beside it that is no grid path
    and takes one value per level (a ladder's other size keys) is a size axis. A ``[grid]`` sweep records
    nothing beside its paths: it stays the user's question (so does a ladder of one key, which is recorded
    as a sweep of that key)."""
    out = []
    for p in paths:
        if not all(p in c.varied for c in cells):
            continue
        for k in set.intersection(*(set(c.varied) for c in cells)) - set(paths):
            per_level: dict[str, set[str]] = {}
            for c in cells:
                per_level.setdefault(repr(c.varied[p]), set()).add(repr(c.varied[k]))
            if len(per_level) > 1 and all(len(v) == 1 for v in per_level.values()):
                out.append(p)
                break
    return out


def _sizes(cells: Sequence[stats.CellInput], axis: str) -> list[str]:
    """The values the cells recorded at ``axis``, smallest first (in the cells' order where not numbers)."""
    seen = list(dict.fromkeys(c.varied[axis] for c in cells if axis in c.varied))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in seen):
        seen.sort()
    return [f"{v:g}" if isinstance(v, float) else str(v) for v in seen]


def sizes_run(cells: Sequence[stats.CellInput], e: stats.AxisEffect) -> stats.AxisEffect:
    """The size axis ``e`` without a verdict: no levels, contrasts or interactions, a note naming the sizes
    run, smallest first (the other axes' answers keep it as a block of their model)."""
    from dataclasses import replace

    sizes = ", ".join(_sizes(cells, e.axis))
    return replace(e, levels=[], contrasts=[], interactions=[], design="",
                   note=f"the ladder's sizes, smallest first: {sizes} (no verdict: a bigger model's lower loss is no "
                        "question asked; abl ladder says whether each ordering holds across the sizes)")


def per_token_refusal(cells: Sequence[stats.CellInput], axes: Sequence[str],
                      metric: str) -> list[stats.AxisEffect] | None:
    """No per-axis verdict on a per-token figure across cells whose tokens differ (abl.analysis.comparable):
    each axis gets a line saying why and which metric compares; None when ``metric`` may be compared."""
    from . import comparable, metrics

    if metrics.across_tokenizers(metric) or len({comparable.token_unit(c.settings) for c in cells}) < 2:
        return None
    instead = metrics.comparison_metric(metric, tokenizers_differ=True)
    return [stats.AxisEffect(a, [], [], note=f"no verdict on {metric}: it is per token and these cells' "
                                             f"tokenizers (or data) differ, so compare {instead}") for a in axes]


def nested_effects(cells: Sequence[stats.CellInput], answered: Sequence[str], paths: Sequence[str] = (),
                   lower_is_better: bool = True, metric: str = "val_loss") -> list[stats.AxisEffect]:
    """The axes that apply to some cells only, each answered among the cells where it applies.

    A grid can nest axes inside a level of another (MoE's routing, aux loss and capacity inside
    ``model.ffn = moe``; fp8's scaling inside ``train.precision = fp8``): the cells of other levels do not
    hold those settings, so the whole grid's model has no term for them. Each such axis (one of the grid's
    ``paths`` when known, else a setting that varies among the cells that hold it) is answered by the same
    rule as a top-level one, on the cells that hold it: pooled over the other axes nested with it (a
    factorial model, least-squares means) or, with one, each pair of levels by its own paired t. Its note
    names where it applies. ``answered``: the axes the whole grid's model already answers."""
    holders: dict[frozenset, list[str]] = {}
    held_by_some = {k for c in cells for k in c.settings} - set(answered)
    for axis in sorted(held_by_some):
        if paths and axis not in paths:
            continue
        sub = [c for c in cells if axis in c.settings]
        if len(sub) < 2 or len(sub) == len(cells) or len({c.settings[axis] for c in sub}) < 2:
            continue
        holders.setdefault(frozenset(c.key for c in sub), []).append(axis)
    out: list[stats.AxisEffect] = []
    for keys, axes in holders.items():
        sub = [c for c in cells if c.key in keys]
        where = ", ".join(f"{a} = {_level(sub[0], a)}" for a in answered
                          if a in sub[0].settings and len({c.settings.get(a) for c in sub}) == 1)
        note = f"among the {len(sub)} cells where it applies" + (f" ({where})" if where else "")
        refused = per_token_refusal(sub, axes, metric)
        if refused:
            out += refused
            continue
        try:
            effects = stats.main_effects(sub, axes, lower_is_better=lower_is_better)
        except Exception as exc:  # noqa: BLE001 - a nested design the model cannot fit: say so, keep the rest
            out.append(stats.AxisEffect(", ".join(axes), [], [], note=f"{note}: per-axis analysis unavailable: "
                                                                      f"{type(exc).__name__}: {exc}"))
            continue
        for e in effects:
            e = paired_answer(sub, e) or e if e.design == "one-axis" and e.contrasts else e
            e.note = "; ".join(x for x in (note, e.note) if x)
            out.append(e)
    return out


def _levels_are_cells(cells: Sequence[stats.CellInput], axis: str) -> bool:
    """Is each level of ``axis`` one cell, and does every cell hold the axis (a one-axis grid)? Not where
    several cells share a level or the axis applies to some cells only (nested): then the cells are no
    levels, and a cell's rank or row cannot stand for the axis's answer."""
    held = [_level(c, axis) for c in cells if axis in c.settings]
    return len(held) == len(cells) and len(set(held)) == len(held)
