"""``abl compare``: compare the stored runs of an experiment or grid, nothing trained.

The use case: resolve the workspace, read the runs (abl.store.reader: a grid
file's cells, of an lr sweep its phase 2 as the store's tuning chose it; or an
experiment's runs), build the view (abl.present.summary.build, on
abl.analysis.verdicts) and print it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import click

from ..store.workspace import Workspace
from .common import fail, load_registry, plugins_dir_option, read_db_option, user_errors


@click.command("compare")
@click.argument("source", metavar="EXPERIMENT_OR_GRID")
@read_db_option
@click.option("--metric", "metrics", multiple=True,
              help="Metric(s) to compare (repeatable; default: the grid's experiment.summary, else val_loss).")
@click.option("--baseline", default=None, help="Compare every cell with this one (label, 1-based index or "
                                              "cell-key prefix; default: experiment.baseline or the first cell).")
@click.option("--pairs", "pairs", multiple=True, metavar="A,B",
              help="Compare these two cells, first minus second (repeatable), e.g. --pairs 3,4.")
@click.option("--by", "by", default=None, metavar="PATH",
              help="This axis's main effect (pooled over the other axes, paired by seed), then every pair "
                   "of cells that differ in this setting only, e.g. --by model.ffn.")
@click.option("--bootstrap", is_flag=True, help="Percentile-bootstrap CIs and p-values (non-normal cells).")
@click.option("--correction", type=click.Choice(["holm", "none"]), default="holm", show_default=True,
              help="Multiple-comparison correction over the comparisons shown.")
@click.option("--detect", type=click.FloatRange(min=0, min_open=True), default=None, metavar="EFFECT",
              help="Also print how many seeds per cell would detect this difference at the observed variance.")
@click.option("--json", "as_json", is_flag=True, help="Print the analysis as JSON (the same as --format json).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv", "md"]), default="table",
              show_default=True, help="JSON (every metric's analysis), CSV (one row per cell) or Markdown tables.")
@click.option("--wide", is_flag=True, help="Full-width tables (default: tables when they fit the terminal, else "
              "one block per cell).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Overrides used when the grid was run (so the same cells are found).")
@plugins_dir_option
def command(source, db_path, metrics, baseline, pairs, by, bootstrap, correction, detect, as_json, fmt, wide,
            overrides):
    """Compare the stored runs of an experiment (or grid file) any way you like; nothing is trained.

    Same tests and words as the run summary, the report and the dashboard:
    first each swept axis's main effect (OLS with the other axes and the seed
    as blocks, Holm over the level pairs); then the cells, ranked as tie
    groups, and the comparisons: paired by seed when the cells share seeds and
    data order, else Welch; Holm over the comparisons shown, intervals
    adjusted alike; fewer than 3 seeds: too few to decide (no detectable
    difference); cells that did not learn are not ranked.
    """
    from ..analysis.verdicts import VerdictError
    from ..present.report.runs import ReportError
    from ..present.termlayout import Presentation

    if as_json and fmt not in ("table", "json"):
        fail(f"give --json or --format {fmt}, not both (--json is --format json)")
    presentation = Presentation(layout="wide" if wide else "auto", fmt="json" if as_json else fmt)
    try:
        chosen = _compared(source, db_path, overrides, list(metrics))
        _show(chosen, baseline=baseline, pairs=pairs, by=by, bootstrap=bootstrap, correction=correction,
              detect=detect, presentation=presentation)
    except user_errors() + (ReportError, VerdictError) as exc:
        fail(str(exc))


@dataclass
class _Compared:
    """What ``abl compare`` compares: the runs, their metrics and title, the cells' order, the grid's paths
    and its baseline (an experiment's runs have none of the last three)."""

    runs: list[Any]
    metrics: list[str]
    title: str
    order: list[str] | None = None
    paths: list[str] = field(default_factory=list)
    baseline: str | None = None


def _compared(source: str, db_path: str | None, overrides, metrics: list[str]) -> _Compared:
    """The runs a grid file (its cells as they resolve now) or an experiment name stands for.
    Raises a user error (ConfigError, ReportError, StoreError, ...) for bad input."""
    from ..grid.gridfile import load_grid, names_grid_file
    from ..present.report.runs import ReportError
    from ..store.database import verify_store
    from ..store.reader import experiments, read_runs

    if names_grid_file(source):
        registry = load_registry()
        grid = load_grid(source, registry, list(overrides))
        exp = grid.cells[0].experiment
        ws = Workspace.resolve(db_path, grid)
        verify_store(ws.db)  # a damaged store: one clear message before anything is read
        metrics = metrics or list(exp.summary)
        from ..run.lr_sweep import compared_grid

        grid = compared_grid(grid, registry, ws.db)  # an lr sweep's phase 2, as the store's tuning chose it
        runs = read_runs(ws.db, run_ids=[c.run_id for c in grid.cells]) if grid.cells else []
        if not runs:
            raise ReportError(f"no run of {source} as it resolves now is in {ws.db}: abl run {source} first")
        # with train.lr under a sweep, the paths keep it: each variant's label says its lr
        return _Compared(runs, metrics, exp.name, order=list(dict.fromkeys(c.cell_key for c in grid.cells)),
                         paths=list(grid.grid_paths), baseline=exp.baseline or None)
    if source.endswith(".toml"):
        raise ReportError(f"{source}: no such grid file")
    ws = Workspace.resolve(db_path)
    verify_store(ws.db)  # a damaged store: one clear message before any read
    runs = read_runs(ws.db, experiment=source)
    if not runs:
        raise ReportError(f"no runs of experiment {source!r} in {ws.db}; experiments there: "
                          f"{', '.join(experiments(ws.db)) or 'none'}")
    return _Compared(runs, metrics or ["val_loss"], source)


def _show(chosen: _Compared, *, baseline, pairs, by, bootstrap, correction, detect, presentation) -> None:
    """The view of ``chosen`` (abl.present.summary.build), printed as ``presentation`` says; with
    ``detect``, the seeds per cell that would detect that effect."""
    from ..analysis import verdicts
    from ..present import termlayout
    from ..present.summary import build, show

    console = termlayout.output_console()
    view = build(chosen.runs, metrics=chosen.metrics, title=chosen.title, order=chosen.order, paths=chosen.paths,
                 baseline=baseline or chosen.baseline, pairs=pairs, by=by, bootstrap=bootstrap,
                 correction=correction, every_metric=presentation.fmt == "json")
    show(console, view, presentation)
    if detect is not None:
        cells = verdicts.cell_inputs(chosen.runs, chosen.metrics[0], chosen.order)
        msg = verdicts.seeds_for_effect(cells, detect, max(1, len(cells) - 1))
        if presentation.fmt == "table":
            termlayout.print_wrapped(console, msg)
        else:
            click.echo(msg, err=True)
