"""The status vocabulary of a cell, shared by the worker, the runner, the store, the analysis and the dashboard.

A run folder's status.json and the store's ``runs.status`` hold one of ``STATUSES``;
every layer reads these names from here, so the words cannot drift apart.
abl.store.rundir hands them on beside the run folder's files.
"""

from __future__ import annotations

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
