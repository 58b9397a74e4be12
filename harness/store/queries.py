"""The dashboard's queries over runs and metrics: read-only, short-lived connections, bound parameters.

The connection rules (one writer, read-only readers that never hold the lock
for long, running cells' rows read from their run folders) are in
abl.store.readonly; which runs a page looks at is a ``Selection``
(abl.store.selection); the Kernels page's queries are in abl.store.benchqueries.
Stored runs as records (the verdicts) come from the one reader,
abl.store.reader; these are the frames the dashboard's pages draw.

A metric's final value is the aggregate the metric catalogue
(abl.analysis.metrics) names for it, as everywhere (``final_values_sql``).
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Sequence

import pandas as pd

from ..analysis.metrics import metric as metric_info
from ..contracts.status import COMPLETED, NOT_COMPLETED, STATUSES, TERMINAL
from .database import AGGREGATE_SQL, FINAL_VALUE, LAST_STEP, final_values_sql
from .readonly import Live, Store
from .selection import Selection, axis_label, check_path


def final_sql(name: str) -> str:
    """The SQL aggregate of a run's rows of ``name`` that is its final value (the catalogue's choice)."""
    return AGGREGATE_SQL[metric_info(name).final]


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


def grid_rows(store: Store, sel: Selection) -> list:
    """(experiment, cell_key, label, grid_file, grid_index) of the selected runs, by experiment then start;
    ``grid_index`` is None where the store does not record it (an older store)."""
    where, params = sel.where()
    index = "r.grid_index" if "grid_index" in store.columns("runs") else "NULL AS grid_index"
    df = store.query(f"""
        SELECT r.experiment, coalesce(r.cell_key, r.run_id) AS cell_key, r.label, r.grid_file, {index}
        FROM runs r WHERE {where}
        ORDER BY r.experiment, r.started NULLS LAST, r.cell_key, r.seed
    """, params)
    return list(df.itertuples(index=False))


def grid_paths(store: Store, sel: Selection) -> list[str]:
    """The grid paths the selected runs recorded (abl.grid.labels.recorded_paths: each once, in the order
    their grids listed them, by experiment then start); none in an older store that does not record them."""
    if "grid_paths" not in store.columns("runs"):
        return []
    where, params = sel.where()
    df = store.query(f"SELECT r.grid_paths FROM runs r WHERE {where} AND r.grid_paths IS NOT NULL "
                     "ORDER BY r.experiment, r.started NULLS LAST, r.run_id", params)
    out: dict[str, None] = {}
    for text in df["grid_paths"]:
        try:
            paths = json.loads(text) if isinstance(text, str) else []
        except ValueError:
            continue
        out.update((p, None) for p in paths if isinstance(p, str))
    return list(out)


def selected_run_ids(store: Store, sel: Selection) -> list[str]:
    """The run ids of the selected runs, in the order they started."""
    where, params = sel.where()
    return list(store.query(f"SELECT r.run_id FROM runs r WHERE {where} ORDER BY r.started NULLS LAST, r.run_id",
                            params)["run_id"])


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
    """One number per run and metric (its final value, as the metric catalogue says), plus the last
    training step."""
    where, params = sel.where()
    names = list(dict.fromkeys(names))
    # one grouped scan per metric, each filtered on its name: faster than one scan with
    # a FILTER clause per metric on large stores
    parts, args = [], []
    for column, name, agg in [*((n, n, final_sql(n)) for n in names),
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
                            agg=final_sql(metric))
    status_clause, status = ("AND r.status = ?", [COMPLETED]) if completed_only else ("", [])
    return store.query(f"""
        WITH sel AS (SELECT * FROM runs r WHERE {where} {status_clause}),
        f AS ({scan})
        SELECT r.cell_key, r.run_id, r.seed, r.status, r.experiment, r.label, r.started, f.value
        FROM sel r JOIN f USING (run_id)
        WHERE f.value IS NOT NULL AND isfinite(f.value)
        ORDER BY r.cell_key, r.seed
    """, [*params, *status, metric], live=live)


def curves(store: Store, run_ids: Sequence[str], metric: str, with_elapsed: bool = False,
           flops_metric: str | None = None, live: Live | None = None) -> pd.DataFrame:
    """Per-step rows of one metric for the given runs (and elapsed_s / cumulative FLOPs)."""
    extra = ""
    names = [metric]
    params: list[Any] = [metric]
    if with_elapsed:
        extra += ", max(value) FILTER (WHERE name = ?) AS elapsed_s"
        params.append("elapsed_s")
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
