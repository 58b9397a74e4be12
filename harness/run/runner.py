"""``abl run``: prepare run folders, skip completed cells, execute, ingest, summarise.

Progress: in a terminal, a rich bar per running cell (at any width the
elapsed and remaining times stay whole: the cell's label is cut from the left
and the bar column goes first); anywhere else (a log file, nohup, CI) plain
lines, flushed as they are written: one when a cell starts, one when it ends
(status, final loss, wall time), and a heartbeat every ``ABL_HEARTBEAT_S``
seconds (default 30) with each running cell's step, latest loss and ETA from
its own step rate, and the cells done. A run with nothing to do draws nothing.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column

from ..analysis import health
from ..contracts.config import Cell, Grid
from ..contracts.plugin_manager import pm
from ..contracts.registry import Registry
from ..data import tokenstore
from ..present import termlayout
from ..store import database as store
from ..store import rundir
from ..store.provenance import git_commit, versions
from ..store.rundir import COMPLETED, FAILED, KILLED, OOM, RETRY_FAILED, RUNNING, TERMINAL
from .admission import oom_kills
from .executors import Job, LocalExecutor

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


HEARTBEAT_ENV = "ABL_HEARTBEAT_S"
DEFAULT_HEARTBEAT_S = 30.0


def heartbeat_interval() -> float:
    """Seconds between two heartbeat lines: ``ABL_HEARTBEAT_S``, else 30 (a bad value: 30)."""
    try:
        v = float(os.environ.get(HEARTBEAT_ENV, DEFAULT_HEARTBEAT_S))
    except ValueError:
        return DEFAULT_HEARTBEAT_S
    return v if math.isfinite(v) and v > 0 else DEFAULT_HEARTBEAT_S


def fmt_duration(s: float | None) -> str:
    """12s, 3m05s, 1h02m."""
    if s is None or not math.isfinite(s) or s < 0:
        return "-"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _loss_text(job: Job) -> str:
    out = "" if job.train_loss is None else f"loss {job.train_loss:.3f}"
    if job.val_loss is not None:
        out += f" val {job.val_loss:.3f}"
    return out.strip()


class _Rate:
    """A cell's own step rate: steps since its first progress row over the time since."""

    def __init__(self) -> None:
        self.first: tuple[float, int] | None = None
        self.last: tuple[float, int] | None = None

    def see(self, step: int, now: float) -> None:
        if step <= 0:
            return
        if self.first is None:
            self.first = (now, step)
        self.last = (now, step)

    def eta(self, total: int) -> float | None:
        if self.first is None or self.last is None or self.last[1] <= self.first[1]:
            return None
        rate = (self.last[1] - self.first[1]) / max(1e-9, self.last[0] - self.first[0])
        return max(0, total - self.last[1]) / rate


def contention_note(final: dict[str, float], info: dict[str, Any]) -> str:
    """A warning when the run's loop shared the machine (abl.analysis.health's rule), else ""."""
    load, share = final.get("load_per_core"), final.get("cpu_util")
    on_cpu = info.get("device_type", "cpu") == "cpu"
    if not health.contended(load, share, on_cpu):
        return ""
    parts = [] if load is None else [f"load {load:.2f} per core"]
    if on_cpu and share is not None:
        parts.append(f"it got {share:.0%} of its threads' CPU time")
    return "machine contended (" + ", ".join(parts) + "): its speed figures are not comparable"


class LineProgress:
    """Progress as plain lines, for output that is not a terminal (a log file, nohup, CI).

    One line when a cell starts and one when it ends; every ``interval``
    seconds a heartbeat: the cells done, and for each running cell its step,
    latest loss and ETA. Lines go through the console, which flushes each.
    """

    def __init__(self, console: Console, total: int, interval: float) -> None:
        self.console, self.total, self.interval = console, total, interval
        self.done = 0
        self.running: dict[str, tuple[Job, _Rate]] = {}
        self.lock = threading.RLock()
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="abl-heartbeat", daemon=True)

    def __enter__(self) -> LineProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def line(self, text: str) -> None:
        with self.lock:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def print(self, text: str) -> None:  # a marked-up message (a failure): as plain text
        from rich.text import Text

        self.line(Text.from_markup(text).plain)

    def _name(self, job: Job) -> str:
        return f"[{job.index + 1}/{self.total}] {job.cell.label} seed={job.cell.seed}"

    def update(self, job: Job) -> None:
        now = time.monotonic()
        with self.lock:
            entry = self.running.get(job.cell.run_id)
            if entry is None:
                entry = self.running[job.cell.run_id] = (job, _Rate())
                self.line(f"start {self._name(job)}: {job.cell.train.steps} steps")
            entry[1].see(job.step, now)

    def finish(self, job: Job, status: str, wall_s: float | None, note: str = "") -> None:
        with self.lock:
            self.running.pop(job.cell.run_id, None)
            self.done += 1
            loss = _loss_text(job)
            self.line(f"end   {self._name(job)}: {status} at step {job.step}/{job.cell.train.steps}"
                      f"{', ' + loss if loss else ''}, wall {fmt_duration(wall_s)}"
                      f" (cells {self.done}/{self.total}){'; ' + note if note else ''}")

    def heartbeat(self) -> None:
        with self.lock:
            parts = [f"heartbeat {fmt_duration(time.monotonic() - self.t0)}: cells {self.done}/{self.total} done, "
                     f"{len(self.running)} running"]
            for job, rate in self.running.values():
                total = job.cell.train.steps
                loss = _loss_text(job)
                parts.append(f"  {self._name(job)}: step {job.step}/{total}{', ' + loss if loss else ''}, "
                             f"ETA {fmt_duration(rate.eta(total))}")
            self.line("\n".join(parts))

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            self.heartbeat()


class BarProgress:
    """Progress as rich bars, for a terminal.

    Every column but the cell's name has a fixed width, so the timers are never
    cut; the name gets what is left (its label is cut from the left, keeping the
    cell number and the seed), and below 100 columns the bar column is dropped.
    """

    INFO_W = 30  # "step 10000 loss 3.412 val 3.456"
    TIME_W = 7  # "0:01:23"
    BAR_W = 20

    def __init__(self, console: Console, total: int) -> None:
        self.console, self.total = console, total
        width = console.width
        bar = width >= 100
        fixed = self.INFO_W + 2 * self.TIME_W + (self.BAR_W + 1 if bar else 0) + 3
        self.desc_w = max(16, width - fixed - 1)
        columns: list[Any] = [TextColumn("{task.description}", table_column=Column(
            width=self.desc_w, no_wrap=True, overflow="ellipsis"))]
        if bar:
            columns.append(BarColumn(bar_width=self.BAR_W))
        columns += [TextColumn("{task.fields[info]}", table_column=Column(width=self.INFO_W, no_wrap=True,
                                                                            overflow="ellipsis")),
                    TimeElapsedColumn(table_column=Column(width=self.TIME_W, no_wrap=True)),
                    TimeRemainingColumn(table_column=Column(width=self.TIME_W, no_wrap=True))]
        self.progress = Progress(*columns, console=console, transient=False)
        self.overall = self.progress.add_task(f"cells 0/{total}", total=total, info="")
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> BarProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def print(self, text: str) -> None:
        self.progress.console.print(text)

    def _desc(self, job: Job) -> str:
        head, tail = f"  [{job.index + 1}/{self.total}] ", f" seed={job.cell.seed}"
        room = self.desc_w - len(head) - len(tail)
        label = str(job.cell.label)
        if len(label) > room:
            label = "…" + label[len(label) - max(0, room - 1):] if room > 1 else ""
        return head + label + tail

    def update(self, job: Job) -> None:
        from rich.markup import escape

        tid = self.tasks.get(job.cell.run_id)
        if tid is None:
            tid = self.tasks[job.cell.run_id] = self.progress.add_task(
                escape(self._desc(job)), total=job.cell.train.steps, info="")
        info = "" if job.train_loss is None else f"step {job.step} {_loss_text(job)}"
        self.progress.update(tid, completed=job.step, info=info)

    def finish(self, job: Job, status: str, wall_s: float | None, note: str = "") -> None:
        if note:
            self.progress.console.print(f"[yellow]{escape(self._desc(job).strip())}[/]: {escape(note)}")
        tid = self.tasks.pop(job.cell.run_id, None)
        if tid is not None:
            self.progress.remove_task(tid)
        self.progress.advance(self.overall)
        done = int(self.progress.tasks[0].completed)
        self.progress.update(self.overall, description=f"cells {done}/{self.total}")


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
        console = termlayout.output_console()
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
                # FLOP counts and tracked memory of model shapes measured before (abl.model.shapecache)
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
        display.update(job)  # its start line now, not after its worker is up

    if not jobs:  # nothing to do: the sentence above says so, no empty bar
        display: Any = None
    elif console.is_terminal:
        display = BarProgress(console, len(jobs))
    else:
        display = LineProgress(console, len(jobs), heartbeat_interval())

    def on_progress(job: Job) -> None:
        if job.cell.run_id not in started:
            started.add(job.cell.run_id)
            _ingest(db_path, job.run_dir, RUNNING)  # visible as in progress
        display.update(job)

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
        final = {r[1]: r[2] for r in rundir.read_metrics(job.run_dir / rundir.METRICS)
                 if r[1] in ("n_params", "peak_mem_bytes", "wall_s", "load_per_core", "cpu_util")}
        summary = {k: v for k, v in final.items() if k in ("n_params", "peak_mem_bytes", "wall_s")}
        wall = summary.get("wall_s")
        display.finish(job, status, wall if wall is not None else time.time() - job.started,
                       contention_note(final, rundir.read_json(job.run_dir / rundir.INFO, {})))
        if status != COMPLETED:
            failures += 1
            err = (rundir.read_status(job.run_dir) or {}).get("error") or ""
            display.print(f"[red]{status}[/]: {escape(str(job.cell.label))} seed={job.cell.seed}: "
                          f"{escape(err.splitlines()[-1]) if err else ''}")
        pm.hook.run_finished(run_id=job.cell.run_id, status=status, config=job.cell.config,
                             summary=summary)

    started: set[str] = set()
    with display if display is not None else nullcontext():
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

    from ..present.summary import (
        print_run_summary,  # the verdict tables: abl.analysis.verdicts, the same as report/dashboard
    )

    print_run_summary(console, db_path, grid, detect)
    from ..present.taskreport import print_summary as print_task_accuracy

    print_task_accuracy(console, db_path, grid)
    console.print(f"database: {db_path}   run folders: {runs_dir}")
    return failures


def _ingest(db_path: Path, run_dir: Path, status_override: str | None) -> str:
    con = store.open_store(db_path)
    try:
        return store.ingest_run(con, run_dir, status_override)
    finally:
        con.close()
