"""``abl run``: prepare run folders, skip completed cells, execute, ingest, summarise."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from . import rundir, store, tokenstore
from .admission import oom_kills
from .config import Cell, Grid
from .executors import Job, LocalExecutor
from .plugin_manager import pm
from .provenance import git_commit, versions
from .registry import Registry
from .rundir import COMPLETED, FAILED, KILLED, OOM, RETRY_FAILED, RUNNING, TERMINAL

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
        if state == RUNNING and rundir.pid_alive(st.get("pid")):
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
                    # the store may judge the folder otherwise (a completed run whose metrics are cut: incomplete)
                    known[run_dir.name] = store.ingest_run(con, run_dir, override)
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
             retry_failed: bool = False, console: Console | None = None, detect: float | None = None) -> int:
    """Run every cell not yet completed (failed ones only with ``retry_failed``).

    Returns the number of runs that did not complete in this invocation.
    """
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=max(console.width, 200))
    executor = executor or LocalExecutor()
    cells = grid.cells
    # the data of every cell checked, and tokenised once into the store, before the store is touched
    token_entries = tokenstore.prepare_store(cells, registry, db_path.parent / tokenstore.TOKENS_DIR,
                                             log=lambda line: console.print(line, soft_wrap=True, markup=False))
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
    incomplete = sum(known.get(c.run_id) == rundir.INCOMPLETE for c in todo)
    if incomplete:
        msg += f"; {incomplete} stored incomplete (their run folder was not whole), trained again"
    if failed and not retry_failed:
        msg += f"; {len(failed)} failed or diverged, skipped (--retry failed re-runs them)"
    if busy:
        msg += f"; {len(busy)} running in another abl process, left alone"
    console.print(msg + ".", soft_wrap=True)
    commit = git_commit()

    jobs = []
    metas: dict[str, dict[str, Any]] = {}
    for i, cell in enumerate(todo):
        old = rundir.read_json(runs_dir / cell.run_id / rundir.META, {})
        first = old.get("first_commit") or old.get("git_commit") or commit
        meta = {"cell_key": cell.cell_key, "label": f"{cell.label}", "git_commit": commit,
                "first_commit": first, "attempts": int(old.get("attempts", 0)) + 1,
                "code_changed": bool(old.get("code_changed")) or first != commit,
                "executor": executor.name, "versions": versions(cell, registry), "grid_file": grid.path,
                # FLOP counts and tracked memory of model shapes measured before (abl.shapecache)
                "shape_cache": str((db_path.parent / rundir.SHAPES_DIR).resolve())}
        if meta["code_changed"]:
            meta["notes"] = f"code changed between attempts: first {first}, now {commit}"
            console.print(f"[yellow]warning[/]: {cell.label} seed={cell.seed}: {meta['notes']}")
        metas[cell.run_id] = meta
        jobs.append(Job(cell=cell, run_dir=runs_dir / cell.run_id, index=i))
    failures = 0
    oom_before: dict[str, int | None] = {}
    launched: list[Job] = []
    ended: set[str] = set()

    def on_launch(job: Job) -> None:
        # the folder is set up (and the attempt counted) only as its worker starts,
        # so a cell that never started keeps its attempts
        prepare(job.cell, runs_dir, metas[job.cell.run_id])
        if job.cell.run_id in token_entries:  # the tokens its worker maps (a task cell generates its own)
            tokenstore.link_run(job.run_dir, token_entries[job.cell.run_id])
        oom_before[job.cell.run_id] = oom_kills()
        launched.append(job)

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
                error = st.get("error") or rundir.log_tail(job.run_dir)
                before, after = oom_before.get(job.cell.run_id), oom_kills()
                if job.returncode == -signal.SIGKILL and before is not None and after is not None \
                        and after > before:
                    status_override = OOM
                    error = (f"killed by the kernel's OOM killer (SIGKILL while this machine's out-of-memory "
                             f"kills rose from {before} to {after})")
                st.update(status=status_override, finished=time.time(), error=error)
                rundir.write_status(job.run_dir, st)
            status = _ingest(db_path, job.run_dir, status_override)
            ended.add(job.cell.run_id)
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
        previous_int = signal.getsignal(signal.SIGINT)
        try:
            executor.run(jobs, on_progress, on_done, on_launch=on_launch)
        except KeyboardInterrupt:
            # a second Ctrl-C must not cut the clean-up short: the store would keep
            # rows "running" whose folders say killed
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            console.print("[yellow]interrupted: stopping the running cells[/]")
            executor.stop_all()
            # every started cell not stored yet, also one whose on_done the interrupt cut short
            for job in {id(j): j for j in launched + executor.running}.values():
                if job.handle is not None and job.cell.run_id not in ended:
                    on_done(job)
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)

    from .summary import print_run_summary  # the verdict tables: abl.verdicts, the same as report/dashboard

    print_run_summary(console, db_path, grid, detect)
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
