"""The verdict tables of the terminal: the ``abl run`` summary and ``abl compare``.

Both read the store through abl.report.load_runs and compute with
abl.verdicts / abl.stats, like ``abl report`` and the dashboard. The metrics
shown are the grid's ``experiment.summary`` (loss metrics get a verdict
table each; the first one ranks the cells); the baseline is
``experiment.baseline`` or ``--baseline``, a display choice only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import click

from . import stats, verdicts
from .health import HEALTH_METRICS

# shown after the grid's own summary metrics when the runs have them: the cell's true rate
# (train_tokens_per_s: every token over the loop's wall time), the median step's rate, peak memory
ALWAYS = ("train_tokens_per_s", "tokens_per_s", "peak_mem_bytes")


def _final_names(metrics: Sequence[str]) -> tuple[str, ...]:
    from .report import FINAL_NAMES

    return tuple(dict.fromkeys([*FINAL_NAMES, *metrics, *HEALTH_METRICS]))


def load(db_path: Path, *, run_ids: list[str] | None = None, experiment: str | None = None,
         metrics: Sequence[str] = ("val_loss",)):
    from .report import load_runs

    return load_runs(db_path, run_ids=run_ids, experiment=experiment, curve_names=(),
                     final_names=_final_names(metrics))


def _means(runs, metric: str) -> dict[str, float | None]:  # cell key -> mean over completed seeds
    by: dict[str, list[float]] = {}
    for r in runs:
        if r.status == "completed" and r.final.get(metric) is not None:
            by.setdefault(r.cell_key, []).append(float(r.final[metric]))
    return {k: sum(v) / len(v) for k, v in by.items()}


def _lrs(runs) -> dict[str, float] | None:
    tuned = {r.cell_key: r.config["lr_tuned"]["chosen"] for r in runs if r.config.get("lr_tuned")}
    return tuned or None


def render(console, runs, *, metrics: Sequence[str], title: str, order: Sequence[str] | None = None,
           baseline: str | None = None, pairs: Sequence[str] = (), by: str | None = None,
           bootstrap: bool = False, correction: str = stats.HOLM) -> list[stats.Analysis]:
    """Print the cell table (ranked by the first metric) and one verdict table per loss metric."""
    first, rest = metrics[0], list(metrics[1:])
    cells, analysis, what = verdicts.analyse_runs(runs, metric=first, order=order, baseline=baseline,
                                                  pairs=pairs, by=by, bootstrap=bootstrap, correction=correction)
    shown = [m for m in [*rest, *ALWAYS] if any(m in r.final for r in runs)]
    extra = {m: _means(runs, m) for m in shown}
    console.print(verdicts.cells_table(cells, analysis, f"{title}: {first} by cell, best first", extra,
                                       _lrs(runs)))
    out = [analysis]
    for m in [first, *[m for m in rest if verdicts.metric_is_loss(m)]]:
        if m != first:
            _, analysis, what = verdicts.analyse_runs(runs, metric=m, order=order, baseline=baseline, pairs=pairs,
                                                      by=by, bootstrap=bootstrap, correction=correction)
            out.append(analysis)
        console.print(verdicts.comparisons_table(analysis, f"{title}: {m}, {what}"))
    return out


def print_run_summary(console, db_path: Path, grid, detect: float | None = None) -> None:
    """The end of ``abl run``: the grid's verdict tables (and with ``detect``, the seeds it would need)."""
    exp = grid.cells[0].experiment
    metrics = list(getattr(exp, "summary", None) or ["val_loss"])
    order = list(dict.fromkeys(c.cell_key for c in grid.cells))
    try:
        runs = load(db_path, run_ids=[c.run_id for c in grid.cells], metrics=metrics)
        if not runs:
            return
        if metrics == ["val_loss"]:  # the default: a grid that names its metrics gets them as named
            from .report import comparison_metric, group_cells

            if comparison_metric(group_cells(runs, order)) == "val_bpb":
                # the cells' data or tokenizers differ, so a token is not one unit: bits per byte rank them
                metrics = ["val_bpb", "val_loss"]
                console.print("val_bpb: validation loss in bits per byte of text (the cells' data or "
                              "tokenizers differ, so a token is not the same unit: bits per byte rank them)",
                              soft_wrap=True)
        render(console, runs, metrics=metrics, title=exp.name, order=order,
               baseline=getattr(exp, "baseline", "") or None)
        compiled: dict[str, list[float]] = {}  # train.compile cells: their compile time, apart from tokens/s
        for r in runs:
            if r.final.get("compile_s") is not None:
                compiled.setdefault(r.label, []).append(float(r.final["compile_s"]))
        for label, times in compiled.items():
            console.print(f"torch.compile time, {label}: {sum(times) / len(times):.1f} s per run "
                          "(before the first step; not in tokens/s)")
        if detect is not None:
            cells = verdicts.cell_inputs(runs, metrics[0], order)
            console.print(verdicts.seeds_for_effect(cells, detect, max(1, len(cells) - 1)), soft_wrap=True)
    except verdicts.VerdictError as exc:
        console.print(f"[yellow]statistics: {exc}[/]")
    except Exception as exc:  # noqa: BLE001 - statistics must never hide the results or lose the run
        console.print(f"[yellow]statistics unavailable: {type(exc).__name__}: {exc}[/]")


def print_detect(grid, db_path: Path, detect: float) -> None:
    """``abl run --dry-run --detect``: the seeds needed, from the grid's runs stored so far."""
    from rich.console import Console

    exp = grid.cells[0].experiment
    metrics = list(exp.summary or ["val_loss"])
    order = list(dict.fromkeys(c.cell_key for c in grid.cells))
    runs = load(db_path, run_ids=[c.run_id for c in grid.cells], metrics=metrics) if db_path.exists() else []
    cells = verdicts.cell_inputs(runs, metrics[0], order)
    Console().print(verdicts.seeds_for_effect(cells, detect, max(1, len(order) - 1)), soft_wrap=True)


def run_compare(source: str, *, db_path: str | None, default_db: str, registry, metrics: Sequence[str] = (),
                baseline: str | None = None, pairs: Sequence[str] = (), by: str | None = None,
                bootstrap: bool = False, correction: str = stats.HOLM, detect: float | None = None,
                as_json: bool = False, overrides: Sequence[str] = ()) -> None:
    """``abl compare``: raises a user error (ConfigError, ReportError, VerdictError, ...) for bad input."""
    from rich.console import Console

    from .config import load_grid, resolve_grid_path
    from .report import ReportError, experiments

    order, exp_baseline = None, None
    if Path(source).is_file() or (source.endswith(".toml") and resolve_grid_path(source).is_file()):
        grid = load_grid(source, registry(), list(overrides))
        exp = grid.cells[0].experiment
        db = Path(db_path or exp.db or default_db)
        metrics = list(metrics) or list(exp.summary)
        order = list(dict.fromkeys(c.cell_key for c in grid.cells))
        exp_baseline, name = exp.baseline or None, exp.name
        if grid.cells[0].train.lr_sweep:  # the phase-2 runs (abl.lr_sweep) are found by experiment
            runs = load(db, experiment=name, metrics=metrics)
        else:
            runs = load(db, run_ids=[c.run_id for c in grid.cells], metrics=metrics)
        if not runs:
            raise ReportError(f"no run of {source} as it resolves now is in {db}: abl run {source} first")
    else:
        if source.endswith(".toml"):
            raise ReportError(f"{source}: no such grid file")
        db = Path(db_path or default_db)
        metrics = list(metrics) or ["val_loss"]
        runs = load(db, experiment=source, metrics=metrics)
        name = source
        if not runs:
            raise ReportError(f"no runs of experiment {source!r} in {db}; experiments there: "
                              f"{', '.join(experiments(db)) or 'none'}")
    if as_json:
        out: list[dict[str, Any]] = []
        for m in metrics:
            _, an, what = verdicts.analyse_runs(runs, metric=m, order=order, baseline=baseline or exp_baseline,
                                                pairs=pairs, by=by, bootstrap=bootstrap, correction=correction)
            out.append({"metric": m, "comparisons_of": what, "method": an.method,
                        "cells": [{**r.__dict__, "health": r.health.__dict__} for r in an.cells],
                        "comparisons": [c.as_dict() for c in an.comparisons]})
        click.echo(json.dumps(out, indent=1, default=str))
        return
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 200))
    render(console, runs, metrics=metrics, title=name, order=order, baseline=baseline or exp_baseline,
           pairs=pairs, by=by, bootstrap=bootstrap, correction=correction)
    if detect is not None:
        cells = verdicts.cell_inputs(runs, metrics[0], order)
        console.print(verdicts.seeds_for_effect(cells, detect, max(1, len(cells) - 1)), soft_wrap=True)
