"""Matplotlib helpers shared by the report's figures (abl.present.report) and the task-accuracy figure
(abl.present.taskreport): a distinct style per cell (for a factorial grid one channel per axis and a panel
per level of the axes beyond two, abl.present.palette), one legend outside the panels (a column per axis
for a factorial grid), tick labels that never overlap, the conditions footer below everything. Imports
only abl.present.palette."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from typing import Any

from . import palette


def fig_to_png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


LINE_STYLES = palette.LINE_STYLES
MARKERS = palette.MARKERS


def style_dict(s: palette.CellStyle) -> dict[str, Any]:
    """A look as matplotlib keyword values: colour, line style, marker."""
    return {"color": s.colour, "ls": s.mpl_ls, "marker": s.marker}


def cell_styles(cells: int | Sequence[Any]) -> list[dict[str, Any]]:
    """The (colour, line style, marker) of each cell, as the dashboard draws it (abl.present.palette).

    ``cells``: the report's cells (objects with ``key`` and ``runs``, the stored runs): a factorial grid gets
    one channel per axis (colour for one axis, marker and line style for the other(s),
    ``palette.grid_styles`` over what the runs recorded), any other one look per cell by grid position. An
    int ``n``: the looks of grid positions 0..n-1 (a figure whose series are not cells of a grid)."""
    if isinstance(cells, int):
        return [style_dict(s) for s in palette.distinct(cells)]
    looks = cell_channels(cells).styles
    return [style_dict(looks[str(c.key)]) for c in cells]


def cell_channels(cells: Sequence[Any]) -> palette.Channels:
    """How the report draws ``cells`` (objects with ``key`` and ``runs``): ``palette.grid_styles`` over what
    their runs recorded, as the dashboard does; a cell with no run (none expected) gets a look of its own
    after the others."""
    channels = palette.grid_styles([r for c in cells for r in (getattr(c, "runs", None) or [])])
    looks = dict(channels.styles)
    for c in cells:
        looks.setdefault(str(c.key), palette.style(len(looks)))
    return dataclasses.replace(channels, styles=looks)


def facet_groups(cells: Sequence[Any], channels: palette.Channels) -> list[tuple[str, list[int]]]:
    """The panels of a figure: (the panel's level text of the axes beyond colour and marker, the indices
    of its cells), in grid order; one panel ("", every cell) when the grid has no such axis."""
    if not channels.faceted:
        return [("", list(range(len(cells))))]
    groups: dict[str, list[int]] = {lv: [] for lv in channels.facet_levels}
    for i, c in enumerate(cells):  # a cell the channels do not know (no run): the first panel
        groups.setdefault(channels.facet_of.get(str(c.key), channels.facet_levels[0]), []).append(i)
    return [(lv, idx) for lv, idx in groups.items() if idx]


def axis_handles(channels: palette.Channels) -> list[list[Any]]:
    """The legend of a factorial grid, by axis: [the colour axis's title, one entry per level] and [the
    marker axis's title, one entry per level]: a legend entry per level of each axis, not per cell."""
    from matplotlib.lines import Line2D

    def title(text: str) -> Any:
        return Line2D([], [], ls="none", label=text)

    colours = [title(channels.colour_axis)] + [
        Line2D([], [], color=palette.CellStyle(0, i, 0).colour, lw=2.5, label=lv)
        for i, lv in enumerate(channels.colour_levels)]
    forms = [title(channels.form_title)] + [
        Line2D([], [], color="0.3", lw=1.2, ls=palette.CellStyle(0, 0, i).mpl_ls,
               marker=palette.CellStyle(0, 0, i).marker, ms=5, label=lv)
        for i, lv in enumerate(channels.form_levels)]
    return [colours, forms]


def legend_outside(fig, axes, extra: list | None = None, channels: palette.Channels | None = None) -> None:
    """One legend for the figure, below the panels (never over the data): every label once. A factorial
    grid's ``channels``: a column per axis (its title, then each level's colour or marker and line style)
    instead of an entry per cell, then ``extra``."""
    if channels is not None and channels.factorial:
        columns = [*axis_handles(channels), *([list(extra)] if extra else [])]
        rows = max(len(col) for col in columns)
        handles = [h for col in columns for h in col + [_blank() for _ in range(rows - len(col))]]
        leg = fig.legend(handles, [h.get_label() for h in handles], loc="upper center",
                         bbox_to_anchor=(0.5, 0.0), bbox_transform=fig.transFigure, ncol=len(columns),
                         fontsize=8, frameon=False)
        for text in [leg.get_texts()[i * rows] for i in range(2)]:
            text.set_fontweight("bold")  # the axis's name heads its column
        return
    handles, labels = [], []
    for ax in axes:
        for h, lbl in zip(*ax.get_legend_handles_labels()):
            if lbl not in labels and not lbl.startswith("_"):
                handles.append(h)
                labels.append(lbl)
    for h in extra or []:
        handles.append(h)
        labels.append(h.get_label())
    if handles:
        width = max(len(lbl) for lbl in labels)
        across = fig.get_figwidth() * 72 / (0.6 * 8)  # characters of an 8 pt font across the figure
        ncol = max(1, min(len(labels), int(across // max(12, width + 6))))
        # below the figure's edge (the layout keeps every panel inside it; bbox_inches="tight" keeps the
        # legend): not a constrained-layout "outside" legend, which a tight save moves over the footer
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=fig.transFigure,
                   ncol=ncol, fontsize=8, frameon=False)


MIN_GAP_PX = 6  # tick labels closer than this read as one ("8000 9000 1000011000")


def _overlapping(labels: list, gap: float = MIN_GAP_PX) -> bool:
    """Whether two of ``labels`` overlap or sit closer than ``gap`` pixels (so that they run together)."""
    boxes = [t.get_window_extent().expanded(1.0, 1.0).padded(gap / 2) for t in labels]
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def si_ticks(axis, unit: str = "") -> None:
    """Tick labels in SI prefixes (``8k``, ``1.2M``, ``3G``) on a linear axis of large counts (tokens,
    FLOPs): short labels that do not run together, with no offset or power-of-ten multiplier."""
    from matplotlib.ticker import EngFormatter

    axis.set_major_formatter(EngFormatter(unit=unit, sep="" if not unit else " ", places=None))


def plain_ticks(axis) -> None:
    """Each tick label the number itself: no offset or scientific multiplier (a ``1e7`` above the axis that
    the reader has to add to every label)."""
    from matplotlib.ticker import ScalarFormatter

    fmt = ScalarFormatter(useOffset=False)
    fmt.set_scientific(False)
    axis.set_major_formatter(fmt)


def tick_labels(axis) -> list:
    """The tick labels of an axis that are drawn (visible, with text)."""
    return [t for t in axis.get_ticklabels(which="both") if t.get_visible() and t.get_text()]


def thin_ticks(fig) -> None:
    """No two tick labels of an axis overlap: drop the minor labels, then fewer ticks, then rotate the
    x labels, then show every other label, until none does."""
    from matplotlib.ticker import LogLocator, MaxNLocator, NullFormatter

    fig.canvas.draw()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for step in range(6):
                if not _overlapping(tick_labels(axis)):
                    break
                if step == 0:
                    axis.set_minor_formatter(NullFormatter())
                elif step == 1:
                    axis.set_major_locator(LogLocator(numticks=4) if axis.get_scale() == "log"
                                           else MaxNLocator(4))
                elif step == 2 and axis is ax.xaxis:
                    for t in axis.get_ticklabels():
                        t.set_rotation(30)
                        t.set_horizontalalignment("right")
                else:
                    for i, t in enumerate(tick_labels(axis)):
                        t.set_visible(i % 2 == 0)
                fig.canvas.draw()


def add_footer(fig, footer: str) -> None:
    """The conditions line below everything drawn (figure coordinates below 0 are kept by
    ``bbox_inches="tight"``), wrapped to the figure's width."""
    if not footer:
        return
    import textwrap

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    inv = fig.transFigure.inverted()
    bottom = min([inv.transform((0, a.get_tightbbox(renderer).y0))[1] for a in list(fig.legends) + fig.axes]
                 + [0.0])
    width = int(fig.get_figwidth() * 72 / (0.6 * 6))  # characters of a 6 pt font across the figure
    fig.text(0.01, bottom - 0.01, "\n".join(textwrap.wrap(footer, width)), fontsize=6, color="0.35",
             ha="left", va="top")


def _blank() -> Any:
    from matplotlib.lines import Line2D

    return Line2D([], [], ls="none", label=" ")


def finish_figure(fig, axes, footer: str, extra: list | None = None, channels: palette.Channels | None = None):
    """One legend below the panels (by axis for a factorial grid's ``channels``), tick labels apart, the
    footer below everything."""
    legend_outside(fig, axes, extra, channels)
    thin_ticks(fig)
    add_footer(fig, footer)
    return fig
