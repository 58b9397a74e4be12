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
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from ..contracts.registry import Registry


class GridEstimate:
    """Remaining work and the speed measured so far for one ``abl run``'s jobs."""

    def __init__(self, jobs: list[Any], registry: Registry, slots: int, prior: dict[str, list[float]] | None = None):
        from ..model.costmodel import predict

        self.slots = max(1, slots)
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
        """(seconds, where the speed came from) for the whole grid's remaining cells."""
        rate, source = self.rate(running, now), "measured so far"
        if rate is None:
            rate, source = self.prior_rate, f"from {self.prior_n} earlier run(s) in the store"
        if rate is None:
            return None, "after the first steps"
        left = [r for r in self.per_step if r not in self.finished]
        parallel = max(1, min(self.slots, len(left)))
        return max(self.remaining(running) / (rate * parallel), self.longest_running(running, now)), source

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
        from .progress import fmt_duration

        eta, source = self.eta([])
        amount = f"{self.total():.3g} training FLOPs" if self.unit == "flops" else f"{self.total():,.0f} tokens"
        when = f"ETA {fmt_duration(eta)} ({source})" if eta is not None else "ETA after the first steps"
        return f"whole grid: {amount} (cost model), {when}"
