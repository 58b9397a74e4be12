"""Verdict tables from stored runs: the one path from the store to abl.analysis.stats.analyse.

The ``abl run`` summary, ``abl compare``, ``abl report`` and the dashboard's
Compare page all turn runs into ``stats.CellInput`` here (``cell_inputs``),
pick the comparisons here (``choose_comparisons``: each cell against a
baseline, chosen pairs, or every pair of values of one grid axis) and call
``stats.analyse``, so they give the same p-values and verdicts. The baseline
is a display choice: it is read from ``experiment.baseline`` or
``--baseline`` and never enters a run's config or hash.

A run is anything with the attributes of ``RunLike`` (and, optionally, its
``scored_targets``): every reader passes abl.store.reader's ``StoredRun``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Hashable, Protocol, Sequence

from ..contracts.config import solved_paths
from ..contracts.status import COMPLETED
from . import comparable, metrics, stats
from .answers import nested_effects, paired_answer, per_token_refusal, size_axes, sizes_run, to_best
from .formats import fmt, fmt_bytes, fmt_fraction, fmt_speed
from .tables import settings_of
from .units import TOKENS_PER_S

# config paths never used to decide whether two cells differ in one axis only: the learning
# rate a sweep chose per variant (abl.run.lr_sweep) and the sweep itself
TUNED_PATHS = ("train.lr", "train.lr_sweep")


class RunLike(Protocol):
    """A stored run as the verdicts read it (abl.store.reader.StoredRun); its ``scored_targets``, where it has
    them, say what its validation figures were scored on (info.json, abl.train.evaluations)."""

    cell_key: str
    label: str
    seed: int
    status: str
    config: dict
    data_fingerprint: str
    final: dict


class VerdictError(Exception):
    """A comparison that cannot be made as asked (unknown cell, axis with one value...); a user error."""


def settings(config: dict) -> dict[str, Any]:
    """The flattened settings of a cell (model, train, data, and its components' parameters:
    abl.analysis.tables.settings_of), as JSON text, less what the budget or the lr sweep solved."""
    flat = settings_of(config, ("model", "train", "data"))
    for p in solved_paths(config):  # solved for the budget, not chosen: they belong to the level
        flat.pop(p, None)
    if config.get("lr_tuned"):  # each variant's own best learning rate (abl.run.lr_sweep)
        for p in TUNED_PATHS:
            flat.pop(p, None)
    return {k: json.dumps(v, sort_keys=True, default=str) for k, v in flat.items()}


def data_key(run: RunLike) -> tuple:
    """What fixes the data order apart from the seed (the batches depend only on the seed, given these)."""
    return (run.data_fingerprint, run.config.get("model", {}).get("context"),
            run.config.get("train", {}).get("batch_size"))


def _health(runs: Sequence[RunLike]) -> stats.Health:
    h = stats.Health()
    spikes = [float(r.final["max_loss_spike"]) for r in runs if r.final.get("max_loss_spike") is not None]
    for r in runs:
        dnl = r.final.get("did_not_learn")
        if dnl is None:
            continue
        h.runs += 1
        h.did_not_learn += int(dnl >= 0.5)
        if r.final.get("unigram_floor") is not None:
            h.floor = float(r.final["unigram_floor"])
    h.loss_spikes = int(sum(r.final.get("loss_spikes") or 0 for r in runs))
    h.max_loss_spike = max(spikes) if spikes else None
    return h


def cell_inputs(runs: Sequence[RunLike], metric: str = "val_loss",
                order: Sequence[str] | None = None) -> list[stats.CellInput]:
    """One ``CellInput`` per cell (completed runs' final ``metric`` by seed), in ``order`` then first-seen."""
    by_cell: dict[str, list[RunLike]] = {}
    for r in runs:
        by_cell.setdefault(r.cell_key, []).append(r)
    rank = {k: i for i, k in enumerate(order or [])}
    keys = sorted(by_cell, key=lambda k: rank.get(k, len(rank)))
    out = []
    for k in keys:
        rs = sorted(by_cell[k], key=lambda r: r.seed)
        done = [r for r in rs if r.status == COMPLETED]
        values = {r.seed: float(r.final[metric]) for r in done
                  if r.final.get(metric) is not None and math.isfinite(float(r.final[metric]))}
        out.append(stats.CellInput(
            key=k, label=rs[0].label or k[:8], values=values,
            data_key=data_key(done[0]) if done else None,
            health=_health(done) if metric_is_loss(metric) else stats.Health(),
            settings=settings(rs[0].config), statuses=_count(r.status for r in rs),
            varied=dict(getattr(rs[0], "grid_varied", None) or {})))
    return out


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def metric_is_loss(metric: str) -> bool:
    """Learning health applies to loss metrics (a cell that did not learn is not ranked on them)."""
    return metrics.is_loss(metric)


def lower_is_better(metric: str) -> bool:
    return metrics.lower_is_better(metric)


def find_cell(cells: Sequence[stats.CellInput], ref: str, what: str = "--baseline") -> stats.CellInput:
    """A cell by 1-based index, exact label, cell-key prefix, or a unique part of its label."""
    ref = str(ref).strip()
    if ref.isdigit() and 1 <= int(ref) <= len(cells):
        return cells[int(ref) - 1]
    hits = [c for c in cells if c.label == ref] or [c for c in cells if str(c.key).startswith(ref)] or \
           [c for c in cells if ref in c.label]
    if len(hits) != 1:
        listing = "; ".join(f"{i}: {c.label}" for i, c in enumerate(cells, 1))
        raise VerdictError(f"{what} {ref!r} matches {len(hits)} cells; give a label, key prefix or "
                           f"index ({listing})")
    return hits[0]


def default_baseline(cells: Sequence[stats.CellInput]) -> stats.CellInput:
    """The first cell that has a completed run and learned (the grid's first cell when the grid order is
    known and it is healthy)."""
    return next((c for c in cells if c.values and not c.health.flagged),
                next((c for c in cells if c.values), cells[0]))


def choose_comparisons(cells: Sequence[stats.CellInput], *, baseline: str | None = None,
                       pairs: Sequence[str] = (), by: str | None = None
                       ) -> tuple[list[tuple[Hashable, Hashable]], str]:
    """The comparisons asked for, and a sentence saying which. At most one of pairs / by; else baseline.

    ``pairs``: "a,b" strings (cells as in ``find_cell``); ``by``: a config
    path such as ``model.ffn`` (every pair of cells that differ in it only).
    """
    if not cells:
        raise VerdictError("no cells to compare")
    if pairs and by:
        raise VerdictError("give --pairs or --by, not both")
    if pairs:
        out = []
        for p in pairs:
            parts = [x for x in str(p).split(",")]
            if len(parts) != 2 or not all(x.strip() for x in parts):
                raise VerdictError(f"--pairs {p!r}: expected two cells separated by a comma, e.g. --pairs 2,3")
            a, b = (find_cell(cells, x, "--pairs") for x in parts)
            if a.key == b.key:
                raise VerdictError(f"--pairs {p!r}: both sides are the cell {a.label!r}")
            out.append((a.key, b.key))
        return out, "chosen pairs (first minus second)"
    if by:
        path = by[2:] if by.startswith("$.") else by
        known = set().union(*(c.settings for c in cells))
        if path not in known:
            raise VerdictError(f"--by {by!r}: not a setting of these runs (e.g. model.ffn, model.norm)")
        values = {c.settings.get(path) for c in cells}
        if len(values) < 2:
            raise VerdictError(f"--by {by!r}: every cell has the same value ({values.pop()})")
        out = stats.by_axis(cells, path)
        if not out:
            raise VerdictError(f"--by {by!r}: no two cells differ in {path} alone")
        return out, f"every pair of cells that differ in {path} only (first minus second)"
    base = find_cell(cells, baseline) if baseline else default_baseline(cells)
    return stats.against_baseline([c.key for c in cells], base.key), f"each cell minus the baseline {base.label}"


def analyse_runs(runs: Sequence[RunLike], *, metric: str = "val_loss", order: Sequence[str] | None = None,
                 baseline: str | None = None, pairs: Sequence[str] = (), by: str | None = None,
                 bootstrap: bool = False, correction: str = stats.HOLM
                 ) -> tuple[list[stats.CellInput], stats.Analysis, str]:
    """Cells, their analysis and the sentence naming the comparisons: what every verdict table shows."""
    cells = cell_inputs(runs, metric, order)
    comps, what = choose_comparisons(cells, baseline=baseline, pairs=pairs, by=by)
    comps, what = comparable.keep_comparable(metric, cells, comps, what)  # no val_loss across tokenizers
    analysis = stats.analyse(cells, comps, bootstrap=bootstrap, correction=correction,
                             lower_is_better=lower_is_better(metric))
    flag_different_targets(runs, metric, analysis)
    return cells, analysis, what


NOT_COMPARABLE = f"{stats.NOT_COMPARABLE}: scored on different validation targets"


def flag_different_targets(runs: Sequence[RunLike], metric: str, analysis: stats.Analysis) -> None:
    """A difference between cells scored on different validation targets is partly a difference in the text:
    such a comparison's verdict says so, with the reason. What a run was scored on is its ``scored_targets``
    fingerprint of the figure (abl.train.evaluations); runs that do not say are not judged."""
    key = ("extrapolation" if re.fullmatch(r"val_(loss|bpb)_x\d+", metric) else "val_bpb" if metric == "val_bpb"
           else "val_loss" if metric == "val_loss" or re.fullmatch(r"(?!probe_).+_accuracy(_.+)?", metric) else None)
    scored: dict[Hashable, set] = {}
    for r in runs:
        fp = (getattr(r, "scored_targets", None) or {}).get(key) if key else None
        if fp and r.status == COMPLETED:
            scored.setdefault(r.cell_key, set()).add(fp)
    for c in analysis.comparisons:
        a, b = scored.get(c.a, set()), scored.get(c.b, set())
        if a and b and (a != b or len(a) > 1):
            c.verdict = NOT_COMPARABLE
            reason = (f"{metric} of {c.a_label} and {c.b_label} was scored on different validation targets "
                      f"(fingerprints {', '.join(sorted(x[:8] for x in a | b))}: another tokenizer, context, data, "
                      "number of evaluation windows, or a run from before the windows were fixed)")
            c.note = f"{c.note}; {reason}" if c.note else reason


# ---------------------------------------------------------------- power for a planned effect


def observed_sd(cells: Sequence[stats.CellInput]) -> tuple[float | None, bool, int]:
    """(sd, paired, cells used) at the observed variance of a grid's cells.

    Paired (every cell ran the same seeds on the same data): the pooled sd of
    the per-seed differences to the first cell; else the pooled within-cell sd.
    Cells that did not learn are left out. None with no cell of >= 2 seeds.
    """
    ok = [c for c in cells if not c.health.flagged and len(c.values) >= 2]
    if not ok:
        return None, False, 0
    same = len({c.data_key for c in ok}) == 1 and len({frozenset(c.values) for c in ok}) == 1
    if same and len(ok) >= 2:
        base = ok[0]
        var, dof = 0.0, 0
        for c in ok[1:]:
            d = [c.values[s] - base.values[s] for s in base.values]
            m = sum(d) / len(d)
            var += sum((x - m) ** 2 for x in d)
            dof += len(d) - 1
        return math.sqrt(var / dof), True, len(ok)
    var, dof = 0.0, 0
    for c in ok:
        xs = list(c.values.values())
        m = sum(xs) / len(xs)
        var += sum((x - m) ** 2 for x in xs)
        dof += len(xs) - 1
    return math.sqrt(var / dof), False, len(ok)


def seeds_for_effect(cells: Sequence[stats.CellInput], effect: float, comparisons: int,
                     paths: Sequence[str] = ()) -> str:
    """A sentence: how many seeds per cell the grid needs to detect ``effect`` (abl run --detect)."""
    sd, is_paired, n = observed_sd(cells)
    if sd is None:
        return (f"--detect {effect:g}: no cell that learned has 2 completed seeds yet, so there is no observed "
                "variance; run the grid with at least 2 seeds first")
    need = stats.seeds_needed(sd, effect, paired=is_paired, comparisons=comparisons)
    kind = "per-seed differences between cells (paired by seed)" if is_paired else "seeds within a cell (Welch)"
    where = (f"at the observed sd {sd:.4g} of {kind}, over {n} cells; two-sided, alpha {stats.ALPHA}"
             + (f" / {comparisons} comparisons (Holm's strictest step)" if comparisons > 1 else "")
             + f", power {stats.POWER:.0%}")
    if need is None:
        out = f"--detect {effect:g}: more than 10000 seeds per cell would be needed ({where})"
    else:
        out = f"--detect {effect:g}: {need} seeds per cell needed to detect |Δ| = {effect:g} ({where})"
    return "\n".join([out, *axis_seeds(cells, effect, paths)])


def axis_seeds(cells: Sequence[stats.CellInput], effect: float, paths: Sequence[str] = ()) -> list[str]:
    """Per swept axis: the seeds its main effect needs to tell two levels ``effect`` apart."""
    out = []
    for e in axis_effects(cells, paths):
        if e.sigma is None:
            continue
        k = stats.seeds_for_axis(e, effect)
        need = f"{k} seeds" if k is not None else "more than 200 seeds"
        out.append(f"--detect {effect:g}, {e.axis} (main effect, pooled over {', '.join(e.blocks) or 'nothing'}): "
                   f"{need} to tell its two least-run levels {effect:g} apart at the model's residual sd "
                   f"{e.sigma:.4g} (alpha {e.alpha} / {len(e.levels) * (len(e.levels) - 1) // 2} level pairs, "
                   f"power {stats.POWER:.0%})")
    return out


# ---------------------------------------------------------------- rendering (terminal)

def display_name(metric: str) -> str:
    """A metric's column header, from the metric catalogue: ``train_tokens_per_s`` -> ``tokens/s (loop)``,
    ``val_loss_x2`` -> ``val loss (2x context)``; a plugin's metric with its unit, ``parameter RMS (rms)``."""
    return metrics.header(metric)


_f = fmt


def value_text(metric: str, x: float | None) -> str:
    """A metric's value as the tables print it, the unit in the column's header (bytes in KiB/MiB/GiB, tokens/s
    as whole tokens with separators at every magnitude, shares as percentages)."""
    if x is None or not math.isfinite(x):
        return "-"
    unit = metrics.metric(metric).unit
    if unit == "bytes":
        return fmt_bytes(x)
    if unit == TOKENS_PER_S:
        return fmt_speed(x, unit=False)
    if unit == "fraction" and metrics.is_speed(metric):
        return fmt_fraction(x)
    return f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:.4g}" if abs(x) >= 100 else f"{x:.4f}"



def health_text(h: stats.Health) -> str:
    parts = []
    if h.flagged:
        parts.append(h.describe())
    if h.runs or h.loss_spikes:
        parts.append(f"spikes {h.loss_spikes}" + (f" (max +{h.max_loss_spike:.2f})" if h.loss_spikes and
                                                  h.max_loss_spike is not None else ""))
    return "; ".join(parts) or "-"


def cells_table(cells: Sequence[stats.CellInput], analysis: stats.Analysis, title: str,
                extra: dict[str, dict[Any, str]] | None = None, lr: dict | None = None,
                numbers: dict[Any, int] | None = None, metric: str = "val_loss", caption: str | None = None):
    """A rich table: one row per cell, ranked cells first (best first), then the unranked ones.

    ``extra``: column header -> {cell key: the figure's text}; ``numbers``: cell key -> the number
    ``--baseline`` / ``--pairs`` take (default: the cell's position in ``cells``)."""
    from rich.table import Table

    extra = extra or {}
    numbers = numbers or {c.key: i for i, c in enumerate(cells, 1)}
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for col in ("#", "rank", "cell", "seeds", f"{display_name(metric)} (mean ± std)", "95% CI", *extra,
                *(["lr"] if lr else []), "health"):
        table.add_column(col, no_wrap=col not in ("cell", "health"), justify="right" if col == "#" else "left")
    rows = sorted(analysis.cells, key=lambda r: r.order_key)
    by_key = {c.key: c for c in cells}
    for r in rows:
        statuses = by_key[r.key].statuses if r.key in by_key else {}
        runs = sum(statuses.values()) or r.n
        others = ", ".join(f"{n} {st}" for st, n in statuses.items() if st != COMPLETED)
        ms = _f(r.mean) + ("" if r.std is None else f" ± {_f(r.std)}")
        ci = "-" if r.ci_low is None else f"[{_f(r.ci_low)}, {_f(r.ci_high)}]"
        table.add_row(str(numbers.get(r.key, "-")), r.rank_text, r.label,
                      f"{r.n}/{runs}", ms, ci, *[extra[m].get(r.key, "-") for m in extra],
                      *([f"{lr[r.key]:g}" if lr.get(r.key) is not None else "-"] if lr else []),
                      "; ".join(x for x in (r.status or health_text(r.health), others) if x and x != "-") or "-")
    return table


def shown_comparisons(analysis: stats.Analysis) -> tuple[list[stats.ComparisonRow], str]:
    """The rows of a comparison table worth a line (those that can decide, and those whose cells did not learn
    or cannot be compared), and a sentence on the rows left out ("" when none is): a row with too few seeds
    decides nothing, so it is counted, not listed."""
    few = [c for c in analysis.comparisons if stats.verdict_word(c.verdict) == stats.TOO_FEW
           or (c.role == stats.DIAGNOSTIC_ROLE and c.p_adjusted is None)]
    shown = [c for c in analysis.comparisons if c not in few]
    if not few:
        return shown, ""
    ns = sorted({min(c.n_a, c.n_b) for c in few})
    return shown, (f"{len(few)} comparison{'s' if len(few) != 1 else ''} not listed: {TOO_FEW_TEXT} "
                   f"(n={', '.join(map(str, ns))}; at least {stats.MIN_SEEDS} seeds per cell give a verdict)")


TOO_FEW_TEXT = stats.TOO_FEW


def legend(analysis: stats.Analysis, effects: Sequence[stats.AxisEffect] = ()) -> str:
    """The statistics legend, once per summary or report: the per-axis model when a factorial grid's axes
    are answered by it, then the rules of the per-cell tables (``Analysis.method``)."""
    pooled = any(e.design == "factorial" and e.contrasts for e in effects)
    return " ".join([*([EFFECTS_METHOD] if pooled else []), analysis.method])


def comparisons_table(analysis: stats.Analysis, title: str, caption: str | None = None):
    """The comparisons that can decide, one row each (``shown_comparisons``); ``caption``: the legend or a
    note (the legend is printed once per summary, not under every table). With no row that can decide: the
    title and the sentence on the rows left out, as text."""
    from rich.table import Table

    rows, left = shown_comparisons(analysis)
    if not rows:  # nothing can decide: a line under the title, not the header of an empty table
        from rich.text import Text

        return Text.assemble((title, "italic"), "\n", " ".join(x for x in (left, caption or "") if x)
                             or "no comparison")
    table = Table(title=title, title_justify="left", caption=" ".join(x for x in (left, caption or "") if x) or None,
                  caption_justify="left")
    for col in ("a", "b", "Δ = a − b", analysis.interval_header, "p", "p (Holm)" if analysis.correction == stats.HOLM else "p (adj.)",
                "test", "MDD", "verdict"):
        table.add_column(col, no_wrap=col not in ("a", "b", "verdict"))
    for c in rows:
        ci = "-" if c.ci_low is None else f"[{_f(c.ci_low, signed=True)}, {_f(c.ci_high, signed=True)}]"
        table.add_row(c.a_label, c.b_label, _f(c.delta, signed=True), ci, stats.fmt_p(c.p_value),
                      stats.fmt_p(c.p_adjusted), c.test, _f(c.mdd), c.verdict)
    return table


# ---------------------------------------------------------------- per axis: main effects


def design_axes(cells: Sequence[stats.CellInput], paths: Sequence[str] = ()) -> list[str]:
    """The grid's swept axes: ``paths`` (the grid's own, when known) that the cells hold, else every
    setting all cells hold that takes more than one value (settings solved for a budget are not among
    them: they belong to their level)."""
    if not cells:
        return []
    if paths:
        return [p for p in paths if all(p in c.settings for c in cells)]
    shared = set.intersection(*(set(c.settings) for c in cells))
    return sorted(k for k in shared if len({c.settings[k] for c in cells}) > 1)


def axis_effects(cells: Sequence[stats.CellInput], paths: Sequence[str] = (), metric: str = "val_loss",
                 only: str | None = None) -> list[stats.AxisEffect]:
    """The main effect of each swept axis (abl.analysis.stats.effects): best level, by how much, and
    whether it is real, pooled over the other axes and paired by seed. ``only``: the one axis to show
    (``--by``); the others stay in the model as blocks."""
    axes = design_axes(cells, paths)
    if not axes or len(cells) < 2:
        return []
    only = only[2:] if only and only.startswith("$.") else only
    refused = per_token_refusal(cells, axes, metric)  # no val_loss across tokenizers, as the per-cell rows
    if refused is not None:
        return [e for e in refused + nested_effects(cells, axes, paths, True, metric) if not only or e.axis == only]
    try:
        effects = stats.main_effects(cells, axes, lower_is_better=lower_is_better(metric))
    except Exception as exc:  # noqa: BLE001 - a design the model cannot fit must not hide the cell tables
        return [stats.AxisEffect(", ".join(axes), [], [], note=f"per-axis analysis unavailable: "
                                                              f"{type(exc).__name__}: {exc}")]
    # one answer per question, chosen by the design: a factorial grid's axis is answered by the model pooled
    # over the other axes (paired by seed); a one-axis grid's levels are its cells, and each pair of them is
    # answered by the test of the two cells alone (paired t across seeds), which does not borrow a variance
    # from steadier pairs as the pooled model would: separate paired t-tests, not the pooled error term, are
    # the pairwise comparisons that keep their error rate when the pairs' variances differ (Maxwell 1980,
    # "Pairwise multiple comparisons in repeated measures designs", J. Educational Statistics 5(3); here
    # with Holm 1979 over the pairs)
    effects = [paired_answer(cells, e) or e if e.design == "one-axis" and e.contrasts else e for e in effects]
    effects += nested_effects(cells, axes, paths, lower_is_better(metric), metric)  # axes nested in a level
    sizes = size_axes(cells, axes)  # a ladder's size axis is no question asked: its sizes, no verdict
    effects = [sizes_run(cells, e) if e.axis in sizes else e for e in effects]
    return [e for e in effects if not only or e.axis == only]


EFFECTS_METHOD = ("Per axis: each swept axis's main effect, pooled over the other axes and paired by seed: an OLS "
                  "model of the final value on the axis with the other axes and the seed as blocking factors "
                  "(statsmodels); level figures are least-squares means; every pair of levels is a t-test of "
                  "the model's contrast, Holm over the pairs, intervals Holm-adjusted like the verdicts; an "
                  "interaction with another axis is its F-test, named when p < 0.05.")


def effect_lines(effects: Sequence[stats.AxisEffect], metric: str = "val_loss") -> list[str]:
    """Per axis, the answer first: one line with the best level, the verdict and the one model that gave it;
    beneath it one line per level, best first: rank (or why untested) with letters, mean, and its difference
    to the best level with the interval and p at the verdict's level (Holm), MDD and verdict (a forest plot in
    words); interactions and notes when they matter."""
    out = []
    for e in effects:
        best = e.best
        if best is None or e.headline() is None:
            out.append(f"{e.axis}: {e.note or 'one level among the cells that learned'}")
            continue
        out.append(f"{e.axis}: best {best.level}; verdict: {e.verdict()}"
                   + (f" ({e.model})" if e.model else ""))
        mean = "least-squares mean" if e.design == "factorial" else "mean"
        width = max(len(str(lv.level)) for lv in e.levels)
        rank_w = max(len(lv.rank_text) for lv in e.levels)
        for lv in e.levels:
            c = to_best(e, lv.level)
            if lv is best:
                tail = f"best level ({display_name(metric)} {mean})"
            elif c is None:
                tail = "not tested against the best level"
            elif c.p_adjusted is None:
                tail = f"Δ {fmt(c.delta, signed=True)} to the best; {c.verdict}"
            else:
                tail = (f"Δ {fmt(c.delta, signed=True)} to the best, CI (Holm-adj.) [{fmt(c.ci_low, signed=True)}, "
                        f"{fmt(c.ci_high, signed=True)}], p (Holm) {stats.fmt_p(c.p_adjusted)}"
                        + ("" if c.mdd is None else f", MDD {fmt(c.mdd)}") + f": {c.verdict}")
            out.append(f"    {str(lv.level):<{width}}  {lv.rank_text:<{rank_w}}  {fmt(lv.mean)}  {tail}")
        for extra in (e.interaction_text(), e.note,
                      f"left out (did not learn or no value): {', '.join(e.left_out)}" if e.left_out else ""):
            if extra:
                out.append(f"    {extra}")
    return out


def effect_section(effects: Sequence[stats.AxisEffect], title: str, metric: str = "val_loss") -> list[str]:
    """The per-axis section every summary leads with: a title, each axis's lines, the method ([] if none)."""
    if not effects:
        return []
    return [f"{title}: {metric} per axis (main effects), best level first", *effect_lines(effects, metric),
            EFFECTS_METHOD]


def verdict_lines(effects: Sequence[stats.AxisEffect]) -> list[str]:
    """One closing line per axis: ``Verdict, model.norm: rmsnorm is better than layernorm``."""
    return [f"Verdict, {e.axis}: {e.verdict()}" + (f" ({e.interaction_text()})" if e.interaction_text() else "")
            for e in effects if e.best is not None]


def effects_json(effects: Sequence[stats.AxisEffect]) -> list[dict[str, Any]]:
    from dataclasses import asdict

    return [{"axis": e.axis, "best": e.best.level if e.best else None, "verdict": e.verdict(),
             "model": e.model, "design": e.design,
             "levels": [{**asdict(lv), "rank_text": lv.rank_text,
                         "to_best": (lambda c: None if c is None else c.as_dict())(to_best(e, lv.level))}
                        for lv in e.levels], "contrasts": [c.as_dict() for c in e.contrasts],
             "interactions": [asdict(i) for i in e.interactions], "blocks": e.blocks, "df_resid": e.df_resid,
             "left_out": e.left_out, "note": e.note, "method": EFFECTS_METHOD} for e in effects]
