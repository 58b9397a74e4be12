"""``abl run``: expand a grid, check it, and train the cells not yet completed (options: abl.cli)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .common import (
    DEFAULT_DB,
    exit_now,
    fail,
    load_registry,
    note_new_store,
    remove_if_untouched,
    storage_fault,
    take_store_lock,
    user_errors,
)


def run(grid_file, overrides, dry_run, db_path, runs_dir, retry, max_cells, executor, workers,
        slurm_partition, slurm_time, slurm_cluster, gpus_per_cell, ray_address, detect, wait, force,
        only, cell_numbers, wide, fmt):
    """The body of ``abl run``: its options and help are declared in abl.cli."""
    from ..grid.gridfile import load_grid
    from ..grid.selection import cell_numbers as numbers_of
    from ..grid.selection import select
    from ..present import termlayout
    from ..run import preflight

    registry = load_registry()
    try:
        full = load_grid(grid_file, registry, list(overrides), max_cells=max_cells)
        preflight.check(full, registry)  # the whole grid's checks (a sweep that collapses, ...), then the cells
        grid = select(full, only, cell_numbers)
    except user_errors() as exc:
        fail(str(exc))
    for note in full.notes:
        click.echo(f"note: {note}", err=True)
    termlayout.PRESENTATION = termlayout.Presentation(layout="wide" if wide else "auto", fmt=fmt)
    if not dry_run:  # the seed warnings of an lr sweep are printed by the sweep itself
        for w in preflight.run_warnings(full):
            click.echo(f"warning: {w}", err=True)
    if dry_run:
        for w in preflight.warnings(full):  # the run itself prints them too (abl.run.lr_sweep)
            click.echo(f"warning: {w}")
        from ..grid.design import design_lines

        for line in design_lines(full):  # what the seeds can decide, before any run
            click.echo(line)
        if grid.cells[0].train.lr_sweep:  # abl.run.lr_sweep: phase 2's cells depend on phase 1's results
            from ..grid.design import compared_seeds
            from ..run.lr_sweep import tuning_grid, tuning_seeds

            tuned = tuning_seeds(grid)
            on = f"seed {tuned[0]}" if len(tuned) == 1 else f"seeds {tuned} (the lowest mean val_loss wins)"
            click.echo(f"lr sweep: phase 1 (below) trains every cell at each lr of train.lr_sweep on {on}; phase 2 "
                       f"then trains each variant at its own best lr on seeds {compared_seeds(grid)}")
            _print_cells(tuning_grid(grid, registry))
        else:
            _print_cells(grid, numbers_of(full))
        if executor == "local" and any(c.train.compile for c in grid.cells):
            from ..run.compiled import planned_payback_notes
            from ..store.rundir import SHAPES_DIR

            db = Path(db_path or grid.cells[0].experiment.db or DEFAULT_DB)
            for note in planned_payback_notes(grid.cells, registry, db.parent / SHAPES_DIR, slots=workers or 1):
                click.echo(f"note: {note}")
        if detect is not None:
            from ..present.summary import print_detect
            from ..run.lr_sweep import compared_grid

            db = Path(db_path or grid.cells[0].experiment.db or DEFAULT_DB)
            detected = compared_grid(grid, registry, db)  # an lr sweep's phase 2, as the store's tuning chose it
            if detected.cells:
                print_detect(detected, db, detect)
            else:
                click.echo("--detect: no phase-2 run of this lr sweep is stored yet, so there is no variance to "
                           "size the seeds from")
        return
    from ..run.runner import run_grid

    db = Path(db_path or grid.cells[0].experiment.db or DEFAULT_DB)
    runs = Path(runs_dir) if runs_dir else db.parent / "runs"
    problems = preflight.db_problems(db) + preflight.runs_dir_problems(runs)
    if problems:
        fail("\n".join(problems))
    console = None
    if fmt != "table":  # the summary alone on stdout: the progress and the other tables go to stderr
        from rich.console import Console

        console = Console(stderr=True)
    try:
        engine = _make_executor(executor, workers, runs, slurm_partition, slurm_time, slurm_cluster,
                                gpus_per_cell, ray_address)
    except ImportError as exc:
        fail(f"--executor {executor} needs an extra package ({exc.name}): pip install 'abl[distributed]'")
    except user_errors() as exc:
        fail(str(exc))
    announced = note_new_store(db)
    fresh = [p for p in (db.parent, *db.parent.parents) if not p.exists()]  # folders the lock will create
    lock = take_store_lock(db, wait)  # held until this process exits, however it exits
    if all(c.train.devices <= 1 for c in grid.cells):
        engine.prestart()  # the workers' zygote imports while the memory check and the token store run
    try:
        from ..run.admission import AdmissionError, check_run

        too_big = check_run(grid.cells, registry, runs, engine, retry_failed=retry == "failed")
        if too_big and not force:
            raise AdmissionError("the grid does not fit in memory:\n" + "\n".join(too_big))
        if too_big:
            click.echo("warning (--force): " + "\n".join(too_big), err=True)
        if grid.cells[0].train.lr_sweep:
            from ..run.lr_sweep import run_sweep

            failures = run_sweep(grid, registry, db, runs, executor=engine, retry_failed=retry == "failed",
                                 detect=detect, console=console)
        else:
            failures = run_grid(grid, registry, db, runs, executor=engine, retry_failed=retry == "failed",
                                detect=detect, console=console)
    except user_errors() as exc:
        lock.release()
        remove_if_untouched(db, lock.path, fresh)  # bad input leaves no trace: not even the lock's folder
        fail(str(exc) + (f"\nno store was created at {db}" if announced and not db.exists() else ""))
    except OSError as exc:  # a full disk mid-run: finished cells are stored, the rest resume
        lock.release()
        storage_fault(exc, "free some space and run the same command to resume")
    except KeyboardInterrupt:
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the cells are stopped and stored: a second Ctrl-C
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # must not turn the exit into a traceback or a -2
        click.echo("stopped; finished cells are stored, run the same command to resume", err=True)
        lock.release()
        exit_now(130)
    finally:
        lock.release()
        engine.close()  # a zygote started early for cells that never ran
    if failures:
        click.echo(f"{failures} run(s) did not complete; see the table above", err=True)
        sys.exit(1)


def _make_executor(kind, workers, runs_dir, partition, time_min, cluster, gpus, ray_address):
    """The executor registered as ``kind`` (hook register_executors; the built-ins in abl.plugins.executors)."""
    from ..run import executors

    return executors.make_executor(kind, executors.ExecutorOptions(
        workers=workers, runs_dir=runs_dir, slurm_partition=partition, slurm_time=time_min, slurm_cluster=cluster,
        gpus_per_cell=gpus, ray_address=ray_address))


def _print_cells(grid, numbers: dict[str, int] | None = None) -> None:
    """The runs of ``grid``; ``#`` is the cell's number in the full grid (``--cells`` takes it)."""
    from rich.console import Console
    from rich.table import Table

    from ..grid.labels import show
    from ..grid.selection import cell_numbers

    numbers = numbers or cell_numbers(grid)
    table = Table(title=f"{grid.path}: {len(grid.cells)} runs ({len({c.cell_key for c in grid.cells})} cells; "
                        "# is the cell's number for --cells)", title_justify="left")
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("run_id", no_wrap=True, min_width=max(len(c.run_id) for c in grid.cells))
    for p in grid.grid_paths:
        table.add_column(p, overflow="fold")  # a narrow terminal folds the values, never cuts them
    table.add_column("seed", justify="right", no_wrap=True)
    for c in grid.cells:
        table.add_row(str(numbers.get(c.cell_key, "-")), c.run_id, *[show(c.varied[p]) for p in grid.grid_paths],
                      str(c.seed))
    Console().print(table)
