"""The dashboard Kernels page's queries over the ``bench`` table (``abl bench`` timings).

The few identifiers that cannot be parameters (the columns of the ``bench``
table) are checked against the table's own column list and ``IDENT_RE``
first; values are bound parameters.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import pandas as pd

from .readonly import Store

# bench columns are interpolated only after matching this and the table's column list
IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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
