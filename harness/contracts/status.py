"""The status vocabulary of a cell, shared by the worker, the runner, the store, the analysis and the dashboard.

A run folder's status.json and the store's ``runs.status`` hold one of ``STATUSES``;
every layer reads these names from here, so the words cannot drift apart.
abl.store.rundir hands them on beside the run folder's files.
"""

from __future__ import annotations

import re
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


def signal_reason(num: int, who: str = "the worker") -> tuple[str, str]:
    """The status and reason of a process (``who``) that signal ``num`` ended before it said how it ended.

    A crash signal is ``failed`` (a plain re-run would crash the same way; ``--retry failed`` runs it
    again); any other is ``killed`` (stopped from outside: a plain re-run restarts it)."""
    name = signal_name(num)
    if num in CRASH_SIGNALS:
        return FAILED, (f"{who} died of {name} (signal {num}): a crash in native code (torch, a compiled "
                        f"kernel or a plugin's extension), not a stop from outside; it would crash again, so a "
                        f"plain abl run does not retry it (abl run --retry failed does)")
    return KILLED, (f"{who} was stopped from outside by {name} (signal {num}): the kernel's OOM killer, a "
                    f"user or a scheduler; a plain abl run restarts it")


def launcher_signal(code: int | None) -> int | None:
    """The signal an exit status on torchrun's launch path says ended a process: minus the signal (as
    subprocess and torchrun's report give a process a signal ended) or 128 + the signal (a shell's
    convention, where a shell, ``srun`` or a wrapper script sits between); None for any other status.

    Only for that path: there no ordinary exit status is above 128 (torchrun exits 0, 1 or 2, a worker
    rank with EXIT_CODES or 2), so 129 and up cannot be one. A one-process worker's signal death
    reaches abl as minus the signal, and there a plugin's ``sys.exit(139)`` is an exit status, not SIGSEGV."""
    if code is None:
        return None
    num = -code if code < 0 else code - 128 if code > 128 else 0
    try:
        return int(signal.Signals(num)) if num > 0 else None
    except ValueError:
        return None


# torchrun (torch.distributed.run; read from torch 2.13's torch.distributed.elastic) never passes a rank's end
# on as its own exit status. When a rank fails it exits 1 after a report (ChildFailedError) whose last block,
# "Root Cause (first observed failure)", names the rank and its exit code, minus the signal for a signal
# ("exitcode  : -11 (pid: 6235)  (SIGSEGV)"); its log line before the report says the same ("failed
# (exitcode: -11) local_rank: 0"). When torchrun itself gets SIGTERM, SIGINT, SIGHUP or SIGQUIT it stops the
# ranks and exits 1 after "SignalException: Process 6309 got signal: 15".
_ROOT_CAUSE = "Root Cause (first observed failure):"
_ROOT_RANK = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
_RANK_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
_TORCHRUN_STOPPED = re.compile(r"SignalException: Process \d+ got signal: (\d+)")


def torchrun_signal(returncode: int | None, log: str) -> tuple[int, str] | None:
    """(the signal, whom it ended) for a cell launched by torchrun that did not end well: a rank's death by
    a signal from torchrun's report in ``log`` (the cell's output since its launch), else torchrun's own
    stop by a signal (its SignalException, or its exit status); None when neither was a signal."""
    if returncode == 0:
        return None
    if _ROOT_CAUSE in log:
        found = _ROOT_RANK.search(log.rsplit(_ROOT_CAUSE, 1)[1])
        failed = (found.group(2), found.group(1)) if found else None
    else:
        failed = next(((m.group(1), m.group(2)) for m in reversed(list(_RANK_FAILED.finditer(log)))), None)
    if failed is not None:  # torchrun's first observed failure: the cause, whatever the other ranks did then
        num = launcher_signal(int(failed[0]))
        return (num, f"rank {failed[1]} of the cell's torchrun") if num else None
    stopped = _TORCHRUN_STOPPED.findall(log)
    num = int(stopped[-1]) if stopped else launcher_signal(returncode)
    return (num, "the cell's torchrun") if num else None


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
