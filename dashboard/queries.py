"""Every query the dashboard runs: read-only, short-lived connections, bound parameters.

The ``abl run`` parent is the only writer of the store and opens it briefly
for each ingest. DuckDB refuses a read-only connection while another process
holds a read-write one (and the reverse), so the dashboard never keeps a
connection: a query opens the file read-only and closes it at once, or the
queries of one page render share a connection (``Store.session``) that is
reopened after ``MAX_HOLD_S`` and closed when the render ends. Opening retries
for a moment while the writer holds the lock (then ``StoreBusy``, shown as a
message); the writer retries the same way, so neither waits for long.

User choices reach SQL only as bound parameters. The few identifiers that
cannot be parameters (the columns of the ``bench`` table) are checked against
the table's own column list first. JSON paths into ``runs.config`` are bound
parameters too, and also validated against ``PATH_RE``.

Metrics of cells still running are read from their growing
``runs/<run_id>/metrics.jsonl`` (see harness/rundir.py) and joined to the
stored rows inside DuckDB, so every page shows in-progress runs.

Nothing here imports Streamlit; the app caches these functions.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import duckdb
import pandas as pd

from abl.analysis.health import HEALTH_METRICS
from abl.analysis.stats import HOLM, Analysis, CellInput
from abl.analysis.verdicts import RunRecord, analyse_runs
from abl.store import rundir
from abl.store.database import FINAL_VALUE, LAST_STEP, final_values_sql
from abl.store.rundir import COMPLETED, NOT_COMPLETED, RUNNING, STATUSES, TERMINAL

DEFAULT_DB = "results/abl.duckdb"

# A JSON path into runs.config: $.model.norm, $.components.norm.params.eps, $.a[0].b
PATH_RE = re.compile(r"^\$(\.[A-Za-z_][A-Za-z0-9_]*|\[[0-9]+\])+$")
# bench columns are interpolated only after matching this and the table's column list
IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# A page render shares one read-only connection, but holds it at most this long
# before reopening, so a waiting writer (abl run retries for 5 s) gets its turn.
MAX_HOLD_S = 1.0
_local = threading.local()

# How one number per run is taken from a metric's rows. Throughput is noisy per
# step, so its median; memory its peak; everything else the value at the last step.
AGGREGATES = {"last": FINAL_VALUE, "median": "median(value)", "max": "max(value)"}


@dataclass(frozen=True)
class MetricInfo:
    label: str
    agg: str = "last"
    better: str = "lower"  # lower, higher or none (neither is better: parameters, FLOPs)
    unit: str = ""


# Metrics the pages know by name; any other metric is shown with the defaults.
KNOWN_METRICS: dict[str, MetricInfo] = {
    "val_loss": MetricInfo("final val_loss"),
    "train_loss": MetricInfo("final train_loss"),
    "tokens_per_s": MetricInfo("tokens/s (median over steps)", "median", "higher", "tok/s"),
    "train_tokens_per_s": MetricInfo("tokens/s (true rate: all tokens over the loop's wall time)", "last",
                                     "higher", "tok/s"),
    "compile_s": MetricInfo("torch.compile time", "max", "lower", "s"),
    "decode_tokens_per_s": MetricInfo("decode tokens/s", "median", "higher", "tok/s"),
    "peak_mem_bytes": MetricInfo("peak memory", "max", "lower", "bytes"),
    "baseline_rss_bytes": MetricInfo("baseline RSS", "max", "lower", "bytes"),
    "kv_bytes_per_token": MetricInfo("KV cache bytes/token", "last", "lower", "bytes"),
    "n_params": MetricInfo("parameters", "max", "none"),
    "n_params_non_embedding": MetricInfo("parameters (non-embedding)", "max", "none"),
    "wall_s": MetricInfo("wall time", "max", "lower", "s"),
    "elapsed_s": MetricInfo("elapsed", "max", "lower", "s"),
    "grad_norm": MetricInfo("final grad_norm", "last", "none"),
    "lr": MetricInfo("final lr", "last", "none"),
    "mfu": MetricInfo("MFU", "median", "higher"),
    "flops": MetricInfo("training FLOPs", "max", "none", "FLOP"),
    "flops_per_token": MetricInfo("forward FLOPs/token", "last", "none", "FLOP"),
    "train_flops_per_token": MetricInfo("training FLOPs/token", "last", "none", "FLOP"),
    "contended": MetricInfo("measured on a contended machine (1 = yes)", "last", "none"),
    "cpu_util": MetricInfo("CPU share the run got", "last", "none"),
    "load_per_core": MetricInfo("load average per core during the loop", "last", "none"),
}

# speed figures: what a contended machine falsifies
SPEED_METRICS = ("tokens_per_s", "train_tokens_per_s", "decode_tokens_per_s", "mfu")


def is_speed(name: str) -> bool:
    return name in SPEED_METRICS or name.endswith("_per_s") or name.startswith("mfu")


def metric_info(name: str) -> MetricInfo:
    if name in KNOWN_METRICS:
        return KNOWN_METRICS[name]
    if name.endswith("_per_s"):
        return MetricInfo(name, "median", "higher")
    if name.endswith("_bytes"):
        return MetricInfo(name, "max", "lower", "bytes")
    if "_accuracy" in name:  # task accuracy (abl.data.tasks): <task>_accuracy, ..._accuracy_<slice>
        return MetricInfo(name, "last", "higher")
    return MetricInfo(name)


class StoreUnavailable(Exception):
    """The store cannot be read right now; the message is shown to the user as is."""


class StoreBusy(StoreUnavailable):
    """The writer held the lock for longer than we were willing to wait."""


# ---------------------------------------------------------------- selection


@dataclass(frozen=True)
class Selection:
    """Which runs a page looks at; every field is optional (empty = no filter)."""

    experiments: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    # (JSON path, allowed values); None among the values matches runs without the key
    axes: tuple[tuple[str, tuple[str | None, ...]], ...] = ()
    cells: tuple[str, ...] = ()

    def where(self, alias: str = "r") -> tuple[str, list[Any]]:
        """A SQL boolean over ``runs AS alias`` and its parameters."""
        clauses: list[str] = ["TRUE"]
        params: list[Any] = []
        if self.experiments:
            clauses.append(f"{alias}.experiment IN (SELECT unnest(?::VARCHAR[]))")
            params.append(list(self.experiments))
        if self.statuses:
            clauses.append(f"{alias}.status IN (SELECT unnest(?::VARCHAR[]))")
            params.append(list(self.statuses))
        for path, values in self.axes:
            check_path(path)
            present = [v for v in values if v is not None]
            expr = f"json_extract_string({alias}.config, ?)"
            parts = []
            if present:
                parts.append(f"{expr} IN (SELECT unnest(?::VARCHAR[]))")
                params += [path, present]
            if len(present) < len(values):
                parts.append(f"{expr} IS NULL")
                params.append(path)
            clauses.append("(" + (" OR ".join(parts) or "FALSE") + ")")
        if self.cells:
            clauses.append(f"{alias}.cell_key IN (SELECT unnest(?::VARCHAR[]))")
            params.append(list(self.cells))
        return " AND ".join(clauses), params


def check_path(path: str) -> str:
    if not isinstance(path, str) or not PATH_RE.match(path):
        raise ValueError(f"not a config path: {path!r}")
    return path


def axis_label(path: str) -> str:
    """``$.components.norm.params.eps`` -> ``norm.eps``; ``$.model.norm`` -> ``model.norm``."""
    p = path[2:] if path.startswith("$.") else path
    parts = p.split(".")
    if len(parts) >= 4 and parts[0] == "components" and parts[2] == "params":
        return ".".join([parts[1], *parts[3:]])
    return p


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
        db = os.environ.get("ABL_DB") or DEFAULT_DB
        runs = os.environ.get("ABL_RUNS_DIR") or str(Path(db).parent / "runs")
        return cls(db=db, runs_dir=runs)

    def signature(self) -> tuple:
        """Changes whenever the writer commits (the file or its WAL changes)."""
        out = []
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
        of running cells taken from their run folders when ``live`` has any.
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
            if live:
                con.register("live_metrics", live.frame)
                registered = True
                src = ("(SELECT run_id, step, name, value FROM metrics WHERE run_id NOT IN "
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
    key = []
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


# ---------------------------------------------------------------- overview


def experiments(store: Store) -> pd.DataFrame:
    """One row per experiment: runs, cells, and how many completed, are under way or did not complete."""
    return store.query("""
        SELECT experiment,
               count(*) AS runs,
               count(DISTINCT cell_key) AS cells,
               count(*) FILTER (WHERE status = ?) AS completed,
               count(*) FILTER (WHERE list_contains(?::VARCHAR[], status)) AS running,
               count(*) FILTER (WHERE list_contains(?::VARCHAR[], status)) AS not_completed,
               min(started) AS first_started,
               max(coalesce(finished, started)) AS last_activity,
               string_agg(DISTINCT grid_file, ', ') AS grid_files
        FROM runs GROUP BY experiment
        ORDER BY last_activity DESC NULLS LAST, experiment
    """, [COMPLETED, [s for s in STATUSES if s not in TERMINAL], list(NOT_COMPLETED)])


def status_values(store: Store) -> list[str]:
    return list(store.query("SELECT DISTINCT status FROM runs ORDER BY status")["status"])


# leaves of the config that are not axes: the grouping keys, and the component
# names / per-layer specs that repeat what model.* / train.* / data.* already say
_HIDDEN_PATHS = re.compile(r"^\$\.(seed|experiment)$|^\$\.components\.[A-Za-z0-9_]+\.name$"
                           r"|^\$\.components\.layer_mixers\[")


def config_axes(store: Store, sel: Selection) -> pd.DataFrame:
    """Every leaf of the selected runs' configs: path, label, values, whether it varies."""
    where, params = sel.where()
    # owner: for a component's parameter ($.components.norm.params.eps), the component selected
    # ($.components.norm.name); used to tell a swept parameter from one that only differs
    # because the component differs
    df = store.query(f"""
        WITH r AS (SELECT run_id, config FROM runs r WHERE {where}),
        leaves AS (
            SELECT r.run_id, t.fullkey AS path, t.value->>'$' AS v,
                   CASE WHEN t.fullkey SIMILAR TO '\\$\\.components\\.[A-Za-z0-9_]+\\.params\\..*'
                        THEN json_extract_string(r.config, '$.components.' || split_part(t.fullkey, '.', 3) || '.name')
                   END AS owner
            FROM r, json_tree(r.config) t WHERE t.type NOT IN ('OBJECT', 'ARRAY')
        ),
        within AS (
            SELECT path, max(n) AS within_owner FROM (
                SELECT path, owner, count(DISTINCT v) AS n FROM leaves WHERE owner IS NOT NULL
                GROUP BY path, owner) GROUP BY path
        )
        SELECT path, count(DISTINCT run_id) AS runs, count(DISTINCT v) AS n_values,
               list(DISTINCT v) AS vals_list, (SELECT count(*) FROM r) AS total,
               any_value(within_owner) AS within_owner
        FROM leaves LEFT JOIN within USING (path) GROUP BY path ORDER BY path
    """, params)
    if df.empty:
        return pd.DataFrame(columns=["path", "label", "values", "varied", "partial", "implied"])
    df = df[~df["path"].str.match(_HIDDEN_PATHS)].copy()
    df["partial"] = df["runs"] < df["total"]
    df["values"] = [sort_values(list(v)) + ([None] if p else [])
                    for v, p in zip(df["vals_list"], df["partial"])]
    # varies only with the component that owns it (rmsnorm's eps vs layernorm's bias): not an axis
    df["implied"] = df["within_owner"].notna() & (df["within_owner"] <= 1)
    df["varied"] = ((df["n_values"] > 1) | df["partial"]) & ~df["implied"]
    df["label"] = df["path"].map(axis_label)
    # the sections' own keys (model.norm, train.lr) before the selected components' parameters
    df["rank"] = df["path"].str.startswith("$.components.").astype(int)
    df = df.sort_values(["rank", "path"], kind="stable")
    return df[["path", "label", "values", "varied", "partial", "implied"]].reset_index(drop=True)


def sort_values(values: list[str]) -> list[str]:
    """Numbers numerically, then text; values are JSON scalars rendered as text."""
    def key(v):
        try:
            return (0, float(v), "")
        except (TypeError, ValueError):
            return (1, 0.0, str(v))
    return sorted(values, key=key)


def runs(store: Store, sel: Selection, axis_paths: Iterable[str] = ()) -> pd.DataFrame:
    """One row per selected run; column ``axis:<path>`` for each requested config path."""
    where, params = sel.where()
    paths = [check_path(p) for p in axis_paths]
    axis_cols = "".join(f", json_extract_string(r.config, ?) AS a{i}" for i in range(len(paths)))
    df = store.query(f"""
        SELECT r.run_id, r.experiment, r.cell_key, r.label, r.seed, r.status, r.started, r.finished,
               r.device, r.git_commit, r.notes, r.error,
               TRY_CAST(json_extract(r.config, '$.train.steps') AS BIGINT) AS steps,
               TRY_CAST(json_extract(r.config, '$.train.batch_size') AS BIGINT)
                 * TRY_CAST(json_extract(r.config, '$.model.context') AS BIGINT) AS tokens_per_step
               {axis_cols}
        FROM runs r WHERE {where}
        ORDER BY r.experiment, r.started NULLS LAST, r.cell_key, r.seed
    """, [*paths, *params])
    df = df.rename(columns={f"a{i}": f"axis:{p}" for i, p in enumerate(paths)})
    df["label"] = [lbl if isinstance(lbl, str) and lbl else (ck or "")[:10]
                   for lbl, ck in zip(df["label"], df["cell_key"])]
    return df


def metric_catalogue(store: Store, sel: Selection, live: Live | None = None) -> pd.DataFrame:
    """Metric names of the selected runs, with rows per run: per-step metrics have many."""
    _, params = sel.where()
    cond = _in_selection(store, sel)
    df = store.query(f"""
        SELECT name, count(*) AS rows, approx_count_distinct(run_id) AS runs FROM {{metrics}}
        WHERE {cond} GROUP BY name ORDER BY name
    """, params if cond != "TRUE" else [], live=live)
    df["per_step"] = [is_curve(n, r / max(k, 1)) for n, r, k in zip(df["name"], df["rows"], df["runs"])]
    return df


def is_curve(name: str, rows_per_run: float) -> bool:
    """Whether a metric is worth a curve: logged at many steps (once-per-run figures can be logged
    twice, e.g. n_params at the start and the end)."""
    return name in ("train_loss", "val_loss") or rows_per_run > 2.5


def _in_selection(store: Store, sel: Selection) -> str:
    """``run_id IN (the selection)``, or TRUE when the selection is every run (no join: 3-4x faster)."""
    where, params = sel.where()
    n_sel, n_all = store.query(f"SELECT count(*) FILTER (WHERE {where}) AS n_sel, count(*) AS n_all FROM runs r",
                               params).iloc[0]
    return "TRUE" if n_sel == n_all else f"run_id IN (SELECT run_id FROM runs r WHERE {where})"


def metric_names(store: Store, sel: Selection, live: Live | None = None) -> list[str]:
    """Names of the metrics the selected runs have (cheaper than ``metric_catalogue``)."""
    _, params = sel.where()
    cond = _in_selection(store, sel)
    return list(store.query(f"SELECT DISTINCT name FROM {{metrics}} WHERE {cond} ORDER BY name",
                            params if cond != "TRUE" else [], live=live)["name"])


def finals(store: Store, sel: Selection, names: Sequence[str], live: Live | None = None) -> pd.DataFrame:
    """One number per run and metric (see ``AGGREGATES``), plus the last training step."""
    where, params = sel.where()
    names = list(dict.fromkeys(names))
    # one grouped scan per metric, each filtered on its name: faster than one scan with
    # a FILTER clause per metric on large stores
    parts, args = [], []
    for column, name, agg in [*((n, n, AGGREGATES[metric_info(n).agg]) for n in names),
                              ("last_step", "train_loss", LAST_STEP)]:
        scan = final_values_sql(f"name = ? AND run_id IN (SELECT run_id FROM runs r WHERE {where})",
                                metrics="{metrics}", agg=agg)
        parts.append(f"SELECT run_id, ? AS metric, value AS v FROM ({scan})")
        args += [column, name, *params]
    long = store.query(" UNION ALL ".join(parts), args, live=live)
    if long.empty:
        return pd.DataFrame({c: pd.Series(dtype=str if c == "run_id" else float)
                             for c in ["run_id", "last_step", *names]})
    wide = long.pivot_table(index="run_id", columns="metric", values="v", aggfunc="first").reset_index()
    wide.columns.name = None
    for n in [*names, "last_step"]:
        if n not in wide:
            wide[n] = float("nan")
    return wide[["run_id", "last_step", *names]]


def cell_values(store: Store, sel: Selection, metric: str, completed_only: bool = True,
                live: Live | None = None) -> pd.DataFrame:
    """One number per run for ``metric`` with its cell: the input of the per-cell statistics."""
    where, params = sel.where()
    scan = final_values_sql("name = ? AND run_id IN (SELECT run_id FROM sel)", metrics="{metrics}",
                            agg=AGGREGATES[metric_info(metric).agg])
    status_clause, status = ("AND r.status = ?", [COMPLETED]) if completed_only else ("", [])
    return store.query(f"""
        WITH sel AS (SELECT * FROM runs r WHERE {where} {status_clause}),
        f AS ({scan})
        SELECT r.cell_key, r.run_id, r.seed, r.status, r.experiment, r.label, r.started, f.value
        FROM sel r JOIN f USING (run_id)
        WHERE f.value IS NOT NULL AND isfinite(f.value)
        ORDER BY r.cell_key, r.seed
    """, [*params, *status, metric], live=live)


def verdict_runs(store: Store, sel: Selection, metric: str) -> list[RunRecord]:
    """The selected runs as abl.analysis.verdicts records: each with its final ``metric`` and health figures."""
    where, params = sel.where()
    runs_df = store.query(f"""
        SELECT r.run_id, r.cell_key, r.label, r.seed, r.status, r.config, r.data_fingerprint
        FROM runs r WHERE {where} ORDER BY r.started NULLS LAST, r.run_id
    """, params)
    if runs_df.empty:
        return []
    finals = store.query(f"""
        SELECT run_id, name, value FROM ({final_values_sql(
            "name = ? AND run_id IN (SELECT run_id FROM runs r WHERE " + where + ")",
            agg=AGGREGATES[metric_info(metric).agg])})
        UNION ALL
        SELECT run_id, name, value FROM ({final_values_sql(
            "list_contains(?, name) AND run_id IN (SELECT run_id FROM runs r WHERE " + where + ")")})
    """, [metric, *params, list(HEALTH_METRICS), *params])
    by_run: dict[str, dict[str, float]] = {}
    for rid, name, value in finals.itertuples(index=False):
        if value is not None and not pd.isna(value):
            by_run.setdefault(rid, {})[name] = float(value)
    out = []
    for r in runs_df.itertuples(index=False):
        config = r.config if isinstance(r.config, dict) else json.loads(r.config or "{}")
        out.append(RunRecord(cell_key=r.cell_key or r.run_id, label=r.label or "", seed=int(r.seed),
                             status=r.status, config=config, data_fingerprint=r.data_fingerprint or "unknown",
                             final=by_run.get(r.run_id, {})))
    return out


def verdicts(store: Store, sel: Selection, metric: str = "val_loss", *, baseline: str | None = None,
             pairs: Sequence[str] = (), by: str | None = None, bootstrap: bool = False,
             correction: str = HOLM) -> tuple[list[CellInput], Analysis, str]:
    """The verdict table of the selected runs: abl.analysis.verdicts.analyse_runs, as the CLI and the report do.

    Cells in the order their first run started (the grid's order when one
    grid ran them); the baseline, pairs or axis as in ``abl compare``.
    """
    return analyse_runs(verdict_runs(store, sel, metric), metric=metric, baseline=baseline, pairs=pairs, by=by,
                        bootstrap=bootstrap, correction=correction)


def curves(store: Store, run_ids: Sequence[str], metric: str, with_elapsed: bool = False,
           flops_metric: str | None = None, live: Live | None = None) -> pd.DataFrame:
    """Per-step rows of one metric for the given runs (and elapsed_s / cumulative FLOPs)."""
    extra = ""
    names = [metric]
    params: list[Any] = [metric]
    if with_elapsed:
        extra += ", max(value) FILTER (WHERE name = 'elapsed_s') AS elapsed_s"
        names.append("elapsed_s")
    if flops_metric:
        extra += ", max(value) FILTER (WHERE name = ?) AS flops"
        params.append(flops_metric)
        names.append(flops_metric)
    return store.query(f"""
        SELECT run_id, step, max(value) FILTER (WHERE name = ?) AS y {extra}
        FROM {{metrics}}
        WHERE run_id IN (SELECT unnest(?::VARCHAR[])) AND name IN (SELECT unnest(?::VARCHAR[]))
        GROUP BY run_id, step
        HAVING y IS NOT NULL
        ORDER BY run_id, step
    """, [*params, list(run_ids), names], live=live)


# ---------------------------------------------------------------- one run


def run_row(store: Store, run_id: str) -> dict[str, Any] | None:
    df = store.query("SELECT * FROM runs WHERE run_id = ?", [run_id])
    return None if df.empty else df.iloc[0].to_dict()


def cell_config(store: Store, cell_key: str) -> str | None:
    df = store.query("SELECT config FROM runs WHERE cell_key = ? ORDER BY seed LIMIT 1", [cell_key])
    return None if df.empty else df["config"].iloc[0]


def cell_configs(store: Store, sel: Selection) -> dict[str, Any]:
    """``{cell_key: config}`` (one seed's) of the selected cells: the input of abl.grid.labels."""
    where, params = sel.where()
    df = store.query(f"SELECT cell_key, arg_min(config, seed) AS config FROM runs r WHERE {where} "
                     "GROUP BY cell_key", params)
    out: dict[str, Any] = {}
    for key, cfg in zip(df["cell_key"], df["config"]):
        try:
            out[str(key)] = json.loads(cfg) if isinstance(cfg, str) else (cfg or {})
        except ValueError:
            out[str(key)] = {}
    return out


def run_metric_summary(store: Store, run_id: str, live: Live | None = None) -> pd.DataFrame:
    return store.query(f"""
        SELECT name, count(*) AS rows, min(step) AS first_step, {LAST_STEP} AS last_step,
               arg_min(value, step) AS first, {FINAL_VALUE} AS last,
               min(value) AS min, max(value) AS max, avg(value) AS mean
        FROM {{metrics}} WHERE run_id = ? GROUP BY name ORDER BY name
    """, [run_id], live=live)


def run_metrics(store: Store, run_id: str, live: Live | None = None) -> pd.DataFrame:
    """Every metric row of one run (a run has at most a few tens of thousands)."""
    return store.query("SELECT step, name, value FROM {metrics} WHERE run_id = ? ORDER BY name, step",
                       [run_id], live=live)


# ---------------------------------------------------------------- kernels

BENCH_REQUIRED = ("op", "provider", "p50")
BENCH_OPTIONAL = ("bench_id", "created", "shape", "dtype", "pass", "p20", "p80", "gbps", "tflops",
                  "peak_fraction", "peak_basis", "device", "versions", "git_commit", "timing", "notes")
_BENCH_TEXT = {"bench_id", "op", "provider", "shape", "dtype", "pass", "peak_basis", "device", "versions",
               "git_commit", "timing", "notes"}


def bench_columns(store: Store) -> list[str] | None:
    """The bench table's columns, or None when the table does not exist (an older store)."""
    if "bench" not in store.tables():
        return None
    return [c for c in store.columns("bench") if IDENT_RE.match(c)]


def _bench_where(cols: Sequence[str], filters) -> tuple[str, list[Any]]:
    clauses, params = ["TRUE"], []
    for c, values in dict(filters).items():
        if c not in cols or not IDENT_RE.match(c):
            raise ValueError(f"not a bench column: {c!r}")
        if values:
            clauses.append(f'CAST("{c}" AS VARCHAR) IN (SELECT unnest(?::VARCHAR[]))')
            params.append(list(values))
    return " AND ".join(clauses), params


def bench_sessions(store: Store, cols: Sequence[str]) -> pd.DataFrame:
    """One row per ``abl bench`` invocation (bench_id), latest first; per device on older tables."""
    cols = [c for c in cols if IDENT_RE.match(c)]
    if "bench_id" in cols:
        created = 'min("created")' if "created" in cols else "NULL"
        device = 'any_value(CAST("device" AS VARCHAR))' if "device" in cols else "NULL"
        return store.query(f"""
            SELECT bench_id, {created} AS created, {device} AS device, count(*) AS rows
            FROM bench GROUP BY bench_id ORDER BY created DESC NULLS LAST, bench_id""")
    if "device" in cols:
        return store.query('SELECT CAST("device" AS VARCHAR) AS device, count(*) AS rows FROM bench '
                           "GROUP BY 1 ORDER BY 1")
    return store.query("SELECT count(*) AS rows FROM bench HAVING count(*) > 0")


def bench_facets(store: Store, cols: Sequence[str], filters=()) -> dict[str, list[str]]:
    """Distinct ops, dtypes and passes of the rows that match ``filters``."""
    where, params = _bench_where(cols, filters)
    out = {}
    for c in ("op", "dtype", "pass"):
        if c in cols:
            out[c] = [v for v in store.query(
                f'SELECT DISTINCT CAST("{c}" AS VARCHAR) AS v FROM bench WHERE {where} ORDER BY v',
                params)["v"] if v is not None]
    return out


def bench_rows(store: Store, cols: Sequence[str], filters=()) -> pd.DataFrame:
    """Rows of bench; ``filters`` maps a column to its allowed values (an empty list: any)."""
    wanted = [c for c in (*BENCH_REQUIRED, *BENCH_OPTIONAL) if c in cols]
    select = ", ".join(f'CAST("{c}" AS VARCHAR) AS "{c}"' if c in _BENCH_TEXT else f'"{c}"' for c in wanted)
    where, params = _bench_where(cols, filters)
    return store.query(f"SELECT {select} FROM bench WHERE {where}", params)
