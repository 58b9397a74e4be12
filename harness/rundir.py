"""The run folder ``runs/<run_id>/``: the one protocol between a worker, ``abl run``, the store and the dashboard.

Files (the folders are the source of truth; the store is rebuilt from them):

- ``config.json``: the resolved cell config; ``meta.json``: the attempts'
  bookkeeping. Both written by the ``abl run`` parent before launch
  (``prepare``);
- ``status.json``: ``{"status": one of STATUSES, ...}``, written atomically by
  the worker as it starts and ends, and by the parent when a worker died
  without saying how;
- ``metrics.jsonl``: one JSON object per line, ``{"step": N, name: value,
  ...}``, appended and flushed per line by the worker (``JsonlSink``), so it is
  safe to read while it grows. Readers skip a torn last line (a killed writer)
  and lines that are not a metrics object;
- ``info.json`` (worker), ``worker.log`` (the worker's output),
  ``checkpoint.pt`` (kept until the cell completes).

Everything here is plain Python: the worker, the parent and the dashboard all
import it, and it imports nothing of abl.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

CONFIG = "config.json"
META = "meta.json"
STATUS = "status.json"
INFO = "info.json"
METRICS = "metrics.jsonl"
CHECKPOINT = "checkpoint.pt"
LOG = "worker.log"
SHAPE_CACHE = ".cache/shapes"  # beside the run folders: abl.shapecache

# ---------------------------------------------------------------- statuses

QUEUED, RUNNING, COMPLETED = "queued", "running", "completed"
DIVERGED, OOM, FAILED, KILLED = "diverged", "oom", "failed", "killed"

STATUSES = (QUEUED, RUNNING, COMPLETED, DIVERGED, OOM, FAILED, KILLED)
# the worker has ended
TERMINAL = (COMPLETED, DIVERGED, OOM, FAILED, KILLED)
# ended without completing: what summaries and the dashboard count as "did not complete"
NOT_COMPLETED = (DIVERGED, OOM, FAILED, KILLED)
# re-run only with ``--retry failed``: run again as they are, they would end the same way.
# Not killed: a kill says nothing about the cell, so a plain re-run restarts it, like a
# running one whose worker is gone (README, "When things go wrong").
RETRY_FAILED = (DIVERGED, OOM, FAILED)
# the worker's exit status for each final status
EXIT_CODES = {COMPLETED: 0, FAILED: 1, DIVERGED: 3, OOM: 4, KILLED: 5}


def runs_again(status: str | None, retry_failed: bool = False) -> bool:
    """Whether ``abl run`` runs a cell whose last status is ``status`` (None: it never started)."""
    if status == COMPLETED:
        return False
    if status in RETRY_FAILED:
        return retry_failed
    return True


# ---------------------------------------------------------------- JSON files


def write_json(path: Path, obj: Any) -> None:
    """Write atomically: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return default


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """The folder's status.json, or None when it is missing or unreadable."""
    st = read_json(run_dir / STATUS)
    return st if isinstance(st, dict) else None


def write_status(run_dir: Path, status: dict[str, Any]) -> None:
    write_json(run_dir / STATUS, status)


def prepare(run_dir: Path, config: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Set a folder up for a fresh attempt: config and meta written, the old status gone.

    The previous attempt's metrics stay: the worker keeps the rows up to its
    checkpoint (``truncate_metrics``) and drops the rest.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / CONFIG, config)
    write_json(run_dir / META, meta)
    (run_dir / STATUS).unlink(missing_ok=True)
    return run_dir


def log_tail(run_dir: Path, n: int = 12) -> str:
    """The last ``n`` lines of the worker's log (what a worker that died silently left)."""
    try:
        lines = (run_dir / LOG).read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return "worker exited without a status"
    return "\n".join(lines[-n:]) or "worker exited without a status"


# ---------------------------------------------------------------- metrics.jsonl


def parse_line(line: str | bytes) -> dict[str, Any] | None:
    """One complete metrics line as a dict with an int ``step`` (0 if absent); None if damaged."""
    try:
        obj = json.loads(line)
    except ValueError:  # JSONDecodeError, or bytes that are not UTF-8
        return None
    if not isinstance(obj, dict):
        return None
    step = obj.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step):
        return None
    obj["step"] = int(step)
    return obj


def _complete_lines(path: Path):
    """The file's complete lines; a torn last line (no newline yet) ends the iteration."""
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                return
            yield line


def read_metrics(path: Path) -> list[tuple[int, str, float]]:
    """Long rows (step, name, value) of the numeric values in a metrics file (none if it is missing)."""
    rows: list[tuple[int, str, float]] = []
    try:
        lines = list(_complete_lines(path))
    except FileNotFoundError:
        return rows
    for line in lines:
        obj = parse_line(line)
        if obj is None:
            continue
        step = obj.pop("step")
        for name, value in obj.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                rows.append((step, name, float(value)))
    return rows


def tail_metrics(path: Path, offset: int) -> tuple[int, list[dict[str, Any]]]:
    """The complete lines written after byte ``offset``: (the new offset, their parsed objects).

    A file shorter than ``offset`` was truncated (a resumed worker) and is read
    from the start again.
    """
    try:
        if path.stat().st_size < offset:
            offset = 0
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return offset, []
    end = chunk.rfind(b"\n")
    if end < 0:
        return offset, []
    objs = [obj for line in chunk[: end + 1].splitlines() if (obj := parse_line(line)) is not None]
    return offset + end + 1, objs


def truncate_metrics(path: Path, last_step: int | None) -> None:
    """Keep rows up to ``last_step`` (all of them dropped if None): the rows a resumed run will write again.

    Damaged lines and a torn last line go too.
    """
    if not path.exists():
        return
    if last_step is None:
        path.unlink()
        return
    kept = [line for line in _complete_lines(path)
            if (obj := parse_line(line)) is not None and obj["step"] <= last_step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


class JsonlSink:
    """The worker's metrics sink: appends one line per ``log`` and flushes it at once."""

    def __init__(self, path: Path):
        self.f = open(path, "a", buffering=1)

    def log(self, step: int, metrics: dict) -> None:
        self.f.write(json.dumps({"step": step, **metrics}) + "\n")
        self.f.flush()

    def close(self) -> None:
        os.fsync(self.f.fileno())
        self.f.close()


class NullSink:
    """Ranks other than 0 of a multi-process cell record nothing."""

    def log(self, step: int, metrics: dict) -> None:
        pass

    def close(self) -> None:
        pass
