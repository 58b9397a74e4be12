"""The whole grid's remaining time, at start and in every heartbeat (issue 27, 1).

Each cell's work is the cost model's training FLOPs per step (``flops_per_step``
of abl.model.costmodel) times its steps; a cell the cost model cannot price
makes every cell count in tokens (batch x context x steps) instead. The speed is
work done over the cells' own wall time, start-up included: at start, from the
earlier completed runs in the store (the median of their rate); once cells run,
from this invocation's cells (finished, and running ones up to their last
step). The remaining work, spread over the cells run at once, over that speed
is the ETA, and never less than the longest a running cell needs at its own step
rate. No speed known yet: no ETA, never a made-up one.

Several cells on one GPU (issue 37): the earlier runs' speed is a cell's speed
as it ran then, often alone on its GPU. Cells that share a GPU share its speed;
how much packing gains (the GPU idle between one cell's kernels, filled by
another's) is not known before they run. So at start the ETA of a packed grid
is a range: each cell at the earlier runs' speed, all run at once (the least),
to the GPUs' speed shared by their cells, as many at once as the GPUs hold
alone (the figure ``eta`` gives). Once cells run, their measured speed is the
contended one, and it is spread over no more cells than have run at once (the
GPU's memory may hold fewer than the slots).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from ..contracts.registry import Registry


class GridEstimate:
    """Remaining work and the speed measured so far for one ``abl run``'s jobs."""

    def __init__(self, jobs: list[Any], registry: Registry, slots: int, prior: dict[str, list[float]] | None = None,
                 gpus: int | None = None):
        """``slots``: the cells run at once; ``gpus``: the GPUs they share (None: the CPU, whose cores the
        threads rule shares among the slots)."""
        from ..model.costmodel import predict

        self.slots = max(1, slots)
        gpus = gpus if gpus and gpus > 0 else None
        # the cells at once if no GPU holds more than one cell's worth of speed: as many as the GPUs hold
        # alone (a cell of k processes takes k GPUs)
        widest = max((max(1, int(getattr(j.cell.train, "devices", 1) or 1)) for j in jobs), default=1)
        self.alone = self.slots if gpus is None else max(1, min(self.slots, gpus // widest))
        self.per_gpu = 1 if gpus is None else -(-self.slots // gpus)  # the most cells sharing a GPU
        self.most_running = 0  # the most cells seen running at once in this invocation
        per_step: dict[str, float] = {}
        self.unit = "flops"
        for job in jobs:
            try:
                per_step[job.cell.run_id] = float(predict(job.cell, registry)["flops_per_step"])
            except Exception:  # noqa: BLE001 - a component without a cost function: count tokens instead
                self.unit = "tokens"
                break
        if self.unit == "tokens":
            per_step = {j.cell.run_id: float(j.cell.train.batch_size * j.cell.model.context) for j in jobs}
        self.per_step = per_step
        self.steps = {j.cell.run_id: j.cell.train.steps for j in jobs}
        self.done_work = 0.0  # of finished cells
        self.done_s = 0.0  # their wall seconds
        self.finished: set[str] = set()
        rates = (prior or {}).get(self.unit) or []
        self.prior_rate = statistics.median(rates) if rates else None
        self.prior_n = len(rates)

    def total(self) -> float:
        return sum(self.per_step[r] * self.steps[r] for r in self.per_step)

    def finish(self, job: Any, wall_s: float | None) -> None:
        rid = job.cell.run_id
        if rid in self.finished or rid not in self.per_step:
            return
        self.finished.add(rid)
        self.done_work += self.per_step[rid] * job.step
        self.done_s += wall_s if wall_s is not None else max(0.0, time.time() - job.started)

    def rate(self, running: list[Any], now: float | None = None) -> float | None:
        """Work per cell-second measured in this invocation (None before any step)."""
        now = time.time() if now is None else now
        work, secs = self.done_work, self.done_s
        for job in running:
            if job.cell.run_id in self.per_step and job.step > 0:
                work += self.per_step[job.cell.run_id] * job.step
                secs += max(0.0, now - job.started)
        return work / secs if work > 0 and secs > 0 else None

    def remaining(self, running: list[Any]) -> float:
        steps_done = {j.cell.run_id: j.step for j in running}
        return sum(self.per_step[r] * max(0, self.steps[r] - steps_done.get(r, 0))
                   for r in self.per_step if r not in self.finished)

    def eta(self, running: list[Any], now: float | None = None) -> tuple[float | None, str]:
        """(seconds, where the speed came from) for the whole grid's remaining cells: at start of a packed
        grid the top of ``eta_span``'s range."""
        _, high, source = self.eta_span(running, now)
        return high, source

    def eta_span(self, running: list[Any], now: float | None = None) -> tuple[float | None, float | None, str]:
        """(least, most seconds, where the speed came from); the two are one figure but at start of a grid
        whose cells share GPUs (the module docstring)."""
        self.most_running = max(self.most_running, len(running))
        rate, source = self.rate(running, now), "measured so far"
        left = len([r for r in self.per_step if r not in self.finished])
        parallel = low_parallel = max(1, min(self.slots, left))
        if rate is not None:
            parallel = low_parallel = max(1, min(parallel, self.most_running or parallel))
        else:
            rate, source = self.prior_rate, f"from {self.prior_n} earlier run(s) in the store"
            if rate is not None and self.alone < low_parallel:
                parallel = max(1, min(self.alone, left))
                source += (f"; up to {self.per_gpu} cells share each GPU: the least if each keeps that speed, the most "
                           f"if together they get one cell's")
        if rate is None:
            return None, None, "after the first steps"
        longest, work = self.longest_running(running, now), self.remaining(running)
        return max(work / (rate * low_parallel), longest), max(work / (rate * parallel), longest), source

    def longest_running(self, running: list[Any], now: float | None = None) -> float:
        """The longest remaining time of a running cell at its own step rate (start-up included): the grid
        cannot end before it, whatever the pooled speed says (a Triton-interpreter cell among fast torch
        cells runs far below their pooled FLOP rate)."""
        now = time.time() if now is None else now
        out = 0.0
        for job in running:
            rid = job.cell.run_id
            if rid in self.steps and rid not in self.finished and job.step > 0 and now > job.started:
                out = max(out, (self.steps[rid] - job.step) * (now - job.started) / job.step)
        return out

    def start_line(self) -> str:
        from .progress import fmt_span

        low, high, source = self.eta_span([])
        amount = f"{self.total():.3g} training FLOPs" if self.unit == "flops" else f"{self.total():,.0f} tokens"
        when = f"ETA {fmt_span(low, high)} ({source})" if high is not None else "ETA after the first steps"
        return f"whole grid: {amount} (cost model), {when}"
