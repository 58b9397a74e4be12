"""Altair charts, and ``show``: a chart with its CSV and PNG downloads.

Every chart is interactive (tooltips; zoom and pan on the scales of the line
and scatter charts; click a legend entry to highlight one series). The PNG is
rendered on demand, when its button is clicked, with vl-convert (no browser).
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any, Literal, cast

import altair as alt
import pandas as pd
import streamlit as st

from abl.analysis import stats
from abl.dashboard import intervals
from abl.present import palette

alt.data_transformers.disable_max_rows()
# Altair checks every chart against the Vega-Lite JSON schema when it is built and again
# when it is serialised: over half of a page's render time. The charts here are fixed
# code, checked against the schema by the tests, so the app skips both.
alt.utils.schemapi.disable_debug_mode()

HEIGHT = 340
# the verdict words of abl.analysis.stats (the CLI's and the report's), one colour each, from the same
# colour-blind-safe scheme as the cells (abl.present.palette): baseline indigo, better green, worse rose,
# the undecided ones in greys and sand
_VERDICT_COLOURS = {stats.BASELINE: "#332288", stats.BETTER: "#117733", stats.WORSE: "#CC6677",
                    stats.SAME: "#777777", stats.TOO_FEW: "#DDCC77", stats.DID_NOT_LEARN: "#882255",
                    stats.NOT_COMPARABLE: "#44AA99"}
SIGNIFICANCE = alt.Scale(domain=list(stats.VERDICT_WORDS),
                         range=[_VERDICT_COLOURS.get(w, palette.NEUTRAL) for w in stats.VERDICT_WORDS])


def png_bytes(chart: alt.TopLevelMixin, width: int = 900, scale: float = 2.0) -> bytes:
    """The chart as PNG, at a fixed width (the app's charts size to their container)."""
    import vl_convert as vlc

    spec = copy.deepcopy(chart.to_dict())
    spec.setdefault("background", "white")
    composite = any(k in spec for k in ("facet", "hconcat", "vconcat", "concat", "repeat"))
    if not composite and spec.get("width") in (None, "container"):
        spec["width"] = width
    elif "facet" in spec and isinstance(spec.get("spec"), dict):
        spec["spec"].setdefault("width", 260)
    return vlc.vegalite_to_png(vl_spec=spec, scale=scale)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "chart"


def show(chart: alt.TopLevelMixin, data: pd.DataFrame, name: str, key: str,
         caption: str | None = None, height: int | None = None) -> None:
    """Render ``chart`` with buttons that download ``data`` as CSV and the chart as PNG.

    ``height``: the element's total height in pixels, for charts with a discrete
    y axis (Streamlit does not size those from the chart's own height).
    """
    fast = cast(Any, chart).copy(deep=False)  # every chart kind abl draws has copy(); the mixin type does not say so
    object.__setattr__(fast, "to_dict", functools.partial(type(chart).to_dict, fast, validate=False))
    if height is None:
        st.altair_chart(fast, width="stretch")
    else:
        st.altair_chart(fast, width="stretch", height=height)
    slug = _slug(name)
    row = st.container(horizontal=True, vertical_alignment="center", gap="small")
    row.download_button("CSV", data=lambda: data.to_csv(index=False), file_name=f"{slug}.csv",
                        mime="text/csv", key=f"dl_csv_{key}", on_click="ignore",
                        icon=":material/download:", help="the data behind this chart")
    row.download_button("PNG", data=lambda: png_bytes(chart), file_name=f"{slug}.png",
                        mime="image/png", key=f"dl_png_{key}", on_click="ignore",
                        icon=":material/image:", help="this chart as an image")
    if caption:
        row.caption(caption)


def rows_height(n_rows: int, facets: bool = False) -> int:
    """Total element height for a chart with ``n_rows`` bands on its y axis, legend below."""
    return 28 * max(1, n_rows) + 150 + (30 if facets else 0)


MAX_COLOURS = 20  # more cells than this in one chart: facet by the first grid axis
CONTENDED_COLOUR = "#d62728"
# the trade-off plot's two small legends above it and its axis take room from the plot: give it back (at 1024 px
# the plot area was about 100 px tall)
PARETO_EXTRA = 220


def cell_scales(domain: list[str], styles: list[palette.CellStyle] | None = None) -> tuple[alt.Scale, alt.Scale]:
    """(colour, strokeDash) scales for the series ``domain`` in the styles ``styles`` (abl.present.palette, one
    per series, by the cell's grid position: the same colour on every page and in the report; default: the
    series' own order)."""
    styles = list(styles) if styles is not None else palette.distinct(len(domain))
    if len(styles) != len(domain):
        raise ValueError(f"{len(domain)} series but {len(styles)} styles")
    colours, dashes = palette.vega_scales(domain, styles)
    return alt.Scale(**colours), alt.Scale(**dashes)


def factor_scales(channels: palette.Channels) -> tuple[alt.Scale, alt.Scale, alt.Scale]:
    """(colour, strokeDash, shape) scales of a factorial grid's channels (abl.present.palette.grid_styles):
    the colour axis's levels in their colours, the other axes' levels in their line styles and markers,
    by level index as the report draws them."""
    n_colour = len(channels.colour_levels)
    looks = [palette.CellStyle(0, i, 0) for i in range(n_colour)]
    forms = [palette.CellStyle(0, 0, i) for i in range(len(channels.form_levels))]
    return (alt.Scale(domain=list(channels.colour_levels), range=[s.colour for s in looks]),
            alt.Scale(domain=list(channels.form_levels), range=[s.vega_dash for s in forms]),
            alt.Scale(domain=list(channels.form_levels), range=[s.vega_shape for s in forms]))


def with_levels(df: pd.DataFrame, channels: palette.Channels, key_of: dict[str, str],
                field: str = "cell") -> pd.DataFrame:
    """``df`` with each row's level of the colour axis (``colour_level``) and of the marker axes
    (``form_level``), from its ``field`` (a cell label) through ``key_of`` (label -> cell key)."""
    out = df.copy()
    keys = out[field].astype(str).map(key_of)
    out["colour_level"] = keys.map(channels.colour_of)
    out["form_level"] = keys.map(channels.form_of)
    if channels.faceted:  # the panel: the cell's levels of the axes beyond colour and marker
        out["facet_level"] = keys.map(channels.facet_of)
    return out


FACET_WIDTH, FACET_HEIGHT = 320, 240


def facet_levels(channels: palette.Channels | None, df: pd.DataFrame) -> list[str]:
    """The panels a chart of ``df`` (with ``with_levels``' columns) draws: the levels of a factorial grid's
    axes beyond colour and marker that its rows have, in grid order; none (one plot) when fewer than two
    are drawn."""
    if channels is None or not channels.faceted or "facet_level" not in df:
        return []
    present = set(df["facet_level"].dropna())
    shown = [lv for lv in channels.facet_levels if lv in present]
    return shown if len(shown) > 1 else []


def level_facet(channels: palette.Channels, levels: list[str]) -> alt.Facet:
    """One panel per level (or combination of levels) of a factorial grid's axes beyond colour and marker,
    in grid order, titled by those axes."""
    return alt.Facet("facet_level:N", title=channels.facet_title, sort=list(levels),
                     header=alt.Header(labelLimit=0, labelFontSize=12))


def cell_legend(columns: int = 1, **kw: Any) -> alt.Legend:
    """Below the plot, never over the data; labels never cut (labelLimit 0)."""
    return alt.Legend(orient="bottom", direction="vertical", columns=columns, labelLimit=0, symbolOpacity=1, **kw)


def legend_columns(labels: list[str]) -> int:
    """Two legend columns when the labels are short enough to sit side by side at a laptop width."""
    return 2 if labels and max(len(x) for x in labels) <= 40 and len(labels) > 4 else 1


def x_axis(fmt: str | None = None, **kw: Any) -> alt.Axis:
    """Horizontal labels, thinned rather than overlapping."""
    return alt.Axis(format=fmt, labelAngle=0, labelOverlap=True, tickCount=8, labelFlush=True, **kw) \
        if fmt else alt.Axis(labelAngle=0, labelOverlap=True, tickCount=8, labelFlush=True, **kw)


def y_axis(**kw: Any) -> alt.Axis:
    return alt.Axis(labelOverlap=True, tickCount=6, **kw)


def _scale(log: bool, zero: bool = False) -> alt.Scale:
    return alt.Scale(type="log") if log else alt.Scale(zero=zero)


# ---------------------------------------------------------------- curves


def curve_chart(mean: pd.DataFrame, seeds: pd.DataFrame | None, x_title: str, y_title: str,
                log_x: bool = False, log_y: bool = False, band: bool = True,
                x_format: str = ",.4~g", domain: list[str] | None = None,
                facet: str | None = None, styles: list[palette.CellStyle] | None = None,
                y_domain: tuple[float, float] | None = None, channels: palette.Channels | None = None,
                key_of: dict[str, str] | None = None) -> alt.TopLevelMixin:
    """Mean line per cell, with its 95% CI band (``band``) and/or a faint line per seed (``seeds``).

    ``mean``: cell, x, mean, lo, hi, n. ``seeds``: cell, seed, x, y. With more
    than MAX_COLOURS cells the chart is faceted by ``facet`` (a column of both
    frames: the first grid axis), so no two cells in one panel share a colour.
    """
    zoom = alt.selection_interval(bind="scales")
    x = alt.X("x:Q", title=x_title, scale=_scale(log_x), axis=x_axis(x_format))
    # a fixed domain keeps each cell's color the same in every chart of the page
    domain = domain or sorted(mean["cell"].unique())
    faceted = bool(facet) and len(domain) > MAX_COLOURS and facet in mean
    legend = cell_legend(legend_columns(domain), symbolType="stroke", symbolStrokeWidth=3)
    factorial = channels is not None and channels.factorial and key_of is not None
    if factorial:  # one channel per axis: colour for one, line style for the other(s); a line per cell
        assert channels is not None and key_of is not None
        mean = with_levels(mean, channels, key_of)
        seeds = None if seeds is None else with_levels(seeds, channels, key_of)
        c_scale, d_scale, _ = factor_scales(channels)
        pick = alt.selection_point(fields=["colour_level"], bind="legend")
        color = alt.Color("colour_level:N", title=channels.colour_axis, scale=c_scale,
                          legend=cell_legend(1 if len(channels.colour_levels) < 5 else 2, symbolType="stroke",
                                             symbolStrokeWidth=3))
        dash = alt.StrokeDash("form_level:N", title=channels.form_title, scale=d_scale,
                              legend=cell_legend(1 if len(channels.form_levels) < 5 else 2, symbolType="stroke",
                                                 symbolStrokeWidth=2, symbolStrokeColor="#333"))
    else:
        pick = alt.selection_point(fields=["cell"], bind="legend")
        colour_scale, dash_scale = cell_scales(domain, styles)
        color = alt.Color("cell:N", title="cell", scale=colour_scale, legend=legend)
        dash = alt.StrokeDash("cell:N", title="cell", scale=dash_scale, legend=legend)
    per_cell: dict[str, Any] = {"detail": "cell:N"} if factorial else {}
    faded = alt.condition(pick, alt.value(1.0), alt.value(0.12))
    tooltip = [alt.Tooltip("cell:N"), alt.Tooltip("x:Q", title=x_title, format=",.4~g"),
               alt.Tooltip("mean:Q", title=f"{y_title} (mean)", format=".4f"),
               alt.Tooltip("lo:Q", title="95% CI low", format=".4f"),
               alt.Tooltip("hi:Q", title="95% CI high", format=".4f"),
               alt.Tooltip("n:Q", title="seeds")]
    frames = [mean.assign(kind="mean")]
    if seeds is not None and len(seeds):
        frames.append(seeds.assign(kind="seed"))
    data = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    base = alt.Chart(data)
    y_scale = _scale(log_y)
    if y_domain is not None:
        y_scale = alt.Scale(type="log", domain=list(y_domain)) if log_y else alt.Scale(zero=False,
                                                                                        domain=list(y_domain))
    layers = []
    if band:
        layers.append(base.transform_filter("datum.kind == 'mean'").mark_area(opacity=0.18).encode(
            x=x, y=alt.Y("lo:Q", title=y_title, scale=y_scale, axis=y_axis()), y2="hi:Q", color=color,
            opacity=alt.condition(pick, alt.value(0.18), alt.value(0.03)), **per_cell))
    if len(frames) > 1:
        layers.append(base.transform_filter("datum.kind == 'seed'").mark_line(strokeWidth=1, strokeDash=[3, 2])
                      .encode(x=x, y=alt.Y("y:Q", title=y_title, scale=y_scale, axis=y_axis()), color=color,
                              detail=[alt.Detail("cell:N"), alt.Detail("seed:N")] if factorial else "seed:N", opacity=alt.condition(pick, alt.value(0.45), alt.value(0.06)),
                              tooltip=[alt.Tooltip("cell:N"), alt.Tooltip("seed:N"),
                                       alt.Tooltip("x:Q", title=x_title, format=",.4~g"),
                                       alt.Tooltip("y:Q", title=y_title, format=".4f")]))
    layers.append(base.transform_filter("datum.kind == 'mean'")
                  .mark_line(strokeWidth=2, point=alt.Undefined if factorial else alt.OverlayMarkDef(size=12, opacity=0.0))
                  .encode(
        x=x, y=alt.Y("mean:Q", title=y_title, scale=y_scale, axis=y_axis()), color=color, strokeDash=dash,
        opacity=faded, tooltip=tooltip, **per_cell))
    n_legend = -(-len(domain) // legend_columns(domain))
    if factorial:
        assert channels is not None
        n_legend = 2 + -(-len(channels.colour_levels) // 2) + -(-len(channels.form_levels) // 2)
    chart = alt.layer(*layers).add_params(pick, zoom)
    panels = facet_levels(channels, mean) if factorial else []
    if panels:  # a third axis and beyond: a panel per level
        assert channels is not None
        return chart.properties(width=FACET_WIDTH, height=FACET_HEIGHT).facet(
            facet=level_facet(channels, panels), columns=2).resolve_scale(x="shared", y="shared")
    if faceted:
        assert facet is not None
        return chart.properties(width=320, height=220).facet(
            facet=alt.Facet(f"{facet}:N", title=facet), columns=2)
    return chart.properties(height=_with_legend(n_legend))


def _with_legend(rows: int, extra: int = 0) -> int:
    """Streamlit fits the whole chart, legend included, into the height: leave room for it."""
    return HEIGHT + extra + (30 + 20 * rows if rows else 0)


def line_chart(df: pd.DataFrame, x: str, y: str, x_title: str, y_title: str,
               log_y: bool = False) -> alt.TopLevelMixin:
    return alt.Chart(df).mark_line(point=alt.OverlayMarkDef(size=10)).encode(
        x=alt.X(f"{x}:Q", title=x_title),
        y=alt.Y(f"{y}:Q", title=y_title, scale=_scale(log_y)),
        tooltip=[alt.Tooltip(f"{x}:Q", title=x_title), alt.Tooltip(f"{y}:Q", title=y_title, format=".6g")],
    ).add_params(alt.selection_interval(bind="scales")).properties(height=HEIGHT)


# ---------------------------------------------------------------- compare


def compare_chart(df: pd.DataFrame, y: str, y_title: str | None, x_title: str, color: str | None,
                  facet: str | None, sort: list[str], baseline: float | None,
                  colour_scale: alt.Scale | None = None, shape: Any = None) -> alt.TopLevelMixin:
    """Mean and 95% CI per cell; ``df`` has mean, ci_lo, ci_hi, n, marker, cell, and the fields named.
    One labelled row per cell (abl.dashboard.intervals); with ``facet``, one panel per value of that column."""
    if color == "significance":
        col = alt.Color("significance:N", scale=SIGNIFICANCE, legend=cell_legend(2))
    elif color:
        n = df[color].nunique()
        col = alt.Color(f"{color}:N", scale=colour_scale or cell_scales(sorted(df[color].astype(str).unique()))[0],
                        legend=cell_legend(1 if n < 5 else 2))
    else:
        col = alt.value("#0072B2")  # type: ignore[assignment]  # a constant colour instead of a field
    tooltip = [alt.Tooltip("cell:N"), alt.Tooltip("n:Q", title="seeds"),
               alt.Tooltip("mean:Q", format=".4f"), alt.Tooltip("ci_lo:Q", title="95% CI low", format=".4f"),
               alt.Tooltip("ci_hi:Q", title="95% CI high", format=".4f")]
    if "delta" in df:
        tooltip += [alt.Tooltip("delta:Q", title="Δ vs baseline", format="+.4f"),
                    alt.Tooltip("p:Q", title="p", format=".3g"), alt.Tooltip("marker:N", title="verdict")]
    ref = baseline if baseline is not None and pd.notna(baseline) else None

    def labelled(part: pd.DataFrame) -> pd.DataFrame:
        """One row per cell, labelled: by cell, or (grouped) by the group's value and then the cell, the
        cells of one group next to each other in ``sort``'s order of the groups."""
        part = part.copy()
        if y == "cell":
            part["_row"] = part["cell"].astype(str)
            order = [r for r in dict.fromkeys(sort) if r in set(part["_row"])]
        else:
            rank = {v: i for i, v in enumerate(sort)}
            other = part[color if color and color in part else "cell"].astype(str)
            part["_row"] = part[y].astype(str).where(other == part[y].astype(str),
                                                     part[y].astype(str) + " · " + other)
            if not part["_row"].is_unique:
                part["_row"] = part[y].astype(str) + " · " + part["cell"].astype(str)
            part = part.sort_values(y, key=lambda v: v.astype(str).map(rank), kind="stable")
            order = list(part["_row"])
        return part.drop_duplicates("_row").set_index("_row", drop=False).loc[order].reset_index(drop=True)

    if not facet:
        rows = labelled(df)
        return intervals.interval_chart(rows, row="_row", x="mean", lo="ci_lo", hi="ci_hi", x_title=x_title,
                                        colour=col, shape=shape, text="marker" if "marker" in rows else None,
                                        ref=ref, tooltip=tooltip)
    panels: list[alt.LayerChart] = []
    for value in dict.fromkeys(df[facet].astype(str)):
        part = labelled(df[df[facet].astype(str) == value])
        panels.append(intervals.interval_chart(part, row="_row", x="mean", lo="ci_lo", hi="ci_hi",
                                               x_title=x_title, colour=col, shape=shape,
                                               text="marker" if "marker" in part else None, ref=ref,
                                               tooltip=tooltip)
                      .properties(title=f"{facet} = {value}"))
    return alt.vconcat(*panels).resolve_scale(x="independent")


def delta_chart(df: pd.DataFrame, sort: list[str], x_title: str) -> alt.TopLevelMixin:
    """Difference of each pair with its interval (adjusted like the verdicts), colored by the verdict: one
    labelled row per pair, the axis set by the differences (an interval past it cut and marked)."""
    color = alt.Color("significance:N", scale=SIGNIFICANCE, legend=cell_legend(2))
    tooltip = [alt.Tooltip("cell:N"), alt.Tooltip("delta:Q", title="Δ", format="+.4f"),
               alt.Tooltip("delta_lo:Q", title="CI low", format="+.4f"),
               alt.Tooltip("delta_hi:Q", title="CI high", format="+.4f"),
               alt.Tooltip("p:Q", title="p", format=".3g"), alt.Tooltip("marker:N", title="verdict")]
    rows = df.set_index("cell", drop=False).loc[list(dict.fromkeys(sort))].reset_index(drop=True)
    return intervals.interval_chart(rows, row="cell", x="delta", lo="delta_lo", hi="delta_hi", x_title=x_title,
                          colour=color, ref=0.0, ref_dash=False, tooltip=tooltip)


# ---------------------------------------------------------------- trade-offs


def pareto_chart(df: pd.DataFrame, x: str, x_title: str, y_title: str, color: str | None,
                 log_x: bool, x_better: str, domain: list[str] | None = None,
                 styles: list[palette.CellStyle] | None = None, channels: palette.Channels | None = None,
                 key_of: dict[str, str] | None = None) -> alt.TopLevelMixin:
    """Quality (y, lower is better) against a cost; ``df`` has x, y, y_lo, y_hi, cell, front.

    ``channels`` (a factorial grid's, abl.present.palette.grid_styles) with ``key_of`` (label -> cell key),
    when the points are coloured by cell: colour for one axis, marker for the other(s), a legend each.

    Optional columns: ``x_lo``/``x_hi`` (the cost's min and max over a cell's
    seeds, drawn as a horizontal bar: a speed measured once per seed is a
    spread, not a number) and ``contended`` (bool: a run measured on a
    contended machine, or a cell with one; drawn with a red ring, in the legend
    as "contended").
    """
    field = color or "cell"
    domain = domain or sorted(df[field].astype(str).unique())
    factorial = field == "cell" and channels is not None and channels.factorial and key_of is not None
    panels: list[str] = []
    if factorial:
        assert channels is not None and key_of is not None
        df = with_levels(df, channels, key_of)
        panels = facet_levels(channels, df)
        c_scale, _, s_scale = factor_scales(channels)
        pick = alt.selection_point(fields=["colour_level"], bind="legend")
        col = alt.Color("colour_level:N", title=channels.colour_axis, scale=c_scale,
                        legend=cell_legend(1 if len(channels.colour_levels) < 5 else 2))
    else:
        pick = alt.selection_point(fields=[field], bind="legend")
        col = alt.Color(f"{field}:N", scale=cell_scales(domain, styles)[0],
                        legend=cell_legend(legend_columns(domain) if field == "cell" else 4))
    tooltip = [alt.Tooltip("cell:N"), alt.Tooltip("x:Q", title=x_title, format=",.4~g"),
               alt.Tooltip("y:Q", title=y_title, format=".4f"), alt.Tooltip("n:Q", title="runs"),
               alt.Tooltip("front:N", title="on the Pareto front")]
    if "x_lo" in df:
        tooltip += [alt.Tooltip("x_lo:Q", title=f"{x_title} (min)", format=",.4~g"),
                    alt.Tooltip("x_hi:Q", title=f"{x_title} (max)", format=",.4~g")]
    if "contended" in df:
        tooltip.append(alt.Tooltip("contended_runs:N", title="contended") if "contended_runs" in df
                       else alt.Tooltip("contended:N"))
    xs = alt.X("x:Q", title=x_title, scale=_scale(log_x), axis=x_axis(",.4~s" if not log_x else ",.2~s"))
    ys = alt.Y("y:Q", title=y_title, scale=alt.Scale(zero=False), axis=y_axis())
    front = df[df["front"]].sort_values("x")
    step: Literal["step-after", "step-before"] = "step-after" if x_better == "lower" else "step-before"
    if panels:  # a panel per level of the axes beyond two: one data set (a facet needs it), the whole front in
        assert channels is not None  # every panel (the front is over every cell shown)
        fronts = [front.assign(facet_level=lv) for lv in panels]
        data = pd.concat([df.assign(part="point"), *[f.assign(part="front") for f in fronts]], ignore_index=True)
        base = alt.Chart(data).transform_filter("datum.part == 'point'")
        line = alt.Chart(data).transform_filter("datum.part == 'front'").mark_line(
            interpolate=step, color="#444", strokeDash=[6, 3]).encode(x=xs, y=ys)
    else:
        base = alt.Chart(df)
        line = alt.Chart(front).mark_line(interpolate=step, color="#444", strokeDash=[6, 3]).encode(x=xs, y=ys)
    err = base.mark_rule(opacity=0.5).encode(x=xs, y=alt.Y("y_lo:Q", title=y_title, scale=alt.Scale(zero=False)),
                                              y2="y_hi:Q", color=col,
                                              opacity=alt.condition(pick, alt.value(0.5), alt.value(0.08)))
    layers: list[Any] = []
    if "x_lo" in df:
        layers.append(base.mark_rule(strokeWidth=2).encode(
            x=alt.X("x_lo:Q", title=x_title, scale=_scale(log_x)), x2="x_hi:Q", y=ys, color=col,
            opacity=alt.condition(pick, alt.value(0.6), alt.value(0.08))))
    # past the nine colours a cell is told apart by its marker (abl.present.palette), so the Pareto front is
    # marked by a heavy outline and a larger point, not by a shape of its own
    shape: Any = alt.Undefined
    if factorial:
        assert channels is not None
        shape = alt.Shape("form_level:N", title=channels.form_title, scale=s_scale,
                          legend=cell_legend(1 if len(channels.form_levels) < 5 else 2))
    elif field == "cell":
        looks = list(styles) if styles is not None else palette.distinct(len(domain))
        shape = alt.Shape("cell:N", scale=alt.Scale(domain=list(domain), range=[s.vega_shape for s in looks]),
                          legend=cell_legend(legend_columns(domain)))
    pts = base.mark_point(filled=True, stroke="#111").encode(
        x=xs, y=ys, color=col, shape=shape,
        size=alt.condition("datum.front", alt.value(190), alt.value(110)),
        strokeWidth=alt.condition("datum.front", alt.value(2.4), alt.value(0.5)),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)), tooltip=tooltip)
    if "contended" in df and df["contended"].astype(bool).any():
        layers.append(base.transform_filter("datum.contended").mark_point(
            filled=False, size=360, strokeWidth=2, shape="circle").encode(
            x=xs, y=ys, stroke=alt.Stroke("speed:N", title=None, legend=alt.Legend(orient="top"),
                                          scale=alt.Scale(domain=["contended"], range=[CONTENDED_COLOUR])),
            tooltip=tooltip).transform_calculate(speed="'contended'"))
    n_legend = -(-len(domain) // (legend_columns(domain) if field == "cell" else 4))
    if factorial:
        assert channels is not None
        n_legend = 2 + -(-len(channels.colour_levels) // 2) + -(-len(channels.form_levels) // 2)
    chart = alt.layer(line, err, *layers, pts).add_params(pick, alt.selection_interval(bind="scales"))
    if panels:
        assert channels is not None
        return chart.properties(width=FACET_WIDTH, height=FACET_HEIGHT).facet(
            facet=level_facet(channels, panels), columns=2).resolve_scale(x="shared", y="shared")
    return chart.properties(height=_with_legend(n_legend + 2, extra=PARETO_EXTRA))


# ---------------------------------------------------------------- kernels


def bench_chart(df: pd.DataFrame, value: str, title: str, lo: str | None = None, hi: str | None = None,
                rule: float | None = None) -> alt.TopLevelMixin:
    """Providers side by side for each case (``df``: case, provider and the value columns)."""
    providers = sorted(df["provider"].astype(str).unique())
    color = alt.Color("provider:N", scale=cell_scales(providers)[0], legend=cell_legend(4))
    tooltip: list[Any] = [alt.Tooltip("case:N"), alt.Tooltip("provider:N"),
                          alt.Tooltip(f"{value}:Q", title=title, format=".4~g")]
    if lo and hi:
        tooltip += [alt.Tooltip(f"{lo}:Q", format=".4~g"), alt.Tooltip(f"{hi}:Q", format=".4~g")]
    for extra in ("shape", "dtype", "pass", "device", "notes"):
        if extra in df:
            tooltip.append(alt.Tooltip(f"{extra}:N"))
    base = alt.Chart(df)
    x = alt.X("case:N", title=None, sort=None, axis=alt.Axis(labelAngle=-25, labelLimit=260))
    bars = base.mark_bar().encode(x=x, xOffset="provider:N", y=alt.Y(f"{value}:Q", title=title),
                                  color=color, tooltip=tooltip)
    layers = [bars]
    if lo and hi:
        layers.append(base.mark_rule(color="#222").encode(x=x, xOffset="provider:N", y=f"{lo}:Q", y2=f"{hi}:Q"))
    if rule is not None:
        layers.append(alt.Chart(pd.DataFrame({"y": [rule]})).mark_rule(color="#d62728", strokeDash=[4, 3])
                      .encode(y="y:Q"))
    return alt.layer(*layers).properties(height=_with_legend(1, extra=90))  # legend, slanted labels
