"""Predicted against measured costs, contention, and the points of a scaling fit.

Predictions come from the registered components' cost functions
(abl.model.costmodel). A cell with a component that declares no cost function
has none: its figures are measured once per shape instead, as ``abl cost``
measures them (abl.model.measuredcost), and are marked ``measured`` (its checks
then compare the run's own step with that measurement). Measured figures are
the runs' final metrics, averaged over a cell's completed seeds.
Disagreements are flagged, never hidden.
"""

from __future__ import annotations

import math
from typing import Any

from ...analysis import sections
from ...contracts.status import COMPLETED
from ...model.costmodel import CHECKS, agreement
from ...store.reader import StoredRun
from .runs import Cell

# ---------------------------------------------------------------- predictions


def attach_predictions(cells: list[Cell], registry) -> None:
    """Predicted costs per cell from the registered cost functions, or, for a cell with a component that
    declares no cost function, measured once per shape as abl cost does (``cost_source`` "measured", the
    components in ``cost_missing``). Errors are kept, not raised."""
    from ...contracts.config import ConfigError
    from ...contracts.registry import RegistryError
    from ...contracts.config import cell_from_config
    from ...model.costmodel import missing_costs, predict
    from ...store.provenance import missing_plugin

    for c in cells:
        r = c.runs[0]
        c.not_loaded = not_loaded(r, registry)
        if c.not_loaded:  # its cost functions are in a plugin not loaded here: the runs' own figures, or none
            c.predict_error = "; ".join(missing_plugin(key, origin) for key, origin in c.not_loaded.items())
            c.predicted = stored_predictions(c)
            continue
        try:
            cell = cell_from_config(r.config, registry)
            vocab = r.env.get("vocab_size") or None
            c.predicted = predict(cell, registry, vocab_size=vocab, measure_missing=True)
            if c.predicted.get("cost_source") == "measured":
                c.cost_missing = missing_costs(cell.components, registry)
        except (ConfigError, RegistryError) as exc:
            c.predict_error = str(exc).splitlines()[0]
        except Exception as exc:  # noqa: BLE001 - a report still comes out, with the reason
            c.predict_error = f"{type(exc).__name__}: {exc}"


# the checks' predictions a run records itself (abl.train.measure.measure_costs): prediction key -> metric
STORED_PREDICTIONS = {"n_params": "n_params_predicted", "flops_per_step": "flops_per_step_predicted"}


def not_loaded(run: StoredRun, registry) -> dict[str, dict]:
    """The components of a stored run that no loaded plugin provides, ``"axis:name"`` -> the origin its
    run recorded (abl.store.provenance.plugin_records; ``{}`` for a run recorded before runs kept it)."""
    from ...store.provenance import component_keys

    return {key: run.plugins.get(key) or {} for key, axis, name in component_keys(run.config.get("components") or {})
            if (axis, name) not in registry.components}


def stored_predictions(cell: Cell) -> dict | None:
    """The predictions the cell's completed runs recorded as they ran (``STORED_PREDICTIONS``, with the plugin
    loaded), averaged over them, as ``cost_source`` "recorded"; None when they recorded none."""
    figures = {key: _mean([r.final.get(metric) for r in cell.completed]) for key, metric in STORED_PREDICTIONS.items()}
    figures = {k: v for k, v in figures.items() if v is not None}
    return {**figures, "cost_source": "recorded"} if figures else None


def cost_source(cell: Cell) -> str:
    """Where a cell's figures came from: "predicted" (the cost functions), "measured" (one step of its
    shape, a component declaring no cost function), or "-" (neither: ``predict_error`` says why)."""
    return str(cell.predicted.get("cost_source", "predicted")) if cell.predicted else "-"


def measured_note(cells: list[Cell]) -> str:
    """One paragraph on the cells whose figures were measured, not predicted ("" when none was)."""
    meas = [c for c in cells if cost_source(c) == "measured"]
    if not meas:
        return ""
    why = sorted({m for c in meas for m in c.cost_missing})
    return (f"Source 'measured' ({len(meas)} of {len(cells)} cells): {', '.join(why)} declare(s) no cost "
            "function, so those cells were built once per shape and measured as abl cost measures them "
            "(abl.model.measuredcost): FLOPs counted over one forward and backward by torch's flop counter "
            "(as executed, so useful = counted), memory = the live tensor peak of one training step (torch's "
            "MemTracker); activations and the decode cache are not measured ('-'). Their checks compare the "
            "runs' own steps with that measurement. A cost function (docs/plugins.md, 'Costs') predicts them "
            "without building the model.")


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(vals) / len(vals) if vals else None


def measured(cell: Cell, name: str) -> float | None:
    return _mean([r.final.get(name) for r in cell.completed])


def model_flops_utilization(cell: Cell) -> float | None:
    """MFU as the trainer recorded it: useful (model) FLOPs per step over the median
    step time of the same timed steps, over the device peak (abl.train.loop.mfu).

    Useful FLOPs are the variant-aware prediction of model FLOPs, recomputation
    excluded (MFU as Chowdhery et al. 2022 define it, PaLM, arXiv:2204.02311,
    App. B), so a variant cannot show an MFU above 100%
    by being counted as dense attention. There is no fallback from a single
    step's tokens/s: one noisy step once gave a report an MFU of 105%.
    """
    return measured(cell, "mfu")


def cost_rows(cells: list[Cell]) -> list[dict[str, Any]]:
    """Predicted vs measured, one dict per cell and check (see costmodel.CHECKS); ``source`` says whether
    ``predicted`` came from the cost functions or from measuring the cell's shape (``cost_source``)."""
    rows = []
    for c in cells:
        for pred_key, meas_key, required in CHECKS:
            pred = c.predicted.get(pred_key) if c.predicted else None
            meas = measured(c, meas_key)
            ratio, verdict = agreement(pred, meas, required)
            if pred is None and c.not_loaded:
                verdict = f"not compared: {c.predict_error}"
            elif pred is None and c.predict_error:
                verdict = f"not predicted: {c.predict_error}"
            elif meas_key == "peak_tensor_bytes" and meas is not None and any(
                    r.env.get("kernels") == "triton" for r in c.completed):
                verdict = ("not compared: the run used the Triton kernels, which keep less for backward "
                           "than the torch reference path the prediction models")
            rows.append({"cell_key": c.key, "label": c.label, "figure": pred_key, "predicted": pred,
                         "source": cost_source(c), "measured": meas, "measured_as": meas_key, "ratio": ratio,
                         "agreement": verdict, "not_loaded": c.predict_error if c.not_loaded else ""})
    return rows


def is_compared(row: dict[str, Any]) -> bool:
    """Did this check compare a prediction with a measurement (it agrees or it disagrees)?"""
    return str(row["agreement"]).startswith(("agrees", "DISAGREES"))


def compared_note(rows: list[dict[str, Any]]) -> str:
    """How many cells the checks compared, and why the others were not: "k of n cells compared on every
    check; m not (or only in part) because <plugin> is not loaded: <how to load it>"; "" when every cell was.
    A summary that says every check agrees says this beside it, so a skipped cell is never silent."""
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_cell.setdefault(r["cell_key"], []).append(r)
    full = [k for k, rs in by_cell.items() if all(is_compared(r) for r in rs)]
    if len(full) == len(by_cell):
        return ""
    plugin: dict[str, list[str]] = {}  # why (a plugin not loaded) -> the cells
    other: dict[str, list[str]] = {}  # the other reasons: no measurement, no prediction, Triton kernels
    for key, rs in by_cell.items():
        if key in full:
            continue
        if rs[0].get("not_loaded"):
            plugin.setdefault(rs[0]["not_loaded"], []).append(rs[0]["label"])
            continue
        for r in rs:
            if not is_compared(r):
                head, _, detail = str(r["agreement"]).partition(": ")  # "not measured", "not compared: why"
                why = f"{head} ({detail.split(',')[0]})" if head == "not compared" and detail else head
                other.setdefault(f"{r['figure']} {why}", []).append(r["label"])
    parts = [f"{len(full)} of {len(by_cell)} cells compared on every check"]
    for why, labels in plugin.items():
        parts.append(f"{len(labels)} not (or only where the runs recorded a prediction) because {why} "
                     f"[{', '.join(labels)}]")
    for why, labels in other.items():
        parts.append(f"{len(set(labels))} with {why} [{', '.join(dict.fromkeys(labels))}]")
    return "; ".join(parts) + "."


def cost_summary(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(one summary per figure, the rows that disagree) from ``cost_rows``.

    A summary: ``figure``, ``cells``, ``compared`` (both sides known), ``agree``,
    ``disagree``, ``not_compared``, and ``worst_ratio`` (the measured / predicted
    farthest from 1, as a factor either way). The outliers are the rows whose
    agreement is a disagreement; every other row is counted, not listed."""
    by_figure: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_figure.setdefault(r["figure"], []).append(r)
    out = []
    for figure, rs in by_figure.items():
        ratios = [r["ratio"] for r in rs if r["ratio"] is not None and r["ratio"] > 0]
        worst = max(ratios, key=lambda x: max(x, 1 / x)) if ratios else None
        agree = sum(1 for r in rs if str(r["agreement"]).startswith("agrees"))
        disagree = sum(1 for r in rs if str(r["agreement"]).startswith("DISAGREES"))
        out.append({"figure": figure, "cells": len(rs), "compared": agree + disagree, "agree": agree,
                    "disagree": disagree, "not_compared": len(rs) - agree - disagree, "worst_ratio": worst,
                    "worst_cell": next((r["label"] for r in rs if r["ratio"] == worst), None)})
    outliers = [r for r in rows if str(r["agreement"]).startswith("DISAGREES")]
    return out, outliers


def contended_runs(runs: list[StoredRun]) -> list[StoredRun]:
    """The completed runs whose machine was contended during their loop (``abl.analysis.sections.is_contended``)."""
    return [r for r in runs if r.status == COMPLETED and sections.is_contended(r.final)]


def contention_note(runs: list[StoredRun]) -> str:
    """One sentence on the contended runs ("" when none is)."""
    bad = contended_runs(runs)
    if not bad:
        return ""
    done = [r for r in runs if r.status == COMPLETED]
    return (f"{len(bad)} of {len(done)} completed runs ran on a contended machine (marked {CONTENDED_MARK}): "
            "their tokens/s, wall time and MFU are not comparable with the other runs' (the loss at equal "
            "tokens is).")


CONTENDED_MARK = "‡"


def scaling_points(cells: list[Cell]) -> list[tuple[float, float, float]]:
    """(N non-embedding, D training tokens, final val_loss) for every completed run."""
    pts = []
    for c in cells:
        for r in c.completed:
            n = r.final.get("n_params_non_embedding") or (c.predicted or {}).get("n_params_non_embedding")
            loss = r.final.get("val_loss")
            d = r.final.get("tokens") or r.config["train"]["steps"] * r.tokens_per_step
            if n and loss is not None and math.isfinite(loss):
                pts.append((float(n), float(d), float(loss)))
    return pts

