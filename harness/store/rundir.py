"""The run folder ``runs/<run_id>/``: the one protocol between a worker, ``abl run``, the store and the dashboard.

Files (the folders are the source of truth; the store is rebuilt from them):

- ``config.json``: the resolved cell config; ``meta.json``: the attempts'
  bookkeeping, and which plugin provided each component (``plugins``,
  abl.store.provenance.plugin_records). Both written by the ``abl run`` parent
  before launch (``prepare``);
- ``status.json``: ``{"status": one of abl.contracts.status.STATUSES, ...}``, written atomically by
  the worker as it starts and ends, and by the parent when a worker died
  without saying how;
- ``metrics.jsonl``: one JSON object per line, ``{"step": N, name: value,
  ...}``, appended and flushed per line by the worker (``JsonlSink``), so it is
  safe to read while it grows. Readers skip a torn last line (a killed writer)
  and lines that are not a metrics object;
- ``info.json`` (worker), ``worker.log`` (the worker's output),
  ``checkpoint.pt`` (kept until the cell completes).

Everything here is plain Python: the worker, the parent and the dashboard all
import it, and it imports nothing of abl but abl.files (atomic writes). The status
words it writes are abl.contracts.status's: import them from there.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import files

CONFIG = "config.json"
META = "meta.json"
STATUS = "status.json"
INFO = "info.json"
METRICS = "metrics.jsonl"
CHECKPOINT = "checkpoint.pt"
LOG = "worker.log"
SHAPES_DIR = "shapes"  # beside the database, like the token store: abl.model.shapecache (abl.store.workspace)

def pid_alive(pid: Any) -> bool:
    """Does a process with this PID exist on this machine (one of another user's counts)?"""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------- JSON files


def write_json(path: Path, obj: Any) -> None:
    """Write atomically and durably: a reader sees the old file or the new one, never half of one."""
    files.write_json(path, obj, fsync=True)


def read_json(path: Path, default: Any = None) -> Any:
    """The file's JSON, or ``default`` when it cannot be read for any reason (abl.files.read_json)."""
    return files.read_json(path, default)


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


def plugins_record(meta: Any) -> dict[str, dict[str, str]]:
    """meta.json's ``plugins`` (abl.store.provenance.plugin_records: ``"axis:name"`` -> where its plugin came
    from), the entries of the recorded shape only (a run folder is untrusted input: string keys, each a dict
    of strings); empty for a folder written before runs recorded them."""
    record = meta.get("plugins") if isinstance(meta, dict) else None
    if not isinstance(record, dict):
        return {}
    return {key: {k: v for k, v in origin.items() if isinstance(k, str) and isinstance(v, str)}
            for key, origin in record.items() if isinstance(key, str) and isinstance(origin, dict)}


def log_tail(run_dir: Path, n: int = 12, offset: int = 0) -> str:
    """The last ``n`` lines of the worker's log from byte ``offset`` on (what this attempt's worker, if it died
    silently, left; ``log_size`` as it was launched), every absolute path shortened (abl.files.scrub_paths; a
    path in the run folder as ``runs/<run_id>/...``): the parent stores them as the run's error, which travels
    with the store."""
    try:
        lines = files.read_bytes(run_dir / LOG)[offset:].decode(errors="replace").strip().splitlines()
    except OSError:
        return "worker exited without a status"
    tail = "\n".join(lines[-n:])
    return files.scrub_paths(tail, (str(Path(run_dir).absolute().parent.parent),)) or "worker exited without a status"


def log_size(run_dir: Path) -> int:
    """The size of the worker's log now (0: none yet)."""
    try:
        return (run_dir / LOG).stat().st_size
    except OSError:
        return 0


def log_text(run_dir: Path, offset: int = 0) -> str:
    """The worker's log from byte ``offset`` on ("" when it cannot be read), as written: for reading
    what a launcher reported (abl.contracts.status.torchrun_signal), never for storing."""
    try:
        return files.read_bytes(run_dir / LOG)[offset:].decode(errors="replace")
    except OSError:
        return ""


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
    return scan_metrics(path).rows


@dataclass
class MetricsScan:
    """What a metrics file holds: its rows, and the damage a reader skipped."""

    rows: list[tuple[int, str, float]] = field(default_factory=list)
    damaged_lines: list[int] = field(default_factory=list)  # 1-based numbers of complete lines that do not parse
    torn_tail: bool = False  # the last line has no newline (its writer was stopped mid-line)
    exists: bool = True
    problem: str | None = None  # why the file could not be read at all (a FIFO, a folder, no permission)


def scan_metrics(path: Path) -> MetricsScan:
    """Read a metrics file, keeping count of the lines that had to be skipped."""
    scan = MetricsScan()
    try:
        data = files.read_bytes(path)
    except FileNotFoundError:
        scan.exists = False
        return scan
    except OSError as exc:  # never opened blocking: a FIFO here would hang ingest
        scan.exists = False
        scan.problem = f"{path.name} cannot be read ({exc.strerror or exc}); skipped"
        return scan
    lines = data.split(b"\n")
    scan.torn_tail = lines[-1] != b""
    for number, line in enumerate(lines[:-1], 1):
        obj = parse_line(line)
        if obj is None or not -(2**31) <= obj["step"] < 2**31:  # the store's step column is INTEGER
            scan.damaged_lines.append(number)
            continue
        step = obj.pop("step")
        for name, value in obj.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                scan.rows.append((step, name, float(value)))
    return scan


# what a run that completed has always written (harness/train/loop.py): the parameter count at
# step 0, one train_loss per step, and at the last step its val_loss and the summary row
FIRST_ROW = ("n_params",)
LAST_ROW = ("val_loss", "wall_s", "peak_mem_bytes")


def check_complete(scan: MetricsScan, steps: int) -> list[str]:
    """Why a run that says completed is not whole (empty when it is): damaged lines,
    missing or repeated steps, a missing first or last row."""
    problems: list[str] = []
    if not scan.exists:
        return [scan.problem or "metrics.jsonl is missing"]
    if scan.damaged_lines:
        shown = ", ".join(map(str, scan.damaged_lines[:5])) + (", ..." if len(scan.damaged_lines) > 5 else "")
        problems.append(f"metrics.jsonl has {len(scan.damaged_lines)} damaged line(s) (line {shown})")
    if scan.torn_tail:
        problems.append("metrics.jsonl ends in a cut line")
    seen: dict[int, int] = {}
    names_at: dict[int, set[str]] = {}
    for step, name, _ in scan.rows:
        names_at.setdefault(step, set()).add(name)
        if name == "train_loss":
            seen[step] = seen.get(step, 0) + 1
    missing = [s for s in range(1, steps + 1) if s not in seen]
    repeated = sorted(s for s, n in seen.items() if n > 1)
    if missing:
        problems.append(f"train_loss of {len(missing)} of {steps} steps is missing ({_ranges(missing)})")
    if repeated:
        problems.append(f"train_loss of {len(repeated)} step(s) is written more than once ({_ranges(repeated)})")
    for step, wanted in ((0, FIRST_ROW), (steps, LAST_ROW)):
        absent = [n for n in wanted if n not in names_at.get(step, set())]
        if absent:
            problems.append(f"no {', '.join(absent)} at step {step}")
    return problems


def _ranges(steps: list[int]) -> str:
    out, start, prev = [], steps[0], steps[0]
    for s in steps[1:] + [None]:  # type: ignore[list-item]
        if s is not None and s == prev + 1:
            prev = s
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if s is not None:
            start = prev = s
    return ", ".join(out[:6]) + (", ..." if len(out) > 6 else "")


def tail_metrics(path: Path, offset: int) -> tuple[int, list[dict[str, Any]]]:
    """The complete lines written after byte ``offset``: (the new offset, their parsed objects).

    A file shorter than ``offset`` was truncated (a resumed worker) and is read
    from the start again.
    """
    try:
        if not path.is_file():  # missing, or a FIFO or folder: nothing to follow (never opened blocking)
            return offset, []
        if path.stat().st_size < offset:
            offset = 0
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except OSError:
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
    if last_step is None or not path.is_file():  # a FIFO or folder is no metrics file: gone, written anew
        path.unlink() if not path.is_dir() else None
        return
    kept = [line for line in _complete_lines(path)
            if (obj := parse_line(line)) is not None and obj["step"] <= last_step]
    files.write_text(path, "".join(kept), fsync=True)


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
