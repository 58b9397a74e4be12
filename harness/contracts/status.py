"""The status vocabulary of a cell, shared by the worker, the runner, the store, the analysis and the dashboard.

A run folder's status.json and the store's ``runs.status`` hold one of ``STATUSES``;
every layer reads these names from here, so the words cannot drift apart.
abl.store.rundir hands them on beside the run folder's files.
"""

from __future__ import annotations

import signal
import socket
import time
from typing import Any

QUEUED, RUNNING, COMPLETED = "queued", "running", "completed"
DIVERGED, OOM, FAILED, KILLED = "diverged", "oom", "failed", "killed"
# The worker said completed, but its folder does not hold a whole run (a cut or
# garbled metrics.jsonl, a missing final step or summary row): decided by the
# store at ingest (``check_complete``), never written by a worker. The folder keeps
# saying completed, so an ingest after a repair restores the run.
INCOMPLETE = "incomplete"

STATUSES = (QUEUED, RUNNING, COMPLETED, DIVERGED, OOM, FAILED, KILLED, INCOMPLETE)
# the worker has ended
TERMINAL = (COMPLETED, DIVERGED, OOM, FAILED, KILLED, INCOMPLETE)
# ended without completing: what summaries and the dashboard count as "did not complete"
NOT_COMPLETED = (DIVERGED, OOM, FAILED, KILLED, INCOMPLETE)
# re-run only with ``--retry failed``: run again as they are, they would end the same way.
# Not killed: a kill says nothing about the cell, so a plain re-run restarts it, like a
# running one whose worker is gone (docs/troubleshooting.md). Not incomplete:
# the training ended, its record was damaged; a re-run gives the whole record.
RETRY_FAILED = (DIVERGED, OOM, FAILED)
# statuses only the store gives (from what a folder holds); no worker ends with one
STORE_ONLY = (INCOMPLETE,)
# the worker's exit status for each final status
EXIT_CODES = {COMPLETED: 0, FAILED: 1, DIVERGED: 3, OOM: 4, KILLED: 5}


def runs_again(status: str | None, retry_failed: bool = False) -> bool:
    """Whether ``abl run`` runs a cell whose last status is ``status`` (None: it never started)."""
    if status == COMPLETED:
        return False
    if status in RETRY_FAILED:
        return retry_failed
    return True


# Signals a process raises on itself when it crashes (a bad memory access, an abort, a bad
# instruction): a deterministic crash of the cell, so failed, never killed. Every other signal
# came from outside (SIGKILL from the OOM killer or a user, SIGTERM or SIGINT from abl's shutdown).
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL,
                           signal.SIGSYS, signal.SIGTRAP})


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def signal_end(returncode: int | None) -> tuple[str, str] | None:
    """The status and reason of a worker that a signal ended before it wrote its own
    (``returncode`` as ``subprocess`` reports it: minus the signal); None when no signal ended it.

    A crash signal is ``failed`` (a plain re-run would crash the same way; ``--retry failed`` runs it
    again); any other is ``killed`` (stopped from outside: a plain re-run restarts it)."""
    if returncode is None or returncode >= 0:
        return None
    num = -returncode
    name = signal_name(num)
    if num in CRASH_SIGNALS:
        return FAILED, (f"the worker died of {name} (signal {num}): a crash in native code (torch, a compiled "
                        f"kernel or a plugin's extension), not a stop from outside; it would crash again, so a "
                        f"plain abl run does not retry it (abl run --retry failed does)")
    return KILLED, (f"the worker was stopped from outside by {name} (signal {num}): the kernel's OOM killer, a "
                    f"user or a scheduler; a plain abl run restarts it")


# why a folder left running by a worker that is gone is killed (abl ingest, abl run's reconcile)
GONE = ("the worker is gone without writing how it ended (abl run or the worker was killed, or the "
        "machine restarted); a plain abl run restarts it")


def settle_gone(status: dict[str, Any], alive: bool) -> dict[str, Any] | None:
    """A status.json that says running while the worker it names (``alive``: its pid on this machine)
    is gone, settled as killed with the reason; None when it needs no settling (another status, a
    live worker, no pid recorded, or one that ran on another host, which this machine cannot see)."""
    pid = status.get("pid")
    if status.get("status") != RUNNING or alive or not isinstance(pid, int) or isinstance(pid, bool) \
            or status.get("host", socket.gethostname()) != socket.gethostname():
        return None
    return {**status, "status": KILLED, "finished": status.get("finished") or time.time(),
            "error": status.get("error") or GONE}


def timed_out(limit_s: float, ran_s: float) -> str:
    """Why a cell the parent stopped at its time limit (``train.timeout_s``) is failed."""
    return (f"timed out: the cell ran {ran_s:.0f} s, past its time limit train.timeout_s = {limit_s:g} s, and "
            f"abl run stopped it; a plain abl run does not retry it (give it a longer train.timeout_s and run "
            f"abl run --retry failed)")
