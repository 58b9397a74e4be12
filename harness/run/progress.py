"""The progress of ``abl run``.

In a terminal, a rich bar per running cell (at any width the
elapsed and remaining times stay whole: below 100 columns the bar column goes
and the step and loss are written shorter, then the cell's label is cut from
the middle of its values, never below what keeps each axis's level apart:
abl.present.termlayout.fit_varied) and, as each cell ends, a line with its
status, final loss and wall time; anywhere else (a log file, nohup, CI) plain
lines, flushed as they are written: one when a cell starts, one when it ends
(status, final loss, wall time), and a heartbeat every ``ABL_HEARTBEAT_S``
seconds (default 30) with each running cell's step, latest loss and ETA from
its own step rate, and the cells done. A run with nothing to do draws nothing.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column

from ..analysis import health
from ..contracts.status import COMPLETED
from ..present.termlayout import fit_varied
from .executors import Job


HEARTBEAT_ENV = "ABL_HEARTBEAT_S"
DEFAULT_HEARTBEAT_S = 30.0


def fmt_span(low: float | None, high: float | None) -> str:
    """``12s``, or ``12s to 36s`` where the least and the most differ as written."""
    a, b = fmt_duration(low), fmt_duration(high)
    return b if a == b else f"{a} to {b}"


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


def varied_parts(cell: Any) -> list[tuple[str, str]]:
    """A cell's label as (axis, value) pairs: from what its grid varied (the label's own parts,
    abl.grid.labels.grid_label), else split from its label; none for ``base``."""
    from ..grid.labels import show

    varied = getattr(cell, "varied", None)
    if isinstance(varied, dict) and varied:
        return [(path.split(".")[-1], show(value)) for path, value in varied.items()]
    label = str(cell.label)
    if label == "base":
        return []
    return [(a, v) if sep else ("", a) for a, sep, v in (p.partition("=") for p in label.split(", "))]


def axis_levels(jobs: list[Job]) -> dict[str, list[str]]:
    """Each varied axis's levels among the jobs (the values ``fit_varied`` must keep apart)."""
    out: dict[str, list[str]] = {}
    for job in jobs:
        for axis, value in varied_parts(job.cell):
            if value not in out.setdefault(axis, []):
                out[axis].append(value)
    return out


def fitted_label(cell: Any, room: int, levels: dict[str, list[str]] | None = None,
                 names: bool | None = None) -> str:
    """The cell's label in ``room`` characters, every varied value kept (abl.present.termlayout.fit_varied)."""
    parts = varied_parts(cell)
    if not parts:
        return str(cell.label)
    return fit_varied(parts, room, [(levels or {}).get(a) or [v] for a, v in parts], names=names)


def longest_label(levels: dict[str, list[str]]) -> int:
    """The length of the grid's longest whole label (``axis=value, ...``, each axis at its longest level)."""
    return sum(len(a) + 1 + max((len(v) for v in vs), default=0) for a, vs in levels.items()) + 2 * (len(levels) - 1)


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


def packed_note(job: Job) -> str:
    """What a cell that shared its GPU with others of the grid says where it ends ("" when it had the GPU
    to itself): its speed figures are marked contended in its folder (abl.run.speedpass.mark_packed)."""
    if job.packed <= 1 or not job.gpus:
        return ""
    where = f"GPU {job.gpus[0]}" if len(job.gpus) == 1 else f"GPUs {','.join(map(str, job.gpus))}"
    return f"shared {where} with {job.packed - 1} other cell(s), speed contended"


def _notes(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


class LineProgress:
    """Progress as plain lines, for output that is not a terminal (a log file, nohup, CI).

    One line when a cell starts and one when it ends; every ``interval``
    seconds a heartbeat: the cells done, and for each running cell its step,
    latest loss and ETA. Lines go through the console, which flushes each.
    """

    def __init__(self, console: Console, total: int, interval: float, estimate: Any = None) -> None:
        self.console, self.total, self.interval = console, total, interval
        self.estimate = estimate  # abl.run.estimate.GridEstimate: the whole grid's ETA (None: not shown)
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
                threads = f", {job.threads_note}" if job.threads_note else ""
                self.line(f"start {self._name(job)}: {job.cell.train.steps} steps{threads}")
            entry[1].see(job.step, now)

    def finish(self, job: Job, status: str, wall_s: float | None, note: str = "") -> None:
        with self.lock:
            self.running.pop(job.cell.run_id, None)
            if self.estimate is not None:
                self.estimate.finish(job, wall_s)
            self.done += 1
            loss = _loss_text(job)
            note = _notes(note, packed_note(job))
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
            if self.estimate is not None:
                parts.append("  " + grid_eta(self.estimate, [job for job, _ in self.running.values()]))
            self.line("\n".join(parts))

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            self.heartbeat()


class BarProgress:
    """Progress as rich bars, for a terminal.

    Every column but the cell's name has a fixed width, so the timers are never
    cut; below 100 columns the bar column is dropped and the step and loss are
    written shorter; the name gets what is left: the cell number, its varied
    values (cut from the middle, each level kept apart from its axis's others:
    ``fitted_label``) and the seed. As a cell ends, a line above the bars says
    its status, final loss and wall time.
    """

    INFO_W = 30  # "step 10000 loss 3.412 val 3.456"
    NARROW_INFO_W = 23  # "10000 loss 3.412 v3.456"
    TIME_W = 7  # "0:01:23"
    BAR_W = 20

    def __init__(self, console: Console, total: int, estimate: Any = None,
                 levels: dict[str, list[str]] | None = None) -> None:
        self.console, self.total = console, total
        self.estimate = estimate
        self.levels = levels or {}  # each axis's levels in the grid (axis_levels), kept apart when cut
        self.jobs: dict[str, Job] = {}
        width = console.width
        bar = width >= 100
        self.narrow = not bar
        info_w = self.NARROW_INFO_W if self.narrow else self.INFO_W
        fixed = info_w + 2 * self.TIME_W + (self.BAR_W + 1 if bar else 0) + 3
        self.desc_w = max(16, width - fixed - 1)
        # one form for the whole grid, bars and end lines: the axis names only where every label keeps them
        widest = len(f"{'' if self.narrow else '  '}[{total}/{total}]  seed=") + 6
        self.names: bool | None = None if not self.levels or \
            longest_label(self.levels) <= self.desc_w - widest else False
        columns: list[Any] = [TextColumn("{task.description}", table_column=Column(
            width=self.desc_w, no_wrap=True, overflow="ellipsis"))]
        if bar:
            columns.append(BarColumn(bar_width=self.BAR_W))
        columns += [TextColumn("{task.fields[info]}", table_column=Column(width=info_w, no_wrap=True,
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

    def _desc(self, job: Job, width: int | None = None) -> str:
        head = f"{'' if self.narrow else '  '}[{job.index + 1}/{self.total}] "
        tail = f" seed={job.cell.seed}"
        room = (self.desc_w if width is None else width) - len(head) - len(tail)
        return head + fitted_label(job.cell, room, self.levels, names=self.names) + tail

    def _info(self, job: Job) -> str:
        if job.train_loss is None:
            return ""
        if not self.narrow:
            return f"step {job.step} {_loss_text(job)}"
        val = "" if job.val_loss is None else f" v{job.val_loss:.3f}"
        return f"{job.step} loss {job.train_loss:.3f}{val}"

    def update(self, job: Job) -> None:
        tid = self.tasks.get(job.cell.run_id)
        if tid is None:
            tid = self.tasks[job.cell.run_id] = self.progress.add_task(
                escape(self._desc(job)), total=job.cell.train.steps, info="")
        self.progress.update(tid, completed=job.step, info=self._info(job))
        self.jobs[job.cell.run_id] = job
        self._overall()

    def _overall(self) -> None:
        done = int(self.progress.tasks[0].completed)
        eta = "" if self.estimate is None else "; " + grid_eta(self.estimate, list(self.jobs.values()))
        self.progress.update(self.overall, description=escape(f"cells {done}/{self.total}{eta}"))

    def end_line(self, job: Job, status: str, wall_s: float | None) -> str:
        """The line a finished cell leaves above the bars: its name (fitted to what the rest leaves of
        the terminal), status, final loss and wall time, and whether it shared its GPU (``packed_note``)."""
        loss = _loss_text(job)
        rest = f": {status}{', ' + loss if loss else ''}, {fmt_duration(wall_s)}"
        if status != COMPLETED:
            rest = f": {status} at step {job.step}/{job.cell.train.steps}{', ' + loss if loss else ''}, " \
                   f"{fmt_duration(wall_s)}"
        if packed := packed_note(job):
            rest += f"; {packed}"
        return self._desc(job, self.console.width - len(rest)).strip() + rest

    def finish(self, job: Job, status: str, wall_s: float | None, note: str = "") -> None:
        self.progress.console.print(escape(self.end_line(job, status, wall_s)), highlight=False)
        if note:
            self.progress.console.print(f"[yellow]{escape(self._desc(job).strip())}[/]: {escape(note)}")
        tid = self.tasks.pop(job.cell.run_id, None)
        if tid is not None:
            self.progress.remove_task(tid)
        self.jobs.pop(job.cell.run_id, None)
        if self.estimate is not None:
            self.estimate.finish(job, wall_s)
        self.progress.advance(self.overall)
        self._overall()


def grid_eta(estimate: Any, running: list[Job]) -> str:
    """The whole grid's remaining time (abl.run.estimate; a range at start of a grid whose cells share
    GPUs), as the heartbeat and the bars show it."""
    low, eta, source = estimate.eta_span(running)
    return f"whole grid: ETA {fmt_span(low, eta)} ({source})" if eta is not None else \
        "whole grid: ETA after the first steps"


def make_display(console: Console, jobs: list[Job] | int, estimate: Any = None) -> Any:
    """Bars in a terminal, plain lines elsewhere; None when nothing runs (the plan sentence says so,
    no empty bar). ``jobs``: the jobs (their axes' levels keep cut labels apart) or their number.
    ``estimate``: the whole grid's ETA, shown in every heartbeat and on the overall bar."""
    n_jobs = jobs if isinstance(jobs, int) else len(jobs)
    if not n_jobs:
        return None
    if console.is_terminal:
        return BarProgress(console, n_jobs, estimate, None if isinstance(jobs, int) else axis_levels(jobs))
    return LineProgress(console, n_jobs, heartbeat_interval(), estimate)
