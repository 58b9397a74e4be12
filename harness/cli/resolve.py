"""Which stored runs a command that reads (``abl compare``, ``abl ladder``) stands for, nothing trained.

One rule for both: a grid file's cells as they resolve now (under train.lr_sweep its phase 2, as the
store's tuning chose it: abl.run.lr_sweep.compared_grid), else an experiment's runs. Bad input is a
user error (ConfigError, ReportError, StoreError, ...), never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..store.workspace import Workspace
from .common import load_registry


@dataclass
class Compared:
    """The runs a source stands for, their metrics and title, the cells' order, the grid's paths, its
    baseline and its ``[ladder]`` table (an experiment's runs have none of the last four)."""

    runs: list[Any]
    metrics: list[str]
    title: str
    order: list[str] | None = None
    paths: list[str] = field(default_factory=list)
    baseline: str | None = None
    ladder: dict[str, Any] = field(default_factory=dict)


def compared(source: str, db_path: str | None, overrides, metrics: list[str]) -> Compared:
    """The runs a grid file (its cells as they resolve now) or an experiment name stands for; ``metrics``
    default to the grid's experiment.summary, else val_loss.
    Raises a user error (ConfigError, ReportError, StoreError, ...) for bad input."""
    from ..grid.gridfile import load_grid, names_grid_file
    from ..present.report.runs import ReportError
    from ..store.database import verify_store
    from ..store.reader import experiments, read_runs

    if names_grid_file(source):
        from ..run.guard import time_limit

        registry = load_registry()
        with time_limit("loading the grid (its components' parameters, checks and costs)"):
            grid = load_grid(source, registry, list(overrides))
        exp = grid.cells[0].experiment
        ws = Workspace.resolve(db_path, grid)
        verify_store(ws.db)  # a damaged store: one clear message before anything is read
        metrics = metrics or list(exp.summary)
        from ..run.lr_sweep import compared_grid

        ladder = dict(grid.raw.get("ladder") or {})
        grid = compared_grid(grid, registry, ws.db)  # an lr sweep's phase 2, as the store's tuning chose it
        runs = read_runs(ws.db, run_ids=[c.run_id for c in grid.cells]) if grid.cells else []
        if not runs:
            raise ReportError(f"no run of {source} as it resolves now is in {ws.db}: abl run {source} first")
        # with train.lr under a sweep, the paths keep it: each variant's label says its lr
        return Compared(runs, metrics, exp.name, order=list(dict.fromkeys(c.cell_key for c in grid.cells)),
                        paths=list(grid.grid_paths), baseline=exp.baseline or None, ladder=ladder)
    if source.endswith(".toml"):
        raise ReportError(f"{source}: no such grid file")
    ws = Workspace.resolve(db_path)
    verify_store(ws.db)  # a damaged store: one clear message before any read
    runs = read_runs(ws.db, experiment=source)
    if not runs:
        raise ReportError(f"no runs of experiment {source!r} in {ws.db}; experiments there: "
                          f"{', '.join(experiments(ws.db)) or 'none'}")
    return Compared(runs, metrics or ["val_loss"], source)
