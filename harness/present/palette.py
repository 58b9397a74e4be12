"""One cell, one look: the colour, line style and marker of a cell on every dashboard page and in every
report figure.

A one-axis grid (or cells whose grid is not known) gets one look per cell, by the cell's position in its grid
(the order ``abl run`` expands the grid file into: the grid's axes varied in the order the file lists them,
the last fastest), which each run records (``grid_index``), never from the order of a table, a ranking or
the order the runs happened to start, so a cell keeps its colour from the Curves page to Trade-offs to the
report, and after the grid file is moved or deleted. A ninth cell starts again at the first colour with the
next line style and the next marker.

A factorial grid (two swept axes or more) gets one visual channel per axis (``grid_styles``): colour for
the axis with the most levels (the first in the grid file on a tie), marker and line style for the one with
the most levels among the others, and a panel (facet) per level, or combination of levels, of any axis
beyond those two, with the same colour and marker mapping in every panel; so "which norm" is read from the
colour, "which block layout" from the marker and "which position encoding" from the panel, instead of
telling thirteen colours apart. What a cell's level of each axis is comes from what
its runs recorded (``grid_varied``, else its config at the recorded ``grid_paths``), never from re-reading a
grid file. When an axis has more levels than a channel has looks, the grid falls back to one look per cell.

The colours are Okabe and Ito's qualitative scheme (M. Okabe and K. Ito, "Color Universal Design (CUD): how
to make figures and presentations that are friendly to colorblind people", 2008,
https://jfly.uni-koeln.de/color/; the same eight in B. Wong, "Points of view: Color blindness", Nature Methods
8, 441, 2011): eight saturated colours told apart under the common forms of colour blindness and on a white
page. The order puts the darker, most distinct ones first and the yellow, weakest on white, last.

Plain data, no plotting library: the report (matplotlib) and the dashboard (Vega-Lite) translate a
``CellStyle`` into their own terms (``mpl_ls``, ``vega_dash``, ``marker``, ``vega_shape``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# Okabe-Ito, reordered: blue, vermillion, bluish green, reddish purple, orange, sky blue, black, yellow
COLOURS: tuple[str, ...] = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
                            "#F0E442")
# line styles: matplotlib's and the same dashes as Vega-Lite strokeDash arrays
LINE_STYLES: tuple[Any, ...] = ("-", "--", ":", "-.", (0, (10, 3)), (0, (6, 2, 2, 2, 2, 2)))
VEGA_DASHES: tuple[tuple[int, ...], ...] = ((1, 0), (6, 3), (2, 2), (6, 2, 2, 2), (10, 3), (6, 2, 2, 2, 2, 2))
MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P", "X", "*")
VEGA_SHAPES: tuple[str, ...] = ("circle", "square", "triangle-up", "diamond", "triangle-down", "cross",
                                "triangle-left", "triangle-right")
# a colour for "not a cell" (a reference line, a band): a pale grey, not among COLOURS
NEUTRAL = "#DDDDDD"


@dataclass(frozen=True)
class CellStyle:
    """The look of the cell at ``position`` (0-based) in its grid. ``hue`` and ``form`` (indices into the
    colours and the line styles / markers) are set for a factorial grid's cells (one channel per axis);
    -1: from the position (one look per cell)."""

    position: int
    hue: int = -1
    form: int = -1

    @property
    def colour(self) -> str:
        return COLOURS[(self.hue if self.hue >= 0 else self.position) % len(COLOURS)]

    @property
    def _round(self) -> int:
        """The line style and marker index: the form, else how many times the colours have come round."""
        return self.form if self.form >= 0 else self.position // len(COLOURS)

    @property
    def mpl_ls(self) -> Any:
        return LINE_STYLES[self._round % len(LINE_STYLES)]

    @property
    def vega_dash(self) -> list[int]:
        return list(VEGA_DASHES[self._round % len(VEGA_DASHES)])

    @property
    def marker(self) -> str:
        return MARKERS[self._round % len(MARKERS)]

    @property
    def vega_shape(self) -> str:
        return VEGA_SHAPES[self._round % len(VEGA_SHAPES)]


def style(position: int) -> CellStyle:
    if position < 0:
        raise ValueError(f"a cell's grid position is 0 or more, not {position}")
    return CellStyle(position)


def styles(keys_in_grid_order: Iterable[str]) -> dict[str, CellStyle]:
    """Each cell key's style, by its position in ``keys_in_grid_order`` (every cell of the grid, not only the
    ones shown: hiding a cell must not recolour the others). A repeated key keeps its first position."""
    out: dict[str, CellStyle] = {}
    for k in keys_in_grid_order:
        if k not in out:
            out[k] = style(len(out))
    return out


def distinct(n: int) -> list[CellStyle]:
    """The first ``n`` styles (for a figure whose series are not cells of a grid)."""
    return [style(i) for i in range(n)]


def vega_scales(labels: Sequence[str], keyed: Sequence[CellStyle]) -> tuple[dict, dict]:
    """(colour scale, strokeDash scale) for series named ``labels`` with the styles ``keyed`` (same order), as
    Vega-Lite scale dicts: the domain is fixed, so a series' colour does not depend on what else is drawn."""
    return ({"domain": list(labels), "range": [s.colour for s in keyed]},
            {"domain": list(labels), "range": [s.vega_dash for s in keyed]})


def grid_order(runs: Sequence[Any]) -> list[str]:
    """The cell keys of ``runs`` (objects with ``experiment``, ``cell_key``, ``grid_file`` and ``grid_index``,
    in the order they started) in their grid's order, experiment by experiment (by name): by the grid file
    each cell's runs recorded (several: in the order they were first run), then the cell's recorded index
    among that file's points (abl.contracts.config.Cell.grid_index: the order ``abl run`` expands the file
    into). Nothing is re-read: a store copied elsewhere, or a grid file since moved, edited or deleted,
    orders its cells as when they ran. A cell that recorded no index (a run folder from before runs
    recorded their grid) comes after the indexed ones, in the order its first run started. The dashboard
    and ``abl report`` order cells, and so colour them, by this."""
    by_experiment: dict[str, list[Any]] = {}
    for r in runs:
        by_experiment.setdefault(str(r.experiment), []).append(r)
    out: list[str] = []
    for name in sorted(by_experiment):
        group = by_experiment[name]
        files = list(dict.fromkeys(str(r.grid_file or "") for r in group))
        rank: dict[str, tuple[int, int, int]] = {}
        for i, r in enumerate(group):
            index = _index(r.grid_index)
            if index is not None:
                rank.setdefault(str(r.cell_key), (0, files.index(str(r.grid_file or "")), index))
            else:
                rank.setdefault(str(r.cell_key), (1, i, 0))
        out += sorted(rank, key=lambda k: rank[k])
    return list(dict.fromkeys(out))


def _index(value: Any) -> int | None:
    """A recorded grid index as an int (a DataFrame gives numpy integers, or floats beside NULLs), else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        as_float = float(value)
    except (TypeError, ValueError):
        return None
    return int(as_float) if as_float == as_float and as_float.is_integer() and as_float >= 0 else None


# ---------------------------------------------------------------- one channel per axis


@dataclass(frozen=True)
class Channels:
    """How a grid's cells are drawn: ``styles`` (cell key -> look) and, for a factorial grid, which axis is
    on the colour (``colour_axis``) and which on the marker and line style (``form_axes``), with each cell's
    level text on both (``colour_of``, ``form_of``) and the levels in grid order. ``factorial`` False: one
    look per cell, the legend lists cells."""

    styles: dict[str, CellStyle]
    colour_axis: str = ""
    form_axes: tuple[str, ...] = ()
    colour_of: dict[str, str] = field(default_factory=dict)
    form_of: dict[str, str] = field(default_factory=dict)
    colour_levels: tuple[str, ...] = ()
    form_levels: tuple[str, ...] = ()
    # the axes beyond the colour's and the marker's (a third swept axis and more): one panel per level (or
    # combination of levels), ``facet_of`` each cell's panel, ``facet_levels`` the panels in grid order
    facet_axes: tuple[str, ...] = ()
    facet_of: dict[str, str] = field(default_factory=dict)
    facet_levels: tuple[str, ...] = ()

    @property
    def factorial(self) -> bool:
        return bool(self.colour_axis)

    @property
    def faceted(self) -> bool:
        return bool(self.facet_axes)

    @property
    def form_title(self) -> str:
        return ", ".join(self.form_axes)

    @property
    def facet_title(self) -> str:
        return ", ".join(self.facet_axes)

    def describe(self) -> str:
        """One sentence for a caption: what the colour, the marker and the panels say."""
        if not self.factorial:
            return "colour, line style and marker: the cell"
        return (f"colour: {self.colour_axis}; marker and line style: {self.form_title}"
                + (f"; one panel per {self.facet_title}" if self.faceted else ""))


def level_text(value: Any) -> str:
    """An axis level as the legends write it: a string as it is, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return str(value)


_MISSING = object()


def _at(config: Any, path: str) -> Any:
    """The value at a dotted ``path`` of a nested config dict (``_MISSING`` when absent)."""
    node = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _recorded_levels(runs: Sequence[Any], keys: Sequence[str]) -> tuple[list[str], dict[str, dict[str, str]]]:
    """(the swept paths the runs recorded, in their grids' order; each cell's level text of each path), from
    the runs' ``grid_varied`` and, for a run that recorded only ``grid_paths``, its config at those paths."""
    paths: dict[str, None] = {}
    levels: dict[str, dict[str, str]] = {}
    for r in runs:
        varied = getattr(r, "grid_varied", None) or {}
        recorded = [str(p) for p in (getattr(r, "grid_paths", None) or [])]
        paths.update((p, None) for p in [*recorded, *(str(k) for k in varied)])
        cell = levels.setdefault(str(r.cell_key), {})
        for p in [*recorded, *(str(k) for k in varied)]:
            if p in cell:
                continue
            value = varied[p] if p in varied else _at(getattr(r, "config", None) or {}, p)
            if value is not _MISSING:
                cell[p] = level_text(value)
    return list(paths), {k: levels.get(k, {}) for k in keys}


def grid_styles(runs: Sequence[Any]) -> Channels:
    """Each cell's look for the runs' grid (objects as ``grid_order`` takes, with ``grid_varied``,
    ``grid_paths`` and ``config`` where they have them): one channel per swept axis for a factorial grid,
    else one look per cell by grid position (``styles(grid_order(runs))``). Every page of the dashboard and
    every figure of the report draws a grid's cells with this."""
    order = grid_order(runs)
    per_cell = Channels(styles(order))
    if not order:
        return per_cell
    paths, levels = _recorded_levels(runs, order)
    # an axis every cell recorded that takes two values or more among them
    axes = [p for p in paths if all(p in levels[k] for k in order) and len({levels[k][p] for k in order}) > 1]
    if len(axes) < 2:
        return per_cell
    ordered = {a: list(dict.fromkeys(levels[k][a] for k in order)) for a in axes}
    colour_axis = max(axes, key=lambda a: (len(ordered[a]), -axes.index(a)))
    rest = [a for a in axes if a != colour_axis]
    form_axis = max(rest, key=lambda a: (len(ordered[a]), -rest.index(a)))
    form_axes = (form_axis,)
    facet_axes = tuple(a for a in rest if a != form_axis)  # in the grid's order
    forms = list(dict.fromkeys(tuple(levels[k][a] for a in form_axes) for k in order))
    if len(ordered[colour_axis]) > len(COLOURS) or len(forms) > min(len(VEGA_DASHES), len(MARKERS)):
        return per_cell  # more levels than the channel has looks: one look per cell, as for one axis
    looks, colour_of, form_of, facet_of = {}, {}, {}, {}
    for i, k in enumerate(order):
        form = tuple(levels[k][a] for a in form_axes)
        looks[k] = CellStyle(i, ordered[colour_axis].index(levels[k][colour_axis]), forms.index(form))
        colour_of[k] = levels[k][colour_axis]
        form_of[k] = ", ".join(form)
        facet_of[k] = ", ".join(f"{a}={levels[k][a]}" for a in facet_axes)
    if len({(s.hue, s.form, facet_of[k]) for k, s in looks.items()}) < len(looks):
        return per_cell  # two cells the axes do not tell apart (an axis the grid did not record)
    return Channels(looks, colour_axis, form_axes, colour_of, form_of, tuple(ordered[colour_axis]),
                    tuple(", ".join(f) for f in forms), facet_axes,
                    facet_of if facet_axes else {}, tuple(dict.fromkeys(facet_of[k] for k in order))
                    if facet_axes else ())
