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
                y_domain: tuple[float, float] | None = None) -> alt.TopLevelMixin:
    """Mean line per cell, with its 95% CI band (``band``) and/or a faint line per seed (``seeds``).

    ``mean``: cell, x, mean, lo, hi, n. ``seeds``: cell, seed, x, y. With more
    than MAX_COLOURS cells the chart is faceted by ``facet`` (a column of both
    frames: the first grid axis), so no two cells in one panel share a colour.
    """
    pick = alt.selection_point(fields=["cell"], bind="legend")
    zoom = alt.selection_interval(bind="scales")
    x = alt.X("x:Q", title=x_title, scale=_scale(log_x), axis=x_axis(x_format))
    # a fixed domain keeps each cell's color the same in every chart of the page
    domain = domain or sorted(mean["cell"].unique())
    faceted = bool(facet) and len(domain) > MAX_COLOURS and facet in mean
    colour_scale, dash_scale = cell_scales(domain, styles)
    legend = cell_legend(legend_columns(domain), symbolType="stroke", symbolStrokeWidth=3)
    color = alt.Color("cell:N", title="cell", scale=colour_scale, legend=legend)
    dash = alt.StrokeDash("cell:N", title="cell", scale=dash_scale, legend=legend)
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
            opacity=alt.condition(pick, alt.value(0.18), alt.value(0.03))))
    if len(frames) > 1:
        layers.append(base.transform_filter("datum.kind == 'seed'").mark_line(strokeWidth=1, strokeDash=[3, 2])
                      .encode(x=x, y=alt.Y("y:Q", title=y_title, scale=y_scale, axis=y_axis()), color=color,
                              detail="seed:N", opacity=alt.condition(pick, alt.value(0.45), alt.value(0.06)),
                              tooltip=[alt.Tooltip("cell:N"), alt.Tooltip("seed:N"),
                                       alt.Tooltip("x:Q", title=x_title, format=",.4~g"),
                                       alt.Tooltip("y:Q", title=y_title, format=".4f")]))
    layers.append(base.transform_filter("datum.kind == 'mean'")
                  .mark_line(strokeWidth=2, point=alt.OverlayMarkDef(size=12, opacity=0.0)).encode(
        x=x, y=alt.Y("mean:Q", title=y_title, scale=y_scale, axis=y_axis()), color=color, strokeDash=dash,
        opacity=faded, tooltip=tooltip))
    n_legend = -(-len(domain) // legend_columns(domain))
    chart = alt.layer(*layers).add_params(pick, zoom)
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


def compare_chart(df: pd.DataFrame, y: str, y_title: str, x_title: str, color: str | None,
                  facet: str | None, sort: list[str], baseline: float | None) -> alt.TopLevelMixin:
    """Mean and 95% CI per cell; ``df`` has mean, ci_lo, ci_hi, n, marker, cell, and the fields named."""
    enc_y = alt.Y(f"{y}:N", title=y_title, sort=sort, axis=alt.Axis(labelLimit=0))
    if color == "significance":
        col = alt.Color("significance:N", scale=SIGNIFICANCE, legend=cell_legend(2))
    elif color:
        n = df[color].nunique()
        col = alt.Color(f"{color}:N", scale=cell_scales(sorted(df[color].astype(str).unique()))[0],
                        legend=cell_legend(1 if n < 5 else 2))
    else:
        col = alt.value("#1f77b4")  # type: ignore[assignment]  # a constant colour instead of a field
    tooltip = [alt.Tooltip("cell:N"), alt.Tooltip("n:Q", title="seeds"),
               alt.Tooltip("mean:Q", format=".4f"), alt.Tooltip("ci_lo:Q", title="95% CI low", format=".4f"),
               alt.Tooltip("ci_hi:Q", title="95% CI high", format=".4f")]
    if "delta" in df:
        tooltip += [alt.Tooltip("delta:Q", title="Δ vs baseline", format="+.4f"),
                    alt.Tooltip("p:Q", title="p", format=".3g"), alt.Tooltip("marker:N", title="verdict")]
    xscale = alt.Scale(zero=False)
    base = alt.Chart(df)
    bars = base.mark_rule(strokeWidth=2).encode(x=alt.X("ci_lo:Q", title=x_title, scale=xscale, axis=x_axis()),
                                                x2="ci_hi:Q", y=enc_y, color=col, tooltip=tooltip)
    dots = base.mark_point(filled=True, size=80).encode(
        x=alt.X("mean:Q", title=x_title, scale=xscale), y=enc_y, color=col, tooltip=tooltip)
    text = base.mark_text(align="left", dx=8, dy=-8, fontSize=11).encode(
        x="mean:Q", y=enc_y, text=alt.Text("marker:N"))
    layers = [bars, dots, text]
    if baseline is not None and pd.notna(baseline):
        layers.insert(0, base.mark_rule(strokeDash=[5, 4], color="#888").encode(x="baseline:Q"))
    n_rows = max(1, len(sort)) if not facet else max(1, df[y].nunique())
    chart = alt.layer(*layers).properties(height=max(120, min(900, 26 * n_rows)))
    if facet:
        chart = chart.facet(column=alt.Column(f"{facet}:N", title=facet))
        chart = chart.resolve_scale(x="shared", y="independent" if y == "cell" else "shared")
    return chart.interactive(bind_y=False) if not facet else chart


def delta_chart(df: pd.DataFrame, sort: list[str], x_title: str) -> alt.TopLevelMixin:
    """Difference to the baseline with its interval (adjusted like the verdicts), colored by the verdict."""
    enc_y = alt.Y("cell:N", title=None, sort=sort, axis=alt.Axis(labelLimit=0))
    color = alt.Color("significance:N", scale=SIGNIFICANCE, legend=cell_legend(2))
    tooltip = [alt.Tooltip("cell:N"), alt.Tooltip("delta:Q", title="Δ", format="+.4f"),
               alt.Tooltip("delta_lo:Q", title="CI low", format="+.4f"),
               alt.Tooltip("delta_hi:Q", title="CI high", format="+.4f"),
               alt.Tooltip("p:Q", title="p", format=".3g"), alt.Tooltip("marker:N", title="verdict")]
    base = alt.Chart(df)
    zero = alt.Chart(pd.DataFrame({"x": [0.0]})).mark_rule(color="#888").encode(x="x:Q")
    bars = base.mark_rule(strokeWidth=2).encode(
        x=alt.X("delta_lo:Q", title=x_title, axis=x_axis()), x2="delta_hi:Q", y=enc_y, color=color, tooltip=tooltip)
    dots = base.mark_point(filled=True, size=70).encode(x="delta:Q", y=enc_y, color=color, tooltip=tooltip)
    return alt.layer(zero, bars, dots).properties(height=max(120, min(900, 26 * len(sort))))


# ---------------------------------------------------------------- trade-offs


def pareto_chart(df: pd.DataFrame, x: str, x_title: str, y_title: str, color: str | None,
                 log_x: bool, x_better: str, domain: list[str] | None = None,
                 styles: list[palette.CellStyle] | None = None) -> alt.TopLevelMixin:
    """Quality (y, lower is better) against a cost; ``df`` has x, y, y_lo, y_hi, cell, front.

    Optional columns: ``x_lo``/``x_hi`` (the cost's min and max over a cell's
    seeds, drawn as a horizontal bar: a speed measured once per seed is a
    spread, not a number) and ``contended`` (bool: a run measured on a
    contended machine, or a cell with one; drawn with a red ring, in the legend
    as "contended").
    """
    field = color or "cell"
    domain = domain or sorted(df[field].astype(str).unique())
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
    base = alt.Chart(df)
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
    if field == "cell":
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
    front = df[df["front"]].sort_values("x")
    step: Literal["step-after", "step-before"] = "step-after" if x_better == "lower" else "step-before"
    line = alt.Chart(front).mark_line(interpolate=step, color="#444", strokeDash=[6, 3]).encode(x=xs, y=ys)
    n_legend = -(-len(domain) // (legend_columns(domain) if field == "cell" else 4))
    return (alt.layer(line, err, *layers, pts).add_params(pick, alt.selection_interval(bind="scales"))
            .properties(height=_with_legend(n_legend + 2, extra=PARETO_EXTRA)))


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
