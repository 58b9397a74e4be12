"""Compare: one final number per cell with its 95% CI across seeds, and each cell against a baseline.

Per cell: the mean over its seeds and the 95% t-interval of that mean (n - 1
degrees of freedom). Against the baseline cell: the difference of means, its
95% interval and a two-sided p-value, by Welch's unequal-variance t-test (the
default) or a paired t-test over the seeds both cells ran; optionally
Holm-adjusted for the number of cells compared.
"""

import numpy as np
import streamlit as st

from abl import stats
from abl.dashboard import charts, common
from abl.dashboard import queries as q

NONE = "(none)"
PREFERRED = ("val_loss", "train_loss", "tokens_per_s", "peak_mem_bytes", "kv_bytes_per_token",
             "decode_tokens_per_s", "wall_s", "n_params")

sel: q.Selection = st.session_state["selection"]
st.title("Compare")
if common.no_runs(sel):
    st.stop()

cells = common.cell_table(sel)
axes = cells.attrs.get("axes", [])
names = common.load(q.metric_names, sel)
choices = [n for n in PREFERRED if n in names] + [n for n in names if n not in PREFERRED]
if not choices:
    st.info("The selected runs have no metrics yet.")
    st.stop()

top = st.columns([2, 2, 2, 3])
metric = top[0].selectbox("Metric", choices, key="cmp_metric",
                          format_func=lambda n: f"{n} ({q.metric_info(n).label})"
                          if q.metric_info(n).label != n else n)
info = q.metric_info(metric)
group = top[1].selectbox("Group by", [NONE, *axes], key="cmp_group",
                         help="One row per value of this axis; cells that differ in other axes are colored.")
facet = top[2].selectbox("Facet by", [NONE, *[a for a in axes if a != group]], key="cmp_facet",
                         help="One panel per value of this axis.")
TESTS = {"welch": "Welch's t-test (unpaired)", "paired": "paired t-test over shared seeds"}
with top[3]:
    include_all = st.toggle("include runs that did not complete", key="cmp_incomplete",
                            help="By default only completed runs count: the last value of a diverged "
                                 "or running run is not comparable.")
    use_holm = st.toggle("Holm correction", value=True, key="cmp_holm",
                         help="Adjust the p-values for comparing every cell with the baseline.")

vals = common.load(q.cell_values, sel, metric, not include_all)
if vals.empty:
    st.info(f"No {'' if include_all else 'completed '}run of the selection has {metric} yet.")
    st.stop()
summ = stats.summarize_groups(vals, "cell_key", "value")
summ = summ.merge(cells, on="cell_key", how="left")
lower_better = info.better != "higher"
summ = summ.sort_values("mean", ascending=lower_better, kind="stable").reset_index(drop=True)

# baseline: remembered across pages; the grid's first cell by default
keys = list(summ["cell_key"])
labels = dict(zip(summ["cell_key"], summ["cell"]))
remembered = st.session_state.get("baseline")
if st.session_state.get("cmp_baseline") not in keys:
    first = summ.sort_values("first_started", na_position="last")["cell_key"].iloc[0]
    st.session_state["cmp_baseline"] = remembered if remembered in keys else first


def _remember() -> None:
    st.session_state["baseline"] = st.session_state["cmp_baseline"]


mid = st.columns([3, 2])
baseline = mid[0].selectbox("Baseline cell", keys, key="cmp_baseline", format_func=lambda k: labels.get(k, k),
                            on_change=_remember, help="Every other cell is tested against this one.")
test_kind = mid[1].radio("Test", list(TESTS), format_func=TESTS.get, key="cmp_test", horizontal=True,
                         help="Welch: no assumption about the two cells' spreads. Paired: differences per "
                              "seed; with the same seed two cells of a grid see the same batches in the "
                              "same order, which removes the variance the seed adds to both.")
st.session_state.setdefault("baseline", baseline)
b = summ[summ["cell_key"] == baseline].iloc[0]
if test_kind == "welch":
    w = stats.welch(summ["mean"], summ["std"], summ["n"], b["mean"], b["std"], b["n"])
else:
    by_seed = {k: dict(zip(g["seed"], g["value"])) for k, g in vals.groupby("cell_key")}
    rows = [stats.paired(by_seed[k], by_seed[baseline]) for k in summ["cell_key"]]
    w = {f: np.array([r[f] for r in rows]) for f in ("diff", "diff_lo", "diff_hi", "p")}
summ["delta"] = w["diff"]
summ["delta_lo"] = w["diff_lo"]
summ["delta_hi"] = w["diff_hi"]
summ["p"] = np.where(summ["cell_key"] == baseline, np.nan, w["p"])
summ["p_holm"] = stats.holm(summ["p"])
p_used = summ["p_holm"] if use_holm else summ["p"]
summ["marker"] = ["baseline" if k == baseline else stats.stars(p) for k, p in zip(summ["cell_key"], p_used)]


def _significance(delta: float, p: float) -> str:
    if not np.isfinite(p):
        return "n/a"
    if p >= 0.05 or info.better == "none":
        return "not significant" if p >= 0.05 else ("worse" if delta > 0 else "better")
    return "better" if (delta < 0) == lower_better else "worse"


summ["significance"] = [_significance(d, p) for d, p in zip(summ["delta"], p_used)]
summ.loc[summ["cell_key"] == baseline, "significance"] = "baseline"
summ["baseline"] = b["mean"]

sort = list(summ["cell"])
x_title = common.metric_title(metric)
if group != NONE:
    others = [a for a in axes if a not in (group, facet)]
    summ["variant"] = summ[others].astype(str).agg(", ".join, axis=1) if others else summ[group].astype(str)
    y, color = group, "variant"
    y_sort = list(dict.fromkeys(summ[group].astype(str)))
    summ[group] = summ[group].astype(str)
else:
    y, color, y_sort = "cell", "significance", sort
chart = charts.compare_chart(summ, y=y, y_title=None if y == "cell" else y, x_title=x_title, color=color,
                             facet=None if facet == NONE else facet, sort=y_sort, baseline=b["mean"])
n_seeds = f"{int(summ['n'].min())}–{int(summ['n'].max())}" if summ["n"].nunique() > 1 else str(int(summ["n"].iloc[0]))
test = ("Welch's t-test (two-sided, unequal variances)" if test_kind == "welch" else
        "a paired t-test over the seeds both cells ran (two-sided)") + (", Holm-adjusted" if use_holm else "")
caption = (f"Dots: mean over seeds ({n_seeds} per cell); bars: 95% CI of the mean (t-distribution, n−1 df). "
           f"Dashed line: the baseline's mean. Markers vs baseline by {test}: * p<0.05, ** p<0.01, "
           "*** p<0.001, n.s. not significant, n/a fewer than 2 seeds on a side.")
table_cols = ["cell", *axes, "n", "mean", "std", "ci_lo", "ci_hi", "delta", "delta_lo", "delta_hi", "p",
              "p_holm", "marker"]
export = summ[[c for c in dict.fromkeys(table_cols + ["cell_key"]) if c in summ]]
st.subheader(f"{info.label}: mean and 95% CI per cell, {'lower' if lower_better else 'higher'} is better")
charts.show(chart, export, f"compare_{metric}", key="compare", caption=caption,
            height=charts.rows_height(len(y_sort), facets=facet != NONE))

st.subheader(f"Difference to the baseline: {labels[baseline]}")
delta_df = summ[summ["cell_key"] != baseline]
if delta_df.empty:
    st.info("Only the baseline cell is selected.")
else:
    charts.show(charts.delta_chart(delta_df, [s for s in sort if s != labels[baseline]],
                                   f"Δ {metric} vs baseline"), delta_df[[c for c in export if c in delta_df]],
                f"delta_{metric}", key="delta", height=charts.rows_height(len(delta_df)),
                caption=f"Bars: 95% CI of the difference ({'Welch–Satterthwaite df' if test_kind == 'welch' else 'pairs − 1 df'}). "
                        f"Color: {test} at 0.05.")

st.subheader("Table")
fmt = "%.4f" if "loss" in metric else "%.4g"
st.dataframe(export.drop(columns=["cell_key"]), hide_index=True, width="stretch", column_config={
    "n": st.column_config.NumberColumn("seeds"),
    **{c: st.column_config.NumberColumn(c, format=fmt) for c in ("mean", "std", "ci_lo", "ci_hi")},
    **{c: st.column_config.NumberColumn(c, format="%+.4f" if "loss" in metric else "%+.4g")
       for c in ("delta", "delta_lo", "delta_hi")},
    "p": st.column_config.NumberColumn("p", format="%.3g"),
    "p_holm": st.column_config.NumberColumn("Holm p", format="%.3g"),
    "marker": st.column_config.TextColumn("sig."),
})
st.caption(f"{test}. {len(summ)} cells, {int(summ['n'].sum())} runs"
           + ("" if include_all else " (completed runs only)") + ".")
