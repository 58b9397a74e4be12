"""Costs: predicted against measured, per cell, and the scaling-law fit.

The table is ``abl report``'s (harness/report.py ``cost_rows``): parameters
must agree exactly, FLOPs per step within 5% of torch's flop counter, peak
tensor memory within the band in harness/costmodel.py. Rows that disagree
are listed first and counted in a warning: nothing is hidden. The scaling
section fits L(N, D) = E + A/N^alpha + B/D^beta over the completed runs when
the selection spans enough model sizes.
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
    from abl import report
    from abl.plugin_manager import get_registry

    runs = report.load_runs(db, run_ids=list(run_ids))
    cells = report.group_cells(runs)
    report.attach_predictions(cells, get_registry())
    rows = report.cost_rows(cells)
    points = report.scaling_points(cells)
    return rows, points, [c.label for c in cells]


runs = common.runs_table(sel)
ctx = common.ctx()
try:
    rows, points, labels = _analyse(ctx.store.db, tuple(runs["run_id"]), ctx.sig)
except Exception as exc:  # noqa: BLE001 - a busy or odd store is shown, not raised
    st.error(f"Could not read the runs for the cost check: {exc}")
    st.stop()

from abl import report  # noqa: E402 - after the page's early exits
from abl.costmodel import MEMORY_BAND  # noqa: E402

table = pd.DataFrame(rows)
if table.empty:
    st.info("The selected runs have no cells to check.")
    st.stop()
table["disagrees"] = table["agreement"].str.startswith("DISAGREES")
bad = table[table["disagrees"]]
if len(bad):
    st.warning(f"{len(bad)} of {len(table)} predicted-vs-measured checks disagree: "
               + "; ".join(f"{r.label}: {r.figure}" for r in bad.head(8).itertuples())
               + (" ..." if len(bad) > 8 else ""), icon=":material/warning:")
else:
    measured = table["measured"].notna().sum()
    st.success(f"Every measured check agrees ({measured} of {len(table)} checks have a measurement).")

figures = sorted(table["figure"].unique())
pick = st.multiselect("Figures", figures, default=figures, key="costs_figures")
shown = table[table["figure"].isin(pick)].sort_values(["disagrees", "label"], ascending=[False, True])
st.dataframe(
    shown[["label", "figure", "predicted", "measured", "ratio", "agreement"]].rename(
        columns={"label": "cell", "ratio": "measured / predicted"}),
    hide_index=True, width="stretch")
st.caption("Required: parameters exact; FLOPs per step within 5% of torch.utils.flop_counter on one step; "
           f"peak tensor memory (one whole training step, torch's MemTracker) within {MEMORY_BAND[0]:g}-"
           f"{MEMORY_BAND[1]:g}x of the prediction, which models the torch reference path. Predictions come "
           "from the components' registered cost functions (harness/costmodel.py).")
png = report.plot_predicted_vs_measured(rows, "")
if png:
    st.image(png, caption="predicted against measured, one point per cell")

st.subheader("Scaling fit")
sizes = sorted({round(n) for n, _, _ in points})
if len(sizes) < report.MIN_SIZES_FOR_FIT:
    st.info(f"The selection spans {len(sizes)} model size(s); a fit of L(N, D) = E + A/N^α + B/D^β needs "
            f"at least {report.MIN_SIZES_FOR_FIT} (e.g. a grid over `model.scale`).")
    st.stop()
from abl.scaling import ScalingFitError, fit as fit_scaling  # noqa: E402

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
st.image(report.plot_scaling(points, fit, ""), caption="final val_loss against non-embedding parameters")
