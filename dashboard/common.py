"""What the app and its pages share: the store, the query cache, the sidebar filters.

Query results are cached under the store's signature (the database file's
and its WAL's mtime and size) and the metrics files of running cells, so a
page rerenders from memory until ``abl run`` writes something, and shows the
new rows on the next refresh after it does.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, replace
from typing import Any, Callable

import pandas as pd
import streamlit as st

from abl.analysis import formats, metrics, sections
from abl.dashboard import queries as q
from abl.grid import labels as abl_labels
from abl.present import palette

ABSENT = "(absent)"


@dataclass
class Ctx:
    store: q.Store
    sig: tuple
    live: q.Live


@st.cache_data(max_entries=512, show_spinner=False)
def _cached(name: str, db: str, runs_dir: str, sig: tuple, live_key: tuple | None,
            args: tuple, kwargs: tuple, _store: q.Store, _live: q.Live | None) -> Any:
    fn = getattr(q, name)
    kw = dict(kwargs)
    if live_key is not None:
        kw["live"] = _live
    return fn(_store, *args, **kw)


@st.cache_data(max_entries=16, show_spinner=False)
def _live_cached(db: str, runs_dir: str, ids: tuple, key: tuple, _store: q.Store) -> q.Live:
    return q.live_snapshot(_store, ids)



def shown_path(path) -> str:
    """A path as the sidebar shows it: relative to the working folder when it lies inside it
    (``results/abl.duckdb``, as the user typed it), else whole."""
    import os

    rel = os.path.relpath(str(path))
    return str(path) if rel == ".." or rel.startswith(".." + os.sep) else rel

def _takes_live(fn: Callable) -> bool:
    return "live" in inspect.signature(fn).parameters


def init() -> Ctx:
    """Called by app.py at the start of every script run."""
    store = q.Store.from_env()
    ctx = Ctx(store=store, sig=store.signature(), live=q.Live())
    st.session_state["_abl_ctx"] = ctx
    ids = tuple(load(q.running_ids))
    if ids:
        ctx.live = _live_cached(store.db, store.runs_dir, ids, q.live_key(store, ids), store)
    return ctx


def session():
    """Share read-only connections among the queries of one script run (see Store.session)."""
    return q.Store.from_env().session()


def ctx() -> Ctx:
    return st.session_state["_abl_ctx"]


def load(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Call a function of dashboard.queries through the cache."""
    c = ctx()
    live_key = c.live.key if _takes_live(fn) else None
    return _cached(fn.__name__, c.store.db, c.store.runs_dir, c.sig, live_key, args,
                   tuple(sorted(kwargs.items())), c.store, c.live if live_key is not None else None)


def clear_cache() -> None:
    _cached.clear()
    _live_cached.clear()


# ---------------------------------------------------------------- sidebar


def _keep_valid(key: str, options: list, default: list) -> None:
    """Drop remembered choices that are no longer offered (a widget refuses unknown values)."""
    if key not in st.session_state:
        st.session_state[key] = [v for v in default if v in options]
    else:
        st.session_state[key] = [v for v in st.session_state[key] if v in options]


def _show_value(v: Any) -> str:
    return ABSENT if v is None else str(v)


def sidebar() -> q.Selection:
    """The filters every page shares; returns the selection they describe."""
    sb = st.sidebar
    c = ctx()
    exps = load(q.experiments)
    if exps.empty:
        sb.info("The store has no runs yet. Start a grid with `abl run ablations/norms.toml`; "
                "its runs appear here as they start.")
        return q.Selection(experiments=("",))  # matches nothing
    options = list(exps["experiment"])
    _keep_valid("f_experiments", options, default=options[:1])
    chosen = sb.multiselect("Experiments", options, key="f_experiments", placeholder="all experiments",
                            help="Most recent first. Leave empty to see every experiment.")
    statuses = load(q.status_values)
    _keep_valid("f_status", statuses, default=[])
    picked_status = sb.multiselect("Status", statuses, key="f_status", placeholder="any status")
    sel = q.Selection(experiments=tuple(chosen), statuses=tuple(picked_status))

    axes = load(q.config_axes, q.Selection(experiments=tuple(chosen)))
    varied = axes[axes["varied"]]
    filters = []
    with sb.expander(f"Config axes ({len(varied)} varied)", expanded=False):
        if varied.empty:
            st.caption("Every selected run has the same config apart from its seed.")
        for path, label, values in zip(varied["path"], varied["label"], varied["values"]):
            shown = [_show_value(v) for v in values]
            key = f"f_axis:{path}"
            _keep_valid(key, shown, default=[])
            pick = st.multiselect(label, shown, key=key, placeholder="any")
            if pick:
                filters.append((path, tuple(None if v == ABSENT else v for v in pick)))
    sel = replace(sel, axes=tuple(filters))

    cells = cell_table(sel)
    keys = list(cells["cell_key"])
    labels = dict(zip(cells["cell_key"], cells["cell"]))
    _keep_valid("f_cells", keys, default=[])
    picked = sb.multiselect("Cells to compare", keys, key="f_cells", format_func=lambda k: labels.get(k, k),
                            placeholder="all cells that match",
                            help="Restrict every page to these cells (also set from the runs table).")
    sel = replace(sel, cells=tuple(picked))

    sb.divider()
    sb.caption(f"Store: `{shown_path(c.store.db)}`  \nRun folders: `{shown_path(c.store.runs_dir)}`")
    left, right = sb.columns(2)
    if left.button("Refresh", icon=":material/refresh:", help="Re-read the store (new and running runs)"):
        clear_cache()
    right.toggle("Live", key="auto_refresh", help="Re-read every 5 s while runs are in progress")
    if st.session_state.get("auto_refresh"):
        _watch(c.sig, c.live.key)
    return sel


@st.fragment(run_every=5)
def _watch(sig: tuple, live_key: tuple) -> None:
    """Rerun the whole page when the store or a running cell's metrics file changed."""
    c = ctx()
    ids = tuple(q.running_ids(c.store)) if c.store.signature() != sig else tuple(r[0] for r in live_key)
    if c.store.signature() != sig or q.live_key(c.store, ids) != live_key:
        st.rerun(scope="app")


# ---------------------------------------------------------------- shared frames


def varied_axes(sel: q.Selection) -> pd.DataFrame:
    """Config paths that differ between the selected runs (the grid's axes)."""
    axes = load(q.config_axes, sel)
    return axes[axes["varied"]].reset_index(drop=True)


def runs_table(sel: q.Selection) -> pd.DataFrame:
    """Selected runs with a ``cell`` label and one column per varied axis (named by its label)."""
    axes = varied_axes(sel)
    df = load(q.runs, sel, tuple(axes["path"]))
    if len(df):  # labels from the settings that differ between the cells shown (abl.grid.labels)
        stored = dict(zip(df["cell_key"].astype(str), df["label"]))
        # the grid's axes first, in the grid's order, as the runs recorded them
        names = abl_labels.cell_labels(load(q.cell_configs, sel), load(q.grid_paths, sel), stored)
        df["label"] = [names.get(str(k), lbl) for k, lbl in zip(df["cell_key"], df["label"])]
    multi = df["experiment"].nunique() > 1
    df["cell"] = [f"{e} · {lbl}" if multi else lbl for e, lbl in zip(df["experiment"], df["label"])]
    rename = {f"axis:{p}": lbl for p, lbl in zip(axes["path"], axes["label"])}
    df = df.rename(columns=rename)
    for lbl in rename.values():
        df[lbl] = df[lbl].fillna(ABSENT)
    df.attrs["axes"] = list(rename.values())
    df.attrs["axis_paths"] = dict(zip(axes["label"], axes["path"]))
    return df


def cell_table(sel: q.Selection) -> pd.DataFrame:
    """One row per cell: key, label, experiment, runs, statuses, the axes' values."""
    df = runs_table(sel)
    axes = df.attrs.get("axes", [])
    if df.empty:
        return pd.DataFrame(columns=["cell_key", "cell", "experiment", "runs", "statuses", "first_started", *axes])
    agg = df.groupby("cell_key", sort=False).agg(
        cell=("cell", "first"), experiment=("experiment", "first"), runs=("run_id", "count"),
        statuses=("status", lambda s: ", ".join(sorted(set(s)))), first_started=("started", "min"),
        **{a: (a, "first") for a in axes}).reset_index()
    agg.attrs["axes"] = axes
    return agg


def no_runs(sel: q.Selection) -> bool:
    if runs_table(sel).empty:
        st.info("No runs match the filters in the sidebar." if sel.experiments != ("",) else
                "The store has no runs yet. Start a grid with `abl run ablations/norms.toml`; "
                "its runs appear here as they start.")
        return True
    return False


# ---------------------------------------------------------------- contention

CONTENDED_NOTE = ("measured while the machine was busy with other work (its load or the CPU time the run got "
                  "says so): its speed figures are contention, not a property of the cell")


def contended_runs(sel: q.Selection) -> set[str]:
    """The selected runs whose speed was measured on a contended machine (abl.analysis.sections.is_contended)."""
    if sections.CONTENDED not in load(q.metric_names, sel):
        return set()
    fin = load(q.finals, sel, (sections.CONTENDED,))
    return {str(r) for r, v in zip(fin["run_id"], fin[sections.CONTENDED])
            if pd.notna(v) and sections.is_contended({sections.CONTENDED: float(v)})}


def contended_caption(n: int, total: int) -> str:
    return (f"Red rings / ⚠: {n} of {total} run(s) were {CONTENDED_NOTE}. With several seeds the bar is "
            "the min–max over seeds, not one number.")


# ---------------------------------------------------------------- formatting


def fmt_bytes(n: Any) -> str:
    return formats.fmt_bytes(n, missing="–")


def fmt_num(x: Any, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    x = float(x)
    if x != 0 and (abs(x) >= 1e6 or abs(x) < 1e-3):
        return f"{x:.{digits - 1}e}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def fmt_metric(name: str, value: Any) -> str:
    """A figure of the metric ``name`` in its unit (abl.analysis.metrics.display: MiB, GFLOP, tokens/s...)."""
    return metrics.display(name, None if value is None or pd.isna(value) else value, missing="–")


def metric_summary_text(summary: pd.DataFrame) -> pd.DataFrame:
    """A run's per-metric summary in each metric's unit, not raw numbers (``268231000``): the metric, its
    final value, its range and how many rows it has, the columns that fit beside the sidebar (every row of
    every metric is in the run's CSV)."""
    out = pd.DataFrame({"metric": summary["name"]})
    for col, head in (("last", "final"), ("min", "min"), ("max", "max")):
        out[head] = [fmt_metric(n, v) for n, v in zip(summary["name"], summary[col])]
    out["rows"] = summary["rows"].astype(int)
    return out


# ---------------------------------------------------------------- tables

PAGE_ROWS = 50  # rows of one page of a table (the norms grid's 26 runs on one); more: the table pages
ROW_PX, HEADER_PX = 35, 38  # st.dataframe's row and header heights


def table_height(rows: int) -> int:
    """The height that shows ``rows`` rows and the header with no inner scroll bar."""
    return HEADER_PX + ROW_PX * max(1, rows) + 2


def page_of(df: pd.DataFrame, key: str, page_rows: int = PAGE_ROWS) -> pd.DataFrame:
    """The rows of ``df`` on the page picked above the table (all of them when they fit on one page)."""
    n = len(df)
    pages = max(1, -(-n // page_rows))
    if pages == 1:
        return df
    page = int(st.number_input(f"Page (of {pages}, {page_rows} rows each)", min_value=1, max_value=pages,
                               value=1, step=1, key=f"{key}_page"))
    part = df.iloc[(page - 1) * page_rows: page * page_rows]
    first = (page - 1) * page_rows + 1
    st.caption(f"Rows {first}–{first + len(part) - 1} of {n}.")
    return part


def table(df: pd.DataFrame, key: str, column_config: dict | None = None, page_rows: int = PAGE_ROWS,
          help_text: str | None = None, column_order: list[str] | None = None) -> None:
    """``df`` as a table that shows every row of its page (no rows hidden behind an inner scroll bar): past
    ``page_rows`` rows a page picker above it, and a caption saying which rows are shown. ``column_order``:
    the columns shown (the ones that fit a laptop's width), the others kept in the data and its CSV."""
    part = page_of(df, key, page_rows)
    st.dataframe(part, hide_index=True, width="stretch", height=table_height(len(part)),
                 column_config=column_config or {}, key=key, column_order=column_order)
    if help_text:
        st.caption(help_text)


_TEXT_TABLE_CSS = """<style>
.abl-text-table table {width: 100%; border-collapse: collapse; font-size: 0.85rem; margin-bottom: 0.5rem}
.abl-text-table th, .abl-text-table td {padding: 0.2rem 0.45rem; border-bottom: 1px solid rgba(128,128,128,0.25);
  text-align: left; vertical-align: top; overflow-wrap: break-word}
.abl-text-table th {font-weight: 600}
</style>"""


def text_table(df: pd.DataFrame, key: str, page_rows: int = PAGE_ROWS, caption: str | None = None) -> None:
    """``df`` (its values as they should read: abl.analysis.formats) as a plain table that fits its column:
    a long value wraps inside its cell instead of pushing columns out of view; past ``page_rows`` rows,
    pages. For tables that are read, not sorted or selected."""
    part = page_of(df, key, page_rows)
    html = part.to_html(index=False, escape=True, border=0, na_rep="–")
    st.markdown(f'{_TEXT_TABLE_CSS}<div class="abl-text-table">{html}</div>', unsafe_allow_html=True)
    if caption:
        st.caption(caption)


def metric_title(name: str) -> str:
    return q.metric_info(name).title  # the catalogue's label [unit] (abl.analysis.metrics)


# ---------------------------------------------------------------- one cell, one colour


def cell_channels(sel: q.Selection) -> palette.Channels:
    """How the selected experiments' cells are drawn (abl.present.palette.grid_styles, as ``abl report``
    draws them): a factorial grid's axes each on one channel (colour, marker and line style), else one look
    per cell by grid position; from what the runs recorded, over the whole experiments whatever the other
    filters hide, so a cell keeps its look on every page and in the report."""
    return load(q.grid_channels, q.Selection(experiments=sel.experiments))


def cell_styles(sel: q.Selection) -> dict[str, palette.CellStyle]:
    """Each cell's look (``cell_channels``); a cell outside the experiments' listing (none expected) after
    them, one look each."""
    out = dict(cell_channels(sel).styles)
    for k in cell_table(sel)["cell_key"]:
        out.setdefault(k, palette.style(len(out)))
    return out
