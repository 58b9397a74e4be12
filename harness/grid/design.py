"""What a grid's design can decide before it runs (``abl run --dry-run`` prints it; a test holds every shipped
grid's header to it).

For each swept axis: the smallest true difference between two of its levels, in residual standard deviations
(sigma: the spread of a run's final value around the additive model of abl.analysis.stats.effects), that the
grid's compared seeds detect with 80% power for every pair of levels, Holm's strictest step included. The
figure depends on the design alone (which cells, which seeds); how large sigma is only runs can tell.
"""

from __future__ import annotations

import json

from ..analysis import stats
from ..contracts.config import Grid


def compared_seeds(grid: Grid) -> list[int]:
    """The seeds whose runs are compared: all of them, or those after the tuning seeds under train.lr_sweep
    (the first ``train.lr_tuning_seeds`` tune)."""
    seeds = list(grid.cells[0].experiment.seeds) if grid.cells else []
    return seeds[grid.cells[0].train.lr_tuning_seeds:] if grid.cells and grid.cells[0].train.lr_sweep else seeds


def detectable(grid: Grid) -> dict[str, stats.DesignPower]:
    """Per swept axis (``grid.grid_paths``): the difference in sigmas the design detects between the levels
    that can get a verdict at these seeds, and the levels that cannot (abl.analysis.stats.detectable_by_design)."""
    seeds = set(compared_seeds(grid))
    cells: dict[str, stats.CellInput] = {}
    for cell in grid.cells:
        varied = {p: v for p, v in cell.varied.items() if p in grid.grid_paths}
        key = json.dumps(varied, sort_keys=True, default=str)
        c = cells.setdefault(key, stats.CellInput(key, cell.label, {}, None,
                                                  settings={p: json.dumps(v) for p, v in varied.items()}))
        for s in seeds:
            c.values[s] = 0.0
    return stats.detectable_by_design(list(cells.values()), grid.grid_paths)


def design_lines(grid: Grid) -> list[str]:
    """The dry run's sentences: per axis, what the compared seeds can tell apart."""
    found = detectable(grid)
    if not found:
        return []
    seeds = compared_seeds(grid)
    parts = []
    for axis, d in found.items():
        if d.sigmas is None:
            parts.append(f"{axis}: no verdict at {len(seeds)} seed(s) (fewer than {stats.MIN_SEEDS} runs on a "
                         f"level, or too few residual degrees of freedom)")
        else:
            short = f" (not {', '.join(d.short)}: fewer than {stats.MIN_SEEDS} runs)" if d.short else ""
            parts.append(f"{axis}: levels {d.sigmas:.1f} σ apart{short}")
    return [f"design: with seeds {seeds} compared, the grid can tell apart (80% power, Holm over the pairs of "
            f"levels) " + "; ".join(parts),
            "  σ is the residual standard deviation of a run's final value around the per-axis model "
            "(seed and other axes as blocks); only runs can tell its size"]
