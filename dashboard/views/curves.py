"""Curves: train and val loss (or any per-step metric) against step, tokens, FLOPs or wall time.

The seeds of a cell are averaged at each step into one line, with the 95%
t-interval of that mean as a band (where at least two seeds reached the step).
The bands are on by default only when every cell shown has at least 3 seeds
(``abl.analysis.sections.bands_by_default``: at n = 2 the t multiplier is 12.7 and a
band is a smear); otherwise each seed's line is drawn faintly instead, and a
toggle turns the bands on. Validation figures are drawn raw: a smoothed
val_loss ends above the final value every table shows. Smoothing (a debiased
EMA of each run before averaging) is offered for the training loss only, off
by default, and the caption says when it is on. The y axis holds every cell's
final value. Each cell has its grid position's colour and line style
(abl.present.palette), the same on every page and in the report. More cells
than MAX_COLOURS: one panel per value of the first grid axis.
"""

import numpy as np
import pandas as pd
import streamlit as st

from abl.analysis import sections, stats
from abl.dashboard import charts, common
from abl.dashboard import queries as q

MAX_POINTS = 400  # per line, after smoothing
SMOOTHABLE = ("train_loss",)  # noisy per-batch figures; a validation figure is drawn as measured
DEFAULT_CELLS = charts.MAX_COLOURS  # as many as the palette tells apart (the best first when there are more)

# The FLOPs axis, from the first of these a run records: cumulative training FLOPs at each
# step; FLOPs of one training step (x step); forward FLOPs per token (x tokens x 3, backward
# counted as twice the forward as in harness/contracts/cost.py).
FLOPS_CUMULATIVE = ("flops", "train_flops")
FLOPS_PER_RUN = (("flops_per_step_measured", "step", 1.0), ("flops_per_step", "step", 1.0),
                 ("train_flops_per_token", "token", 1.0), ("flops_per_token", "token", 3.0))

sel: q.Selection = st.session_state["selection"]
st.title("Curves")
if common.no_runs(sel):
    st.stop()

runs = common.runs_table(sel)
catalogue = common.load(q.metric_catalogue, sel)
per_step = [n for n, s in zip(catalogue["name"], catalogue["per_step"]) if s and n != "elapsed_s"]
if not per_step:
    st.info("The selected runs have no per-step metrics yet.")
    st.stop()
present = set(catalogue["name"])

# cells, best final val_loss first, so the default picks the interesting ones
cells = common.cell_table(sel)
if "val_loss" in present:
    vals = common.load(q.cell_values, sel, "val_loss", False)
    best = vals.groupby("cell_key")["value"].mean()
    cells["order"] = cells["cell_key"].map(best)
    cells = cells.sort_values("order", na_position="last")
labels = dict(zip(cells["cell_key"], cells["cell"]))

x_options = {"step": "step", "tokens": "tokens seen"}
flops_cum = next((n for n in FLOPS_CUMULATIVE if n in present), None)
flops_run = next((f for f in FLOPS_PER_RUN if f[0] in present), None)
if flops_cum or flops_run:
    x_options["flops"] = q.metric_info("flops").label
if "elapsed_s" in present:
    x_options["wall"] = "wall time [s]"

top = st.columns([3, 2, 2])
default_metrics = [m for m in ("train_loss", "val_loss") if m in per_step] or per_step[:1]
metrics = top[0].multiselect("Metrics", per_step, default=default_metrics, key="curve_metrics")
x_kind = top[1].radio("x axis", list(x_options), format_func=x_options.get, horizontal=True, key="curve_x")
smooth = top[2].slider("EMA smoothing of train_loss", 0.0, 0.99, 0.0, 0.01, key="curve_ema",
                       help="Weight of the previous value; 0 = raw (the default). Debiased like TensorBoard's. "
                            "Applies to the training loss only: validation figures are always drawn raw.")
keys = list(cells["cell_key"])
default_cells = keys if len(keys) <= DEFAULT_CELLS else keys[:DEFAULT_CELLS]
shown_keys = [k for k in st.session_state.get("curve_cells") or () if k in keys] or default_cells
seeds_per_cell = runs[runs["cell_key"].isin(shown_keys)].groupby("cell_key")["seed"].nunique()
bands = sections.bands_by_default(seeds_per_cell.tolist())
row = st.container(horizontal=True, gap="large")  # toggles as wide as their labels, wrapping: none cut
log_x = row.toggle("log x", key="curve_logx")
log_y = row.toggle("log y", key="curve_logy")
show_seeds = row.toggle("individual seeds", value=not bands, key="curve_seeds",
                            help="A faint dashed line per seed (on by default when a cell has fewer than "
                                 f"{sections.MIN_SEEDS_FOR_BANDS} seeds).")
show_band = row.toggle("95% CI band", value=bands, key="curve_band",
                           help=f"Off by default when a cell shown has fewer than {sections.MIN_SEEDS_FOR_BANDS} "
                                "seeds: with 2 seeds the 95% t multiplier is 12.7, so the band says little.")
if "curve_cells" in st.session_state:
    st.session_state["curve_cells"] = [k for k in st.session_state["curve_cells"] if k in keys]
else:
    st.session_state["curve_cells"] = default_cells
chosen = st.multiselect("Cells", keys, key="curve_cells", format_func=lambda k: labels.get(k, k),
                        help=f"The {DEFAULT_CELLS} with the best final val_loss are shown at first.")
if len(keys) > len(chosen):
    st.caption(f"Showing {len(chosen)} of {len(keys)} cells.")
if not chosen or not metrics:
    st.info("Pick at least one metric and one cell.")
    st.stop()

sub = runs[runs["cell_key"].isin(chosen)]
run_ids = tuple(sub["run_id"])
axes = runs.attrs.get("axes", [])
facet = axes[0] if axes and len(chosen) > charts.MAX_COLOURS else None
meta = sub.set_index("run_id")[["cell", "seed", "tokens_per_step", "cell_key", *([facet] if facet else [])]]
contended = common.contended_runs(sel) & set(run_ids)

flops_factor = None  # per run: FLOPs per step
if x_kind == "flops" and not flops_cum:
    assert flops_run is not None  # "flops" is offered only when a cumulative or a per-run FLOPs metric exists
    name, unit, factor = flops_run
    f = common.load(q.finals, sel, (name,)).set_index("run_id")[name] * factor
    flops_factor = f * (meta["tokens_per_step"].astype(float).reindex(f.index) if unit == "token" else 1.0)


def smoothing_of(metric: str) -> float:
    """The EMA weight applied to ``metric``: the slider's for the training loss, 0 for every other figure."""
    return float(smooth) if metric in SMOOTHABLE else 0.0


def curve_frames(metric: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    df = common.load(q.curves, run_ids, metric, x_kind == "wall", flops_cum if x_kind == "flops" else None)
    if df.empty:
        return df, df
    df = df.join(meta, on="run_id")
    df = df.sort_values(["run_id", "step"], kind="stable")
    if smoothing_of(metric) > 0:
        df["y"] = stats.ema_by_group(df, "run_id", "y", smoothing_of(metric))
    if x_kind == "step":
        df["x"] = df["step"].astype(float)
    elif x_kind == "tokens":
        df["x"] = df["step"] * df["tokens_per_step"].astype(float)
    elif x_kind == "wall":
        df["x"] = df["elapsed_s"]
    elif flops_cum:
        df["x"] = df["flops"]
    else:
        df["x"] = df["step"] * df["run_id"].map(flops_factor)
    df = df.dropna(subset=["x", "y"])
    if log_x:
        df = df[df["x"] > 0]
    if log_y:
        df = df[df["y"] > 0]
    # seeds of a cell share their steps; average per step (wall time: the mean x)
    g = df.groupby(["cell_key", "step"], sort=False)
    agg = g.agg(cell=("cell", "first"), x=("x", "mean"), mean=("y", "mean"), std=("y", "std"),
                n=("y", "count"), **({facet: (facet, "first")} if facet else {})).reset_index()
    hw = stats.t_halfwidth(agg["std"].fillna(0.0), agg["n"])
    agg["lo"] = np.where(agg["n"] >= 2, agg["mean"] - hw, agg["mean"])
    agg["hi"] = np.where(agg["n"] >= 2, agg["mean"] + hw, agg["mean"])
    agg = agg.sort_values(["cell_key", "step"])
    agg = stats.downsample(agg, "cell_key", MAX_POINTS)
    seeds = stats.downsample(df[["run_id", "cell", "seed", "step", "x", "y", *([facet] if facet else [])]],
                             "run_id", MAX_POINTS)
    return agg, seeds


def y_extent(metric: str, agg: pd.DataFrame, seeds: pd.DataFrame) -> tuple[float, float]:
    """The y axis's extent: every value drawn (the means, the seeds' lines when shown, the band only when it
    is on: a 2-seed band is t(1)-wide and would stretch the axis around nothing) and every shown cell's
    final value (as the tables show it), with a little room; a log axis keeps positive values only."""
    drawn = ([agg["mean"]] + ([agg["lo"], agg["hi"]] if show_band else [])
             + ([seeds["y"]] if show_seeds else []))
    finals = common.load(q.cell_values, sel, metric, False)
    finals = finals[finals["run_id"].isin(run_ids)]
    cell_finals = finals.groupby("cell_key")["value"].mean()  # the number the tables show for each cell
    values = pd.concat([*drawn, finals["value"], cell_finals], ignore_index=True).dropna()
    if log_y:
        values = values[values > 0]
    lo, hi = float(values.min()), float(values.max())
    if log_y:
        return lo / 1.02, hi * 1.02
    pad = 0.03 * (hi - lo) if hi > lo else max(abs(hi) * 0.01, 1e-3)
    return lo - pad, hi + pad


styles = common.cell_styles(sel)
channels = common.cell_channels(sel)  # a factorial grid: colour for one axis, line style for the other(s)
for metric in metrics:
    agg, seeds = curve_frames(metric)
    st.subheader(common.metric_title(metric))
    if agg.empty:
        st.info(f"No {metric} rows for these cells yet.")
        continue
    chart = charts.curve_chart(agg[["cell", "step", "x", "mean", "lo", "hi", "n", *([facet] if facet else [])]],
                               seeds if show_seeds else None, x_options[x_kind], common.metric_title(metric),
                               log_x=log_x, log_y=log_y, band=show_band,
                               x_format={"step": "d", "wall": ",.0f"}.get(x_kind, "~s"),
                               domain=[labels[k] for k in chosen], facet=facet,
                               styles=[styles[k] for k in chosen], y_domain=y_extent(metric, agg, seeds),
                               channels=channels, key_of={labels[k]: k for k in chosen})
    # the x column under its own name (step is there already)
    x_col = {"tokens": "tokens", "flops": "flops", "wall": "elapsed_s"}.get(x_kind)
    cols = ["cell", "cell_key", "step", *(["x"] if x_col else []), "mean", "std", "n", "lo", "hi"]
    export = agg[cols].rename(columns={"x": x_col, "lo": "ci95_lo", "hi": "ci95_hi"})
    if show_seeds:
        per_seed = seeds[["cell", "seed", "step", *(["x"] if x_col else []), "y"]]
        export = pd.concat([export.assign(kind="mean over seeds"),
                            per_seed.rename(columns={"x": x_col, "y": "mean"}).assign(kind="one seed")])
    what = [f"lines: mean over seeds ({channels.describe().replace('marker and line style', 'line style')})"]
    if show_seeds:
        what.append("thin faint lines: each seed")
    if show_band:
        what.append("band: 95% t-interval across seeds")
    charts.show(chart, export, f"{metric}_vs_{x_kind}", key=f"curve_{metric}",
                caption="; ".join(what)
                        + (f"; train_loss smoothed: EMA {smoothing_of(metric):.2f}" if smoothing_of(metric)
                           else "; raw values (no smoothing)") + "; "
                        "drag to pan, scroll to zoom, click a legend entry to highlight "
                        + ("a level" if channels.factorial else "a cell"))
    if q.is_speed(metric) and contended:
        hit = sorted({labels.get(k, k) for k in sub.loc[sub["run_id"].isin(contended), "cell_key"]})
        st.caption(f"⚠ {len(contended)} run(s) of these cells were {common.CONTENDED_NOTE}: " + "; ".join(hit))
if not bands and not show_band:
    st.caption(f"95% CI bands are off: a cell shown has fewer than {sections.MIN_SEEDS_FOR_BANDS} seeds "
               f"(min {int(seeds_per_cell.min()) if len(seeds_per_cell) else 0}); each seed's line is drawn instead.")
if x_kind == "flops" and not flops_cum:
    assert flops_run is not None  # "flops" is offered only when a cumulative or a per-run FLOPs metric exists
    name, unit, factor = flops_run
    st.caption(f"training FLOPs = {'step' if unit == 'step' else 'tokens seen'} × {name}"
               + (" × 3 (forward + backward ≈ 3 × forward)" if factor != 1 else ""))
