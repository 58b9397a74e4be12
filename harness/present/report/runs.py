"""The report's data: runs and their cells from the store, and the per-cell statistics.

Stored runs come from the one reader, abl.store.reader.read_runs (``load_runs``
is its use here: a missing store is a ``ReportError``): each run with the final
value of every stored metric (as the metric catalogue, abl.analysis.metrics,
defines it) and its curves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...analysis import metrics as catalogue
from ...analysis import sections, stats
from ...contracts.status import COMPLETED
from ...store.reader import StoredRun

# eval.extrapolation's metrics, one per abl.model.decode.EXTRAPOLATION_SCALES (spelled here so that reading a
# report does not import torch; tests/test_scoring.py keeps the two equal)
EXTRAPOLATION = ("val_loss_x1", "val_loss_x2", "val_loss_x4")
MIN_SIZES_FOR_FIT = sections.MIN_SIZES  # kept for callers; the rule is abl.analysis.sections.scaling_fit_applies
class ReportError(Exception):
    """Nothing to report, or an unusable source (a user error)."""


# ---------------------------------------------------------------- data


@dataclass
class Cell:
    key: str
    label: str
    runs: list[StoredRun]
    predicted: dict | None = None  # abl.model.costmodel.predict's figures; cost_source "measured" without a cost function
    predict_error: str = ""
    cost_missing: list[str] = field(default_factory=list)  # components without a cost function ("norm 'x'")
    # components no loaded plugin provides, "axis:name" -> the origin its runs recorded (report.costs.not_loaded)
    not_loaded: dict = field(default_factory=dict)

    @property
    def completed(self) -> list[StoredRun]:
        return [r for r in self.runs if r.status == COMPLETED]

    @property
    def config(self) -> dict:
        return self.runs[0].config


def load_runs(db_path: str | Path, *, run_ids: list[str] | None = None, experiment: str | None = None,
              curve_names: tuple[str, ...] = ("val_loss", "train_loss", "elapsed_s"),
              metrics: tuple[str, ...] | None = None) -> list[StoredRun]:
    """Runs by run id or experiment name through the one reader (abl.store.reader.read_runs): each with the
    final value of every stored metric (or of ``metrics``) and the curves of ``curve_names``."""
    from ...store import reader

    if run_ids is None and experiment is None:
        return []
    try:
        return reader.read_runs(db_path, run_ids=run_ids, experiment=experiment if run_ids is None else None,
                                metrics=metrics, curves=curve_names)
    except reader.NotAStore as exc:
        raise ReportError(str(exc)) from None


def experiments(db_path: str | Path) -> list[str]:
    from ...store import reader

    return reader.experiments(db_path)


def group_cells(runs: list[StoredRun], order: list[str] | None = None) -> list[Cell]:
    """Runs grouped by cell, in ``order`` (cell keys, e.g. the grid's) then first-seen order."""
    cells: dict[str, Cell] = {}
    for r in runs:
        cells.setdefault(r.cell_key, Cell(r.cell_key, r.label or r.cell_key[:8], [])).runs.append(r)
    for c in cells.values():
        c.runs.sort(key=lambda r: r.seed)
    rank = {k: i for i, k in enumerate(order or [])}
    return sorted(cells.values(), key=lambda c: rank.get(c.key, len(rank)))


def pick_baseline(cells: list[Cell], baseline: str | None) -> Cell:
    """The baseline cell: the first healthy one (the grid's first cell), or one chosen by label, key or
    1-based index (abl.analysis.verdicts.find_cell)."""
    from ...analysis.verdicts import VerdictError, default_baseline, find_cell

    inputs = _inputs(cells)
    try:
        chosen = find_cell(inputs, baseline) if baseline else default_baseline(inputs)
    except VerdictError as exc:
        raise ReportError(str(exc)) from None
    return next(c for c in cells if c.key == chosen.key)


def _inputs(cells: list[Cell], metric: str = "val_loss"):
    from ...analysis.verdicts import cell_inputs

    return cell_inputs([r for c in cells for r in c.runs], metric, [c.key for c in cells])


def final_val_losses(cell: Cell, metric: str = "val_loss") -> dict[int, float]:
    return {r.seed: r.final[metric] for r in cell.completed if r.final.get(metric) is not None}


def comparison_metric(cells: list[Cell]) -> str:
    """What cells are compared on: ``val_loss`` (nats per token), or ``val_bpb`` (bits per byte) when
    their data or tokenizer differ, so a token means different things, and every completed run has it."""
    runs = [r for c in cells for r in c.completed]
    data = {json.dumps([(r.config.get("components") or {}).get(a) for a in ("dataset", "tokenizer")],
                       sort_keys=True, default=str) for r in runs}
    metric = catalogue.comparison_metric("val_loss", tokenizers_differ=len(data) > 1)
    if runs and all(r.final.get(metric) is not None for r in runs):
        return metric
    return "val_loss"


def cell_statistics(cells: list[Cell], baseline: Cell, alpha: float = stats.ALPHA,
                    bootstrap: bool = False, metric: str = "val_loss",
                    effects: list[stats.AxisEffect] | None = None) -> list[dict[str, Any]]:
    """One dict per cell: the final ``metric`` over seeds, learning health, and the comparison with
    ``baseline`` (abl.analysis.stats.analyse: the same engine and defaults as the run summary, abl compare and
    the dashboard). ``effects``: the per-axis answers of the same runs (abl.analysis.verdicts.axis_effects);
    the rows are made to agree with them (abl.analysis.answers.reconcile: one verdict per pair)."""
    inputs = _inputs(cells, metric)
    analysis = stats.analyse(inputs, stats.against_baseline([c.key for c in cells], baseline.key), alpha=alpha,
                             bootstrap=bootstrap, lower_is_better=catalogue.lower_is_better(metric))
    from ...analysis.answers import reconcile
    from ...analysis.verdicts import flag_different_targets

    flag_different_targets([r for c in cells for r in c.runs], metric, analysis)
    reconcile(inputs, analysis, effects or [])
    comps = {cr.a: cr for cr in analysis.comparisons}
    out = []
    for c, row in zip(cells, analysis.cells):
        comp = comps.get(c.key)
        h = row.health
        out.append({
            "cell_key": c.key, "label": c.label, "metric": metric, "runs": len(c.runs), "completed": len(c.completed),
            "seeds": sorted(inputs[cells.index(c)].values), "n": row.n, "mean": row.mean, "std": row.std,
            "ci_low": row.ci_low, "ci_high": row.ci_high, "rank": row.rank, "rank_text": row.rank_text,
            "delta": comp.delta if comp else (0.0 if row.n else None),
            "delta_ci_low": comp.ci_low if comp else None, "delta_ci_high": comp.ci_high if comp else None,
            "p_value": comp.p_value if comp else None, "p_adjusted": comp.p_adjusted if comp else None,
            "mdd": comp.mdd if comp else None, "test": comp.test if comp else stats.BASELINE,
            "verdict": comp.verdict if comp else stats.BASELINE, "note": comp.note if comp else "",
            "is_baseline": c.key == baseline.key, "did_not_learn": h.did_not_learn, "unigram_floor": h.floor,
            "loss_spikes": h.loss_spikes, "max_loss_spike": h.max_loss_spike, "method": analysis.method,
            "interval": analysis.interval, "interval_header": analysis.interval_header,
            # why the cell has no rank ("untested (n=2)", "per axis"); the comparison's role ("verdict" or
            # "diagnostic"), the model that answers it, and the level its verdict, interval and MDD use
            "unranked": row.unranked, "role": comp.role if comp else stats.VERDICT,
            "model": comp.model if comp else "", "level": comp.level if comp else None,
        })
    return out


def statistics_for_runs(db_path: str | Path, run_ids: list[str], order: list[str] | None = None,
                        baseline: str | None = None) -> list[dict[str, Any]]:
    """``cell_statistics`` straight from the store, on ``comparison_metric``, which each row
    names under ``metric``.

    ``order``: cell keys in grid order (the first is the baseline unless
    ``baseline`` names another by label, key prefix or 1-based index).
    """
    cells = group_cells(load_runs(db_path, run_ids=run_ids, curve_names=()), order)
    if not cells:
        return []
    metric = comparison_metric(cells)
    return cell_statistics(cells, pick_baseline(cells, baseline), metric=metric)


def label_cells(cells: list[Cell], grid_raw: dict | None = None) -> None:
    """Every cell's display label from the settings that differ between these cells (abl.grid.labels),
    the grid's paths first when the grid is known."""
    from ...grid.labels import run_labels

    grid = (grid_raw or {}).get("grid")
    order = [k for k in grid if k != "exclude"] if isinstance(grid, dict) else []
    labels = run_labels([r for c in cells for r in c.runs], order)
    for c in cells:
        c.label = labels.get(c.key, c.label)

