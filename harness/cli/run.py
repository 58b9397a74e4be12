"""``abl run``: expand a grid, check it, and train the cells not yet completed.

The use case in steps: load and check the grid (``_grids``), resolve the
workspace (abl.store.workspace), then either list what would run
(``_dry_run``) or check the store's folders, make the executor and run the
grid under the store's lock (``_run_locked``: the memory check, then
abl.run.runner.run_grid or abl.run.lr_sweep.run_sweep, which print the
summary as ``--wide`` / ``--format`` say).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import click

from ..run.guard import DEFAULT_PLUGIN_TIMEOUT_S
from ..store.workspace import DEFAULT_DB, Workspace
from .choices import ExecutorChoice
from .common import (
    exit_now,
    fail,
    load_registry,
    note_new_store,
    plugins_dir_option,
    remove_if_untouched,
    storage_fault,
    take_store_lock,
    user_errors,
)


def _set_warm_workers(value: str | None) -> None:
    """--warm-workers reaches the local executor as ABL_WARM_WORKERS (abl.run.warm.warm_mode)."""
    if value is not None:
        os.environ["ABL_WARM_WORKERS"] = value


def _set_plugin_timeout(ctx, param, value: float) -> float:
    """--plugin-timeout is read first (an eager option), so the plugins loaded while the other options are
    read (--executor's choices) load under it."""
    from ..run import guard

    guard.set_plugin_timeout(value)
    return value


@click.command("run")
@click.argument("grid_file", type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override any config key, e.g. --set model.d_model=64 (repeatable).")
@click.option("--dry-run", is_flag=True, help="Print the cells and exit without training.")
@click.option("--db", "db_path", default=None,
              help=f"DuckDB file to write (default: experiment.db of the grid, else {DEFAULT_DB}).")
@click.option("--runs-dir", default=None, help="Run folders (default: runs/ beside the database).")
@click.option("--retry", type=click.Choice(["failed"]), default=None,
              help="Also re-run cells that failed, diverged or ran out of memory.")
@click.option("--max-cells", default=10_000, show_default=True, type=click.IntRange(1),
              help="Refuse grids with more runs than this.")
@click.option("--executor", type=ExecutorChoice(), default="local", show_default=True,
              help="Where cells run: this machine, Slurm jobs (submitit), Ray tasks, or a plugin's executor "
                   "(abl plugins lists them).")
@click.option("--workers", default=None, type=click.IntRange(1, 256),
              help="local: cells at once (default: on CUDA as many as --cells-per-gpu allows on every GPU, "
                   "else 1).")
@click.option("--cells-per-gpu", default=None, type=click.IntRange(1, 64),
              help="local, CUDA: most cells on one GPU at once; a cell joins a GPU while the predicted peaks of "
                   "the cells on it, its own and 1 GiB kept free fit the GPU's free memory (default: as many of "
                   "the grid's largest cell as fit the GPU with the least free memory, at most 8; 1 when the "
                   "free memory is unknown).")
@click.option("--speed-pass", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True,
              help="local: after the grid, time each shape alone on its device (a few steps after warm-up) and "
                   "show its tokens/s and MFU as '(alone)' beside the packed figures: auto when cells shared a GPU "
                   "(their speed is marked contended), always, or never.")
@click.option("--warm-workers", type=click.Choice(["auto", "on", "off"]), default=None, expose_value=False,
              callback=lambda ctx, param, value: _set_warm_workers(value),
              help="local: one worker process per slot trains cell after cell (torch imported and, on CUDA, the "
                   "context made once; a cell that crashes, is stopped or runs out of memory ends its worker and "
                   "the next cell gets a fresh one), instead of a process per cell. auto (default): on where the "
                   "cells run on CUDA (unless ABL_ZYGOTE=0 asks for a process per cell), off on a CPU, where each cell "
                   "is forked from the pre-imported zygote.")
@click.option("--slurm-partition", default=None, help="slurm: partition.")
@click.option("--slurm-time", default=60, show_default=True, type=click.IntRange(1), help="slurm: minutes per cell.")
@click.option("--slurm-cluster", type=click.Choice(["slurm", "local"]), default="slurm", show_default=True,
              help="slurm: 'local' runs the submitit path on this machine without Slurm.")
@click.option("--gpus-per-cell", default=0, show_default=True, type=click.IntRange(0),
              help="slurm/ray: GPUs reserved per cell.")
@click.option("--ray-address", default=None, help="ray: address of an existing cluster (default: start a local one).")
@click.option("--detect", type=click.FloatRange(min=0, min_open=True), default=None, metavar="EFFECT",
              help="Also print how many seeds per cell the grid needs to detect this difference of the "
                   "first summary metric at the observed variance (with --dry-run: from the runs stored so far).")
@click.option("--wait", is_flag=True, help="If another abl run or ingest writes this database, queue behind it "
              "instead of stopping.")
@click.option("--force", is_flag=True, help="Run even if the cells' predicted memory does not fit the free memory.")
@click.option("--only", "only", multiple=True, metavar="AXIS=V1,V2",
              help="Run only the cells with these values of a grid axis, e.g. --only 'model.norm=rmsnorm,layernorm' "
                   "(repeatable, one per axis); run ids stay those of the full grid.")
@click.option("--cells", "cell_numbers", default=None, metavar="N,M-K",
              help="Run only these cells, by their number in --dry-run's listing, e.g. --cells 1,3 or 2-4.")
@click.option("--wide", is_flag=True, help="Print the summary as full-width tables (default: tables when they "
              "fit the terminal, else one block per cell).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv", "md"]), default="table",
              show_default=True, help="The summary at the end as JSON, CSV or Markdown on stdout (progress goes "
              "to stderr), for piping.")
@click.option("--plugin-timeout", default=DEFAULT_PLUGIN_TIMEOUT_S, show_default=True, metavar="SECONDS",
              type=click.FloatRange(min=0), is_eager=True, callback=_set_plugin_timeout,
              help="The longest abl run waits on plugin code it runs itself (loading the plugins and the grid, the "
                   "memory check, the cost estimate, an lr sweep's phase-2 grid, each --until-decided round's grid, "
                   "the executor's factory), per step; past it abl run stops (exit 2) naming the code. 0: no "
                   "limit. A cell's own limit is train.timeout_s.")
@click.option("--until-decided", is_flag=True,
              help="Add seeds only to the cells of comparisons still undecided (every pair of cells that differ "
                   "in one swept setting), one seed per round, until each is decided or --budget is reached; "
                   "a group-sequential test keeps the false-positive rate at 0.05 however often it looks.")
@click.option("--budget", default=10, show_default=True, type=click.IntRange(3, 1000), metavar="SEEDS",
              help="With --until-decided: the most seeds any cell gets.")
@plugins_dir_option
def command(grid_file, overrides, dry_run, db_path, runs_dir, retry, max_cells, executor, workers,
            slurm_partition, slurm_time, slurm_cluster, gpus_per_cell, ray_address, detect, wait, force,
            only, cell_numbers, wide, fmt, plugin_timeout, cells_per_gpu=None, speed_pass="auto",
            until_decided=False, budget=10):
    """Expand GRID_FILE into cells, validate them all, then train those not yet completed.

    Running the same command again resumes the grid: completed cells are
    skipped, killed or interrupted ones restart (from their checkpoint when
    train.checkpoint_every is set), failed and diverged ones re-run only with
    --retry failed.
    """
    import signal

    from ..run import guard

    previous = signal.getsignal(signal.SIGTERM)
    guard.stop_on_signals()  # SIGTERM at any point: the clean-up and exit 130 of a Ctrl-C, no lock left
    guard.set_plugin_timeout(plugin_timeout)
    try:
        _command(grid_file, overrides, dry_run, db_path, runs_dir, retry, max_cells, executor, workers,
                 slurm_partition, slurm_time, slurm_cluster, gpus_per_cell, ray_address, detect, wait, force,
                 only, cell_numbers, wide, fmt, cells_per_gpu=cells_per_gpu, speed_pass=speed_pass,
                 until_decided=until_decided, budget=budget)
    except KeyboardInterrupt:  # before the store's lock was taken (_run_locked handles it after)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        click.echo("stopped before any cell started", err=True)
        exit_now(130)
    except guard.PluginTimeout as exc:
        fail(str(exc))
    finally:  # a caller in the same process (a test's CliRunner) gets its own handling back
        if signal.getsignal(signal.SIGTERM) is guard.raise_stopped and previous is not None:
            signal.signal(signal.SIGTERM, previous)
        guard.set_plugin_timeout(guard.DEFAULT_PLUGIN_TIMEOUT_S)


def _command(grid_file, overrides, dry_run, db_path, runs_dir, retry, max_cells, executor, workers,
             slurm_partition, slurm_time, slurm_cluster, gpus_per_cell, ray_address, detect, wait, force,
             only, cell_numbers, wide, fmt, cells_per_gpu=None, speed_pass="auto", until_decided=False, budget=10):
    registry = load_registry()
    full, grid = _grids(grid_file, overrides, max_cells, only, cell_numbers, registry)
    ws = Workspace.resolve(db_path, grid, runs_dir)
    engine = _Engine(executor, workers, slurm_partition, slurm_time, slurm_cluster, gpus_per_cell, ray_address,
                     cells_per_gpu, speed_pass)
    if until_decided and (only or cell_numbers or full.cells[0].train.lr_sweep or dry_run):
        fail("--until-decided runs the whole grid and cannot be combined with --only, --cells, --dry-run or a "
             "grid with train.lr_sweep")
    if dry_run:
        _dry_run(full, grid, registry, ws, engine, detect)
        return
    from ..present.termlayout import Presentation
    from ..run import preflight

    for w in preflight.run_warnings(full):  # the seed warnings of an lr sweep are printed by the sweep itself
        click.echo(f"warning: {w}", err=True)
    problems = preflight.db_problems(ws.db) + preflight.runs_dir_problems(ws.runs)
    if problems:
        fail("\n".join(problems))
    presentation = Presentation(layout="wide" if wide else "auto", fmt=fmt)
    if until_decided:
        failures = _until_decided(grid_file, overrides, max_cells, registry, ws, engine, budget,
                                  retry_failed=retry == "failed", force=force, wait=wait, presentation=presentation)
    else:
        failures = _run_locked(grid, registry, ws, engine.make(ws), retry_failed=retry == "failed", force=force,
                               wait=wait, detect=detect, presentation=presentation)
    if failures:
        click.echo(f"{failures} run(s) did not complete; see the table above", err=True)
        sys.exit(1)


def _grids(grid_file, overrides, max_cells, only, cell_numbers, registry):
    """(the whole grid, the cells ``--only`` / ``--cells`` select), checked; or exit 2 with why not.
    The grid file's notes go to stderr."""
    from ..grid.gridfile import load_grid
    from ..grid.selection import select
    from ..run import preflight

    from ..run.guard import time_limit

    try:
        with time_limit("loading the grid (its components' parameters, checks and costs)"):
            full = load_grid(grid_file, registry, list(overrides), max_cells=max_cells)
            preflight.check(full, registry)  # the whole grid's checks (a sweep that collapses, ...), then the cells
        grid = select(full, only, cell_numbers)
    except user_errors() as exc:
        fail(str(exc))
    for note in full.notes:
        click.echo(f"note: {note}", err=True)
    return full, grid


@dataclass(frozen=True)
class _Engine:
    """Where the cells run (``--executor`` and its options)."""

    kind: str
    workers: int | None
    slurm_partition: str | None
    slurm_time: int
    slurm_cluster: str
    gpus_per_cell: int
    ray_address: str | None
    cells_per_gpu: int | None = None
    speed_pass: str = "auto"

    def make(self, ws: Workspace):
        """The executor, or exit 2 (a missing extra package, bad settings)."""
        from ..run import executors
        from ..run.guard import time_limit

        try:  # the executor registered as --executor (hook register_executors; the built-ins: abl.plugins.executors)
            with time_limit(f"making the executor {self.kind!r} (its plugin's factory)"):
                return executors.make_executor(self.kind, executors.ExecutorOptions(
                    workers=self.workers, runs_dir=ws.runs, slurm_partition=self.slurm_partition,
                    slurm_time=self.slurm_time, slurm_cluster=self.slurm_cluster, gpus_per_cell=self.gpus_per_cell,
                    ray_address=self.ray_address, cells_per_gpu=self.cells_per_gpu, speed_pass=self.speed_pass))
        except ImportError as exc:
            fail(f"--executor {self.kind} needs an extra package ({exc.name}): pip install 'abl[distributed]'")
        except user_errors() as exc:
            fail(str(exc))


def _dry_run(full, grid, registry, ws: Workspace, engine: _Engine, detect: float | None) -> None:
    """``--dry-run``: the warnings, what the seeds can decide, the cells (of an lr sweep, phase 1's), the
    compile payback notes and, with ``--detect``, the seeds needed from the runs stored so far."""
    from ..grid.design import design_lines
    from ..grid.selection import cell_numbers as numbers_of
    from ..run import preflight

    for w in preflight.warnings(full):  # the run itself prints them too (abl.run.lr_sweep)
        click.echo(f"warning: {w}")
    if len(full.cells) > LISTED_IN_FULL:  # the model fit of a huge design would take minutes
        click.echo(f"design: not worked out for a grid of {len(full.cells):,} runs (it is for grids of at most "
                   f"{LISTED_IN_FULL:,})")
    else:
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
        _print_cells(grid, numbers_of(full), whole=len(grid.cells) == len(full.cells))
    if engine.kind == "local" and any(c.train.compile for c in grid.cells):
        from ..run.guard import time_limit
        from ..run.payback import planned_payback_notes

        with time_limit("the compile payback notes (the components' cost functions)"):
            notes = planned_payback_notes(grid.cells, registry, ws.shapes, slots=engine.workers or 1)
        for note in notes:
            click.echo(f"note: {note}")
    if detect is not None:
        from ..present.summary import print_detect
        from ..run.lr_sweep import compared_grid

        detected = compared_grid(grid, registry, ws.db)  # an lr sweep's phase 2, as the store's tuning chose it
        if detected.cells:
            print_detect(detected, ws.db, detect)
        else:
            click.echo("--detect: no phase-2 run of this lr sweep is stored yet, so there is no variance to "
                       "size the seeds from")


def _until_decided(grid_file, overrides, max_cells, registry, ws: Workspace, engine: _Engine, budget: int, *,
                   retry_failed: bool, force: bool, wait: bool, presentation) -> int:
    """``--until-decided``: rounds of look, then train the next seed of the cells an undecided comparison
    needs (abl.run.until_decided); each round runs as ``abl run`` does, without the fixed-seed summary,
    whose p-values would not hold after looking this way. Returns the runs that did not complete."""
    from ..grid.gridfile import load_grid
    from ..run.until_decided import run_until_decided
    from ..store.reader import read_runs

    failures = 0

    def expand(seeds):
        extra = [] if seeds is None else [f"experiment.seeds={list(seeds)!r}"]
        return load_grid(grid_file, registry, [*overrides, *extra], max_cells=max_cells)

    def read(run_ids):
        return read_runs(ws.db, run_ids=run_ids) if ws.db.exists() else []

    def train(grid) -> None:
        nonlocal failures
        failures += _run_locked(grid, registry, ws, engine.make(ws), retry_failed=retry_failed, force=force,
                                wait=wait, detect=None, presentation=presentation, summary=False)

    try:
        run_until_decided(expand, read, train, budget=budget, say=lambda line: click.echo(line))
    except user_errors() as exc:
        fail(str(exc))
    click.echo(f"database: {ws.db}   run folders: {ws.runs}\nabl compare {grid_file} shows these runs' fixed-seed "
               "tables: with seeds added until decided, read their p-values as descriptive; the answers are the "
               "lines above")
    return failures


def _run_locked(grid, registry, ws: Workspace, engine, *, retry_failed: bool, force: bool, wait: bool,
                detect: float | None, presentation, summary: bool = True) -> int:
    """Take the store's lock, check that the grid fits in memory, run it (an lr sweep in its two phases)
    and return the runs that did not complete. Bad input leaves no trace (exit 2); a full disk exits 1;
    Ctrl-C stops the cells, stores them and exits 130."""
    console = None
    if presentation.fmt != "table":  # the summary alone on stdout: the progress and the other tables go to stderr
        from rich.console import Console

        console = Console(stderr=True)
    announced = note_new_store(ws.db)
    fresh = [p for p in (ws.db.parent, *ws.db.parent.parents) if not p.exists()]  # folders the lock will create
    from ..run.guard import PluginTimeout, at_hard_exit, time_limit

    lock = take_store_lock(ws.db, wait)  # held until this process exits, however it exits
    forget_lock = at_hard_exit(lock.release)  # a plugin stuck in native code: the watchdog's exit removes it
    if all(c.train.devices <= 1 for c in grid.cells):
        engine.prestart()  # the workers' zygote imports while the memory check and the token store run
    try:
        with time_limit("the memory check (it measures the forward of a component without a cost function)"):
            _admit(grid, registry, ws, engine, retry_failed=retry_failed, force=force)
        from ..run.lr_sweep import run_sweep
        from ..run.runner import run_grid

        run = run_sweep if grid.cells[0].train.lr_sweep else run_grid  # an lr sweep: its two phases
        if not summary:  # a round of --until-decided (never an lr sweep)
            return run_grid(grid, registry, ws.db, ws.runs, executor=engine, retry_failed=retry_failed,
                            console=console, presentation=presentation, summary=False)
        return run(grid, registry, ws.db, ws.runs, executor=engine, retry_failed=retry_failed, detect=detect,
                   console=console, presentation=presentation)
    except (*user_errors(), PluginTimeout) as exc:
        lock.release()
        remove_if_untouched(ws.db, lock.path, fresh)  # bad input leaves no trace: not even the lock's folder
        fail(str(exc) + (f"\nno store was created at {ws.db}" if announced and not ws.db.exists() else ""))
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
        forget_lock()
        lock.release()
        if hasattr(engine, "close"):
            engine.close()  # a zygote started early for cells that never ran
    return 0  # not reached: every handler above exits


def _admit(grid, registry, ws: Workspace, engine, *, retry_failed: bool, force: bool) -> None:
    """The memory check (abl.run.admission): a grid that does not fit stops here, unless ``--force``."""
    from ..run.admission import AdmissionError, check_run

    too_big = check_run(grid.cells, registry, ws.runs, engine, retry_failed=retry_failed)
    if too_big and not force:
        raise AdmissionError("the grid does not fit in memory:\n" + "\n".join(too_big))
    if too_big:
        click.echo("warning (--force): " + "\n".join(too_big), err=True)


LISTED_IN_FULL = 10_000  # a dry run of a larger grid lists its first and last runs (SHOWN_AT_EACH_END each)
SHOWN_AT_EACH_END = 10


def _print_cells(grid, numbers: dict[str, int] | None = None, whole: bool = False) -> None:
    """The runs of ``grid``; ``#`` is the cell's number in the full grid (``--cells`` takes it). A grid of
    more than LISTED_IN_FULL runs: its first and last runs, and how many are between."""
    from rich.console import Console
    from rich.table import Table

    from ..grid.labels import show
    from ..grid.selection import cell_numbers

    n_cells = len(numbers) if numbers and whole else None  # ``whole``: numbers holds exactly grid's cells
    numbers = numbers or cell_numbers(grid)
    n_cells = n_cells or len({c.cell_key for c in grid.cells})
    table = Table(title=f"{grid.path}: {len(grid.cells)} runs ({n_cells} cells; "
                        "# is the cell's number for --cells)", title_justify="left")
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("run_id", no_wrap=True, min_width=max(len(c.run_id) for c in grid.cells))
    for p in grid.grid_paths:
        table.add_column(p, overflow="fold")  # a narrow terminal folds the values, never cuts them
    table.add_column("seed", justify="right", no_wrap=True)
    shown = grid.cells
    if len(shown) > LISTED_IN_FULL:
        shown = [*shown[:SHOWN_AT_EACH_END], None, *shown[-SHOWN_AT_EACH_END:]]
    for c in shown:
        if c is None:
            table.add_row("...", f"{len(grid.cells) - 2 * SHOWN_AT_EACH_END:,} more runs", *["" for _ in grid.grid_paths],
                          "")
            continue
        table.add_row(str(numbers.get(c.cell_key, "-")), c.run_id, *[show(c.varied[p]) for p in grid.grid_paths],
                      str(c.seed))
    Console().print(table)
