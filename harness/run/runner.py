"""``abl run``: prepare run folders, skip completed cells, execute, ingest, summarise.

``run_grid`` reads as its steps: the data checked and tokenised and the store
migrated, the store brought in line with the run folders (``reconcile``),
the cells sorted into completed, failed, busy and to run (``plan``), a job
per cell to run, each run by the executor while ``CellEvents`` stores and
shows it as it starts and ends, then the summary tables. The progress display
is abl.run.progress.
"""

from __future__ import annotations

import signal
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from ..contracts.config import Cell, Grid, canonical_config
from ..contracts.plugin_manager import notify
from ..contracts.registry import Registry
from ..contracts.status import (COMPLETED, DIVERGED, FAILED, INCOMPLETE, KILLED, OOM, RETRY_FAILED, RUNNING, TERMINAL,
                               runs_again)
from ..contracts.status import GONE, settle_gone, signal_name, signal_reason, timed_out, torchrun_signal
from ..data import tokenstore
from ..files import scrub_paths
from ..present import termlayout
from ..store import database as store
from ..store import rundir
from ..store.provenance import git_commit, plugin_records, versions
from ..store.workspace import Workspace
from .admission import oom_kills
from .executors import Job, LocalExecutor
from .guard import Stopped, time_limit
from .guard import raise_stopped as _raise_interrupt
from .progress import contention_note, fmt_duration, make_display

# not a stored status: a live worker of another abl run holds the folder
BUSY = "busy"
# how long a cell stopped at its time limit has to end before it is killed (SIGKILL)
STOP_GRACE_S = 10.0


def prepare(cell: Cell, runs_dir: Path, meta: dict[str, Any]) -> Path:
    return rundir.prepare(runs_dir / cell.run_id, cell.config, meta)


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
        if state == RUNNING:  # its worker is gone: killed, as abl ingest settles it (the folder first)
            rundir.write_status(run_dir, settle_gone(st, False) or {**st, "status": KILLED, "error": GONE})
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

    Which statuses run again is ``abl.contracts.status.runs_again``: killed and running ones
    restart, failed ones only with ``retry_failed``.
    """
    completed = [c for c in cells if known.get(c.run_id) == COMPLETED]
    failed = [c for c in cells if known.get(c.run_id) in RETRY_FAILED and not retry_failed]
    busy = [c for c in cells if known.get(c.run_id) == BUSY]
    todo = [c for c in cells
            if known.get(c.run_id) != BUSY and runs_again(known.get(c.run_id), retry_failed)]
    return completed, failed, busy, todo


def run_grid(grid: Grid, registry: Registry, db_path: Path, runs_dir: Path, executor=None,
             retry_failed: bool = False, console: Console | None = None, detect: float | None = None,
             presentation: termlayout.Presentation | None = None, summary: bool = True) -> int:
    """Run every cell not yet completed (failed ones only with ``retry_failed``).

    In steps: check and tokenise every cell's data, then migrate the store
    (``prepare_data_and_store``); bring the store in line with the run folders
    and sort the cells (``reconcile``, ``plan``) and say so (``plan_sentence``);
    a job per cell to run (``make_jobs``); run them, storing and showing each
    cell as it starts and ends (``CellEvents``, ``execute``); then the summary
    tables (``print_summaries``), as ``presentation`` says (default: tables on the console), unless
    ``summary`` is False (a round of ``abl run --until-decided``, which answers with its own test).

    Returns the number of runs that did not complete in this invocation.
    """
    if console is None:
        console = termlayout.output_console()
    executor = executor or LocalExecutor()
    cells = grid.cells
    ws = Workspace.at(db_path, runs_dir)  # the store's folders, derived once (abl.store.workspace)
    token_entries = prepare_data_and_store(cells, registry, ws, console)
    known = reconcile(cells, runs_dir, db_path)
    completed, failed, busy, todo = plan(cells, known, retry_failed)
    console.print(plan_sentence(grid, runs_dir, known, completed, failed, busy, todo, retry_failed), soft_wrap=True)
    with time_limit("the compile payback notes (the components' cost functions)"):
        notes = compile_payback_notes(todo, registry, ws, executor)
    for note in notes:
        console.print(f"note: {note}", soft_wrap=True, markup=False)
    jobs, metas = make_jobs(grid, todo, registry, ws, executor, console)
    with time_limit("the grid's cost estimate (the components' cost functions)"):
        estimate = start_estimate(jobs, registry, db_path, executor, console)
    display = make_display(console, jobs, estimate)  # the jobs: their axes' levels keep cut labels apart
    events = CellEvents(db_path, runs_dir, metas, token_entries, display)
    execute(executor, jobs, events, display, console)
    from .speedpass import after_grid  # the whole grid's figure, and its packed shapes timed alone (issue 37)

    after_grid(executor, jobs, db_path, console)
    if summary:
        print_summaries(console, db_path, runs_dir, grid, detect, presentation or termlayout.Presentation())
    return events.failures


def compile_payback_notes(todo: list[Cell], registry: Registry, ws: Workspace, executor) -> list[str]:
    """A note per compiled cell to run whose steps cannot repay its compile time, from the step
    times its shape's earlier cells stored (abl.run.payback.planned_payback_notes; cells of this
    machine only, an executor that declares ``local``: a cluster node's speed is not known here)."""
    if not executor.local or not any(c.train.compile for c in todo):
        return []
    from .payback import planned_payback_notes

    return planned_payback_notes(todo, registry, ws.shapes, use_gpus=executor.use_gpus,
                                 slots=executor.slots)


def start_estimate(jobs: list[Job], registry: Registry, db_path: Path, executor, console: Console) -> Any:
    """The whole grid's cost and ETA as it starts (abl.run.estimate), and a warning when this machine is
    oversubscribed before the run adds its cells (abl.run.threads)."""
    if not jobs:
        return None
    from . import threads
    from .estimate import GridEstimate

    if executor.local and not executor.use_gpus:
        busy = threads.oversubscribed(threads.usable_cores(), executor.slots, threads.load_average())
        if busy:
            console.print(f"[yellow]warning[/]: {busy}", soft_wrap=True)
    # the GPUs the slots share: cells packed on a GPU share its speed (abl.run.estimate)
    gpus = len(getattr(executor, "gpus", None) or []) if executor.local and executor.use_gpus else None
    estimate = GridEstimate(jobs, registry, executor.slots, store.completed_rates(db_path), gpus=gpus)
    console.print(estimate.start_line(), soft_wrap=True, markup=False)
    return estimate


def prepare_data_and_store(cells: list[Cell], registry: Registry, ws: Workspace, console: Console) -> dict[str, Any]:
    """Check the data of every cell and tokenise it once into the store's token folder, then open the
    store (migrating it), before anything trains: bad data or a schema problem stops the run here.
    Returns the token store entry of each cell that maps tokens (abl.data.tokenstore)."""
    # no time limit (a big corpus may take long), but a stop signal is acted on even when a dataset's or a
    # tokenizer's native code never gives the interpreter back: the watchdog then ends abl run (exit 130)
    with time_limit("the data preparation (the dataset and tokenizer plugins)", seconds=0):
        token_entries = tokenstore.prepare_store(cells, registry, ws.tokens,
                                                 log=lambda line: console.print(line, soft_wrap=True, markup=False))
    with store.storage_errors(ws.db):
        con = store.open_store(ws.db)  # migrate early so a schema problem stops us before training
        con.close()
    return token_entries


def plan_sentence(grid: Grid, runs_dir: Path, known: dict[str, str], completed: list[Cell], failed: list[Cell],
                  busy: list[Cell], todo: list[Cell], retry_failed: bool) -> str:
    """The one line ``abl run`` opens with: the runs, what is skipped and why, what runs (and resumes)."""
    cells = grid.cells
    resuming = sum((runs_dir / c.run_id / rundir.CHECKPOINT).exists() for c in todo)
    msg = (f"[bold]{grid.cells[0].experiment.name}[/]: {len(cells)} runs "
           f"({len({c.cell_key for c in cells})} cells x seeds); "
           f"{len(completed)} already completed, skipped; {len(todo)} to run")
    if resuming:
        msg += f" ({resuming} resuming from a checkpoint)"
    incomplete = sum(known.get(c.run_id) == INCOMPLETE for c in todo)
    if incomplete:
        msg += f"; {incomplete} stored incomplete (their run folder was not whole), trained again"
    if failed and not retry_failed:
        msg += f"; {len(failed)} failed or diverged, skipped (--retry failed re-runs them)"
    if busy:
        msg += f"; {len(busy)} running in another abl process, left alone"
    return msg + "."


def make_jobs(grid: Grid, todo: list[Cell], registry: Registry, ws: Workspace, executor,
              console: Console) -> tuple[list[Job], dict[str, dict[str, Any]]]:
    """A job per cell to run, and the meta.json of its attempt: the commit, the attempts so far and
    whether the code changed between them (with a warning when it did), versions, what the grid knew,
    and where the store is (so its worker finds the workspace's shape cache: abl.store.workspace)."""
    commit = git_commit()
    runs_dir = ws.runs
    jobs = []
    metas: dict[str, dict[str, Any]] = {}
    for i, cell in enumerate(todo):
        old = rundir.read_json(runs_dir / cell.run_id / rundir.META, {})
        first = old.get("first_commit") or old.get("git_commit") or commit
        meta = {"cell_key": cell.cell_key, "label": f"{cell.label}", "git_commit": commit,
                "first_commit": first, "attempts": int(old.get("attempts", 0)) + 1,
                "code_changed": bool(old.get("code_changed")) or first != commit,
                "executor": executor.name, "versions": versions(cell, registry), "grid_file": grid.path,
                "plugins": plugin_records(cell, registry),  # which plugin provided each component
                "grid": cell.grid_record(grid.path),
                # the worker's way to the store's folders: FLOP counts and tracked memory of model shapes
                # measured before (abl.model.shapecache) are in its shapes folder
                **ws.record(runs_dir / cell.run_id)}
        if meta["code_changed"]:
            meta["notes"] = f"code changed between attempts: first {first}, now {commit}"
            console.print(f"[yellow]warning[/]: {cell.label} seed={cell.seed}: {meta['notes']}")
        metas[cell.run_id] = meta
        jobs.append(Job(cell=cell, run_dir=runs_dir / cell.run_id, index=i))
    return jobs, metas


class CellEvents:
    """What the runner does as each cell starts, reports and ends (the executor's callbacks).

    A cell's folder is set up (and its attempt counted) only as its worker
    starts, so a cell that never started keeps its attempts; it shows as
    running in the store from its first progress row; when it ends its status
    is settled (a worker that died without writing one: killed, failed or
    out of memory), it is ingested, shown, counted if it did not complete, and
    announced to the plugins (``run_finished``).
    """

    # why the cells abl run stopped were killed (execute sets it from the signal or the failed write)
    stop_reason = "stopped by abl run"

    def __init__(self, db_path: Path, runs_dir: Path, metas: dict[str, dict[str, Any]],
                 token_entries: dict[str, Any], display: Any) -> None:
        self.db_path, self.runs_dir, self.metas = db_path, runs_dir, metas
        self.token_entries, self.display = token_entries, display
        self.failures = 0
        self.oom_before: dict[str, int | None] = {}
        self.launched: list[Job] = []  # every job whose worker was started
        self.started: set[str] = set()  # run ids stored as running
        self.ended: set[str] = set()  # run ids stored with their final status
        self.last_step: dict[str, float] = {}  # run id -> when it last reported progress (or started)
        self.stall_warned: set[str] = set()
        self.timed_out: dict[str, tuple[float, float, bool]] = {}  # run id -> (stopped at, ran s, SIGKILL sent)

    def on_launch(self, job: Job) -> None:
        prepare(job.cell, self.runs_dir, self.metas[job.cell.run_id])
        if job.cell.run_id in self.token_entries:  # the tokens its worker maps (a task cell generates its own)
            tokenstore.link_run(job.run_dir, self.token_entries[job.cell.run_id])
        self.oom_before[job.cell.run_id] = oom_kills()
        job.log_offset = rundir.log_size(job.run_dir)  # what earlier attempts wrote there is not this one's
        self.launched.append(job)
        self.display.update(job)  # its start line now, not after its worker is up

    def end_signal(self, job: Job) -> tuple[int, str] | None:
        """(the signal, whom it ended) when a signal ended the job's worker, else None. A one-process
        worker's signal death is its minus-the-signal exit status; a multi-process cell's torchrun exits 1
        whatever ended a rank, so its report in the cell's log says (abl.contracts.status.torchrun_signal)."""
        code = job.returncode
        if job.torchrun:
            return torchrun_signal(code, rundir.log_text(job.run_dir, job.log_offset))
        return (-code, "the worker") if code is not None and code < 0 else None

    def settled(self, job: Job, st: dict[str, Any]) -> str:
        """Write the status of a worker that ended without writing its own, and return it: killed when
        abl run stopped it or a signal from outside ended it, out of memory when the kernel's OOM killer
        did, failed (the signal named) when it crashed or exited without a word. A multi-process cell
        whose rank died of a signal is settled so too, whatever rank 0 wrote as torchrun stopped it."""
        ended = self.end_signal(job)
        said = st.get("error")
        if st.get("status") not in (None, RUNNING):  # rank 0's own word, after another rank's death
            said = f"rank 0 then ended {st.get('status')}: {(str(said or '').strip().splitlines() or [''])[-1]}"
        if job.killed:
            status, error = KILLED, self.stop_reason + (f"; its worker ended by {signal_name(ended[0])}"
                                                        if ended else "")
        elif ended is not None:
            status, why = signal_reason(*ended)  # its log's last lines, then the signal (the line a summary shows)
            error = f"{said or rundir.log_tail(job.run_dir, offset=job.log_offset)}\n{why}"
        else:
            status, error = FAILED, said or rundir.log_tail(job.run_dir, offset=job.log_offset)
        before, after = self.oom_before.get(job.cell.run_id), oom_kills()
        if not job.killed and ended is not None and ended[0] == signal.SIGKILL and before is not None \
                and after is not None and after > before:
            status = OOM
            error = (f"killed by the kernel's OOM killer (SIGKILL to {ended[1]} while this machine's "
                     f"out-of-memory kills rose from {before} to {after})")
        st.update(status=status, finished=time.time(), error=error)
        rundir.write_status(job.run_dir, st)
        return status

    def settle_engine_end(self, job: Job, st: dict[str, Any]) -> str:
        """Write the status the executor's engine gave the job (``job.end``: a scheduler's time limit, a lost
        node, an out-of-memory kill), whatever its worker wrote as the engine stopped it, and return it."""
        assert job.end is not None
        status, why = job.end.status()
        said = (str(st.get("error") or "").strip().splitlines() or [""])[-1]
        error = f"{why} (then: {said})" if said else f"{rundir.log_tail(job.run_dir, offset=job.log_offset)}\n{why}"
        st.update(status=status, finished=time.time(), error=error)
        rundir.write_status(job.run_dir, st)
        return status

    def settle_from_signal(self, job: Job, st: dict[str, Any]) -> str | None:
        """A multi-process cell that a signal ended (one of its ranks, or torchrun itself from outside)
        while rank 0 wrote failed or killed (torchrun's SIGTERM to it, or a collective broken by the dead
        rank: consequences, not the cause): settled by the signal (``settled``), and its status returned;
        None when no signal ended it."""
        if job.killed or not job.torchrun or st.get("status") not in (FAILED, KILLED) or self.end_signal(job) is None:
            return None
        return self.settled(job, st)

    def watch(self, job: Job, executor) -> None:
        """Called for each running job at every poll: its time limit (``train.timeout_s``: stopped, then
        killed ``STOP_GRACE_S`` later if it has not ended; ``on_done`` stores it failed with the reason)
        and its stall warning (``train.stall_warning_s`` without a step: said once, the cell goes on)."""
        rid, train, now = job.cell.run_id, job.cell.train, time.time()
        who = f"{escape(str(job.cell.label))} seed={job.cell.seed}"
        if rid in self.timed_out:
            stopped, ran, hard = self.timed_out[rid]
            if not hard and now - stopped > STOP_GRACE_S:  # it ignored SIGTERM, or is stuck in native code
                self.timed_out[rid] = (stopped, ran, True)
                executor.kill(job)
            return
        if train.timeout_s and now - job.started > train.timeout_s:
            self.timed_out[rid] = (now, now - job.started, False)
            self.display.print(f"[red]timed out[/]: {who}: ran past train.timeout_s = {train.timeout_s:g} s; "
                               f"stopping it (the grid goes on)")
            executor.stop(job)
            return
        quiet = now - self.last_step.get(rid, job.started)
        if train.stall_warning_s and quiet > train.stall_warning_s and rid not in self.stall_warned:
            self.stall_warned.add(rid)
            self.display.print(f"[yellow]warning[/]: {who}: no progress reported for {fmt_duration(quiet)} "
                               f"(train.stall_warning_s = {train.stall_warning_s:g} s); it keeps running"
                               + (f" until train.timeout_s = {train.timeout_s:g} s" if train.timeout_s else
                                  ", with no time limit (train.timeout_s)"))

    def on_progress(self, job: Job) -> None:
        self.last_step[job.cell.run_id] = time.time()
        if job.cell.run_id not in self.started:
            self.started.add(job.cell.run_id)
            _ingest(self.db_path, job.run_dir, RUNNING)  # visible as in progress
        self.display.update(job)

    def on_done(self, job: Job) -> None:
        status_override = None
        st = rundir.read_status(job.run_dir) or {}
        if job.cell.run_id in self.timed_out and not job.killed and st.get("status") != COMPLETED:
            # stopped at its time limit: failed with the reason, whatever the signal made the worker write
            # (killed), in the folder first and then the store
            ran = self.timed_out[job.cell.run_id][1]
            said = (str(st.get("error") or "").strip().splitlines() or [""])[-1]
            st.update(status=FAILED, finished=time.time(),
                      error=timed_out(job.cell.train.timeout_s, ran) + (f" (then: {said})" if said else ""))
            rundir.write_status(job.run_dir, st)
        elif job.end is not None and not job.killed and st.get("status") not in (COMPLETED, DIVERGED, OOM):
            status_override = self.settle_engine_end(job, st)
        elif st.get("status") in (None, RUNNING):
            # the worker died without writing its final status: the parent settles it, in the folder
            # first and then the store, so the two agree (docs/robustness.md)
            status_override = self.settled(job, st)
        elif (by_rank := self.settle_from_signal(job, st)) is not None:
            status_override = by_rank
        elif job.killed and st.get("status") in (FAILED, KILLED):
            # stopped by abl run: what the signal broke on its way in is no verdict on the cell, and the
            # reason names the signal abl run received (a Ctrl-C is SIGINT), not the SIGTERM it sent on
            last = (str(st.get("error") or "").strip().splitlines() or ["no error"])[-1]
            then = "its worker" if st.get("status") == KILLED else "then"
            st.update(status=KILLED, error=f"{self.stop_reason} ({then}: {last})")
            rundir.write_status(job.run_dir, st)
        status = _ingest(self.db_path, job.run_dir, status_override)
        self.ended.add(job.cell.run_id)
        final = {r[1]: r[2] for r in rundir.read_metrics(job.run_dir / rundir.METRICS)
                 if r[1] in ("n_params", "peak_mem_bytes", "wall_s", "load_per_core", "cpu_util")}
        summary = {k: v for k, v in final.items() if k in ("n_params", "peak_mem_bytes", "wall_s")}
        wall = summary.get("wall_s")
        self.display.finish(job, status, wall if wall is not None else time.time() - job.started,
                            contention_note(final, rundir.read_json(job.run_dir / rundir.INFO, {})))
        if status != COMPLETED:
            self.failures += 1
            err = (rundir.read_status(job.run_dir) or {}).get("error") or ""
            self.display.print(f"[red]{status}[/]: {escape(str(job.cell.label))} seed={job.cell.seed}: "
                               f"{escape(err.splitlines()[-1]) if err else ''}")
        # the plugins get the shape the store keeps (each component as {"name", "params"}), so a
        # run_finished hook written before the run folder's config named components once still works
        for problem in notify("run_finished", run_id=job.cell.run_id, status=status,
                              config=canonical_config(job.cell.config), summary=summary):
            self.display.print(f"[yellow]warning[/]: {escape(problem)}")


def execute(executor, jobs: list[Job], events: CellEvents, display: Any, console: Console) -> None:
    """Run the jobs under the display. SIGTERM is a Ctrl-C here; on either, every running cell is
    stopped and every started one stored before the interrupt goes on up."""
    with display if display is not None else nullcontext():
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        previous_int = signal.getsignal(signal.SIGINT)
        try:
            watch = {"watch": lambda job: events.watch(job, executor)} if _takes_watch(executor) else {}
            executor.run(jobs, events.on_progress, events.on_done, on_launch=events.on_launch, **watch)
        except (KeyboardInterrupt, OSError) as exc:  # Ctrl-C, SIGTERM, or a write that failed (a full disk)
            # a second Ctrl-C must not cut the clean-up short: the store would keep
            # rows "running" whose folders say killed
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            why = "interrupted" if isinstance(exc, KeyboardInterrupt) else "a write failed"
            events.stop_reason = stop_reason(exc)
            console.print(f"[yellow]{why}: stopping the running cells[/]")
            executor.stop_all()
            # every started cell not stored yet, also one whose on_done the interrupt cut short
            for job in {id(j): j for j in events.launched + executor.running}.values():
                if job.handle is not None and job.cell.run_id not in events.ended:
                    events.on_done(job)
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)


def stop_reason(exc: BaseException) -> str:
    """Why abl run stopped its cells, stored as their error: the signal it received (a Ctrl-C is Python's
    own SIGINT), or the write that failed, its path without this machine's folders (abl.files.scrub_paths)."""
    if isinstance(exc, KeyboardInterrupt):
        return f"stopped by {exc.signal_name if isinstance(exc, Stopped) else 'SIGINT'} to abl run"
    return f"stopped: abl run could not write ({scrub_paths(str(exc))})"


def _takes_watch(executor) -> bool:
    """Whether ``executor.run`` calls a ``watch`` (abl.run.executors.Executor.run does; a plugin's executor
    that overrides ``run`` with the older signature has no time limit nor stall warning)."""
    import inspect

    try:
        return "watch" in inspect.signature(executor.run).parameters
    except (TypeError, ValueError):
        return False


def print_summaries(console: Console, db_path: Path, runs_dir: Path, grid: Grid, detect: float | None,
                    presentation: termlayout.Presentation) -> None:
    """The verdict tables (abl.analysis.verdicts, the same as report and dashboard), a task grid's
    accuracies, and where everything is stored."""
    from ..present.summary import print_run_summary
    from ..present.taskreport import print_summary as print_task_accuracy

    print_run_summary(console, db_path, grid, detect, presentation)
    print_task_accuracy(console, db_path, grid, presentation.layout)
    console.print(f"database: {db_path}   run folders: {runs_dir}")


def _ingest(db_path: Path, run_dir: Path, status_override: str | None) -> str:
    with store.storage_errors(db_path):  # a full disk: an OSError, which stops the run cleanly (execute)
        con = store.open_store(db_path)
        try:
            return store.ingest_run(con, run_dir, status_override)
        finally:
            con.close()
