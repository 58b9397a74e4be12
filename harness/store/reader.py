"""The one reader of stored runs: ``read_runs`` gives ``StoredRun`` records.

Every display of stored runs reads them here: the run summary and ``abl
compare`` (abl.present.summary), ``abl report`` (abl.present.report), the task
report, the learning-rate sweep's phase 2, the benchmarks and the dashboard.
A run comes with what its grid knew (its grid paths, its index among the grid
file's points, its varied settings: recorded at ingest, abl.store.database),
its flattened settings, each metric's final value as the metric catalogue
(abl.analysis.metrics) defines it, and, on demand, its curves.

The connection is read-only, so an older store is never migrated here: a
column or table it lacks reads as empty (None, [] or {}).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Sequence

from . import database as store


class NotAStore(store.StoreError):
    """No database at the path, or one without a runs table (nothing ran yet): a user error."""


@dataclass
class StoredRun:
    """One stored run, as every reader sees it."""

    run_id: str
    experiment: str
    cell_key: str
    label: str
    seed: int
    status: str
    config: dict  # the store's one config shape (abl.contracts.config.canonical_config)
    git_commit: str = "unknown"
    versions: dict = field(default_factory=dict)
    device: str = "unknown"
    env: dict = field(default_factory=dict)  # the run's info.json
    data_fingerprint: str = "unknown"
    grid_file: str = ""
    notes: str = ""
    error: str | None = None
    started: datetime | None = None
    finished: datetime | None = None
    attempts: int = 1
    executor: str | None = None
    # its shape's speed timed alone after a packed grid (abl.run.speedpass; the store's speed_pass row:
    # tokens_per_s, mfu, warmup_steps, timed_steps, device, timed_run, reason); empty when none was.
    # Its figures are in ``final`` too, as alone_tokens_per_s and alone_mfu
    speed_pass: dict = field(default_factory=dict)
    grid_paths: list[str] = field(default_factory=list)  # the grid's swept paths, in file order
    grid_index: int | None = None  # the cell's 0-based position among the grid file's points
    grid_varied: dict = field(default_factory=dict)  # the cell's swept settings, path -> value
    settings: dict = field(default_factory=dict)  # every flattened setting, path -> value
    final: dict = field(default_factory=dict)  # metric name -> final value (abl.analysis.metrics)
    curves: dict = field(default_factory=dict)  # metric name -> [(step, value)], the names asked for
    # "axis:name" -> which plugin provided that component (abl.store.provenance.plugin_records); empty for a
    # run recorded before runs kept it
    plugins: dict = field(default_factory=dict)

    @property
    def tokens_per_step(self) -> int:
        return int(self.config["train"]["batch_size"]) * int(self.config["model"]["context"])

    @property
    def scored_targets(self) -> dict:
        """Fingerprints of what its validation figures were scored on (abl.analysis.verdicts)."""
        return self.env.get("scored_targets") or {}

    @property
    def data_key(self) -> tuple:
        """What fixes the data order apart from the seed (see harness/analysis/stats/)."""
        return (self.data_fingerprint, self.config["model"]["context"], self.config["train"]["batch_size"])


def _json(text: Any, default: Any) -> Any:
    if text is None:
        return default
    if isinstance(text, (dict, list)):
        return text
    try:
        out = json.loads(text)
    except (TypeError, ValueError):
        return default
    return out if isinstance(out, type(default)) else default


# runs columns read, each with how a missing one (an older store) or a NULL reads
_COLUMNS: dict[str, Any] = {
    "run_id": None, "experiment": None, "cell_key": None, "label": None, "seed": None, "status": None,
    "config": None, "git_commit": None, "versions": None, "device": None, "env": None,
    "data_fingerprint": None, "grid_file": None, "notes": None, "error": None, "started": None,
    "finished": None, "attempts": None, "executor": None, "grid_paths": None, "grid_index": None,
    "grid_varied": None, "plugins": None,
}


def _tables(con) -> set[str]:
    return {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()}


def _columns(con, table: str) -> set[str]:
    return {r[0] for r in con.execute("SELECT column_name FROM duckdb_columns() WHERE schema_name = 'main' "
                                      "AND table_name = ?", [table]).fetchall()}


def _record(row: dict[str, Any]) -> StoredRun:
    run_id = row["run_id"]
    paths = _json(row["grid_paths"], [])
    return StoredRun(
        run_id=run_id, experiment=row["experiment"], cell_key=row["cell_key"] or run_id, label=row["label"] or "",
        seed=row["seed"], status=row["status"], config=_json(row["config"], {}),
        git_commit=row["git_commit"] or "unknown", versions=_json(row["versions"], {}),
        device=row["device"] or "unknown", env=_json(row["env"], {}),
        data_fingerprint=row["data_fingerprint"] or "unknown", grid_file=row["grid_file"] or "",
        notes=row["notes"] or "", error=row["error"], started=row["started"], finished=row["finished"],
        attempts=row["attempts"] if row["attempts"] is not None else 1, executor=row["executor"],
        grid_paths=[str(p) for p in paths], grid_index=row["grid_index"], grid_varied=_json(row["grid_varied"], {}),
        plugins=_json(row["plugins"], {}))


def read_runs(db_path: str | Path, *, experiment: str | None = None, run_ids: Sequence[str] | None = None,
              metrics: Iterable[str] | None = None, curves: Iterable[str] = ()) -> list[StoredRun]:
    """The stored runs of ``experiment`` or with the given ``run_ids`` (neither: every run), read-only, in
    the order they started (then by run id).

    ``metrics``: the metrics whose final value each run's ``final`` holds; None: every metric stored for
    those runs (so a plugin's metric reaches every display). ``curves``: the metrics whose every row
    ``curves`` holds, as ``[(step, value)]`` by step. Raises ``NotAStore`` when there is no database at
    ``db_path`` or it has no runs table, StoreError when it cannot be read.
    """
    if not Path(db_path).exists():
        raise NotAStore(f"no database at {db_path} (abl run writes it; --db picks another)")
    con = store.connect(db_path, read_only=True)
    try:
        tables = _tables(con)
        if "runs" not in tables:
            raise NotAStore(f"{db_path} has no runs table: not an abl database, or nothing ran yet")
        have = _columns(con, "runs")
        select = ", ".join(c if c in have else f"NULL AS {c}" for c in _COLUMNS)
        where = "TRUE"
        params: list[Any] = []
        if run_ids is not None:
            where, params = "list_contains(?, run_id)", [list(run_ids)]
        if experiment is not None:
            where, params = f"{where} AND experiment = ?", [*params, experiment]
        cur = con.execute(f"SELECT {select} FROM runs WHERE {where} ORDER BY started NULLS LAST, run_id", params)
        names = [d[0] for d in cur.description]
        runs = [_record(dict(zip(names, r))) for r in cur.fetchall()]
        if not runs:
            return runs
        by_id = {r.run_id: r for r in runs}
        ids = list(by_id)
        if metrics is None:
            rows = con.execute(store.final_values_sql("list_contains(?, run_id)"), [ids]).fetchall()
        else:
            rows = con.execute(store.final_values_sql("list_contains(?, run_id) AND list_contains(?, name)"),
                               [ids, list(metrics)]).fetchall()
        for rid, name, value in rows:
            by_id[rid].final[name] = value
        wanted = list(curves)
        if wanted:
            for rid, name, step, value in con.execute(
                    "SELECT run_id, name, step, value FROM metrics WHERE list_contains(?, run_id) "
                    "AND list_contains(?, name) ORDER BY run_id, name, step", [ids, wanted]).fetchall():
                by_id[rid].curves.setdefault(name, []).append((step, value))
        if "run_settings" in tables:
            for rid, path, value in con.execute("SELECT run_id, path, value FROM run_settings "
                                                "WHERE list_contains(?, run_id)", [ids]).fetchall():
                by_id[rid].settings[path] = _json_value(value)
        if "speed_pass" in tables:
            _speed_pass(con, by_id, metrics)
        return runs
    finally:
        con.close()


# the speed pass's figures as metrics of the runs it covers (abl.run.speedpass): store column -> metric
SPEED_PASS_METRICS = {"tokens_per_s": "alone_tokens_per_s", "mfu": "alone_mfu"}


def _speed_pass(con, by_id: dict[str, StoredRun], metrics: Iterable[str] | None) -> None:
    """Each run's speed-pass row (``StoredRun.speed_pass``), and its figures in ``final`` where asked for."""
    wanted = None if metrics is None else set(metrics)
    cur = con.execute("SELECT * FROM speed_pass WHERE list_contains(?, run_id) ORDER BY created", [list(by_id)])
    names = [d[0] for d in cur.description]
    for row in cur.fetchall():
        rec = dict(zip(names, row))
        run = by_id[rec.pop("run_id")]
        run.speed_pass = rec
        for column, metric in SPEED_PASS_METRICS.items():
            if rec.get(column) is not None and (wanted is None or metric in wanted):
                run.final[metric] = rec[column]


def _json_value(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def experiments(db_path: str | Path) -> list[str]:
    """The experiments with stored runs, by name (empty without a store or a runs table)."""
    if not Path(db_path).exists():
        return []
    con = store.connect(db_path, read_only=True)
    try:
        if "runs" not in _tables(con):
            return []
        return [r[0] for r in con.execute("SELECT DISTINCT experiment FROM runs ORDER BY 1").fetchall()]
    finally:
        con.close()


def recorded_plugins(db_path: str | Path) -> dict[str, dict]:
    """Which plugin provided each component, as the store's runs recorded it (``StoredRun.plugins``),
    ``"axis:name"`` -> origin, the latest run's where runs differ; empty without a store or records."""
    if not Path(db_path).is_file():
        return {}
    con = store.connect(db_path, read_only=True)
    try:
        if "runs" not in _tables(con) or "plugins" not in _columns(con, "runs"):
            return {}
        out: dict[str, dict] = {}
        for (text,) in con.execute("SELECT plugins FROM runs WHERE plugins IS NOT NULL "
                                   "ORDER BY started NULLS FIRST, run_id").fetchall():
            out.update(_json(text, {}))
        return out
    finally:
        con.close()
