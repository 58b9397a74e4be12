"""One cell, one style: the colour (and, past the palette, the line style and marker) of a cell on every
dashboard page and in every report figure.

A cell's style follows from its position in its grid (the order ``abl run`` expands the grid file into:
the grid's axes varied in the order the file lists them, the last fastest), which each run records
(``grid_order``), never from the order of a table, a ranking or the order the runs happened to start (with
``--workers`` or a resumed grid that is not the grid's), so a cell keeps its colour from the Curves page to
Trade-offs to the report, and after the grid file is moved or deleted. The colours are Paul Tol's "muted" qualitative scheme
(P. Tol, "Colour Schemes", SRON technical note SRON/EPS/TN/09-002, 2021, figure 4): nine colours that stay
apart for the common forms of colour blindness and on a white page. A tenth cell starts again at the first
colour with the next line style (solid, dashed, dotted, dash-dot) and the next marker (eight), so 72 cells
are told apart by (colour, line style, marker) and a scatter's points by (colour, marker).

Plain data, no plotting library: the report (matplotlib) and the dashboard (Vega-Lite) translate a
``CellStyle`` into their own terms (``mpl_ls``, ``vega_dash``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# Paul Tol's muted scheme, in his order (rose, indigo, sand, green, cyan, wine, teal, olive, purple)
COLOURS: tuple[str, ...] = ("#CC6677", "#332288", "#DDCC77", "#117733", "#88CCEE", "#882255", "#44AA99",
                            "#999933", "#AA4499")
# line styles past the colours: matplotlib's names and the same dashes as Vega-Lite strokeDash arrays
LINE_STYLES: tuple[str, ...] = ("-", "--", ":", "-.")
VEGA_DASHES: tuple[tuple[int, ...], ...] = ((1, 0), (6, 3), (2, 2), (6, 2, 2, 2))
MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P", "X", "*")
VEGA_SHAPES: tuple[str, ...] = ("circle", "square", "triangle-up", "diamond", "triangle-down", "cross",
                                "triangle-left", "triangle-right")
# a colour for "not a cell" (a reference line, a band): Tol's pale grey is kept out of COLOURS for this
NEUTRAL = "#DDDDDD"


@dataclass(frozen=True)
class CellStyle:
    """The look of the cell at ``position`` (0-based) in its grid."""

    position: int

    @property
    def colour(self) -> str:
        return COLOURS[self.position % len(COLOURS)]

    @property
    def _round(self) -> int:
        """How many times the colours have come round before this cell (0 for the first nine)."""
        return self.position // len(COLOURS)

    @property
    def mpl_ls(self) -> str:
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
