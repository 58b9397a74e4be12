"""How many CPU threads a cell's worker gets, chosen as it starts (issue 27, 1; docs/robustness.md).

``train.threads`` decides:

- ``N > 0``: exactly N threads (the override);
- ``-1``: torch's own default (one thread per core, whatever else runs);
- ``0`` (the default): the rule below, from the cores this process may use, the
  number of cells run at once (``--workers``) and the 1-minute load average.

The rule: the load that is not this run's own is the load average less this
run's own share of it (``own_load``: what its cells, running or finished, add
to the 1-minute average); the cores left are the cores less that load (rounded,
at least one); each cell gets an equal share of them, at least one thread::

    others  = max(0, load_1min - own_load(this run's cells))
    free    = max(1, cores - round(others))
    threads = max(1, free // workers)

On an idle 2-core machine one worker gets 2 threads; with another job keeping
both cores busy, 1. torch's default there (2 threads on 2 busy cores) ran steps
3-54x slower than one thread. When the other jobs alone keep every core busy
the machine is oversubscribed and ``abl run`` says so as it starts.

GPU cells get host threads by the same rule; a Slurm or Ray cell applies it on
the node that runs it (abl.run.executors.node_threads).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping

TORCH_DEFAULT = -1  # train.threads = -1: leave the thread count to torch
LOAD_TAU_S = 60.0  # the 1-minute load average's time constant (an exponentially damped average)
LOAD_MEMORY_S = 10 * LOAD_TAU_S  # a cell that ended this long ago weighs under e^-10 in the average


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def load_average() -> float | None:
    """The 1-minute load average (None where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def own_load(cells: Iterable[tuple[float, float | None, int | None]], now: float, cores: int,
             tau: float = LOAD_TAU_S) -> float:
    """This run's own part of the 1-minute load average at ``now``: the sum over its cells, each
    ``(start, end, threads)`` (``end`` None: still running; ``threads`` None: torch's default, one
    per core), of what ``threads`` runnable threads from ``start`` to ``end`` leave in an
    exponentially damped average of time constant ``tau``::

        threads x (exp(-(now - end) / tau) - exp(-(now - start) / tau))

    A cell that just finished still weighs in the average for a minute or more, so the next cell
    of the same grid would otherwise read its own grid's work as another job's and get fewer
    threads (a later cell of ``abl bench harness`` got 1 thread on an idle 2-core machine, the
    first 2); a cell that just started has not yet reached the average. The kernel samples every
    5 s; the continuous form is within a few percent of it."""
    total = 0.0
    for start, end, n in cells:
        stop = now if end is None else min(end, now)
        if stop <= start:
            continue
        total += max(1, cores if n is None else n) * (math.exp(-(now - stop) / tau) - math.exp(-(now - start) / tau))
    return total


def choose(requested: int, cores: int, workers: int, load: float | None, ours: float = 0.0) -> tuple[int | None, str]:
    """(threads, why) for a cell: None threads means torch's default. ``ours``: this run's own part of
    ``load`` (``own_load``)."""
    if requested > 0:
        return requested, f"{requested} thread(s) (train.threads)"
    if requested == TORCH_DEFAULT:
        return None, "torch's default threads (train.threads = -1)"
    others = max(0.0, (load or 0.0) - ours)
    free = max(1, cores - round(others))
    n = max(1, free // max(1, workers))
    own = f" ({ours:.1f} of it this run's own)" if load is not None and ours >= 0.05 else ""
    where = f"{cores} core(s), {workers} at once, load {load:.1f}{own}" if load is not None else \
        f"{cores} core(s), {workers} at once, load unknown"
    return n, f"{n} thread(s) (chosen: {where})"


def oversubscribed(cores: int, workers: int, load: float | None) -> str | None:
    """A warning when the machine is already busier than its cores before this run adds its cells."""
    if load is None or load < cores:
        return None
    return (f"the machine is oversubscribed: load {load:.1f} on {cores} core(s) before this run's "
            f"{workers} cell(s) at a time; each cell gets 1 thread and runs slower than on an idle "
            "machine, and its speed figures will be marked contended")


def for_cell(requested: int, slots: int, ours: float = 0.0, env: Mapping[str, str] | None = None) -> tuple[int | None, str]:
    """(threads, why) for a cell about to start on this machine: a user's ``OMP_NUM_THREADS`` stands under
    ``train.threads = 0``; otherwise ``choose`` from this machine's cores and load."""
    user = (os.environ if env is None else env).get("OMP_NUM_THREADS", "").strip()
    if requested == 0 and user.isdigit() and int(user) > 0:
        return int(user), f"{user} thread(s) (OMP_NUM_THREADS)"
    return choose(requested, usable_cores(), slots, load_average(), ours)
