"""The DuckDB store: opening and migrating it (the schema's steps: abl.store.migrations), ingest of run folders,
queries.

Only one process writes the database: the ``abl run`` parent (or ``abl
ingest``). Workers write run folders (see harness/store/rundir.py); the folders are
the source of truth and the database can be rebuilt from them with
``abl ingest``. Connections are opened briefly so readers are not blocked for
long.
"""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import duckdb

from ..analysis import health
from ..analysis import metrics as catalogue
from ..analysis.tables import settings_of
from ..contracts.config import ConfigError, canonical_config, run_id_of
from ..contracts.status import COMPLETED, INCOMPLETE, QUEUED
from ..contracts.status import settle_gone
from . import rundir
from .migrations import MIGRATIONS  # the numbered schema steps ``migrate`` applies


class StoreError(Exception):
    """The database cannot be opened or migrated (reported to the user)."""


def is_lock_conflict(exc: Exception) -> bool:
    """DuckDB's own file lock is held by another process (a reader such as the dashboard)."""
    return "Could not set lock" in str(exc) or "Conflicting lock" in str(exc)


# what DuckDB says of a file whose blocks are damaged or missing (a bad disk, a cut copy)
DAMAGE_SIGNS = ("corrupt", "checksum", "could not read enough bytes", "serialization", "internal error")


def is_damage(exc: Exception) -> bool:
    """DuckDB's error means the file's blocks are damaged or missing (not a lock, not a missing folder)."""
    text = str(exc).lower()
    return any(sign in text for sign in DAMAGE_SIGNS)


def damaged(path: str | Path, exc: Exception) -> StoreError:
    """The one message for a damaged store: the file, what is wrong with it, and what to do."""
    text = str(exc).lower()
    if "could not read enough bytes" in text:
        why = "it is shorter than its own blocks: cut off, e.g. by a full disk or a copy that stopped"
    elif "checksum" in text or "corrupt" in text:
        why = "a block's checksum does not match its contents: bytes in it were overwritten"
    else:
        why = "DuckDB cannot read its contents back"
    return StoreError(
        f"{path} is damaged ({why}); nothing was run, read or written. Keep the file (it may still be "
        f"recovered), give another --db, or rebuild the store from the run folders: move the file aside "
        f"and run abl ingest --db {path} (with --runs-dir if the run folders are not in runs/ beside it)")


def verify_store(path: str | Path) -> None:
    """Read every block of an existing store once, before any work: a damaged one raises ``damaged``
    (StoreError). A scan of every column of every table (DuckDB checks each block's checksum as it
    reads it); about a second per few million metric rows."""
    p = Path(path)
    if not p.is_file():
        return
    con = connect(p, read_only=True)
    try:
        tables = con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT internal").fetchall()
        for (table,) in tables:
            cols = [r[0] for r in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE table_name = ? AND NOT internal", [table]).fetchall()]
            if cols:
                quoted = ", ".join('"' + c.replace('"', '""') + '"' for c in cols)
                con.execute(f'SELECT bit_xor(hash({quoted})) FROM "{table.replace(chr(34), chr(34) * 2)}"').fetchall()
    except duckdb.Error as exc:
        if is_damage(exc):
            raise damaged(path, exc) from None
        raise StoreError(f"cannot read database {path}: {str(exc).splitlines()[0]}") from None
    finally:
        con.close()


def connect(path: str | Path, read_only: bool = False, retries: int = 50) -> duckdb.DuckDBPyConnection:
    """Open the database, retrying briefly while another process holds DuckDB's file lock.

    Any other failure (a folder, a file that is not a database, no such
    folder, a damaged file) is reported at once.
    """
    p = Path(path)
    if not read_only:
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the folder of database {path}: {exc.strerror or exc}") from None
    last: Exception | None = None
    for _ in range(retries):
        try:
            return duckdb.connect(str(p), read_only=read_only)
        except duckdb.Error as exc:
            if is_damage(exc):
                raise damaged(path, exc) from None
            if not is_lock_conflict(exc):
                raise StoreError(f"cannot open database {path}: {exc}") from None
            last = exc
            time.sleep(0.1)
    raise StoreError(f"cannot open database {path}: {last}")


def applied_versions(con) -> set[int]:
    con.execute("CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP)")
    return {int(r[0]) for r in con.execute("SELECT version FROM schema_migrations").fetchall()}


def migrate(con) -> int:
    """Apply every migration not applied yet, in version order; returns the schema version."""
    done = applied_versions(con)
    current = max(done, default=0)
    for version, name, sql in sorted(MIGRATIONS):
        if version in done:
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            for stmt in [s for s in sql.split(";") if s.strip()]:
                con.execute(stmt)
            con.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)",
                        [version, name, datetime.now(timezone.utc).replace(tzinfo=None)])
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
        current = max(current, version)
    return current


def open_store(path: str | Path) -> duckdb.DuckDBPyConnection:
    con = connect(path)
    migrate(con)
    return con


# ---------------------------------------------------------------- run folders


def _ts(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).replace(tzinfo=None)


def ingest_run(con, run_dir: Path, status_override: str | None = None) -> str:
    """Copy one run folder into the store (idempotent). Returns the run's status."""
    config = rundir.read_json(run_dir / rundir.CONFIG)
    if not isinstance(config, dict) or not {"experiment", "seed"} <= set(config):
        raise StoreError(f"{run_dir}: no readable config.json; not a run folder")
    try:  # the store keeps one shape of config whichever version wrote the folder (abl.contracts.config)
        stored_config = canonical_config(config)
    except ConfigError as exc:
        raise StoreError(f"{run_dir}: {exc}") from None
    if (hashed := run_id_of(config)) != run_dir.name:  # the run id is the hash of its config
        raise StoreError(f"{run_dir}: config.json does not hash to its folder's name (run id {run_dir.name}, "
                         f"config hashes to {hashed}): edited after it ran, or copied under another name; not stored")
    meta = rundir.read_json(run_dir / rundir.META, {})
    status = rundir.read_status(run_dir) or {"status": QUEUED}
    if status_override is None and (settled := settle_gone(status, rundir.pid_alive(status.get("pid")))):
        status = settled  # left running by a worker that is gone: killed, the folder too (they agree)
        with suppress(OSError):  # a read-only folder keeps its file; the store still says killed
            rundir.write_status(run_dir, status)
    info = rundir.read_json(run_dir / rundir.INFO, {})
    state = status_override or status.get("status", QUEUED)
    run_id = run_dir.name
    scan = rundir.scan_metrics(run_dir / rundir.METRICS)
    rows = scan.rows
    # unigram floor, did_not_learn, loss spikes, contended (from load_per_core and cpu_util): abl.analysis.health
    rows += health.derived_rows(rows, info)
    error = status.get("error")
    damage = None
    if status_override is None and rundir.read_status(run_dir) is None:
        state, error = no_status(run_dir, scan)
    if state == COMPLETED:
        problems = rundir.check_complete(scan, _int(config.get("train", {}).get("steps")))
        if problems:
            state = INCOMPLETE
            error = ("the worker completed, but its run folder is not whole: " + "; ".join(problems)
                     + f". Repair {run_dir / rundir.METRICS} and run abl ingest, or run the grid again")
    elif scan.damaged_lines:
        damage = f"metrics.jsonl: {len(scan.damaged_lines)} damaged line(s) skipped"
    elif scan.problem:
        damage = scan.problem
    notes = "; ".join(n for n in (meta.get("notes"), status.get("notes"), damage) if n) or None
    seed = config["seed"]
    if not isinstance(seed, int) or not INT32[0] <= seed <= INT32[1]:
        raise StoreError(f"{run_dir}: seed {seed!r} does not fit the store's INTEGER column")
    grid, plugins = grid_record(meta.get("grid")), json.dumps(rundir.plugins_record(meta), sort_keys=True)
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM runs WHERE run_id = ?", [run_id])
        con.execute(
            "INSERT INTO runs (run_id, experiment, cell_key, label, seed, status, config, started,"
            " finished, git_commit, versions, device, env, data_fingerprint, grid_file, notes, error,"
            " attempts, code_changed, executor, grid_paths, grid_index, grid_varied, plugins)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [run_id, config["experiment"], meta.get("cell_key"), meta.get("label"), config["seed"], state,
             json.dumps(stored_config, sort_keys=True), _ts(status.get("started")), _ts(status.get("finished")),
             meta.get("git_commit"), json.dumps(meta.get("versions", {}), sort_keys=True),
             info.get("device"), json.dumps(info, sort_keys=True), info.get("data_fingerprint"),
             meta.get("grid_file"), notes, error, meta.get("attempts", 1),
             bool(meta.get("code_changed", False)), meta.get("executor"),
             None if grid is None else json.dumps(grid["paths"]), None if grid is None else grid["index"],
             None if grid is None else json.dumps(grid["varied"], sort_keys=True, default=str), plugins],
        )
        write_settings(con, run_id, stored_config)
        con.execute("DELETE FROM metrics WHERE run_id = ?", [run_id])
        if rows:
            steps, names, values = zip(*rows)
            con.execute(
                "INSERT INTO metrics SELECT ?, s, n, v FROM "
                "(SELECT unnest(?) AS s, unnest(?) AS n, unnest(?) AS v)",
                [run_id, list(steps), list(names), list(values)],
            )
        con.execute("COMMIT")
    except duckdb.Error as exc:
        con.execute("ROLLBACK")
        raise StoreError(f"{run_dir}: cannot store the run: {exc}") from None
    except Exception:
        con.execute("ROLLBACK")
        raise
    return state


def grid_record(record: Any) -> dict[str, Any] | None:
    """meta.json's ``grid`` object (abl.contracts.config.Cell.grid_record) when it has the recorded shape
    (a run folder is untrusted input): swept paths (strings), the cell's index among the grid's points
    (a non-negative int that fits the store, or None) and its swept settings; else None (a folder
    written before runs recorded their grid, or a damaged one)."""
    if not isinstance(record, dict):
        return None
    paths, index, varied = record.get("paths"), record.get("index"), record.get("varied")
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths) or not isinstance(varied, dict):
        return None
    if not (isinstance(index, int) and not isinstance(index, bool) and 0 <= index <= INT32[1]):
        index = None
    return {"paths": paths, "index": index, "varied": varied}


def write_settings(con, run_id: str, config: dict[str, Any]) -> None:
    """The run's flattened settings (abl.analysis.tables.settings_of) as ``run_settings`` rows, one per
    path, the value as JSON: the one place a stored run's settings are flattened (inside the caller's
    transaction)."""
    flat = settings_of(config)
    con.execute("DELETE FROM run_settings WHERE run_id = ?", [run_id])
    if flat:
        con.execute("INSERT INTO run_settings SELECT ?, p, v FROM (SELECT unnest(?) AS p, unnest(?) AS v)",
                    [run_id, list(flat), [json.dumps(v, sort_keys=True, default=str) for v in flat.values()]])


# the range of the store's INTEGER columns (runs.seed, runs.attempts, metrics.step)
INT32 = (-(2**31), 2**31 - 1)


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def no_status(run_dir: Path, scan: rundir.MetricsScan) -> tuple[str, str]:
    """A folder whose status.json is missing or unreadable: never stored as a plain "queued".
    With metric rows its worker ran and its end is unknown (incomplete); without, it never started."""
    what = "missing" if not (run_dir / rundir.STATUS).exists() else "unreadable"
    if scan.rows:
        return INCOMPLETE, (f"status.json is {what}, yet metrics.jsonl holds {len(scan.rows)} row(s): "
                                   "how its worker ended is unknown; run the grid again to train it")
    return QUEUED, f"status.json is {what}: its worker never started (run the grid to train it)"


def ingest_dirs(db_path: str | Path, run_dirs: Iterable[Path],
                skipped: list[tuple[Path, str]] | None = None) -> dict[str, str]:
    """Ingest each folder; returns {run id: status}. With ``skipped``, a folder that cannot be ingested
    (no readable config.json, ...) is listed there with why, and the rest go on; without, it raises."""
    with storage_errors(db_path):
        con = open_store(db_path)
        try:
            out: dict[str, str] = {}
            for d in run_dirs:
                try:
                    out[d.name] = ingest_run(con, d)
                except StoreError as exc:
                    if skipped is None:
                        raise
                    skipped.append((d, str(exc).removeprefix(f"{d}: ")))
            return out
        finally:
            con.close()


@contextmanager
def storage_errors(db_path: str | Path) -> Iterator[None]:
    """DuckDB's failed writes (a full disk: ``IOException``) as the OSError they are, so every caller
    handles a full disk one way (abl run and abl ingest: a message and exit 1, the folders keep the truth)."""
    try:
        yield
    except duckdb.IOException as exc:
        text = str(exc)
        code = errno.ENOSPC if "No space left" in text else errno.EIO
        raise OSError(code, text.splitlines()[0] if text else "write failed", str(db_path)) from None


# ---------------------------------------------------------------- queries


def completed_rates(db_path: str | Path, limit: int = 50) -> dict[str, list[float]]:
    """The work per wall second of the latest completed runs in the store (read-only; empty without one):
    ``flops`` (the cost model's FLOPs per step x steps / wall_s) and ``tokens`` (batch x context x steps /
    wall_s). abl.run.estimate's speed before this run has measured its own."""
    out: dict[str, list[float]] = {"flops": [], "tokens": []}
    if not Path(db_path).exists():
        return out
    try:
        con = connect(db_path, read_only=True)
    except (duckdb.Error, OSError):
        return out
    try:
        if "runs" not in {r[0] for r in con.execute("SHOW TABLES").fetchall()}:
            return out
        rows = con.execute(
            "SELECT r.config, max(CASE WHEN m.name = 'wall_s' THEN m.value END),"
            " max(CASE WHEN m.name = 'flops_per_step_predicted' THEN m.value END)"
            " FROM runs r JOIN metrics m USING (run_id) WHERE r.status = 'completed'"
            " AND m.name IN ('wall_s', 'flops_per_step_predicted')"
            " GROUP BY r.run_id, r.config, r.finished ORDER BY r.finished DESC NULLS LAST LIMIT ?", [limit]).fetchall()
    except duckdb.Error:
        return out
    finally:
        con.close()
    for config, wall, flops in rows:
        try:
            cfg = json.loads(config)
            steps, tokens = int(cfg["train"]["steps"]), int(cfg["train"]["batch_size"]) * int(cfg["model"]["context"])
        except (ValueError, KeyError, TypeError):
            continue
        if not wall or wall <= 0:
            continue
        out["tokens"].append(tokens * steps / wall)
        if flops:
            out["flops"].append(flops * steps / wall)
    return out


def statuses(db_path: str | Path, run_ids: list[str]) -> dict[str, str]:
    """Status of each given run id that is in the store (read-only; empty if no store)."""
    if not Path(db_path).exists() or not run_ids:
        return {}
    con = connect(db_path, read_only=True)
    try:
        if "runs" not in {r[0] for r in con.execute("SHOW TABLES").fetchall()}:
            return {}
        rows = con.execute("SELECT run_id, status FROM runs WHERE list_contains(?, run_id)",
                           [run_ids]).fetchall()
        return dict(rows)
    finally:
        con.close()


# A run's last value of a metric: the value logged at its highest step (a resumed run
# stores each step once, so the highest step is the last one written).
FINAL_VALUE = "arg_max(value, step)"
# the highest step a metric was logged at
LAST_STEP = "max(step)"
# the SQL of each aggregate the metric catalogue (abl.analysis.metrics) may name as a final value
AGGREGATE_SQL = {catalogue.LAST: FINAL_VALUE, catalogue.MEDIAN: "median(value)", catalogue.MAX: "max(value)"}


def _quoted(names) -> str:
    return ", ".join("'" + n.replace("'", "''") + "'" for n in names)


def final_aggregate_sql(column: str = "name") -> str:
    """A SQL expression over a metric-name column: ``'last'``, ``'median'`` or ``'max'``, the catalogue's
    final aggregate of that metric (its own entry, else the first family whose pattern matches)."""
    parts = []
    for agg in catalogue.AGGREGATES:
        names = [n for n, m in catalogue.entries().items() if m.final == agg]  # abl's and the plugins' metrics
        if names:
            parts.append(f"WHEN {column} IN ({_quoted(names)}) THEN '{agg}'")
    for fam in catalogue.families():
        pattern = fam.pattern.replace("'", "''")
        parts.append(f"WHEN regexp_full_match({column}, '{pattern}') THEN '{fam.final}'")
    return f"(CASE {' '.join(parts)} ELSE '{catalogue.LAST}' END)"


def final_value_sql(column: str = "name") -> str:
    """The aggregate expression of a query grouped by run and metric: each metric's final value as the
    catalogue defines it (the peak of memory, the median of per-step throughput, else the last value)."""
    which = final_aggregate_sql(column)
    median = f"{AGGREGATE_SQL[catalogue.MEDIAN]} FILTER (WHERE {which} = '{catalogue.MEDIAN}')"
    return (f"CASE {which} WHEN '{catalogue.MEDIAN}' THEN {median} "
            f"WHEN '{catalogue.MAX}' THEN {AGGREGATE_SQL[catalogue.MAX]} ELSE {FINAL_VALUE} END")


def final_values_sql(where: str = "TRUE", *, metrics: str = "metrics", agg: str | None = None) -> str:
    """A query of ``(run_id, name, value)``: one row per run and metric among the rows matching ``where``.

    ``value`` is the run's final value of the metric as the metric catalogue
    (abl.analysis.metrics) defines it, or ``agg`` of its rows (``LAST_STEP``:
    the highest step). ``metrics``: the table or subquery to read (the
    dashboard passes one that adds running cells' rows).
    """
    return (f"SELECT run_id, name, {agg or final_value_sql()} AS value FROM {metrics} WHERE {where} "
            "GROUP BY run_id, name")


def append_rows(db_path: str | Path, table: str, columns: Iterable[str], rows: Iterable[Iterable[Any]]) -> None:
    """Append ``rows`` (values in ``columns`` order) to ``table`` of the store, migrating it first: the one
    writer of the ``bench`` and ``selftest`` tables (abl bench, abl selftest). Table and columns are the
    callers' own constants, never user input; the values are bound parameters."""
    columns, values = list(columns), [list(r) for r in rows]
    if not values:
        return
    con = open_store(db_path)
    try:
        cols = ", ".join(f'"{c}"' for c in columns)
        con.executemany(f'INSERT INTO "{table}" ({cols}) VALUES ({", ".join("?" for _ in columns)})', values)
    finally:
        con.close()


# the speed pass's figures (abl.run.speedpass): one row per run of a shape timed alone on its device
SPEED_PASS_COLUMNS = ("run_id", "shape", "timed_run", "tokens_per_s", "mfu", "warmup_steps", "timed_steps",
                      "device", "created", "reason")


def store_speed_pass(db_path: str | Path, rows: Iterable[Iterable[Any]]) -> None:
    """Store speed-pass rows (values in ``SPEED_PASS_COLUMNS`` order; ``created`` as a POSIX time), each
    replacing the run's earlier row. The runs' own metrics are never touched."""
    values = [list(r) for r in rows]
    if not values:
        return
    at = SPEED_PASS_COLUMNS.index("created")
    for v in values:
        v[at] = _ts(v[at])
    con = open_store(db_path)
    try:
        con.execute("BEGIN TRANSACTION")
        con.execute("DELETE FROM speed_pass WHERE list_contains(?, run_id)", [[v[0] for v in values]])
        con.executemany(f"INSERT INTO speed_pass ({', '.join(SPEED_PASS_COLUMNS)}) "
                        f"VALUES ({', '.join('?' for _ in SPEED_PASS_COLUMNS)})", values)
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    finally:
        con.close()
