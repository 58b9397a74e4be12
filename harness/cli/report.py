"""``abl report``: a self-contained report of a grid or an experiment."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..store.workspace import Workspace
from .common import fail, load_registry, plugins_dir_option, read_db_option, user_errors


@click.command("report")
@click.argument("source", metavar="GRID_FILE_OR_EXPERIMENT")
@read_db_option
@click.option("--out", "out_dir", default=None,
              help="Folder to write the report into (default: reports/<experiment>/ beside the database).")
@click.option("--format", "fmt", type=click.Choice(["md", "html"]), default="md", show_default=True,
              help="md: report.md with PNG plots beside it; html: one self-contained report.html.")
@click.option("--baseline", default=None,
              help="Baseline cell by label, cell key prefix or 1-based index (default: the grid's first cell).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Overrides used when the grid was run (so the same cells are found).")
@plugins_dir_option
def command(source, db_path, out_dir, fmt, baseline, overrides):
    """Write a self-contained report of a finished (or partly finished) grid.

    GRID_FILE_OR_EXPERIMENT is a grid file (its cells are looked up in the
    store) or an experiment name. The report holds the conditions, the grid,
    the comparison table with 95% CIs and verdicts against the baseline, loss
    curves, quality vs cost, predicted vs measured costs and, with at least 4
    model sizes spanning at least 4x in parameters, a scaling-law fit. A
    section that would mean nothing for these cells is left out, with one
    sentence saying why.
    """
    from ..present.report.runs import ReportError, experiments, load_runs
    from ..present.report.sections import build_report, write_report
    from ..run.guard import time_limit
    from ..store.database import verify_store

    registry = load_registry()
    errors = user_errors() + (ReportError,)
    out: Path | None = None
    try:
        from ..grid.gridfile import load_grid, names_grid_file

        if names_grid_file(source):
            from ..run.lr_sweep import compared_grid

            with time_limit("loading the grid (its components' parameters, checks and costs)"):
                grid = load_grid(source, registry, list(overrides))
            ws = Workspace.resolve(db_path, grid)
            db = ws.db
            out = _folder(out_dir, ws, grid.cells[0].experiment.name)  # refused before anything is read
            verify_store(db)  # a damaged store: one clear message before anything is read
            name, raw = grid.cells[0].experiment.name, grid.raw
            grid = compared_grid(grid, registry, db)  # an lr sweep's phase 2 as the store's tuning chose it
            run_ids = [c.run_id for c in grid.cells]
            runs = load_runs(db, run_ids=run_ids) if run_ids else []
            if not runs:
                hint = (f"; the store has runs of experiment {name!r} from other configs (the code or the "
                        f"grid changed since): abl report {name} reports those" if name in experiments(db)
                        else f": abl run {source} first")
                fail(f"no run of {source} as it resolves now is in {db}{hint}")
            order = list(dict.fromkeys(c.cell_key for c in grid.cells))
            baseline = baseline or grid.cells[0].experiment.baseline or None  # a display choice (abl.analysis.verdicts)
            missing = len(set(run_ids) - {r.run_id for r in runs})
        else:
            if source.endswith(".toml") or os.sep in source:
                fail(f"{source}: no such grid file")
            ws = Workspace.resolve(db_path)
            db = ws.db
            out = _folder(out_dir, ws, source)
            verify_store(db)
            runs = load_runs(db, experiment=source)
            if not runs:
                names = experiments(db)
                fail(f"no experiment {source!r} in {db}; experiments there: {', '.join(names) or 'none'}")
            from ..present.palette import grid_order

            # the grid positions the runs recorded give the order, as on the dashboard
            order, missing, name, raw = grid_order(runs), 0, source, None
        # the report runs the components' cost functions (a measured step for one without) in this process
        with time_limit("building the report (the components' cost functions, or a measured step without one)"):
            rep = build_report(runs, source=source, db_path=str(db), registry=registry, order=order,
                               baseline=baseline, grid_raw=raw, missing_runs=missing)
        path = write_report(rep, out, fmt)
    except errors as exc:
        fail(str(exc))
    except OSError as exc:  # a full disk, a folder that cannot be made
        fail(f"cannot write the report into {out}: {exc.strerror or exc}")
    click.echo(f"wrote {path}")


def _folder(out_dir: str | None, ws: Workspace, name: str) -> Path:
    """Where the report goes: ``--out`` as typed, else ``reports/<name>/`` beside the store, the name
    confined to that folder (abl.files.confined: no '..', no absolute name, no over-long name)."""
    from .. import files

    if out_dir:
        return files.confined(Path.cwd(), out_dir, "--out", user_path=True)
    return files.confined(ws.reports, name, "the experiment name")
