"""Trade-offs: quality against cost, one point per cell, with the Pareto front of each plot.

A cell is on the front when no other cell is at least as good on both axes
and strictly better on one (lower loss; lower memory, KV cache and
parameters; higher throughput).

A cost that every cell shown shares within 5% (``abl.analysis.sections.differs``:
one model size, one KV layout) gets one sentence instead of a plot; a cost
chosen under "More cost axes" is always drawn. Speed axes (tokens/s, MFU) show the min–max over a cell's seeds as a
horizontal bar, and ring in red the cells (or runs) measured on a contended
machine (``abl.analysis.sections.is_contended``): their speed is the machine's load,
not a result. A cell's speed is the mean of its runs measured on a quiet machine,
and only those speeds enter the Pareto front: a cell whose every run was
contended is drawn (ringed) but is never on the front. Each cell has its grid
position's colour (abl.present.palette), as on every page and in the report.
"""

import pandas as pd
import streamlit as st

from abl.analysis import metrics, sections, stats
from abl.dashboard import charts, common
from abl.dashboard import queries as q

# the costs traded against by default; which direction is better comes from the metric catalogue
COSTS = ("tokens_per_s", "peak_mem_bytes", "kv_bytes_per_token", "n_params")


def better_direction(cost: str) -> str:
    """The Pareto front's direction: the catalogue's, and lower where neither is better (fewer parameters
    are the cheaper model)."""
    better = q.metric_info(cost).better
    return better if better in ("lower", "higher") else "lower"

sel: q.Selection = st.session_state["selection"]
st.title("Trade-offs")
if common.no_runs(sel):
    st.stop()

cells = common.cell_table(sel)
axes = cells.attrs.get("axes", [])
names = common.load(q.metric_names, sel)
qualities = [n for n in ("val_loss", "train_loss") if n in names] or names
if not qualities:
    st.info("The selected runs have no metrics yet.")
    st.stop()

top = st.columns(2)
quality = top[0].selectbox("Quality (y, lower is better)", qualities, key="tr_quality")
color = top[1].selectbox("Color by", ["cell", *axes], key="tr_color",
                         index=0 if len(cells) <= charts.MAX_COLOURS or not axes else 1)
row = st.container(horizontal=True, gap="large")  # toggles as wide as their labels, wrapping: none cut
per_run = row.toggle("one point per run", key="tr_runs", help="Default: the mean of each cell's seeds")
include_all = row.toggle("include runs that did not complete", key="tr_incomplete")
extra = [n for n in names if n not in COSTS and n != quality]
custom = st.multiselect("More cost axes", extra, key="tr_custom",
                        help="Any other metric, one plot each (lower is better unless its name ends in _per_s).")

y = common.load(q.cell_values, sel, quality, not include_all)
contended = common.contended_runs(sel)
if y.empty:
    st.info(f"No {'' if include_all else 'completed '}run of the selection has {quality} yet.")
    st.stop()


def points(cost: str) -> pd.DataFrame:
    """x, y (and y's CI) per cell, or per run."""
    x = common.load(q.cell_values, sel, cost, not include_all)
    df = y.merge(x[["run_id", "value"]].rename(columns={"value": "x"}), on="run_id")
    if df.empty:
        return df
    speed = q.is_speed(cost)
    if per_run:
        df = df.rename(columns={"value": "y"}).assign(y_lo=lambda d: d["y"], y_hi=lambda d: d["y"], n=1)
        df = df.merge(cells[["cell_key", "cell", *axes]], on="cell_key", how="left", suffixes=("_run", ""))
        df["cell"] = df["cell"] + " · seed " + df["seed"].astype(str)
        if speed and contended:
            df["contended"] = df["run_id"].isin(contended)
            df["x_front"] = df["x"].where(~df["contended"])  # a contended speed never enters the front
        return df
    s = stats.summarize_groups(df, "cell_key", "value").rename(columns={"mean": "y", "ci_lo": "y_lo", "ci_hi": "y_hi"})
    gx = df.groupby("cell_key", sort=False)["x"]
    s["x"] = gx.mean().reindex(s["cell_key"]).to_numpy()
    if speed and contended:  # a cell's speed: its runs on a quiet machine; the front: those cells only
        quiet_runs = df[~df["run_id"].isin(contended)]
        quiet = quiet_runs.groupby("cell_key")["x"].mean().reindex(s["cell_key"]).to_numpy()
        s["x_front"] = quiet
        s["x"] = pd.Series(quiet).fillna(pd.Series(s["x"].to_numpy())).to_numpy()
    if speed and (gx.count() > 1).any():  # one speed per seed: show the spread, not one number
        s["x_lo"] = gx.min().reindex(s["cell_key"]).to_numpy()
        s["x_hi"] = gx.max().reindex(s["cell_key"]).to_numpy()
    if speed and contended:
        hit = df.assign(c=df["run_id"].isin(contended)).groupby("cell_key")["c"]
        s["contended"] = hit.any().reindex(s["cell_key"]).fillna(False).to_numpy()
        s["contended_runs"] = [f"{int(a)} of {int(b)} runs" for a, b in
                               zip(hit.sum().reindex(s["cell_key"]).fillna(0), hit.count().reindex(s["cell_key"]).fillna(0))]
    s["y_lo"] = s["y_lo"].fillna(s["y"])
    s["y_hi"] = s["y_hi"].fillna(s["y"])
    return s.merge(cells[["cell_key", "cell", *axes]], on="cell_key", how="left")


styles = common.cell_styles(sel)
channels = common.cell_channels(sel)  # a factorial grid: colour for one axis, marker for the other(s)
plots = [(c, better_direction(c), False) for c in [*COSTS, *custom]]
# one plot per row: side by side, a laptop-wide window leaves each plot too narrow for its legend
for i, (cost, better, log_default) in enumerate(plots):
    with st.container():
        title = common.metric_title(cost)
        st.subheader(f"{q.metric_info(quality).label} vs {q.metric_info(cost).label}")
        if cost not in names:
            st.info(f"No run of the selection records {cost} yet"
                    + (" (it is measured by the decode benchmark)." if cost.startswith("kv_") else "."))
            continue
        df = points(cost)
        if df.empty:
            st.info(f"No run has both {quality} and {cost}.")
            continue
        if cost not in custom and not q.is_speed(cost) and not sections.differs(df["x"]):
            # a cost every cell shares is no axis to trade against (the norms grid: one model size)
            st.info(f"Every cell shown has the same {cost} (within {sections.AXIS_REL_TOL:.0%}: "
                    f"{metrics.display(cost, df['x'].min())} to {metrics.display(cost, df['x'].max())}), "
                    "so there is nothing to trade against it.")
            continue
        scale = 2**20 if q.metric_info(cost).unit == "bytes" and df["x"].max() > 2**20 else 1
        if scale != 1:
            for c in ("x", "x_lo", "x_hi", "x_front"):
                if c in df:
                    df[c] = df[c] / scale
            title = f"{q.metric_info(cost).label} [MiB]"
        df["front"] = stats.pareto_mask(df["x_front"] if "x_front" in df else df["x"], df["y"], better)
        log_x = st.toggle("log x", value=log_default, key=f"tr_log_{cost}")
        domain = sorted(cells[color].astype(str).unique()) if color != "cell" else list(cells["cell"])
        looks = [styles[k] for k in cells["cell_key"]] if color == "cell" else None
        if per_run and color == "cell":  # a run in its cell's style
            by_label = dict(zip(df["cell"], df["cell_key"]))
            domain = sorted(df["cell"].unique())
            looks = [styles[by_label[lbl]] for lbl in domain]
        df[color] = df[color].astype(str)
        key_of = dict(zip(df["cell"].astype(str), df["cell_key"].astype(str)))
        chart = charts.pareto_chart(df, "x", title, common.metric_title(quality), color, log_x, better,
                                    domain=domain, styles=looks, channels=channels, key_of=key_of)
        export = df[[c for c in ["cell", "cell_key", "seed", *axes, "x", "x_lo", "x_hi", "y", "y_lo", "y_hi", "n",
                                 "front", "contended"]
                     if c in df]].rename(columns={"x": cost if scale == 1 else f"{cost}_MiB", "y": quality,
                                                  "x_lo": f"{cost}_min", "x_hi": f"{cost}_max"})
        front = df[df["front"]].sort_values("x", ascending=better == "lower")
        charts.show(chart, export, f"{quality}_vs_{cost}", key=f"tr_{cost}",
                    caption=f"{'Higher' if better == 'higher' else 'Lower'} {q.metric_info(cost).label} is better. "
                            + (f"Pareto front ({len(front)} of {len(df)}: heavy outline, dashed line), cheapest "
                               "first: " + " → ".join(front["cell"]) + "." if len(front) else
                               "No Pareto front.")
                            + (f" {channels.describe().capitalize()}." if color == "cell" and channels.factorial
                               else "")
                            + " Vertical bars: 95% CI of the mean across seeds"
                            + ("; horizontal bars: min–max over seeds." if "x_lo" in df else ".")
                            + (" Speeds from runs on a quiet machine only; a cell with no such run is not on "
                               "the front." if "x_front" in df else "")
                            + (" No cell has a speed measured on a quiet machine, so there is no front."
                               if "x_front" in df and df["x_front"].isna().all() else ""))
        if "contended" in df and df["contended"].any():
            n_hit = len(contended & set(y["run_id"]))
            st.caption(f"⚠ Red rings: cells with a run {common.CONTENDED_NOTE} ({n_hit} run(s)).")
