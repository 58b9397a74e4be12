"""``abl report``: a self-contained report of a grid or an experiment (options: abl.cli)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from .common import DEFAULT_DB, fail, load_registry, user_errors


def report(source, db_path, out_dir, fmt, baseline, overrides):
    """The body of ``abl report``: its options and help are declared in abl.cli."""
    from ..present.report import ReportError, build_report, experiments, load_runs, write_report
    from ..store.database import verify_store

    registry = load_registry()
    errors = user_errors() + (ReportError,)
    out: Path | None = None
    try:
        from ..grid.gridfile import load_grid, names_grid_file

        if names_grid_file(source):
            from ..run.lr_sweep import compared_grid

            grid = load_grid(source, registry, list(overrides))
            db = Path(db_path or getattr(grid.cells[0].experiment, "db", "") or DEFAULT_DB)
            out = _folder(out_dir, db, grid.cells[0].experiment.name)  # refused before anything is read
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
            db = Path(db_path or DEFAULT_DB)
            out = _folder(out_dir, db, source)
            verify_store(db)
            runs = load_runs(db, experiment=source)
            if not runs:
                names = experiments(db)
                fail(f"no experiment {source!r} in {db}; experiments there: {', '.join(names) or 'none'}")
            from ..present.palette import grid_order

            # the grid positions the runs recorded give the order, as on the dashboard
            order, missing, name, raw = grid_order(runs), 0, source, None
        rep = build_report(runs, source=source, db_path=str(db), registry=registry, order=order,
                           baseline=baseline, grid_raw=raw, missing_runs=missing)
        path = write_report(rep, out, fmt)
    except errors as exc:
        fail(str(exc))
    except OSError as exc:  # a full disk, a folder that cannot be made
        fail(f"cannot write the report into {out}: {exc.strerror or exc}")
    click.echo(f"wrote {path}")


def _folder(out_dir: str | None, db: Path, name: str) -> Path:
    """Where the report goes: ``--out`` as typed, else ``reports/<name>/`` beside the store, the name
    confined to that folder (abl.files.confined: no '..', no absolute name, no over-long name)."""
    from .. import files

    if out_dir:
        return files.confined(Path.cwd(), out_dir, "--out", user_path=True)
    return files.confined(db.parent / "reports", name, "the experiment name")
