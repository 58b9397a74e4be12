"""Costs: predicted against measured, per cell, and the scaling-law fit.

The same rules as ``abl report`` (abl.present.report, abl.analysis.sections), from the
same functions: parameters must agree exactly, FLOPs per step within 5% of
torch's flop counter, peak tensor memory within the band in
harness/model/costmodel.py. The page shows one summary row per figure (how many
cells agree, the worst ratio) and lists only the checks that disagree; every
row is in a folded table. A plot panel appears only for a figure that differs
between the cells, and the scaling fit only over enough model sizes
(``abl.analysis.sections.scaling_fit_applies``); what is left out says why. Cells are
named by ``abl.grid.labels``; runs on a contended machine are counted in a warning.
A cell with a component that declares no cost function is measured once per shape
instead, as ``abl cost`` does; its rows say ``measured`` in the source column.
"""

import pandas as pd
import streamlit as st

from abl.dashboard import common
from abl.dashboard import queries as q

sel: q.Selection = st.session_state["selection"]
st.title("Costs & scaling")
if common.no_runs(sel):
    st.stop()


@st.cache_data(max_entries=32, show_spinner="Predicting costs...")
def _analyse(db: str, run_ids: tuple[str, ...], sig: tuple):
    from abl.contracts.plugin_manager import get_registry
    from abl.present.report import costs
    from abl.present.report.runs import group_cells, label_cells, load_runs

    runs = load_runs(db, run_ids=list(run_ids))
    cells = group_cells(runs)
    label_cells(cells)
    costs.attach_predictions(cells, get_registry())
    rows = costs.cost_rows(cells)
    points = costs.scaling_points(cells)
    return rows, points, costs.contention_note(runs), costs.measured_note(cells), costs.compared_note(rows)


runs = common.runs_table(sel)
ctx = common.ctx()
try:
    rows, points, contention, measured_note, skipped = _analyse(ctx.store.db, tuple(runs["run_id"]), ctx.sig)
except Exception as exc:  # noqa: BLE001 - a busy or odd store is shown, not raised
    st.error(f"Could not read the runs for the cost check: {exc}")
    st.stop()

from abl.analysis import sections  # noqa: E402 - after the page's early exits
from abl.model.costmodel import MEMORY_BAND  # noqa: E402
from abl.present.report.costs import cost_summary  # noqa: E402
from abl.present.report.plots import (  # noqa: E402
    PLOTTED_CHECKS,
    plot_predicted_vs_measured,
    plot_scaling,
    predicted_vs_measured_panels,
)

table = pd.DataFrame(rows)
if table.empty:
    st.info("The selected runs have no cells to check.")
    st.stop()
if contention:
    st.warning(contention, icon=":material/speed:")
summary, outliers = cost_summary(rows)
source = ["source"] if measured_note else []  # "predicted" or "measured" (no cost function), as abl cost says
compared = sum(s["compared"] for s in summary)
if outliers:
    st.warning(f"{len(outliers)} of {compared} compared checks disagree: "
               + "; ".join(f"{r['label']}: {r['figure']}" for r in outliers[:8])
               + (" ..." if len(outliers) > 8 else ""), icon=":material/warning:")
elif skipped:  # never a green "all agree" over cells that were not compared
    st.warning(f"Every compared check agrees ({compared} of {len(table)} checks), but {skipped}",
               icon=":material/warning:")
else:
    st.success(f"Every measured check agrees ({compared} of {len(table)} checks have a measurement).")
if skipped and outliers:
    st.warning(skipped, icon=":material/warning:")
common.text_table(pd.DataFrame([{
    "figure": s["figure"], "cells": s["cells"], "agree": s["agree"], "disagree": s["disagree"],
    "not compared": s["not_compared"],
    "worst measured / predicted": "-" if s["worst_ratio"] is None else f"{s['worst_ratio']:.4f} ({s['worst_cell']})",
} for s in summary]), key="costs_summary")
if outliers:
    st.markdown("**The checks that disagree**")
    common.text_table(pd.DataFrame(outliers)[["label", "figure", "predicted", *source, "measured", "ratio",
                                              "agreement"]]
                      .rename(columns={"label": "cell", "ratio": "measured / predicted"}), key="costs_outliers")
st.caption("Required: parameters exact; FLOPs per step within 5% of torch.utils.flop_counter on one step; "
           f"peak tensor memory (one whole training step, torch's MemTracker) within {MEMORY_BAND[0]:g}-"
           f"{MEMORY_BAND[1]:g}x of the prediction, which models the torch reference path. Predictions come "
           "from the components' registered cost functions (harness/model/costmodel.py).")
if measured_note:
    st.caption(measured_note)

table["disagrees"] = table["agreement"].str.startswith("DISAGREES")
with st.expander(f"Every check, one row per cell and figure ({len(table)} rows)", expanded=False):
    figures = sorted(table["figure"].unique())
    pick = st.multiselect("Figures", figures, default=figures, key="costs_figures")
    shown = table[table["figure"].isin(pick)].sort_values(["disagrees", "label"], ascending=[False, True])
    st.dataframe(
        shown[["label", "figure", "predicted", *source, "measured", "ratio", "agreement"]].rename(
            columns={"label": "cell", "ratio": "measured / predicted"}),
        hide_index=True, width="stretch")

png = plot_predicted_vs_measured(rows, "")
if png:
    st.image(png, caption="predicted against measured, one point per cell (red: disagrees)")
plotted = predicted_vs_measured_panels(rows)
flat = [name for name in PLOTTED_CHECKS if name not in plotted and (table["figure"] == name).any()
        and table.loc[table["figure"] == name, "measured"].notna().any()]
if flat:
    st.caption(f"Not plotted (the summary says how they agree): {', '.join(flat)}, the same for every cell "
               f"(within {sections.REL_TOL:.0%}).")

st.subheader("Scaling fit")
why = sections.scaling_fit_applies(n for n, _, _ in points)
if why:
    st.info(f"No scaling fit of L(N, D) = E + A/N^α + B/D^β: {why} (e.g. a grid over `model.scale`).")
    st.stop()
from abl.analysis.scaling import ScalingFitError  # noqa: E402
from abl.analysis.scaling import fit as fit_scaling

try:
    fit = fit_scaling(*zip(*points))
except ScalingFitError as exc:
    st.warning(f"The scaling fit failed: {exc}")
    st.stop()
st.dataframe(pd.DataFrame([{"E": fit.E, "A": fit.A, "α": fit.alpha, "B": fit.B, "β": fit.beta, "form": fit.form,
                            "points": fit.n_points, "sizes": fit.n_sizes, "token budgets": fit.n_token_budgets,
                            "rmse(log L)": fit.rmse_log}]), hide_index=True)
for note in getattr(fit, "notes", []) or []:
    st.caption(note)
st.image(plot_scaling(points, fit, ""), caption="final val_loss against non-embedding parameters")
