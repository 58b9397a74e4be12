"""Compare: one final number per cell with its 95% CI across seeds, and any comparison between cells.

The numbers come from abl.analysis.verdicts / abl.analysis.stats.analyse, the engine of the
``abl run`` summary, ``abl compare`` and ``abl report``, with the same
defaults: paired t-test by seed when two cells ran the same seeds on the same
data order, else Welch; Holm over the comparisons shown; fewer than 3 seeds:
"too few seeds to decide" with the minimum detectable difference; a cell that
did not learn (final loss at its data's unigram floor) is not ranked or
tested. Comparisons: every cell against a baseline, chosen pairs, or every
pair of cells that differ in one setting only (e.g. model.ffn).
"""

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from abl.analysis import formats, stats
from abl.analysis.metrics import shown_by_default
from abl.analysis.verdicts import EFFECTS_METHOD, effect_lines, health_text
from abl.dashboard import charts, common, intervals
from abl.dashboard import queries as q
from abl.present import palette

NONE = "(none)"
PREFERRED = shown_by_default()  # the metric catalogue's (abl.analysis.metrics), a plugin's metrics too
MODES = {"baseline": "each cell against a baseline", "pairs": "chosen pairs", "by": "every pair along one setting"}

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
                          if q.metric_info(n).label != n.replace("_", " ") else n)
if metric is None:  # no choice can be made (the choices were checked above)
    st.stop()
info = q.metric_info(metric)
group = top[1].selectbox("Group by", [NONE, *axes], key="cmp_group",
                         help="One row per value of this axis; cells that differ in other axes are colored.")
channels = common.cell_channels(sel)
# a factorial grid's axis beyond colour and marker (abl.present.palette.grid_styles) is a panel on every page:
# here too, unless another is picked
facet_options = [NONE, *[a for a in axes if a != group]]
facet_default = channels.facet_axes[0] if len(channels.facet_axes) == 1 else NONE
facet = top[2].selectbox("Facet by", facet_options, key="cmp_facet",
                         index=facet_options.index(facet_default) if facet_default in facet_options else 0,
                         help="One panel per value of this axis.")
with top[3]:
    use_holm = st.toggle("Holm correction", value=True, key="cmp_holm",
                         help="Adjust the p-values for the number of comparisons shown (Holm's step-down).")
    use_boot = st.toggle("Bootstrap CIs", value=False, key="cmp_boot",
                         help="Percentile bootstrap of the difference of means (resampling seeds), for cells "
                              "whose values are far from normal.")

# the cells, unadjusted, to offer the choices (completed runs only: a diverged or running run's last value
# is not comparable)
base_cells, _, _ = common.load(q.verdicts, sel, metric)
if not any(c.values for c in base_cells):
    st.info(f"No completed run of the selection has {metric} yet.")
    st.stop()
keys = [c.key for c in base_cells if c.values]
labels = {c.key: c.label for c in base_cells}
remembered = st.session_state.get("baseline")
if st.session_state.get("cmp_baseline") not in keys:
    default = next((c.key for c in base_cells if c.values and not c.health.flagged), keys[0])
    st.session_state["cmp_baseline"] = remembered if remembered in keys else default


def _remember() -> None:
    st.session_state["baseline"] = st.session_state["cmp_baseline"]


mid = st.columns([2, 4])
mode = mid[0].radio("Comparisons", list(MODES), format_func=MODES.get, key="cmp_mode")
kwargs: dict = {"bootstrap": use_boot, "correction": stats.HOLM if use_holm else stats.NO_CORRECTION}
baseline = None
if mode == "baseline":
    baseline = mid[1].selectbox("Baseline cell", keys, key="cmp_baseline", format_func=lambda k: labels.get(k, k),
                                on_change=_remember, help="Every other cell is tested against this one.")
    st.session_state.setdefault("baseline", baseline)
    kwargs["baseline"] = baseline
elif mode == "pairs":
    options = [f"{a},{b}" for i, a in enumerate(keys) for b in keys[i + 1:]]
    chosen = mid[1].multiselect("Pairs (first − second)", options, default=options[:1], key="cmp_pairs",
                                format_func=lambda p: " − ".join(labels[k] for k in p.split(",")))
    if not chosen:
        st.info("Choose at least one pair.")
        st.stop()
    kwargs["pairs"] = tuple(chosen)
else:
    varied = sorted(k for k in set().union(*(c.settings for c in base_cells))
                    if len({c.settings.get(k) for c in base_cells}) > 1)
    if not varied:
        st.info("The selected cells do not differ in any setting.")
        st.stop()
    kwargs["by"] = mid[1].selectbox("Setting", varied, key="cmp_by",
                                    help="Every pair of cells that differ in this setting only.")
# one verdict per pair, as the summary, abl compare and the report give it (abl.analysis.oneanswer.answered): the
# per-axis answer leads; a one-axis grid's rows take each level pair's answer; a factorial grid's per-cell rows
# are diagnostics and its cells are ranked per axis, not against each other
try:
    answer = common.load(q.answered, sel, metric, **kwargs)
except Exception as exc:  # an axis along which no two cells differ alone, ...
    st.warning(str(exc))
    st.stop()
cell_inputs, analysis, what, effects = answer.cells, answer.analysis, answer.what, answer.effects
if answer.effects_problem:  # a design the model cannot fit must not hide the cell tables
    st.warning(f"per-axis analysis unavailable: {answer.effects_problem}")

lower_better = analysis.lower_is_better
rows = [r for r in analysis.cells if r.n]
summ = pd.DataFrame({
    "cell_key": [r.key for r in rows], "cell_label": [r.label for r in rows], "n": [r.n for r in rows],
    "mean": [r.mean for r in rows], "std": [r.std for r in rows],
    "ci_lo": [r.ci_low for r in rows], "ci_hi": [r.ci_high for r in rows],
    "rank": [r.rank for r in rows], "health": [r.status or health_text(r.health) for r in rows]})
summ = summ.merge(cells, on="cell_key", how="left")
summ["cell"] = summ["cell"].fillna(summ["cell_label"])
by_row = {r.key: r for r in rows}
summ = summ.sort_values(["rank", "mean"], ascending=[True, lower_better], na_position="last",
                        kind="stable").reset_index(drop=True)
comp = pd.DataFrame([c.as_dict() for c in analysis.comparisons])
by_a = {c.a: c for c in analysis.comparisons} if mode == "baseline" else {}


def _significance(c) -> str:
    """The verdict's words, as the CLI and the report write them (abl.analysis.stats.verdict_word)."""
    return stats.verdict_word(None if c is None else c.verdict)


summ["delta"] = [by_a[k].delta if k in by_a else np.nan for k in summ["cell_key"]]
summ["p"] = [by_a[k].p_value if k in by_a else np.nan for k in summ["cell_key"]]
summ["p_holm"] = [by_a[k].p_adjusted if k in by_a else np.nan for k in summ["cell_key"]]
summ["verdict"] = [by_a[k].verdict if k in by_a else ("baseline" if k == baseline else "")
                   for k in summ["cell_key"]]
summ["significance"] = ["baseline" if k == baseline else _significance(by_a.get(k)) for k in summ["cell_key"]]
summ["marker"] = [summ_sig if k in by_a or k == baseline else "" for k, summ_sig in
                  zip(summ["cell_key"], summ["significance"])]
# the rank is a tie rank (1 + the cells distinguishably better); letters: cells sharing one are not apart. A
# cell no test could rank (too few seeds) says so instead (abl.dashboard.intervals.rank_text)
summ["group"] = [by_row[k].group for k in summ["cell_key"]]
summ["rank_text"] = [intervals.rank_text(by_row[k].rank, by_row[k].tied, by_row[k].group, by_row[k].n,
                                      getattr(by_row[k], "unranked", "") or by_row[k].status)
                     for k in summ["cell_key"]]
for col in ("rank", "delta", "p", "p_holm"):
    summ[col] = pd.to_numeric(summ[col], errors="coerce")
base_mean = float(summ.loc[summ["cell_key"] == baseline, "mean"].iloc[0]) if baseline in set(summ["cell_key"]) \
    else None
summ["baseline"] = base_mean

sort = list(summ["cell"])
x_title = common.metric_title(metric)
unit = "" if info.is_loss or not info.unit else f" [{info.unit}]"


def value_fmt(x, signed: bool = False) -> str:
    """A mean, difference or interval end of ``metric`` as the CLI prints it (abl.analysis.formats)."""
    if x is None or pd.isna(x):
        return "–"
    if info.unit == "bytes":
        return ("+" if signed and x > 0 else "") + formats.fmt_bytes(x)
    return formats.fmt(float(x), 4, signed=signed) if info.is_loss or abs(float(x)) < 1e3 else \
        (f"{float(x):+,.0f}" if signed else f"{float(x):,.0f}")


# ---------------------------------------------------------------- the answer: each axis's main effect

if effects:
    st.subheader(f"The answer: {info.label} per axis, {'lower' if lower_better else 'higher'} is better")
for i, e in enumerate(effects):
    headline = effect_lines([e], metric)
    st.markdown(f"**{e.axis}** — verdict: {e.verdict()}")
    if len(e.levels) < 2:
        st.caption(e.note or "one level among the cells that learned")
        continue
    levels = intervals.effect_rows(e)
    # the axis's own channel (abl.present.palette.grid_styles): its levels in the colours (or markers) they
    # have on every other page; else one colour
    colour = shape = None
    if channels.factorial and e.axis == channels.colour_axis:
        known = [lv for lv in channels.colour_levels if lv in set(levels["level"])]
        colour = alt.Color("level:N", title=e.axis, legend=None, scale=alt.Scale(
            domain=known, range=[palette.COLOURS[channels.colour_levels.index(lv) % len(
                palette.COLOURS)] for lv in known]))
    elif channels.factorial and channels.form_axes == (e.axis,):
        known = [lv for lv in channels.form_levels if lv in set(levels["level"])]
        shape = alt.Shape("level:N", title=e.axis, legend=None, scale=alt.Scale(
            domain=known, range=[palette.VEGA_SHAPES[channels.form_levels.index(lv) % len(
                palette.VEGA_SHAPES)] for lv in known]))
    tip = [alt.Tooltip("level:N"), alt.Tooltip("mean:Q", title="least-squares mean", format=".4f"),
           alt.Tooltip("lo:Q", title="interval low (Holm-adj.)", format=".4f"),
           alt.Tooltip("hi:Q", title="interval high (Holm-adj.)", format=".4f"),
           alt.Tooltip("n:Q", title="runs"), alt.Tooltip("rank:N"),
           alt.Tooltip("verdict:N"), alt.Tooltip("p_holm:Q", title="p (Holm)", format=".3g")]
    chart = intervals.interval_chart(levels, row="label", x="mean", lo="lo", hi="hi", x_title=x_title,
                                  colour=colour, shape=shape, text="verdict", ref=levels["mean"].iloc[0],
                                  tooltip=tip)
    notes = [x for x in (e.interaction_text(), e.note,
                         f"left out (did not learn or no value): {', '.join(e.left_out)}" if e.left_out else "")
             if x]
    charts.show(chart, levels.drop(columns=["label"]), f"effect_{e.axis}_{metric}", key=f"effect_{i}",
                caption=headline[0] + ". Dots: least-squares means; bars: the Holm-adjusted interval of each "
                        "level minus the best, drawn around the level (a bar that does not reach the best "
                        "level's line: distinguishably worse). Rows: level · rank (letters), or why untested."
                        + intervals.off_axis_note(levels, "mean", "lo", "hi", levels["mean"].iloc[0])
                        + ("" if not notes else " " + " ".join(notes)))

# ---------------------------------------------------------------- per cell, folded

can_decide = [c for c in analysis.comparisons if _significance(c) in (stats.BETTER, stats.WORSE, stats.SAME)]
if comp.empty:
    st.info("Nothing to compare: only one cell is selected.")
else:
    words = pd.Series([_significance(c) for c in analysis.comparisons]).value_counts()
    why = "" if can_decide else f": none can decide ({words.index[0]})"
    with st.expander(f"Per-cell comparisons: {what}{why}", expanded=not effects and bool(can_decide)):
        st.caption(f"Comparisons: {what}.")
        comp["cell"] = [f"{a} − {b}" for a, b in zip(comp["a_label"], comp["b_label"])]
        comp["cell"] = [f"{c} ({j})" if list(comp["cell"]).count(c) > 1 else c
                        for j, c in enumerate(comp["cell"], 1)]  # every row its own label
        comp["delta_lo"], comp["delta_hi"], comp["p"] = comp["ci_low"], comp["ci_high"], comp["p_value"]
        comp["significance"] = [_significance(c) for c in analysis.comparisons]
        comp["marker"] = comp["significance"]
        decided = comp[comp["significance"].isin([stats.BETTER, stats.WORSE, stats.SAME]) & comp["delta"].notna()]
        if decided.empty:
            st.caption("No comparison here can decide (each needs at least "
                       f"{stats.MIN_SEEDS} seeds per cell), so none is drawn; the table gives their figures.")
        else:
            charts.show(charts.delta_chart(decided, list(decided["cell"]), f"Δ {info.label}"),
                        decided[["cell", "delta", "delta_lo", "delta_hi", "p", "p_adjusted", "test", "verdict"]],
                        f"delta_{metric}", key="delta",
                        caption=f"The comparisons that can decide ({len(decided)} of {len(comp)}). Bars: "
                                f"{analysis.interval_header} interval of the difference. Colour: the verdict."
                                + intervals.off_axis_note(decided, "delta", "delta_lo", "delta_hi", 0.0))
        comp_cols = ["cell", "delta", "ci_low", "ci_high", "p_adjusted", "significance", "n_a", "n_b", "p_value",
                     "test", "mdd", "verdict"]
        p_head = "Holm p" if use_holm else "p (no correction)"
        common.text_table(pd.DataFrame({
            "a − b": comp["cell"], f"Δ{unit}": [value_fmt(d, signed=True) for d in comp["delta"]],
            analysis.interval_header: [f"[{value_fmt(lo, signed=True)}, {value_fmt(hi, signed=True)}]"
                                       if pd.notna(lo) else "–" for lo, hi in zip(comp["ci_low"], comp["ci_high"])],
            p_head: [stats.fmt_p(p) if pd.notna(p) else "–" for p in comp["p_adjusted"]],
            "verdict": comp["significance"]}), key="cmp_comparisons")
        st.download_button("Comparisons (CSV, every column)",
                           data=lambda: comp[[c for c in comp_cols if c in comp]].to_csv(index=False),
                           file_name=f"comparisons_{metric}.csv", mime="text/csv", on_click="ignore",
                           icon=":material/download:")

if group != NONE:
    others = [a for a in axes if a not in (group, facet)]
    summ["variant"] = summ[others].astype(str).agg(", ".join, axis=1) if others else summ[group].astype(str)
    y, color = group, "variant"
    y_sort = list(dict.fromkeys(summ[group].astype(str)))
    summ[group] = summ[group].astype(str)
else:
    y, color, y_sort = "cell", "significance", sort
chart = charts.compare_chart(summ, y=y, y_title=None if y == "cell" else y, x_title=x_title, color=color,
                             facet=None if facet == NONE else facet, sort=y_sort, baseline=base_mean)
n_seeds = f"{int(summ['n'].min())}–{int(summ['n'].max())}" if summ["n"].nunique() > 1 else str(int(summ["n"].iloc[0]))
caption = (f"Dots: mean over seeds ({n_seeds} per cell, completed runs); bars: 95% CI of the mean "
           f"(t-distribution, n−1 df). " + ("Dashed line: the baseline's mean; colours and words: each cell's "
                                            "verdict against the baseline." if baseline else "")
           + intervals.off_axis_note(summ, "mean", "ci_lo", "ci_hi", base_mean))
table_cols = ["rank", "rank_text", "cell", "group", *axes, "n", "mean", "std", "ci_lo", "ci_hi", "delta", "p",
              "p_holm", "verdict", "health"]
export = summ[[c for c in dict.fromkeys(table_cols + ["cell_key"]) if c in summ]]
with st.expander(f"Per-cell means: {info.label}, mean and 95% CI per cell", expanded=not effects):
    st.caption("Each cell's own interval, across its seeds: with few seeds it is wide (t with n−1 df), and it "
               "says nothing about the difference between two cells run on the same seeds: the paired "
               "comparisons are the test.")
    charts.show(chart, export, f"compare_{metric}", key="compare", caption=caption)
if q.is_speed(metric):
    hit = common.contended_runs(sel)
    if hit:
        st.warning(f"{len(hit)} run(s) of the selection were {common.CONTENDED_NOTE}: compare speeds of runs "
                   "measured on a quiet machine (the runs table flags them).", icon=":material/warning:")


st.subheader("Cells")
cells_text = pd.DataFrame({
    "rank": summ["rank_text"],
    "cell": summ["cell"], "seeds": summ["n"].astype(int),
    f"mean{unit}": [value_fmt(m) for m in summ["mean"]],
    "95% CI": [f"[{value_fmt(lo)}, {value_fmt(hi)}]" if pd.notna(lo) else "–"
               for lo, hi in zip(summ["ci_lo"], summ["ci_hi"])],
    "verdict": summ["significance"], "health": summ["health"]})
common.text_table(cells_text, key="cmp_table")
st.download_button("This table (CSV, every column)", data=lambda: export.to_csv(index=False),
                   file_name=f"compare_{metric}.csv", mime="text/csv", on_click="ignore", icon=":material/download:")
st.caption(f"{len(summ)} cells, {int(summ['n'].sum())} completed runs.")

within = common.load(q.within_cell, sel)
if within:
    st.subheader("Within each cell")
    st.caption("Questions one cell answers about itself, paired by seed (both figures come from the same run): "
               "length extrapolation (the loss at k times the trained context minus 1x) and accuracy against "
               "the task's no-recall baseline; Holm over every contrast shown.")
    common.text_table(pd.DataFrame({
        "cell": [w.label for w in within], "contrast": [w.contrast.name for w in within],
        "Δ": [value_fmt(w.row.delta, signed=True) for w in within],
        "CI (Holm-adj.)": [f"[{value_fmt(w.row.ci_low, signed=True)}, {value_fmt(w.row.ci_high, signed=True)}]"
                           if w.row.ci_low is not None else "–" for w in within],
        "p (Holm)": [stats.fmt_p(w.row.p_adjusted) for w in within],
        "answer": [w.answer() for w in within]}), key="cmp_within")

# the statistics legend, once for the page
st.caption("**How these were computed.** " + (EFFECTS_METHOD + " " if effects else "") + analysis.method)
