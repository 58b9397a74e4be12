"""Sub-grids: ``abl run GRID --only model.norm=rmsnorm,layernorm --cells 1,3``.

A selection keeps some cells of an expanded grid and drops the rest; it never
re-expands, so every kept run has the run id it has in the full grid (a
sub-grid run and a later full run share the stored cells).

- ``--only PATH=V1,V2`` (repeatable, one per grid axis): the cells whose value
  on that axis is one of the values. The values are read as the grid's values
  are (TOML literals) and compared as ``abl.grid.labels.show`` prints them, so
  ``1e-5`` matches a grid value ``1e-05``.
- ``--cells 1,3,5-7``: cell numbers, 1-based, in grid order (every seed of a
  cell has its number), as ``abl run --dry-run`` lists them.

Both may be given: a cell is kept when it passes both. Bad input raises
ConfigError with one line that lists the valid choices.
"""

from __future__ import annotations

from typing import Sequence

from ..contracts.config import ConfigError, Grid
from .parsing import parse_value
from .labels import show


def cell_numbers(grid: Grid) -> dict[str, int]:
    """``{cell_key: number}``, 1-based, in the order the grid expands its cells."""
    out: dict[str, int] = {}
    for c in grid.cells:
        out.setdefault(c.cell_key, len(out) + 1)
    return out


def parse_numbers(text: str, count: int) -> list[int]:
    """``"1,3,5-7"`` -> ``[1, 3, 5, 6, 7]``, each within 1..count."""
    valid = f"valid cell numbers: 1-{count}" if count > 1 else "valid cell number: 1"
    out: list[int] = []
    for part in (p.strip() for p in str(text).split(",")):
        lo_s, sep, hi_s = part.partition("-")
        try:
            lo = int(lo_s)
            hi = int(hi_s) if sep else lo
        except ValueError:
            raise ConfigError(f"--cells {text!r}: {part!r} is not a cell number or a range like 2-4 "
                              f"({valid})") from None
        if lo > hi:
            raise ConfigError(f"--cells {text!r}: the range {part!r} is empty ({valid})")
        bad = [n for n in (lo, hi) if not 1 <= n <= count]
        if bad:
            raise ConfigError(f"--cells {text!r}: no cell {bad[0]} ({valid}; abl run GRID --dry-run lists them)")
        out += [n for n in range(lo, hi + 1) if n not in out]
    return out


def _parse_only(items: Sequence[str], grid: Grid) -> dict[str, set[str]]:
    axes = list(grid.grid_paths)
    listing = ", ".join(axes) if axes else "none (the grid has no [grid] axes)"
    out: dict[str, set[str]] = {}
    for item in items:
        path, sep, values = str(item).partition("=")
        path = path.strip()
        if not sep or not path or not values.strip():
            raise ConfigError(f"--only {item!r}: expected AXIS=VALUE[,VALUE...], e.g. --only "
                              f"'{axes[0] if axes else 'model.norm'}=...' (grid axes: {listing})")
        if path not in axes:
            raise ConfigError(f"--only {item!r}: {path} is not an axis of this grid (grid axes: {listing})")
        if path in out:
            raise ConfigError(f"--only {path} is given twice; give its values once, separated by commas")
        shown = list(dict.fromkeys(show(c.varied[path]) for c in grid.cells))
        wanted = set()
        for v in (v.strip() for v in values.split(",")):
            s = show(parse_value(v))
            if s not in shown:
                raise ConfigError(f"--only {item!r}: {path} has no value {v!r} in this grid "
                                  f"(its values: {', '.join(shown)})")
            wanted.add(s)
        out[path] = wanted
    return out


def select(grid: Grid, only: Sequence[str] = (), cells: str | None = None) -> Grid:
    """The grid with only the chosen cells (the same Cell objects, so the same run ids)."""
    if not only and not cells:
        return grid
    if grid.cells and grid.cells[0].train.lr_sweep:
        raise ConfigError("--only / --cells do not apply to a grid with train.lr_sweep (its phases re-expand "
                          "the whole grid); use --set 'grid.<axis>=[...]' instead")
    numbers = cell_numbers(grid)
    keep_numbers = set(parse_numbers(cells, len(numbers))) if cells else None
    wanted = _parse_only(only, grid)
    kept = [c for c in grid.cells
            if (keep_numbers is None or numbers[c.cell_key] in keep_numbers)
            and all(show(c.varied[p]) in vals for p, vals in wanted.items())]
    if not kept:
        raise ConfigError("the selection keeps no cell (--only and --cells have no cell in common)")
    return Grid(path=grid.path, raw=grid.raw, cells=kept, grid_paths=grid.grid_paths)
