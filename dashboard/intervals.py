"""Interval charts that can be read: one labelled row per line, the axis set by what is drawn.

The Compare page's forest plots (each axis's main effect), its per-cell means and its differences are all
``interval_chart``: a point and its interval per row, every row labelled at a fixed height (labels never
thinned or printed over each other), and an x axis that spans the points (means, differences, the reference
line) and each interval only as far as ``REACH`` times the points' spread beyond them. A 2-seed t(1)
interval is 12.7 standard errors wide: left to set the axis it flattens every effect; here it is cut at the
edge and marked there with a triangle pointing the way it runs on (the tooltip and the tables give it whole).
"""

from __future__ import annotations

from typing import Any, Literal, cast

import altair as alt
import pandas as pd

from abl.analysis import stats


def x_axis() -> alt.Axis:
    """Horizontal labels, thinned rather than overlapping (as abl.dashboard.charts.x_axis)."""
    return alt.Axis(labelAngle=0, labelOverlap=True, tickCount=8, labelFlush=True)


ROW_PX = 30  # one row of an interval chart: room for its label, never shared with another row
# how far past the drawn points an interval may reach before the axis stops and marks it: a multiple of the
# points' own spread (a 2-seed t(1) interval is 12.7 standard errors wide and would flatten every effect)
REACH = 0.75


def interval_domain(points: Any, lows: Any, highs: Any, refs: Any = ()) -> tuple[float, float]:
    """The x axis of an interval chart, set by what is drawn: every point (mean, difference) and reference
    line, and each interval as far as ``REACH`` times the points' spread beyond them; an interval that runs
    further is cut at the axis and marked (``clip_intervals``)."""
    core = [float(x) for x in [*points, *refs] if x is not None and pd.notna(x)]
    if not core:
        return 0.0, 1.0
    lo_core, hi_core = min(core), max(core)
    span = hi_core - lo_core
    ends = [float(x) for x in [*lows, *highs] if x is not None and pd.notna(x)]
    if span <= 0:  # one point: nothing for its interval to flatten, so it is drawn whole
        lo, hi = min([lo_core, *ends]), max([hi_core, *ends])
        pad = 0.04 * (hi - lo) if hi > lo else max(abs(hi_core) * 0.02, 1e-3)
        return lo - pad, hi + pad
    lo = max(min([lo_core, *ends]), lo_core - REACH * span)
    hi = min(max([hi_core, *ends]), hi_core + REACH * span)
    pad = 0.04 * (hi - lo) if hi > lo else span
    return lo - pad, hi + pad


def clip_intervals(df: pd.DataFrame, lo: str, hi: str, domain: tuple[float, float]) -> pd.DataFrame:
    """``df`` with the intervals cut at the axis (``lo_drawn``, ``hi_drawn``) and where they were cut
    (``off_lo``, ``off_hi``: the interval runs off the axis there, drawn as a triangle at the edge)."""
    out = df.copy()
    a, b = domain
    lows = pd.to_numeric(out[lo], errors="coerce")
    highs = pd.to_numeric(out[hi], errors="coerce")
    out["off_lo"] = (lows < a).fillna(False).astype(bool)
    out["off_hi"] = (highs > b).fillna(False).astype(bool)
    out["lo_drawn"] = lows.clip(lower=a, upper=b)
    out["hi_drawn"] = highs.clip(lower=a, upper=b)
    out["edge_lo"], out["edge_hi"] = a, b
    return out


def interval_chart(df: pd.DataFrame, *, row: str, x: str, lo: str, hi: str, x_title: str,
                   colour: Any = None, shape: Any = None, text: str | None = None,
                   ref: float | None = None, ref_dash: bool = True,
                   tooltip: list | None = None) -> alt.LayerChart:
    """One labelled row per line of ``df`` (``row``: its label, unique, every one drawn: a fixed height per
    row, labels never thinned), a point at ``x`` with its interval [``lo``, ``hi``]; the x axis set by what
    is drawn (``interval_domain``) and an interval that runs off it cut at the edge with a triangle there
    pointing the way it goes. ``text``: a column written right of each point (letters, the verdict)."""
    domain = interval_domain(df[x], df[lo], df[hi], [ref] if ref is not None else [])
    data = clip_intervals(df, lo, hi, domain)
    order = list(dict.fromkeys(data[row].astype(str)))
    if len(order) != len(data):
        raise ValueError(f"interval chart rows must be unique: {list(data[row])}")
    scale = alt.Scale(domain=list(domain), zero=False, nice=False)
    enc_y = alt.Y(f"{row}:N", title=None, sort=order,
                  axis=alt.Axis(labelLimit=0, labelOverlap=False, labelPadding=6, ticks=False, domain=False))
    enc_x = alt.X(f"{x}:Q", title=x_title, scale=scale, axis=x_axis())
    tooltip = tooltip or [alt.Tooltip(f"{row}:N"), alt.Tooltip(f"{x}:Q", format=".4f"),
                          alt.Tooltip(f"{lo}:Q", title="interval low", format=".4f"),
                          alt.Tooltip(f"{hi}:Q", title="interval high", format=".4f")]
    colour = colour if colour is not None else alt.value("#0072B2")
    base = alt.Chart(data)
    layers: list[Any] = []
    if ref is not None and pd.notna(ref):
        layers.append(alt.Chart(pd.DataFrame({"ref": [float(ref)]})).mark_rule(
            color="#777", strokeDash=[5, 4] if ref_dash else [1, 0]).encode(x=alt.X("ref:Q", scale=scale)))
    layers.append(base.transform_filter(f"isValid(datum.lo_drawn) && isValid(datum.hi_drawn)")
                  .mark_rule(strokeWidth=2.5).encode(
        x=alt.X("lo_drawn:Q", title=x_title, scale=scale, axis=x_axis()), x2="hi_drawn:Q", y=enc_y, color=colour,
        tooltip=tooltip))
    for side, mark_shape in (("lo", "triangle-left"), ("hi", "triangle-right")):
        layers.append(base.transform_filter(f"datum.off_{side}").mark_point(
            shape=mark_shape, filled=True, size=110, opacity=1).encode(
            x=alt.X(f"edge_{side}:Q", scale=scale), y=enc_y, color=colour, tooltip=tooltip))
    point = base.mark_point(filled=True, size=90, opacity=1, stroke="#111", strokeWidth=0.6)
    layers.append(point.encode(x=enc_x, y=enc_y, color=colour, tooltip=tooltip,
                               **({"shape": shape} if shape is not None else {})))
    if text:  # beside its point, on the side with room (right of a point in the left half, else left of it)
        mid = (domain[0] + domain[1]) / 2
        sides: tuple[tuple[str, Literal["left", "right"], int], ...] = (
            (f"datum['{x}'] <= {mid!r}", "left", 9), (f"datum['{x}'] > {mid!r}", "right", -9))
        for cond, align, dx in sides:
            layers.append(base.transform_filter(cond).mark_text(align=align, dx=dx, dy=-9, fontSize=11,
                                                                color="#333").encode(
                x=alt.X(f"{x}:Q", scale=scale), y=enc_y, text=alt.Text(f"{text}:N")))
    return cast(alt.LayerChart, alt.layer(*layers).properties(height=alt.Step(ROW_PX)))


def off_axis_note(df: pd.DataFrame, x: str, lo: str, hi: str, ref: float | None = None) -> str:
    """The caption's words for the intervals an interval chart cut at its edge (none: "")."""
    domain = interval_domain(df[x], df[lo], df[hi], [ref] if ref is not None else [])
    d = clip_intervals(df, lo, hi, domain)
    n = int((d["off_lo"] | d["off_hi"]).sum())
    return (f" {n} interval(s) run off the axis (a triangle at the edge; the tooltip and the table give them "
            "whole): the axis is set by the points, not by intervals a few seeds make wide.") if n else ""


def _untested(rank: Any, n: int, unranked: str) -> str:
    """Why a cell or level has no rank ("" when it has one): too few seeds for any test, or the analysis's
    own reason."""
    if unranked:
        return unranked
    if n < stats.MIN_SEEDS:
        return f"untested (n={n}; {stats.MIN_SEEDS} give a verdict)"
    return "" if rank else "untested"


def rank_text(rank: Any, tied: bool, group: str, n: int, unranked: str = "") -> str:
    """A rank as the tables print it ("1= (ab)") for a cell or level that was tested; else why not, never a
    rank a test did not give (at 2 seeds every cell would read "1=", tied for best)."""
    why = _untested(rank, n, unranked)
    if why or rank is None or (isinstance(rank, float) and not rank == rank):
        return why or "-"
    return f"{int(rank)}{'=' if tied else ''}" + (f" ({group})" if group else "")


def effect_rows(effect: Any) -> pd.DataFrame:
    """The forest plot of one axis's main effect (abl.analysis.stats.AxisEffect), one row per level, best
    first: its least-squares mean, and the Holm-adjusted interval of its difference to the best level drawn
    around it (best mean + the interval of level − best), so a level whose interval does not reach the
    best level's line is distinguishably worse, exactly as its verdict says; the best level's row is that
    line. ``label``: the level with its rank and letters, or why it has none."""
    best = effect.levels[0]
    rows = []
    for lv in effect.levels:
        c = next((c for c in effect.contrasts if {str(c.a), str(c.b)} == {str(lv.level), str(best.level)}), None)
        lo = hi = None
        word = "best level" if lv is best else stats.verdict_word(None if c is None else c.verdict)
        if c is not None and lv is not best and str(c.a) != str(lv.level):  # the contrast is best − level:
            word = {stats.BETTER: stats.WORSE, stats.WORSE: stats.BETTER}.get(word, word)  # read it from the level
        if c is not None and lv is not best and c.ci_low is not None and c.ci_high is not None:
            sign = 1.0 if str(c.a) == str(lv.level) else -1.0  # the interval of level − best
            a, b = sign * float(c.ci_low), sign * float(c.ci_high)
            lo, hi = best.mean + min(a, b), best.mean + max(a, b)
        rank = rank_text(lv.rank, lv.tied, lv.group, lv.n, getattr(lv, "unranked", ""))
        p = None if c is None or lv is best else c.p_adjusted
        rows.append({"level": str(lv.level), "label": f"{lv.level}  ·  {rank}", "mean": float(lv.mean),
                     "lo": lo, "hi": hi, "n": int(lv.n), "rank": rank,
                     "verdict": word if lv is best else f"vs {best.level}: {word}",
                     "p_holm": p, "delta_to_best": None if lv is best else float(lv.mean) - float(best.mean)})
    return pd.DataFrame(rows)


