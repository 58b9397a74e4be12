"""``abl bench harness``: what a grid cell costs beyond its training steps.

Runs a one-cell grid (the default cell unless overridden) the way ``abl run``
does, in a scratch store, and splits the cell's wall time as the parent sees
it:

- ``steps_s``: the training steps themselves (each step's own wall time as the
  trainer timed it; a step without a timing, the memory-tracked one, counts
  at the median step);
- ``loop_other_s``: the rest of the training loop (in-loop evaluations,
  checkpoints, the memory tracker's extra cost);
- ``before_loop_s``: inside the worker, before the first step (data, model,
  FLOP counting, the device peak, compile warm-up);
- ``after_loop_s``: inside the worker, after the last step (post-training
  evaluations, summary);
- ``process_s``: outside ``train`` (starting the worker process, imports,
  store writes and ingest).

``overhead`` = 1 - steps_s / cell_wall_s: the share of the cell that is not
training. Timings of one run on a shared machine are noisy; compare runs made
in one session, as ratios.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def default_grid(steps: int) -> dict[str, Any]:
    return {"experiment": {"name": "bench-harness", "seeds": [0]}, "train": {"steps": steps}}


def run_harness_bench(steps: int = 200, overrides: list[str] | None = None,
                      workdir: Path | None = None) -> dict[str, Any]:
    """Run the one-cell grid and return the split of its wall time (seconds) and ``overhead``."""
    from rich.console import Console

    from . import store
    from .config import apply_override, expand, parse_overrides
    from .plugin_manager import get_registry
    from .runner import run_grid

    raw = default_grid(steps)
    for path, value in parse_overrides(list(overrides or [])):
        apply_override(raw, path, value)
    registry = get_registry()
    grid = expand(raw, registry, source="abl bench harness")
    if len(grid.cells) != 1:
        raise ValueError(f"abl bench harness times one cell; the overrides give {len(grid.cells)}")
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        db, runs = Path(tmp) / "bench.duckdb", Path(tmp) / "runs"
        t0 = time.perf_counter()
        failed = run_grid(grid, registry, db, runs, console=Console(quiet=True))
        cell_wall = time.perf_counter() - t0
        if failed:
            raise RuntimeError("the benchmark cell did not complete")
        con = store.connect(db, read_only=True)
        try:
            rows = con.execute("SELECT step, name, value FROM metrics WHERE name IN "
                               "('tokens_per_s', 'elapsed_s', 'wall_s', 'compile_s')").fetchall()
        finally:
            con.close()
    cell = grid.cells[0]
    tokens_per_step = cell.train.batch_size * cell.model.context
    by: dict[str, dict[int, float]] = {}
    for step, name, value in rows:
        by.setdefault(name, {})[int(step)] = float(value)
    step_dt = {s: tokens_per_step / v for s, v in by.get("tokens_per_s", {}).items()}
    elapsed = by.get("elapsed_s", {})
    n_steps = cell.train.steps
    median_dt = statistics.median(step_dt.values())
    untimed = [s for s in range(1, n_steps + 1) if s not in step_dt]
    steps_s = sum(step_dt.values()) + median_dt * len(untimed)
    first = min(elapsed)
    loop_start = elapsed[first] - step_dt.get(first, median_dt)
    loop_s = elapsed[max(elapsed)] - loop_start
    wall_s = next(iter(by.get("wall_s", {}).values()))
    return {
        "cell": cell.label, "steps": n_steps, "cell_wall_s": cell_wall, "steps_s": steps_s,
        "loop_other_s": loop_s - steps_s, "before_loop_s": loop_start,
        "after_loop_s": wall_s - elapsed[max(elapsed)], "process_s": cell_wall - wall_s,
        "compile_s": next(iter(by.get("compile_s", {}).values()), None),
        "untimed_steps": untimed, "median_step_s": median_dt,
        "overhead": 1 - steps_s / cell_wall,
    }
