"""Probes: task accuracy (abl.data.tasks) during training, and against model width per mixer.

A run that trained on a task records ``<task>_accuracy`` at every evaluation;
``eval.probes`` adds ``probe_<task>_accuracy`` after training. The first chart
is the accuracy curve of each cell (the mean over its seeds); the second is the
final accuracy against ``model.d_model``, one line per mixer (the hybrid's
``model.layer_pattern`` or ``model.mixer``), with the 95% t-interval over
seeds (harness/analysis/stats/__init__.py), one panel per value of any other varied setting
(e.g. the number of key-value pairs). The table lists each cell's per-slice
accuracies (MQAR: accuracy by number of pairs).
"""

import altair as alt
import pandas as pd
import streamlit as st

from abl.analysis import stats
from abl.dashboard import charts, common
from abl.dashboard import queries as q

WIDTH, MIXER, PATTERN = "$.model.d_model", "$.model.mixer", "$.model.layer_pattern"

sel: q.Selection = st.session_state["selection"]
st.title("Probes")
if common.no_runs(sel):
    st.stop()

names = common.load(q.metric_names, sel)
mains = [n for n in names if n.endswith("_accuracy") and not n.endswith("_example_accuracy")]
if not mains:
    st.info("The selected runs record no task accuracy. Train on a task (`data.dataset = \"mqar\"`, "
            "e.g. `abl run ablations/recall.toml`) or add `eval.probes = [\"mqar\"]` to a grid.")
    st.stop()

metric = st.selectbox("Accuracy metric", mains, key="probe_metric")
cells = common.cell_table(sel)
labels = dict(zip(cells["cell_key"], cells["cell"]))
runs = common.load(q.runs, sel, (WIDTH, MIXER, PATTERN))
runs["mixer"] = [p if isinstance(p, str) and p else m
                 for p, m in zip(runs[f"axis:{PATTERN}"], runs[f"axis:{MIXER}"])]
runs["d_model"] = pd.to_numeric(runs[f"axis:{WIDTH}"], errors="coerce")
runs["cell"] = runs["cell_key"].map(labels)

# ---------------------------------------------------------------- curves
st.subheader("Accuracy during training")
curve = common.load(q.curves, tuple(runs["run_id"]), metric)
if curve.empty:
    st.caption(f"{metric} has no per-step rows (eval.probes records it once, after training).")
else:
    curve = curve.merge(runs[["run_id", "cell_key", "cell"]], on="run_id")
    mean = curve.groupby(["cell", "step"], as_index=False)["y"].mean()
    chart = alt.Chart(mean).mark_line(point=True).encode(
        x=alt.X("step:Q", title="step"),
        y=alt.Y("y:Q", title=metric, scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("cell:N", legend=alt.Legend(orient="bottom", columns=3)),
        tooltip=["cell", "step", alt.Tooltip("y:Q", format=".3f")])
    charts.show(chart, mean, f"{metric}_curves", "probe_curves", caption="mean over each cell's seeds")

# ---------------------------------------------------------------- vs width
st.subheader("Accuracy vs model width, per mixer")
vals = common.load(q.cell_values, sel, metric, True)
if vals.empty:
    st.info(f"No completed run has {metric} yet.")
    st.stop()
vals = vals.merge(runs[["run_id", "mixer", "d_model"]], on="run_id")
axes = common.varied_axes(sel)
others = [(p, lbl) for p, lbl in zip(axes["path"], axes["label"]) if p not in (WIDTH, MIXER, PATTERN)]
if others:
    extra = common.load(q.runs, sel, tuple(p for p, _ in others))
    extra["panel"] = extra[[f"axis:{p}" for p, _ in others]].astype(str).agg(", ".join, axis=1)
    extra["panel"] = [", ".join(f"{lbl}={v}" for (_, lbl), v in zip(others, row.split(", ")))
                      for row in extra["panel"]]
    vals = vals.merge(extra[["run_id", "panel"]], on="run_id")
else:
    vals["panel"] = "all cells"
summary = stats.summarize_groups(vals, ["panel", "mixer", "d_model"])
base = alt.Chart(summary).encode(
    x=alt.X("d_model:Q", title="d_model", scale=alt.Scale(type="log", base=2)),
    color=alt.Color("mixer:N", legend=charts.cell_legend(4)))
lines = base.mark_line(point=True).encode(
    y=alt.Y("mean:Q", title=f"final {metric}", scale=alt.Scale(domain=[0, 1])),
    tooltip=["mixer", "d_model", "panel", "n", alt.Tooltip("mean:Q", format=".3f"),
             alt.Tooltip("ci_lo:Q", format=".3f"), alt.Tooltip("ci_hi:Q", format=".3f")])
bars = base.mark_errorbar().encode(y="ci_lo:Q", y2="ci_hi:Q")
rule = alt.Chart(pd.DataFrame({"y": [0.9]})).mark_rule(strokeDash=[3, 3], color="gray").encode(y="y:Q")
chart = alt.layer(lines, bars, rule, data=summary).facet(column=alt.Column("panel:N", title=None))
charts.show(chart, summary, f"{metric}_vs_width", "probe_width",
            caption="mean over seeds with its 95% t-interval; dotted line: 0.9")

# ---------------------------------------------------------------- slices
slices = [n for n in names if n.startswith(metric + "_")]
if slices:
    st.subheader("Per slice")
    wide = common.load(q.finals, sel, tuple([metric, *slices]))
    wide = wide.merge(runs[["run_id", "cell_key", "cell"]], on="run_id")
    table = wide.groupby("cell", sort=False)[[metric, *slices]].mean().reset_index()
    table.columns = ["cell", metric, *[s[len(metric) + 1:] for s in slices]]
    st.dataframe(table, hide_index=True, width="stretch",
                 column_config={c: st.column_config.NumberColumn(format="%.3f") for c in table.columns[1:]})
    st.caption("mean over seeds of each cell's final value; MQAR's slices are the numbers of pairs")
