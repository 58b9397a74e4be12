"""``abl run``: prepare run folders, skip completed cells, execute, ingest, summarise."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from . import rundir, store
from .config import Cell, Grid
from .executors import Job, LocalExecutor
from .plugin_manager import pm
from .provenance import git_commit, versions
from .registry import Registry
from .rundir import COMPLETED, FAILED, KILLED, RETRY_FAILED, RUNNING, TERMINAL

# not a stored status: a live worker of another abl run holds the folder
BUSY = "busy"


def prepare(cell: Cell, runs_dir: Path, meta: dict[str, Any]) -> Path:
    return rundir.prepare(runs_dir / cell.run_id, cell.config, meta)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def summary_table(rows: list[dict[str, Any]], title: str, grid: Grid | None = None,
                  stats_by_cell: dict[str, dict[str, Any]] | None = None) -> Table:
    """One row per cell, best final val_loss first; one column per varied grid path.

    With ``stats_by_cell`` (harness.report.statistics_for_runs) the table shows
    the 95% CI of the mean, the delta against the baseline cell (the grid's
    first) with its p-value, and a verdict.
    """
    from .stats import fmt_p

    varied = {c.cell_key: c.varied for c in grid.cells} if grid else {}
    paths = grid.grid_paths if grid and grid.grid_paths else []
    stats_by_cell = stats_by_cell or {}
    show_decode = any(r.get("decode_tokens_per_s") is not None for r in rows)
    table = Table(title=title, title_justify="left")
    table.add_column("#", justify="right")
    for p in paths or ["cell"]:
        table.add_column(p)
    cols = [("seeds", "right"), ("val_loss ± std", "right"), ("95% CI", "right"),
            ("Δ vs base (p)", "right"), ("verdict", "left"), ("tokens/s", "right"), ("peak mem", "right")]
    if show_decode:
        cols += [("KV B/token", "right"), ("decode tok/s", "right")]
    cols += [("status", "left")]
    for col, just in cols:
        table.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    for i, r in enumerate(rows, 1):
        if r["val_loss_mean"] is None:
            vl = "-"
        elif r["val_loss_std"] is None:
            vl = f"{r['val_loss_mean']:.4f}"
        else:
            vl = f"{r['val_loss_mean']:.4f} ± {r['val_loss_std']:.4f}"
        st = stats_by_cell.get(r["cell_key"], {})
        ci = "-" if st.get("ci_low") is None else f"[{st['ci_low']:.4f}, {st['ci_high']:.4f}]"
        if st.get("is_baseline"):
            delta, verdict = "baseline", ""
        elif st.get("delta") is None:
            delta, verdict = "-", st.get("verdict") or ""
        else:
            delta = f"{st['delta']:+.4f} ({fmt_p(st.get('p_value'))})"
            verdict = st.get("verdict") or ""
        tps = "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        names = [str(varied.get(r["cell_key"], {}).get(p, "?")) for p in paths] or [r["label"] or "-"]
        cells = [str(i), *names, f"{r['completed']}/{r['runs']}", vl, ci, delta, verdict, tps,
                 fmt_bytes(r["peak_mem_bytes"])]
        if show_decode:
            kv = r.get("kv_bytes_per_token")
            dec = r.get("decode_tokens_per_s")
            cells += ["-" if kv is None else f"{kv:,.0f}", "-" if dec is None else f"{dec:,.0f}"]
        table.add_row(*cells, r["statuses"] or "-")
    return table


def grid_statistics(db_path: Path, grid: Grid) -> dict[str, dict[str, Any]]:
    """Per-cell CI, delta vs the grid's first cell, p-value and verdict (empty if unavailable)."""
    from .report import statistics_for_runs

    order = list(dict.fromkeys(c.cell_key for c in grid.cells))
    try:
        rows = statistics_for_runs(db_path, [c.run_id for c in grid.cells], order=order)
    except Exception as exc:  # noqa: BLE001 - statistics must never hide the results table
        Console(stderr=True).print(f"[yellow]statistics unavailable: {exc}[/]")
        return {}
    return {r["cell_key"]: r for r in rows}


def _pid_alive(pid: Any) -> bool:
    import os

    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reconcile(cells: list[Cell], runs_dir: Path, db_path: Path) -> dict[str, str]:
    """Bring the store in line with the run folders (the source of truth).

    After a kill -9 of ``abl run`` the store can lag behind the folders: a cell
    may have finished without being ingested, or be marked running with no
    worker left. Those folders are ingested now (a dead "running" one as
    killed). Returns the status of every cell that has one.
    """
    known = store.statuses(db_path, [c.run_id for c in cells])
    stale: list[tuple[Path, str | None]] = []
    for cell in cells:
        run_dir = runs_dir / cell.run_id
        st = rundir.read_status(run_dir)
        if st is None or not (run_dir / rundir.CONFIG).exists():
            continue
        state = st.get("status")
        if state == RUNNING and _pid_alive(st.get("pid")):
            known[cell.run_id] = BUSY
            continue
        if state == RUNNING:
            st.update(status=KILLED, error=st.get("error") or "the worker is gone (abl run was killed?)")
            rundir.write_status(run_dir, st)
            state = KILLED
        if state in TERMINAL and known.get(cell.run_id) != state:
            stale.append((run_dir, None))
            known[cell.run_id] = state
    if stale:
        con = store.open_store(db_path)
        try:
            for run_dir, override in stale:
                try:
                    store.ingest_run(con, run_dir, override)
                except store.StoreError:
                    continue  # a damaged folder: the cell simply runs again
        finally:
            con.close()
    return known


def plan(cells: list[Cell], known: dict[str, str], retry_failed: bool = False
         ) -> tuple[list[Cell], list[Cell], list[Cell], list[Cell]]:
    """(completed, failed and skipped, busy, to run) from each cell's last status (``reconcile``).

    Which statuses run again is ``rundir.runs_again``: killed and running ones
    restart, failed ones only with ``retry_failed``.
    """
    completed = [c for c in cells if known.get(c.run_id) == COMPLETED]
    failed = [c for c in cells if known.get(c.run_id) in RETRY_FAILED and not retry_failed]
    busy = [c for c in cells if known.get(c.run_id) == BUSY]
    todo = [c for c in cells
            if known.get(c.run_id) != BUSY and rundir.runs_again(known.get(c.run_id), retry_failed)]
    return completed, failed, busy, todo


def run_grid(grid: Grid, registry: Registry, db_path: Path, runs_dir: Path, executor=None,
             retry_failed: bool = False, console: Console | None = None) -> int:
    """Run every cell not yet completed (failed ones only with ``retry_failed``).

    Returns the number of runs that did not complete in this invocation.
    """
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=max(console.width, 200))
    executor = executor or LocalExecutor()
    cells = grid.cells
    con = store.open_store(db_path)  # migrate early so a schema problem stops us before training
    con.close()
    known = reconcile(cells, runs_dir, db_path)
    completed, failed, busy, todo = plan(cells, known, retry_failed)
    resuming = sum((runs_dir / c.run_id / rundir.CHECKPOINT).exists() for c in todo)
    msg = (f"[bold]{grid.cells[0].experiment.name}[/]: {len(cells)} runs "
           f"({len({c.cell_key for c in cells})} cells x seeds); "
           f"{len(completed)} already completed, skipped; {len(todo)} to run")
    if resuming:
        msg += f" ({resuming} resuming from a checkpoint)"
    if failed and not retry_failed:
        msg += f"; {len(failed)} failed or diverged, skipped (--retry failed re-runs them)"
    if busy:
        msg += f"; {len(busy)} running in another abl process, left alone"
    console.print(msg + ".", soft_wrap=True)
    commit = git_commit()

    jobs = []
    for i, cell in enumerate(todo):
        old = rundir.read_json(runs_dir / cell.run_id / rundir.META, {})
        first = old.get("first_commit") or old.get("git_commit") or commit
        meta = {"cell_key": cell.cell_key, "label": f"{cell.label}", "git_commit": commit,
                "first_commit": first, "attempts": int(old.get("attempts", 0)) + 1,
                "code_changed": bool(old.get("code_changed")) or first != commit,
                "executor": executor.name, "versions": versions(cell, registry), "grid_file": grid.path}
        if meta["code_changed"]:
            meta["notes"] = f"code changed between attempts: first {first}, now {commit}"
            console.print(f"[yellow]warning[/]: {cell.label} seed={cell.seed}: {meta['notes']}")
        jobs.append(Job(cell=cell, run_dir=prepare(cell, runs_dir, meta), index=i))
    failures = 0

    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False,
    )
    with progress:
        overall = progress.add_task(f"cells 0/{len(jobs)}", total=len(jobs), info="")
        tasks: dict[str, Any] = {}

        def on_progress(job: Job) -> None:
            tid = tasks.get(job.cell.run_id)
            desc = f"  [{job.index + 1}/{len(jobs)}] {job.cell.label} seed={job.cell.seed}"
            if tid is None:
                tid = tasks[job.cell.run_id] = progress.add_task(desc, total=job.cell.train.steps, info="")
                _ingest(db_path, job.run_dir, RUNNING)  # visible as in progress
            info = "" if job.train_loss is None else f"step {job.step} loss {job.train_loss:.3f}"
            if job.val_loss is not None:
                info += f" val {job.val_loss:.3f}"
            progress.update(tid, completed=job.step, info=info)

        def on_done(job: Job) -> None:
            nonlocal failures
            status_override = KILLED if job.killed else None
            st = rundir.read_status(job.run_dir) or {}
            if not job.killed and st.get("status") in (None, RUNNING):
                # the worker died without writing its final status (signal, segfault, OOM-kill)
                status_override = KILLED if (job.returncode or 0) < 0 else FAILED
                st.update(status=status_override, finished=time.time(),
                          error=st.get("error") or rundir.log_tail(job.run_dir))
                rundir.write_status(job.run_dir, st)
            status = _ingest(db_path, job.run_dir, status_override)
            if status != COMPLETED:
                failures += 1
                err = (rundir.read_status(job.run_dir) or {}).get("error") or ""
                progress.console.print(f"[red]{status}[/]: {job.cell.label} seed={job.cell.seed}: "
                                       f"{err.splitlines()[-1] if err else ''}")
            tid = tasks.pop(job.cell.run_id, None)
            if tid is not None:
                progress.remove_task(tid)
            progress.advance(overall)
            progress.update(overall, description=f"cells {int(progress.tasks[0].completed)}/{len(jobs)}")
            summary = {r[1]: r[2] for r in rundir.read_metrics(job.run_dir / rundir.METRICS)
                       if r[1] in ("n_params", "peak_mem_bytes", "wall_s")}
            pm.hook.run_finished(run_id=job.cell.run_id, status=status, config=job.cell.config,
                                 summary=summary)

        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            executor.run(jobs, on_progress, on_done)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted: stopping the running cells[/]")
            executor.stop_all()
            for job in executor.running:
                on_done(job)
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)

    rows = store.cell_summary(db_path, [c.run_id for c in cells])
    console.print(summary_table(rows, f"{cells[0].experiment.name}: final val_loss by cell, best first "
                                      "(baseline: the grid's first cell; paired t-test by seed when the "
                                      "cells share seeds and data, else Welch)",
                                grid, grid_statistics(db_path, grid)))
    from .taskreport import print_summary as print_task_accuracy

    print_task_accuracy(console, db_path, grid)
    console.print(f"database: {db_path}   run folders: {runs_dir}")
    return failures


def _ingest(db_path: Path, run_dir: Path, status_override: str | None) -> str:
    con = store.open_store(db_path)
    try:
        return store.ingest_run(con, run_dir, status_override)
    finally:
        con.close()
