"""The ``abl`` command line. Imports stay lazy so ``abl --help`` does not load torch."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

DEFAULT_DB = "results/abl.duckdb"


def fail(message: str) -> None:
    """A user error: a clear message, exit status 2, no traceback."""
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def _user_errors():
    from .contracts.config import ConfigError
    from .contracts.plugin_manager import PluginLoadError
    from .contracts.registry import RegistryError
    from .data.corpus import DataError
    from .run.admission import AdmissionError
    from .store.database import StoreError
    from .store.lock import StoreBusy

    return (ConfigError, RegistryError, PluginLoadError, DataError, StoreError, StoreBusy, AdmissionError)


def _store_lock(db: Path, wait: bool):
    """Take the store's single-writer lock (harness/lock.py), or exit 2 naming its holder."""
    from .store.lock import StoreBusy, StoreLock

    try:
        return StoreLock(db).acquire(wait=wait, on_wait=lambda msg: click.echo(msg, err=True))
    except StoreBusy as exc:
        fail(str(exc))


def _untouched(db: Path, lock_file: Path, fresh: list[Path]) -> None:
    """After bad input refused before anything was stored: remove the lock file (when the store
    does not exist) and the folders created for it (only while they are empty)."""
    if db.exists():
        return
    lock_file.unlink(missing_ok=True)
    for folder in fresh:  # innermost first
        try:
            folder.rmdir()
        except OSError:
            return


def _registry():
    from .contracts.plugin_manager import get_registry

    try:
        return get_registry()
    except _user_errors() as exc:
        fail(str(exc))


class AblGroup(click.Group):
    """Built-in commands are listed eagerly; plugin commands load on first use."""

    _plugins_loaded = False

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        if cmd is None and not AblGroup._plugins_loaded:
            AblGroup._plugins_loaded = True
            from .contracts.plugin_manager import load_plugins

            try:
                load_plugins().hook.register_commands(cli=self)
            except _user_errors() as exc:
                fail(str(exc))
            cmd = super().get_command(ctx, name)
        return cmd


@click.group(cls=AblGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="abl")
@click.option("--plugins-dir", type=click.Path(file_okay=False), multiple=True,
              help="Also load every *.py file in this folder as a plugin (repeatable).")
def cli(plugins_dir):
    """abl: ablations of decoder-only LM architectures, on your data and hardware.

    Run a grid of small training runs (abl run GRID.toml), list the variants
    (abl plugins), and compare results (abl dashboard).
    """
    if plugins_dir:
        existing = [p for p in os.environ.get("ABL_PLUGINS_DIR", "").split(os.pathsep) if p]
        os.environ["ABL_PLUGINS_DIR"] = os.pathsep.join(
            existing + [str(Path(d).resolve()) for d in plugins_dir])


@cli.command()
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
@click.option("--executor", type=click.Choice(["local", "slurm", "ray"]), default="local", show_default=True,
              help="Where cells run: this machine, Slurm jobs (submitit) or Ray tasks.")
@click.option("--workers", default=None, type=click.IntRange(1, 256),
              help="local: cells at once (default: one per GPU, else 1).")
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
def run(grid_file, overrides, dry_run, db_path, runs_dir, retry, max_cells, executor, workers,
        slurm_partition, slurm_time, slurm_cluster, gpus_per_cell, ray_address, detect, wait, force,
        only, cell_numbers, wide, fmt):
    """Expand GRID_FILE into cells, validate them all, then train those not yet completed.

    Running the same command again resumes the grid: completed cells are
    skipped, killed or interrupted ones restart (from their checkpoint when
    train.checkpoint_every is set), failed and diverged ones re-run only with
    --retry failed.
    """
    from .grid.gridfile import load_grid
    from .grid.selection import cell_numbers as numbers_of
    from .grid.selection import select
    from .present import termlayout
    from .run import preflight

    registry = _registry()
    try:
        full = load_grid(grid_file, registry, list(overrides), max_cells=max_cells)
        preflight.check(full, registry)  # the whole grid's checks (a sweep that collapses, ...), then the cells
        grid = select(full, only, cell_numbers)
    except _user_errors() as exc:
        fail(str(exc))
    termlayout.PRESENTATION = termlayout.Presentation(layout="wide" if wide else "auto", fmt=fmt)
    if dry_run:
        if grid.cells[0].train.lr_sweep:  # abl.run.lr_sweep: phase 2's cells depend on phase 1's results
            from .run.lr_sweep import tuning_grid

            seeds = grid.cells[0].experiment.seeds
            click.echo(f"lr sweep: phase 1 (below) trains every cell at each lr of train.lr_sweep on seed "
                       f"{seeds[0]}; phase 2 then trains each variant at its own best lr on seeds {seeds[1:]}")
            _print_cells(tuning_grid(grid, registry))
        else:
            _print_cells(grid, numbers_of(full))
        if detect is not None:
            from .present.summary import print_detect

            print_detect(grid, Path(db_path or grid.cells[0].experiment.db or DEFAULT_DB), detect)
        return
    from .run.runner import run_grid

    db = Path(db_path or grid.cells[0].experiment.db or DEFAULT_DB)
    runs = Path(runs_dir) if runs_dir else db.parent / "runs"
    problems = preflight.db_problems(db)
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
        fail(f"--executor {executor} needs an extra package ({exc.name}): pip install -e '.[distributed]'")
    except _user_errors() as exc:
        fail(str(exc))
    fresh = [p for p in (db.parent, *db.parent.parents) if not p.exists()]  # folders the lock will create
    lock = _store_lock(db, wait)  # held until this process exits, however it exits
    try:
        from .run.admission import check_run

        too_big = check_run(grid.cells, registry, runs, engine, retry_failed=retry == "failed")
        if too_big and not force:
            fail("the grid does not fit in memory:\n" + "\n".join(too_big))
        if too_big:
            click.echo("warning (--force): " + "\n".join(too_big), err=True)
        if grid.cells[0].train.lr_sweep:
            from .run.lr_sweep import run_sweep

            failures = run_sweep(grid, registry, db, runs, executor=engine, retry_failed=retry == "failed",
                                 detect=detect, console=console)
        else:
            failures = run_grid(grid, registry, db, runs, executor=engine, retry_failed=retry == "failed",
                                detect=detect, console=console)
    except _user_errors() as exc:
        lock.release()
        _untouched(db, lock.path, fresh)  # bad input leaves no trace: not even the lock's folder
        fail(str(exc))
    except KeyboardInterrupt:
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the cells are stopped and stored: a second Ctrl-C
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # must not turn the exit into a traceback or a -2
        click.echo("stopped; finished cells are stored, run the same command to resume", err=True)
        sys.exit(130)
    finally:
        lock.release()
    if failures:
        click.echo(f"{failures} run(s) did not complete; see the table above", err=True)
        sys.exit(1)


def _make_executor(kind, workers, runs_dir, partition, time_min, cluster, gpus, ray_address):
    from .run import executors

    if kind == "slurm":
        return executors.SlurmExecutor(runs_dir / "_slurm", partition=partition, time_min=time_min,
                                       gpus_per_cell=gpus, cluster=cluster)
    if kind == "ray":
        return executors.RayExecutor(address=ray_address, gpus_per_cell=gpus)
    return executors.LocalExecutor(workers=workers)


def _print_cells(grid, numbers: dict[str, int] | None = None) -> None:
    """The runs of ``grid``; ``#`` is the cell's number in the full grid (``--cells`` takes it)."""
    from rich.console import Console
    from rich.table import Table

    from .grid.labels import show
    from .grid.selection import cell_numbers

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


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of the listing.")
def plugins(as_json):
    """List every registered component by axis: where it came from, what it is, its parameters.

    Each component gets a line with its name and origin (built-in, the
    installed package of an entry point, or the file a --plugins-dir folder
    held), the first sentence of its docstring, and one line per parameter
    with its type and default; long lines wrap, nothing is cut.
    """
    import json
    import shutil
    import textwrap

    from .contracts.registry import AXES, show_default

    registry = _registry()
    comps = registry.all()
    if as_json:
        click.echo(json.dumps([{**c.summary(), "origin": _origin(c.package, c.version, c.plugin)}
                               for c in comps], indent=2))
        return
    width = max(40, shutil.get_terminal_size((100, 24)).columns - 1)

    def wrap(text: str, indent: int, hang: int = 0) -> list[str]:
        return textwrap.wrap(text, width, initial_indent=" " * indent, subsequent_indent=" " * (indent + hang),
                             break_long_words=True, break_on_hyphens=False) or [" " * indent]

    lines: list[str] = []
    for axis in AXES:
        lines += ["", *wrap(f"{axis}  (selected by {AXES[axis][0]})", 0, 4)]
        for c in (c for c in comps if c.axis == axis):
            lines += wrap(f"{c.name}  {_origin(c.package, c.version, c.plugin)}", 2, 4)
            lines += wrap(c.doc or "(no description: its factory and module have no docstring)", 6)
            for key, prm in c.params.items():
                t = prm.resolved_type().__name__
                shown = show_default(prm.default)
                text = f"{key}: {t} {'≈ ' + shown[1:] if shown.startswith('≈') else '= ' + shown}"
                if prm.choices:
                    text += f", one of {', '.join(map(str, prm.choices))}"
                if prm.doc:
                    text += f" - {prm.doc}"
                lines += wrap(text, 8, 4)
    click.echo("\n".join(lines).lstrip("\n"))


def _origin(package: str, version: str, plugin: str) -> str:
    """Where a component came from, for a reader: built-in, a package's entry point, a plugin file."""
    from .contracts.plugin_manager import SELF_DIST

    if package == SELF_DIST:
        return f"built-in ({package} {version})"
    if package.startswith("file "):
        return f"{package[len('file '):]} from --plugins-dir"
    if ":" in plugin:  # an entry point: its distribution and the entry point's name
        return f"{package} {version} (entry point {plugin.split(':', 1)[1]})"
    return package if version in ("-", "?") else f"{package} {version}"


@cli.command()
@click.argument("run_dirs", nargs=-1, type=click.Path(exists=True, file_okay=False))
@click.option("--db", "db_path", default=DEFAULT_DB, show_default=True)
@click.option("--runs-dir", default=None, help="Ingest every run folder in here (default: runs/ beside the database).")
@click.option("--wait", is_flag=True, help="If another abl run or ingest writes this database, queue behind it.")
def ingest(run_dirs, db_path, runs_dir, wait):
    """Copy run folders into the database (rebuilds it from the folders if needed).

    A run whose worker completed but whose folder is not whole (a cut or
    garbled metrics.jsonl, a missing last step) is stored as incomplete, with
    what is missing; ingesting it again after a repair restores it.
    """
    from .run import preflight
    from .store import database as store

    db = Path(db_path)
    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        base = Path(runs_dir) if runs_dir else db.parent / "runs"
        dirs = sorted(p for p in base.glob("*") if (p / "config.json").exists())
    problems = preflight.db_problems(db)
    if problems:
        fail("\n".join(problems))
    lock = _store_lock(db, wait)
    try:
        result = store.ingest_dirs(db, dirs)
    except _user_errors() as exc:
        fail(str(exc))
    finally:
        lock.release()
    counts: dict[str, int] = {}
    for state in result.values():
        counts[state] = counts.get(state, 0) + 1
    by_status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    click.echo(f"ingested {len(result)} run folder(s) into {db}" + (f" ({by_status})" if by_status else ""))
    from .store import rundir

    damaged = [d for d in dirs if result.get(d.name) == rundir.INCOMPLETE]
    for d in damaged:
        steps = (rundir.read_json(d / rundir.CONFIG, {}).get("train") or {}).get("steps", 0)
        why = "; ".join(rundir.check_complete(rundir.scan_metrics(d / rundir.METRICS), steps))
        click.echo(f"incomplete: {d}: {why}", err=True)
    if damaged:
        sys.exit(1)


@cli.command()
@click.option("--db", "db_path", default=DEFAULT_DB, show_default=True, help="DuckDB file to read.")
@click.option("--runs-dir", default=None,
              help="Run folders, read for the live metrics of running cells (default: runs/ beside the database).")
@click.option("--port", default=8501, show_default=True, type=click.IntRange(1, 65535))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; the default serves this machine only.")
@click.option("--snapshot", "snapshot_dir", default=None, type=click.Path(file_okay=False),
              help="Instead of serving: save a full-page PNG of every page into this folder and exit "
                   "(headless Chromium; a plain `chromium --screenshot` captures the page before it has drawn).")
@click.option("--width", "widths", multiple=True, type=click.IntRange(320, 4000),
              help="Window width in pixels for --snapshot (repeatable; default 1400).")
def dashboard(db_path, runs_dir, port, host, snapshot_dir, widths):
    """Serve the Streamlit comparison dashboard (needs the 'dashboard' extra).

    It only reads the store, with short read-only connections, so it can stay
    open while abl run writes to the same database. With --snapshot it saves a
    screenshot of every page instead.
    """
    import importlib.util
    import subprocess

    if importlib.util.find_spec("streamlit") is None:
        fail("the dashboard needs Streamlit: pip install -e '.[dashboard]'")
    db = Path(db_path).resolve()
    if snapshot_dir is not None:
        _dashboard_snapshot(db, Path(runs_dir).resolve() if runs_dir else db.parent / "runs", Path(snapshot_dir),
                            list(widths) or [1400])
        return
    if widths:
        fail("--width applies to --snapshot only")
    if not db.exists():
        click.echo(f"note: no database at {db} yet; the dashboard shows it once abl run creates it", err=True)
    import abl.dashboard

    app = Path(abl.dashboard.__file__).resolve().parent / "app.py"
    env = dict(os.environ, ABL_DB=str(db),
               ABL_RUNS_DIR=str(Path(runs_dir).resolve() if runs_dir else db.parent / "runs"))
    click.echo(f"abl dashboard: http://{host}:{port}  (store {db})", err=True)
    argv = [sys.executable, "-m", "streamlit", "run", str(app), "--server.address", host,
            "--server.port", str(port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false", "--global.developmentMode", "false",
            "--client.toolbarMode", "minimal"]
    if os.name == "posix":  # become the server, so signals (Ctrl-C, kill) reach it directly
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, argv, env)
    sys.exit(subprocess.call(argv, env=env))


def _dashboard_snapshot(db: Path, runs_dir: Path, out_dir: Path, widths: list[int]) -> None:
    """abl dashboard --snapshot: every page as a PNG, or exit 2 with why not."""
    import importlib.util

    if not db.is_file():
        fail(f"no database at {db}: nothing to take a snapshot of (pass --db)")
    if importlib.util.find_spec("playwright") is None:
        fail("--snapshot needs Playwright: pip install -e '.[dashboard]'")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".abl_write_test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        fail(f"cannot write into {out_dir}: {exc.strerror or exc}")
    from abl.dashboard import snapshot

    try:
        snapshot.chromium()
        shots = snapshot.snapshot(db, runs_dir, out_dir, widths, out_dir / "server.log")
    except snapshot.SnapshotError as exc:
        fail(f"{exc} (server log: {out_dir / 'server.log'})")
    except Exception as exc:  # noqa: BLE001 - a browser that cannot start or a page that never settles
        fail(f"the snapshot failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    broken = [s for s in shots if s.exceptions]
    if not broken:  # the server's log is kept only to explain a failure
        (out_dir / "server.log").unlink(missing_ok=True)
    for s in shots:
        click.echo(f"{s.path}  ({s.width} px wide, {s.content_height} px tall"
                   + (f", {s.exceptions} exception(s) shown" if s.exceptions else "") + ")")
    if broken:
        click.echo(f"{len(broken)} page(s) show an exception: " + ", ".join(sorted({s.page for s in broken})),
                   err=True)
        sys.exit(1)


def _si(x, unit: str = "") -> str:
    if x is None:
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}".rstrip()
    return f"{x:.3g} {unit}".rstrip()


@cli.command()
@click.argument("grid_file", type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override any config key, e.g. --set model.d_model=64 (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list (one object per cell) instead.")
def cost(grid_file, overrides, as_json):
    """Print the predicted cost of every cell of GRID_FILE; nothing is trained.

    Parameters, FLOPs per token and per step, activation, parameter/optimizer
    and KV-cache memory, from the cost functions the components declare
    (harness/costmodel.py).
    """
    import json

    from .grid.gridfile import load_grid
    from .model.costmodel import predict
    from .run.runner import fmt_bytes

    registry = _registry()
    try:
        grid = load_grid(grid_file, registry, list(overrides))
        cells = list({c.cell_key: c for c in reversed(grid.cells)}.values())[::-1]
        preds = [predict(c, registry) for c in cells]
    except _user_errors() as exc:
        fail(str(exc))
    if as_json:
        click.echo(json.dumps([{"cell": c.label, "cell_key": c.cell_key, **p} for c, p in zip(cells, preds)],
                              indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{grid.path}: predicted cost per cell (no training)", title_justify="left")
    table.add_column("#", justify="right")
    for path in grid.grid_paths or ["cell"]:
        table.add_column(path)
    cols = ("params", "non-emb", "fwd FLOP/tok", "train FLOP/step", "useful", "6N·tok", "act./step",
            "params+grad+adam", "KV/tok", "est. peak")
    for col in cols:
        table.add_column(col, justify="right")
    for i, (c, p) in enumerate(zip(cells, preds), 1):
        names = [str(c.varied.get(k, "?")) for k in grid.grid_paths] or [c.label]
        table.add_row(str(i), *names, f"{p['n_params']:,}", f"{p['n_params_non_embedding']:,}",
                      _si(p["flops_per_token"]), _si(p["flops_per_step"]), _si(p["useful_flops_per_step"]),
                      _si(p["flops_6n_per_token"] * p["tokens_per_step"]),
                      fmt_bytes(p["activation_bytes_per_step"]), fmt_bytes(p["static_bytes"]),
                      fmt_bytes(p["kv_cache_bytes_per_token"]), fmt_bytes(p["train_peak_bytes"]))
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 160))
    console.print(table)
    conds = sorted({(p["tokens_per_step"], p["activation_dtype_bytes"], p["vocab_size"]) for p in preds})
    console.print("per step = train.batch_size x model.context tokens; training = forward + backward as "
                  "executed (flop-counter convention); useful = model FLOPs for MFU; 6N = 6 x non-embedding "
                  "params, for reference. Conditions: " + "; ".join(
                      f"{t} tokens/step, activations {b} bytes/element, vocab {v}" for t, b, v in conds))


@cli.command()
@click.argument("source", metavar="GRID_FILE_OR_EXPERIMENT")
@click.option("--db", "db_path", default=None,
              help=f"DuckDB file to read (default: experiment.db of the grid, else {DEFAULT_DB}).")
@click.option("--out", "out_dir", default=None,
              help="Folder to write the report into (default: reports/<experiment>/ beside the database).")
@click.option("--format", "fmt", type=click.Choice(["md", "html"]), default="md", show_default=True,
              help="md: report.md with PNG plots beside it; html: one self-contained report.html.")
@click.option("--baseline", default=None,
              help="Baseline cell by label, cell key prefix or 1-based index (default: the grid's first cell).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Overrides used when the grid was run (so the same cells are found).")
def report(source, db_path, out_dir, fmt, baseline, overrides):
    """Write a self-contained report of a finished (or partly finished) grid.

    GRID_FILE_OR_EXPERIMENT is a grid file (its cells are looked up in the
    store) or an experiment name. The report holds the conditions, the grid,
    the comparison table with 95% CIs and verdicts against the baseline, loss
    curves, quality vs cost, predicted vs measured costs and, with at least 4
    model sizes spanning at least 4x in parameters, a scaling-law fit. A
    section that would mean nothing for these cells is left out, with one
    sentence saying why.
    """
    from .present.report import ReportError, build_report, experiments, load_runs, write_report

    registry = _registry()
    user_errors = _user_errors() + (ReportError,)
    try:
        from .grid.gridfile import load_grid, resolve_grid_path

        if Path(source).is_file() or (source.endswith(".toml") and resolve_grid_path(source).is_file()):
            grid = load_grid(source, registry, list(overrides))
            db = Path(db_path or getattr(grid.cells[0].experiment, "db", "") or DEFAULT_DB)
            run_ids = [c.run_id for c in grid.cells]
            runs = load_runs(db, run_ids=run_ids)
            if not runs:
                name = grid.cells[0].experiment.name
                hint = (f"; the store has runs of experiment {name!r} from other configs (the code or the "
                        f"grid changed since): abl report {name} reports those" if name in experiments(db)
                        else f": abl run {source} first")
                fail(f"no run of {source} as it resolves now is in {db}{hint}")
            order = list(dict.fromkeys(c.cell_key for c in grid.cells))
            baseline = baseline or grid.cells[0].experiment.baseline or None  # a display choice (abl.analysis.verdicts)
            missing = len(set(run_ids) - {r.run_id for r in runs})
            name, raw = grid.cells[0].experiment.name, grid.raw
        else:
            if source.endswith(".toml") or os.sep in source:
                fail(f"{source}: no such grid file")
            db = Path(db_path or DEFAULT_DB)
            runs = load_runs(db, experiment=source)
            if not runs:
                names = experiments(db)
                fail(f"no experiment {source!r} in {db}; experiments there: {', '.join(names) or 'none'}")
            order, missing, name, raw = None, 0, source, None
        rep = build_report(runs, source=source, db_path=str(db), registry=registry, order=order,
                           baseline=baseline, grid_raw=raw, missing_runs=missing)
        path = write_report(rep, Path(out_dir) if out_dir else db.parent / "reports" / name, fmt)
    except user_errors as exc:
        fail(str(exc))
    click.echo(f"wrote {path}")


@cli.group()
def bench():
    """Benchmarks of the harness itself (abl bench kernels)."""


_BENCH_OPS = ("rmsnorm", "layernorm", "rope", "swiglu", "geglu", "cross_entropy", "linear_cross_entropy",
              "flash_attention", "ssd_scan")


@bench.command("kernels")
@click.option("--op", "ops", multiple=True, type=click.Choice(_BENCH_OPS),
              help="Only these ops (repeatable; default: all).")
@click.option("--provider", "providers", multiple=True,
              type=click.Choice(["triton", "torch", "torch.compile", "liger", "flash-attn", "mamba-ssm"]),
              help="Only these providers (repeatable; default: every one available here).")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(["fp32", "bf16", "fp16"]),
              help="Input dtypes (repeatable; default bf16 on CUDA, fp32 on CPU).")
@click.option("--pass", "passes", multiple=True, type=click.Choice(["fwd", "bwd", "fwd+bwd"]),
              help="Passes to time (repeatable; default all three).")
@click.option("--size", type=click.Choice(["auto", "small", "large"]), default="auto", show_default=True,
              help="Shapes: small (CPU default) or large (CUDA default).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON instead of a table.")
@click.option("--db", "db_path", default=DEFAULT_DB, show_default=True, help="DuckDB file to write.")
@click.option("--no-store", is_flag=True, help="Do not write the rows to the database.")
def bench_kernels(ops, providers, dtypes, passes, size, device, as_json, db_path, no_store):
    """Time every kernel op for every available provider: triton, torch, torch.compile, peers.

    p20/p50/p80 in milliseconds, effective GB/s (memory-bound ops) or TFLOP/s
    (attention, fused LM-head cross-entropy) and the fraction of the device's
    peak; stored in the database's ``bench`` table.
    """
    import json

    from .bench.kernelbench import run_bench, store_rows
    from .run.train import resolve_device

    try:
        dev = resolve_device(device)
    except RuntimeError as exc:
        fail(str(exc))
    rows = run_bench(dev, ops=list(ops) or None, providers=list(providers) or None,
                     dtypes=list(dtypes) or None, passes=list(passes) or None, size=size,
                     log=lambda msg: click.echo(msg, err=True))
    if not no_store:
        try:
            store_rows(Path(db_path), rows)
        except _user_errors() as exc:
            fail(str(exc))
    if as_json:
        click.echo(json.dumps(rows, indent=1, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    device_name = rows[0]["device"] if rows else str(dev)
    table = Table(title=f"abl bench kernels: {device_name} (times in ms)")
    for col in ("op", "shape", "dtype", "pass", "provider"):
        table.add_column(col)
    for col in ("p20", "p50", "p80", "GB/s", "TFLOP/s", "of peak"):
        table.add_column(col, justify="right")

    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    for r in rows:
        table.add_row(r["op"], r["shape"], r["dtype"], r["pass"], r["provider"], num(r["p20"], ".4g"),
                      num(r["p50"], ".4g"), num(r["p80"], ".4g"), num(r["gbps"], ".3g"),
                      num(r["tflops"], ".3g"),
                      "-" if r["peak_fraction"] is None else f"{100 * r['peak_fraction']:.1f}%")
    console = Console()
    console.width = max(console.width, 150)  # one row per line, also when piped
    console.print(table)
    for basis in dict.fromkeys(r["peak_basis"] for r in rows):
        click.echo(f"peak: {basis}")
    if not no_store:
        click.echo(f"stored {len(rows)} rows in {db_path} (table bench)")


@cli.command()
@click.argument("source", metavar="EXPERIMENT_OR_GRID")
@click.option("--db", "db_path", default=None,
              help=f"DuckDB file to read (default: experiment.db of the grid, else {DEFAULT_DB}).")
@click.option("--metric", "metrics", multiple=True,
              help="Metric(s) to compare (repeatable; default: the grid's experiment.summary, else val_loss).")
@click.option("--baseline", default=None, help="Compare every cell with this one (label, 1-based index or "
                                              "cell-key prefix; default: experiment.baseline or the first cell).")
@click.option("--pairs", "pairs", multiple=True, metavar="A,B",
              help="Compare these two cells, first minus second (repeatable), e.g. --pairs 3,4.")
@click.option("--by", "by", default=None, metavar="PATH",
              help="Compare every pair of cells that differ in this setting only, e.g. --by model.ffn.")
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
def compare(source, db_path, metrics, baseline, pairs, by, bootstrap, correction, detect, as_json, fmt, wide,
            overrides):
    """Compare the stored runs of an experiment (or grid file) any way you like; nothing is trained.

    Same tests as the run summary, the report and the dashboard: paired by
    seed when the cells share seeds and data order, else Welch; Holm over the
    comparisons shown; fewer than 3 seeds: too few to decide, with the minimum
    detectable difference; cells that did not learn are not ranked.
    """
    from .analysis.verdicts import VerdictError
    from .present.report import ReportError
    from .present.summary import run_compare

    if as_json and fmt not in ("table", "json"):
        fail(f"give --json or --format {fmt}, not both (--json is --format json)")
    try:
        run_compare(source, db_path=db_path, default_db=DEFAULT_DB, registry=_registry, metrics=metrics,
                    baseline=baseline, pairs=pairs, by=by, bootstrap=bootstrap, correction=correction,
                    detect=detect, as_json=as_json, overrides=overrides, fmt=fmt,
                    layout="wide" if wide else "auto")
    except _user_errors() + (ReportError, VerdictError) as exc:
        fail(str(exc))


@bench.command("harness")
@click.option("--steps", default=200, show_default=True, type=click.IntRange(min=1),
              help="Training steps of the cell.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override the default cell (as in abl run), e.g. --set train.compile=true.")
@click.option("--cells", default=1, show_default=True, type=click.IntRange(min=1, max=64),
              help="Run this many cells of the same shape (seeds) one after another and report a cell "
                   "in the running grid (the first, with the run's one-off costs, apart).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench_harness(steps, overrides, cells, as_json):
    """One cell as abl run runs it: its wall time split into training steps and the rest.

    Runs in a scratch store (nothing is kept); ``overhead`` is the share of the
    cell's wall time spent outside its training steps.
    """
    import json

    from .bench.harness import run_harness_bench

    try:
        out = run_harness_bench(steps, list(overrides), cells=cells)
    except _user_errors() as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(str(exc))
    except RuntimeError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(1) from None
    if as_json:
        click.echo(json.dumps(out, indent=1))
        return
    if "first_cell" in out:
        f = out["first_cell"]
        click.echo(f"{out['cells']} cells of one shape in {out['grid_wall_s']:.1f} s; the first (with the run's "
                   f"one-off costs) took {f['cell_wall_s']:.2f} s, overhead {100 * f['overhead']:.1f}%; "
                   f"a cell in the running grid (median of the others):")
    click.echo(f"cell {out['cell']}, {out['steps']} steps: {out['cell_wall_s']:.2f} s of wall time")
    for key, what in (("steps_s", "training steps"), ("loop_other_s", "rest of the loop (evals, tracker)"),
                      ("before_loop_s", "worker, before the first step"),
                      ("after_loop_s", "worker, after the last step"),
                      ("process_s", "process start, imports, store")):
        click.echo(f"  {what:<36} {out[key]:8.2f} s  {100 * out[key] / out['cell_wall_s']:5.1f}%")
    if out["compile_s"] is not None:
        click.echo(f"  (of which torch.compile: {out['compile_s']:.2f} s)")
    click.echo(f"overhead (wall time outside the training steps): {100 * out['overhead']:.1f}%")


def main() -> None:
    cli(prog_name="abl")


if __name__ == "__main__":
    main()
