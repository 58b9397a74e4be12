"""One cell, one style: the colour (and, past the palette, the line style and marker) of a cell on every
dashboard page and in every report figure.

A cell's style follows from its position in its grid (the order ``abl run`` expands the grid file into:
the grid's axes varied in the order the file lists them, the last fastest; ``grid_points`` and
``in_grid_order``), never from the order of a table, a ranking or the order the runs happened to start (with
``--workers`` or a resumed grid that is not the grid's), so a cell keeps its colour from the Curves page to
Trade-offs to the report. Where the grid file cannot be read (a store copied elsewhere), or a cell is not a
point of it (a ``--set grid...`` override, a grid edited since), the cell's first run's start decides, after
the grid's points. The colours are Paul Tol's "muted" qualitative scheme
(P. Tol, "Colour Schemes", SRON technical note SRON/EPS/TN/09-002, 2021, figure 4): nine colours that stay
apart for the common forms of colour blindness and on a white page. A tenth cell starts again at the first
colour with the next line style (solid, dashed, dotted, dash-dot) and the next marker (eight), so 72 cells
are told apart by (colour, line style, marker) and a scatter's points by (colour, marker).

Plain data, no plotting library: the report (matplotlib) and the dashboard (Vega-Lite) translate a
``CellStyle`` into their own terms (``mpl_ls``, ``vega_dash``).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
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


def grid_points(raw: Mapping[str, Any]) -> list[str]:
    """The labels (abl.grid.labels.grid_label: ``norm=rmsnorm, block=pre``) of a grid file's points, in the
    order ``abl run`` expands them (abl.grid.gridfile.expand: itertools.product over the ``[grid]`` axes in
    the file's order). Excluded points are listed too: no run of theirs exists, so they take no place.
    ``raw``: the grid file's tables; a grid without axes has the one point ``base``."""
    from ..grid.labels import grid_label

    grid = raw.get("grid")
    table: Mapping[str, Any] = grid if isinstance(grid, Mapping) else {}
    axes = {p: v for p, v in table.items() if p != "exclude" and isinstance(v, list) and v}
    return [grid_label(dict(zip(axes, combo))) for combo in itertools.product(*axes.values())]


def in_grid_order(cells: Sequence[tuple[Hashable, str]], points: Sequence[str] | None) -> list[Hashable]:
    """The keys of ``cells`` ((key, stored grid label), in the order their first runs started) in the grid's
    order: by the position of their label among ``points`` (``grid_points``), then the cells that are not a
    point of it, or all of them when ``points`` is None (no grid file to read), in the order given."""
    rank: dict[str, int] = {}
    for i, label in enumerate(points or ()):
        rank.setdefault(label, i)
    last = len(rank)
    order = sorted(range(len(cells)), key=lambda i: (rank.get(cells[i][1], last), i))
    return list(dict.fromkeys(cells[i][0] for i in order))


def grid_file_path(name: str, db: str) -> Path | None:
    """The grid file a run recorded (``abl run``'s GRID_FILE as given: absolute, relative to where it ran, or
    a shipped grid's name): as it is, relative to this folder, to the store's project folder (the parent of
    the store's folder, where ``results/abl.duckdb`` lives) or to the store's folder, then a shipped grid of
    that name; None when none is a file."""
    from ..grid.gridfile import resolve_grid_path

    p = Path(name)
    store_dir = Path(db).resolve().parent
    for cand in ([p] if p.is_absolute() else [p, store_dir.parent / p, store_dir / p]):
        if cand.is_file():
            return cand
    try:
        shipped = resolve_grid_path(p.name if p.parent.name == "ablations" else name)
    except Exception:  # noqa: BLE001 - no shipped grids to look in
        return None
    return shipped if shipped.is_file() and shipped.parent.name == "ablations" else None


def recorded_grid_order(runs: Sequence[Any], db: str) -> list[str]:
    """The cell keys of ``runs`` (objects with ``experiment``, ``cell_key``, ``label`` and ``grid_file``, in
    the order they started) in their grid's order, experiment by experiment (by name): the order ``abl run``
    expands each experiment's recorded grid files (several: in the order they were first run) into. Where no
    grid file can be read (a store copied elsewhere, the file moved), or a cell is no point of it, the order
    its first run started. The dashboard and ``abl report`` order cells, and so colour them, by this."""
    from ..grid.parsing import read_toml

    by_experiment: dict[str, list[Any]] = {}
    for r in runs:
        by_experiment.setdefault(str(r.experiment), []).append(r)
    out: list[str] = []
    for name in sorted(by_experiment):
        group = by_experiment[name]
        cells = list(dict.fromkeys((str(r.cell_key), str(r.label or "")) for r in group))
        points: list[str] | None = None
        for f in dict.fromkeys(str(r.grid_file) for r in group if isinstance(r.grid_file, str) and r.grid_file):
            path = grid_file_path(f, db)
            if path is None:
                continue
            try:
                points = (points or []) + grid_points(read_toml(path))
            except Exception:  # noqa: BLE001 - an unreadable grid file orders nothing; the fallback does
                continue
        out += [str(k) for k in in_grid_order(cells, points)]
    return list(dict.fromkeys(out))
