"""Read-only connections to the store for a long-lived reader (the dashboard): short-lived, never
blocking the writer.

The ``abl run`` parent is the only writer of the store and opens it briefly
for each ingest. DuckDB refuses a read-only connection while another process
holds a read-write one (and the reverse), so the dashboard never keeps a
connection: a query opens the file read-only and closes it at once, or the
queries of one page render share a connection (``Store.session``) that is
reopened after ``MAX_HOLD_S`` and closed when the render ends. Opening retries
for a moment while the writer holds the lock (then ``StoreBusy``, shown as a
message); the writer retries the same way, so neither waits for long.

Metrics of cells still running are read from their growing
``runs/<run_id>/metrics.jsonl`` (see abl.store.rundir) and joined to the
stored rows inside DuckDB (``Live``), so every page shows in-progress runs.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import duckdb
import pandas as pd

from abl.contracts.status import RUNNING
from . import rundir
from .reader import SPEED_PASS_METRICS
from abl.store.workspace import DEFAULT_DB, Workspace

# A page render shares one read-only connection, but holds it at most this long
# before reopening, so a waiting writer (abl run retries for 5 s) gets its turn.
MAX_HOLD_S = 1.0
_local = threading.local()


class StoreUnavailable(Exception):
    """The store cannot be read right now; the message is shown to the user as is."""


class StoreBusy(StoreUnavailable):
    """The writer held the lock for longer than we were willing to wait."""


# ---------------------------------------------------------------- live runs


@dataclass(frozen=True)
class Live:
    """Metrics of the runs that the store lists as running, read from their run folders."""

    key: tuple = ()
    frame: pd.DataFrame | None = None  # run_id, step, name, value
    progress: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.frame is not None and len(self.frame) > 0


# ---------------------------------------------------------------- the store


@dataclass(frozen=True)
class Store:
    db: str
    runs_dir: str

    @classmethod
    def from_env(cls) -> "Store":
        ws = Workspace.resolve(os.environ.get("ABL_DB"), runs_option=os.environ.get("ABL_RUNS_DIR"))
        return cls(db=str(ws.db), runs_dir=str(ws.runs))

    def signature(self) -> tuple:
        """Changes whenever the writer commits (the file or its WAL changes)."""
        out: list[tuple[int, int] | None] = []
        for p in (self.db, self.db + ".wal"):
            try:
                s = os.stat(p)
                out.append((s.st_mtime_ns, s.st_size))
            except FileNotFoundError:
                out.append(None)
        return tuple(out)

    def _connect(self, retry_s: float) -> duckdb.DuckDBPyConnection:
        if not Path(self.db).exists():
            raise StoreUnavailable(
                f"No database at {self.db}. Run a grid first (abl run ablations/norms.toml), "
                "or point the dashboard at one with abl dashboard --db PATH.")
        deadline = time.monotonic() + retry_s
        delay = 0.02
        while True:
            try:
                con = duckdb.connect(self.db, read_only=True)
                # a missing table must be an error, never a Python variable of that name
                con.execute("SET python_enable_replacements = false")
                return con
            except (duckdb.IOException, duckdb.ConnectionException) as exc:
                if "lock" not in str(exc).lower():
                    raise StoreUnavailable(f"Cannot open {self.db}: {exc}") from None
                if time.monotonic() > deadline:
                    raise StoreBusy(
                        f"The database {self.db} is busy: abl run is writing to it. "
                        "Its writes take a moment; refresh the page.") from None
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.25)

    @contextmanager
    def session(self) -> Iterator[None]:
        """Let the queries inside share read-only connections (one page render).

        The connection opens at the first query and is replaced by a fresh one
        when it has been open for ``MAX_HOLD_S``, so a writer waiting for the
        lock gets its turn between two queries; it is closed on exit.
        """
        outer = getattr(_local, "session", None)
        _local.session = {"db": self.db, "con": None, "opened": 0.0}
        try:
            yield
        finally:
            con = _local.session["con"]
            _local.session = outer
            if con is not None:
                con.close()

    def query(self, sql: str, params: Sequence[Any] | None = None, live: Live | None = None,
              retry_s: float = 4.0) -> pd.DataFrame:
        """Run one statement read-only: on the session's connection, else on its own.

        ``{metrics}`` in ``sql`` stands for the metrics table, with the rows
        of running cells taken from their run folders when ``live`` has any,
        and the speed pass's figures (abl.run.speedpass) as metric rows.
        """
        sess = getattr(_local, "session", None)
        if sess is not None and sess["db"] == self.db:
            if sess["con"] is not None and time.monotonic() - sess["opened"] > MAX_HOLD_S:
                sess["con"].close()
                sess["con"] = None
            if sess["con"] is None:
                sess["con"] = self._connect(retry_s)
                sess["opened"] = time.monotonic()
            con, owned = sess["con"], False
        else:
            con, owned = self._connect(retry_s), True
        registered = False
        try:
            src = "metrics"
            if "{metrics}" in sql and _has_table(con, "speed_pass"):  # abl.run.speedpass's figures, as metrics
                src = f"(SELECT run_id, step, name, value FROM metrics UNION ALL {SPEED_PASS_ROWS})"
            if live:
                con.register("live_metrics", live.frame)
                registered = True
                src = (f"(SELECT run_id, step, name, value FROM {src} WHERE run_id NOT IN "
                       "(SELECT DISTINCT run_id FROM live_metrics) "
                       "UNION ALL SELECT run_id, step, name, value FROM live_metrics)")
            return con.execute(sql.replace("{metrics}", src), list(params or [])).df()
        except duckdb.CatalogException as exc:
            raise StoreUnavailable(f"{self.db} is not an abl store (or is older than this "
                                   f"dashboard): {str(exc).splitlines()[0]}") from None
        finally:
            if owned:
                con.close()
            elif registered:
                con.unregister("live_metrics")

    def tables(self) -> set[str]:
        return set(self.query("SELECT table_name FROM duckdb_tables()")["table_name"])

    def columns(self, table: str) -> list[str]:
        df = self.query("SELECT column_name FROM duckdb_columns() WHERE table_name = ? "
                        "ORDER BY column_index", [table])
        return list(df["column_name"])

    def run_dir(self, run_id: str) -> Path:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", run_id) or run_id in (".", ".."):
            raise ValueError(f"not a run id: {run_id!r}")
        return Path(self.runs_dir) / run_id


def running_ids(store: Store) -> list[str]:
    if "runs" not in store.tables():
        return []
    return list(store.query("SELECT run_id FROM runs WHERE status = ? ORDER BY run_id", [RUNNING])["run_id"])


def live_key(store: Store, run_ids: Sequence[str]) -> tuple:
    """Changes whenever a running cell appends to its metrics file."""
    key: list[tuple] = []
    for run_id in run_ids:
        try:
            st = (store.run_dir(run_id) / rundir.METRICS).stat()
            key.append((run_id, st.st_mtime_ns, st.st_size))
        except (FileNotFoundError, ValueError):
            key.append((run_id, None))
    return tuple(key)


def live_snapshot(store: Store, run_ids: Sequence[str] | None = None) -> Live:
    """Read the metrics files of the runs the store lists as running."""
    ids = running_ids(store) if run_ids is None else list(run_ids)
    frames, progress = [], {}
    now = time.time()
    for run_id in ids:
        d = store.run_dir(run_id)
        path = d / rundir.METRICS
        info: dict[str, Any] = {"step": None, "age_s": None, "folder_status": _folder_status(d)}
        progress[run_id] = info
        try:
            info["age_s"] = now - path.stat().st_mtime
        except FileNotFoundError:
            continue
        rows = rundir.read_metrics(path)
        if not rows:
            continue
        df = pd.DataFrame(rows, columns=["step", "name", "value"])
        df.insert(0, "run_id", run_id)
        frames.append(df)
        for name in ("train_loss", "val_loss"):
            sub = df[df["name"] == name]
            if len(sub):
                info[name] = float(sub["value"].iloc[-1])
                if name == "train_loss":
                    info["step"] = int(sub["step"].iloc[-1])
    frame = None
    if frames:
        frame = pd.concat(frames, ignore_index=True).astype(
            {"run_id": str, "step": "int64", "name": str, "value": "float64"})
    return Live(key=live_key(store, ids), frame=frame, progress=progress)


def _folder_status(run_dir: Path) -> str | None:
    return (rundir.read_status(run_dir) or {}).get("status")


# the speed pass's figures (abl.run.speedpass, the store's speed_pass table) as metric rows of the runs they
# cover, at each run's last step, named as abl.store.reader names them (``SPEED_PASS_METRICS``)
SPEED_PASS_ROWS = " UNION ALL ".join(
    f"SELECT s.run_id, (SELECT max(m.step) FROM metrics m WHERE m.run_id = s.run_id) AS step, '{name}' AS name, "
    f"s.{column} AS value FROM speed_pass s WHERE s.{column} IS NOT NULL"
    for column, name in SPEED_PASS_METRICS.items())


def _has_table(con, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'main' AND table_name = ?",
                            [name]).fetchall()[0][0])
