"""Experiments & runs: what is in the store, what is running, and the final numbers of each run."""

import streamlit as st

from abl.analysis import stats
from abl.analysis.metrics import shown_by_default
from abl.analysis.units import TOKENS_PER_S
from abl.analysis.verdicts import value_text
from abl.contracts.status import COMPLETED, NOT_COMPLETED, RUNNING
from abl.dashboard import common
from abl.dashboard import queries as q

SUMMARY = shown_by_default()  # the metric catalogue's (abl.analysis.metrics), a plugin's metrics too

sel: q.Selection = st.session_state["selection"]
ctx = common.ctx()
st.title("Experiments & runs")

exps = common.load(q.experiments)
if not exps.empty:
    totals = exps[["runs", "cells", "completed", "running", "not_completed"]].sum()
    tiles = st.container(horizontal=True, gap="small")  # each tile as wide as its label: none is cut
    tiles.metric("experiments", len(exps), width="content")
    tiles.metric("runs", int(totals["runs"]), width="content")
    tiles.metric("completed", int(totals["completed"]), width="content")
    tiles.metric("running", int(totals["running"]), width="content")
    tiles.metric("did not complete", int(totals["not_completed"]), width="content",
                 help="status " + ", ".join(NOT_COMPLETED))
    with st.expander("All experiments", expanded=False):
        st.dataframe(exps, hide_index=True, width="stretch", column_config={
            "not_completed": st.column_config.NumberColumn("did not complete"),
            "first_started": st.column_config.DatetimeColumn("first started", format="YYYY-MM-DD HH:mm"),
            "last_activity": st.column_config.DatetimeColumn("last activity", format="YYYY-MM-DD HH:mm"),
            "grid_files": "grid file(s)"})

if common.no_runs(sel):
    st.stop()

runs = common.runs_table(sel)
axes = runs.attrs["axes"]
catalogue = common.load(q.metric_catalogue, sel)
present = set(catalogue["name"])
once = [n for n, per_step in zip(catalogue["name"], catalogue["per_step"]) if not per_step]
names = [n for n in SUMMARY if n in present] + [n for n in once if n not in SUMMARY]
fin = common.load(q.finals, sel, tuple(names))
df = runs.merge(fin, on="run_id", how="left")
contended = common.contended_runs(sel)
df["contended"] = df["run_id"].isin(contended)

# running cells: progress from their metrics files, and how long ago they last wrote
progress = ctx.live.progress
df["last_step"] = df["last_step"].astype("Float64")
df["progress"] = (df["last_step"] / df["steps"]).clip(0, 1).astype(float)
df.loc[df["status"] == COMPLETED, "progress"] = 1.0


def _activity(row) -> str:
    p = progress.get(row["run_id"])
    if row["status"] != RUNNING or p is None:
        return ""
    parts = []
    if p.get("age_s") is not None:
        parts.append(f"updated {p['age_s']:.0f} s ago")
    else:
        parts.append("no metrics yet")
    fs = p.get("folder_status")
    if fs and fs != RUNNING:
        parts.append(f"run folder says {fs}: run `abl ingest` if abl run is no longer running")
    return "; ".join(parts)


df["activity"] = df.apply(_activity, axis=1) if len(df) else ""
n_running = int((df["status"] == RUNNING).sum())
if n_running:
    st.info(f"{n_running} run(s) in progress: their curves and numbers so far come from their run folders. "
            "Press Refresh in the sidebar (or switch on Live) to follow them.", icon=":material/sync:")

st.subheader("Runs")
view = st.segmented_control("Rows", ["one per run", "one per cell (seeds aggregated)"],
                            default="one per run", key="rows_view")
metric_cols = [n for n in names if n in df and n != "contended"]  # contended: the ⚠ column
mem_cols = [n for n in metric_cols if n.endswith("_bytes")]  # totals in MiB; per-token bytes stay bytes
for n in mem_cols:
    df[n] = df[n] / 2**20

column_config = {
    "cell": st.column_config.TextColumn("cell", width="medium"),
    "status": st.column_config.TextColumn("status"),
    "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0, format="percent"),
    "started": st.column_config.DatetimeColumn("started", format="YYYY-MM-DD HH:mm:ss"),
    "run": st.column_config.LinkColumn("detail", display_text="open", help="Run detail in a new tab"),
    "run_id": st.column_config.TextColumn("run_id"),
    "activity": st.column_config.TextColumn("activity"),
    "contended": st.column_config.CheckboxColumn("⚠", help="Speed measured on a contended machine: "
                                                 "its tokens/s and MFU are the machine's load, not a result"),
    "contended seeds": st.column_config.NumberColumn("⚠ seeds", help="Seeds whose speed was measured "
                                                     "on a contended machine"),
}
for n in metric_cols:  # each in its unit (the metric catalogue): MiB, whole tokens/s, percentages
    info = q.metric_info(n)
    unit = "MiB" if n in mem_cols else info.unit
    label = {TOKENS_PER_S: TOKENS_PER_S, "MiB": "peak MiB" if n == "peak_mem_bytes" else f"{n} [MiB]"}.get(
        unit, f"{n} [{unit}]" if unit and not info.is_loss else n)
    fmt = ("%.4f" if info.is_loss else "%.1f" if n in mem_cols else "%.0f" if unit == TOKENS_PER_S
           else "percent" if unit == "fraction" else "localized" if n.startswith("n_") else "%.4g")
    column_config[n] = st.column_config.NumberColumn(label, format=fmt, help=info.description or info.label)

if view == "one per cell (seeds aggregated)":
    groups = df.groupby("cell_key", sort=False)
    table = groups.agg(cell=("cell", "first"), experiment=("experiment", "first"),
                       **{a: (a, "first") for a in axes}, seeds=("seed", "count"),
                       status=("status", lambda s: ", ".join(f"{k}×{v}" for k, v in s.value_counts().items())),
                       progress=("progress", "mean"), started=("started", "min"),
                       **{n: (n, "mean") for n in metric_cols}, **{"contended seeds": ("contended", "sum")}
                       ).reset_index()
    speed_cols = [n for n in metric_cols if q.is_speed(n)]
    for n in speed_cols:  # one speed per seed: the spread, not one number
        lo, hi, k = groups[n].min(), groups[n].max(), groups[n].count()
        spread = {c: (f"{value_text(n, lo[c])} – {value_text(n, hi[c])}" if k[c] > 1 else "")
                  for c in lo.index}
        table[f"{n} min–max"] = table["cell_key"].map(spread)
    if "val_loss" in df:
        summ = stats.summarize_groups(df.dropna(subset=["val_loss"]), "cell_key", "val_loss")
        summ["val_loss ±95% CI"] = (summ["ci_hi"] - summ["mean"]).round(4)
        table = table.merge(summ[["cell_key", "val_loss ±95% CI"]], on="cell_key", how="left")
    if "val_loss" in table:
        table = table.sort_values("val_loss", na_position="last")
    order = [*axes, "seeds", "status", "progress", *metric_cols[:1],
             *(["val_loss ±95% CI"] if "val_loss ±95% CI" in table else []),
             *[c for n in metric_cols[1:] for c in (n, f"{n} min–max") if c in table],
             *(["contended seeds"] if contended else []), "cell", "started", "experiment"]
    column_config["val_loss"] = st.column_config.NumberColumn("val_loss (mean)", format="%.4f")
else:
    table = df.copy()
    table["run"] = "run_detail?run=" + table["run_id"]
    order = [*axes, "seed", "status", "progress", *metric_cols, *(["contended"] if contended else []),
             "activity", "cell", "started", "experiment", "run_id", "run"]
    if not table["activity"].astype(bool).any():
        order.remove("activity")
table = table.reset_index(drop=True)
available = [c for c in dict.fromkeys(order) if c in table]
# the columns that fit a laptop's width (1024 px leaves about 560 px beside the sidebar); the rest one click
# away: a table wider than its room hides columns behind a scroll bar
per_cell = view == "one per cell (seeds aggregated)"
first = [*axes, "seeds" if per_cell else "seed",
         *(["status"] if (df["status"] != COMPLETED).any() else []),
         *(["progress"] if (df["status"] == RUNNING).any() else []), *(["activity"] if n_running else []),
         *metric_cols[:1], *(["val_loss ±95% CI", "tokens_per_s min–max"] if per_cell else
                             ["tokens_per_s", "peak_mem_bytes"]),
         *(["contended seeds" if per_cell else "contended"] if contended else [])]
first = [c for c in first if c in available]
for c in first:  # widths that add up to the room; with more room they stretch
    cfg = column_config.get(c)
    width = 90 if c in axes else 45 if c in ("seed", "seeds", "contended", "contended seeds") else \
        110 if c.endswith("min–max") else 75
    if cfg is not None:
        cfg["width"] = width
    else:
        column_config[c] = {"width": width}
more = st.multiselect("More columns", [c for c in available if c not in first], key="runs_more_cols",
                      placeholder="add columns: " + ", ".join(c for c in available if c not in first)[:80] + "…")
shown = [c for c in available if c in first or c in more]
page = common.page_of(table, "runs_table")
event = st.dataframe(page[available], hide_index=True, width="stretch", column_config=column_config,
                     column_order=shown,
                     on_select="rerun", selection_mode="multi-row", key="runs_table",
                     height=common.table_height(len(page)))


def _use_selected_cells() -> None:
    rows = st.session_state["runs_table"]["selection"]["rows"]
    st.session_state["f_cells"] = list(dict.fromkeys(page.iloc[rows]["cell_key"]))


rows = event.selection.rows if event is not None else []
left = mid = right = st.container(horizontal=True)  # buttons as wide as their labels, wrapping
left.button(f"Compare the {len(rows)} selected row(s)' cells", disabled=not rows, on_click=_use_selected_cells,
            icon=":material/compare_arrows:",
            help="Restricts every page to these cells (the sidebar's 'Cells to compare').")
if mid.button("Open run detail", disabled=len(rows) != 1 or "run_id" not in table,
              icon=":material/description:"):
    st.session_state["detail_run"] = page.iloc[rows[0]]["run_id"]
    st.switch_page("views/run_detail.py")
right.download_button("Download this table (CSV)", data=lambda: table[shown].to_csv(index=False),
                      file_name="runs.csv", mime="text/csv", on_click="ignore", icon=":material/download:")
st.caption(f"{len(runs)} runs in {runs['cell_key'].nunique()} cells. Columns: the config axes that vary between "
           "the selected runs, then each run's final numbers (val_loss and train_loss at the last step, "
           "tokens/s the median over steps, memory the peak). Select rows to compare their cells.")
if contended:
    st.caption(f"⚠ {len(contended & set(df['run_id']))} run(s) were {common.CONTENDED_NOTE} "
               "(column ⚠ contended). Per cell, speed shows its min–max over seeds.")

problems = df[df["status"].isin(NOT_COMPLETED)]
if len(problems):
    st.subheader(f"Runs that did not complete ({len(problems)})")
    for _, r in problems.iterrows():
        msg = (r["error"] or "").strip().splitlines()
        st.markdown(f"**{r['cell']}** seed {r['seed']} — `{r['status']}`: {msg[-1] if msg else 'no error recorded'}"
                    f"  ·  [details](run_detail?run={r['run_id']})")
