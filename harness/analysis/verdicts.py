"""Verdict tables from stored runs: the one path from the store to abl.analysis.stats.analyse.

The ``abl run`` summary, ``abl compare``, ``abl report`` and the dashboard's
Compare page all turn runs into ``stats.CellInput`` here (``cell_inputs``),
pick the comparisons here (``choose_comparisons``: each cell against a
baseline, chosen pairs, or every pair of values of one grid axis) and call
``stats.analyse``, so they give the same p-values and verdicts. The baseline
is a display choice: it is read from ``experiment.baseline`` or
``--baseline`` and never enters a run's config or hash.

A run is anything with the attributes of ``RunRecord`` (``report.Run`` has
them); the dashboard builds ``RunRecord`` from its own queries.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Hashable, Protocol, Sequence

from ..contracts.status import COMPLETED
from . import comparable, metrics, stats
from .formats import fmt, fmt_bytes
from .tables import flatten

# config paths never used to decide whether two cells differ in one axis only: the learning
# rate a sweep chose per variant (abl.run.lr_sweep) and the sweep itself
TUNED_PATHS = ("train.lr", "train.lr_sweep")


class RunLike(Protocol):
    cell_key: str
    label: str
    seed: int
    status: str
    config: dict
    data_fingerprint: str
    final: dict


@dataclass
class RunRecord:
    cell_key: str
    label: str
    seed: int
    status: str
    config: dict
    data_fingerprint: str
    final: dict = field(default_factory=dict)  # metric -> final value


class VerdictError(Exception):
    """A comparison that cannot be made as asked (unknown cell, axis with one value...); a user error."""


def settings(config: dict) -> dict[str, Any]:
    """The flattened settings of a cell (model, train, data, and its components' parameters)."""
    flat = flatten({k: config.get(k) for k in ("model", "train", "data")})
    for axis, spec in (config.get("components") or {}).items():
        if isinstance(spec, dict) and spec.get("params"):
            for k, v in spec["params"].items():
                flat[f"{axis}.{spec['name']}.{k}"] = v
    matched = config.get("matched") or {}
    if matched.get("by") == "n_layers":  # depth was solved for the budget, not chosen
        flat.pop("model.n_layers", None)
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
            settings=settings(rs[0].config), statuses=_count(r.status for r in rs)))
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
    return cells, stats.analyse(cells, comps, bootstrap=bootstrap, correction=correction,
                                lower_is_better=lower_is_better(metric)), what


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


def seeds_for_effect(cells: Sequence[stats.CellInput], effect: float, comparisons: int) -> str:
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
        return f"--detect {effect:g}: more than 10000 seeds per cell would be needed ({where})"
    return f"--detect {effect:g}: {need} seeds per cell needed to detect |Δ| = {effect:g} ({where})"


# ---------------------------------------------------------------- rendering (terminal)

def display_name(metric: str) -> str:
    """A metric's column header, from the metric catalogue: ``train_tokens_per_s`` -> ``tokens/s (loop)``,
    ``val_loss_x2`` -> ``val loss (2x context)``."""
    return metrics.label(metric)


_f = fmt


def value_text(metric: str, x: float | None) -> str:
    """A metric's value as the tables print it (bytes in KiB/MiB/GiB, large rates with separators)."""
    if x is None or not math.isfinite(x):
        return "-"
    if metrics.metric(metric).unit == "bytes":
        return fmt_bytes(x)
    if metric in ("mfu", "hfu"):
        return f"{100 * x:.1f}%"
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
                numbers: dict[Any, int] | None = None, metric: str = "val_loss"):
    """A rich table: one row per cell, ranked cells first (best first), then the unranked ones.

    ``extra``: column header -> {cell key: the figure's text}; ``numbers``: cell key -> the number
    ``--baseline`` / ``--pairs`` take (default: the cell's position in ``cells``)."""
    from rich.table import Table

    extra = extra or {}
    numbers = numbers or {c.key: i for i, c in enumerate(cells, 1)}
    table = Table(title=title, title_justify="left", caption=analysis.method, caption_justify="left")
    for col in ("#", "rank", "cell", "seeds", f"{display_name(metric)} (mean ± std)", "95% CI", *extra,
                *(["lr"] if lr else []), "health"):
        table.add_column(col, no_wrap=col not in ("cell", "health"), justify="right" if col == "#" else "left")
    rows = sorted(analysis.cells, key=lambda r: (r.rank is None, r.rank or 0))
    by_key = {c.key: c for c in cells}
    for r in rows:
        statuses = by_key[r.key].statuses if r.key in by_key else {}
        runs = sum(statuses.values()) or r.n
        others = ", ".join(f"{n} {st}" for st, n in statuses.items() if st != COMPLETED)
        ms = _f(r.mean) + ("" if r.std is None else f" ± {_f(r.std)}")
        ci = "-" if r.ci_low is None else f"[{_f(r.ci_low)}, {_f(r.ci_high)}]"
        table.add_row(str(numbers.get(r.key, "-")), "-" if r.rank is None else str(r.rank), r.label,
                      f"{r.n}/{runs}", ms, ci, *[extra[m].get(r.key, "-") for m in extra],
                      *([f"{lr[r.key]:g}" if lr.get(r.key) is not None else "-"] if lr else []),
                      "; ".join(x for x in (r.status or health_text(r.health), others) if x and x != "-") or "-")
    return table


def comparisons_table(analysis: stats.Analysis, title: str):
    from rich.table import Table

    table = Table(title=title, title_justify="left", caption=analysis.method, caption_justify="left")
    for col in ("a", "b", "Δ = a − b", "95% CI", "p", "p (Holm)" if analysis.correction == stats.HOLM else "p (adj.)",
                "test", "MDD", "verdict"):
        table.add_column(col, no_wrap=col not in ("a", "b", "verdict"))
    for c in analysis.comparisons:
        ci = "-" if c.ci_low is None else f"[{_f(c.ci_low, signed=True)}, {_f(c.ci_high, signed=True)}]"
        table.add_row(c.a_label, c.b_label, _f(c.delta, signed=True), ci, stats.fmt_p(c.p_value),
                      stats.fmt_p(c.p_adjusted), c.test, _f(c.mdd), c.verdict)
    return table
