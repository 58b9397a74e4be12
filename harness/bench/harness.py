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
training. ``evaluations_s`` is the part of it the grid asked for: every in-loop
evaluation (``eval_s``: val_loss, val_bpb, a task's metrics) and the
post-training evaluations (``post_eval_s``: decoding, extrapolation), as the
worker timed them; ``overhead_besides_evaluations`` is what is left, abl's own
cost (processes, imports, the token store, the store, FLOP counting, memory
tracking).

With ``cells`` > 1 the grid holds that many cells of the same shape (seeds
0..N-1, run one after another) and the figures are those of a cell in a
running grid: the time between one cell's end and the next one's (launching
its worker, its whole run, storing it) against its training steps. One-off
costs of an ``abl run`` (starting the worker zygote, building the token
store) and of a store (the first cell of a shape counts its FLOPs and tracks
its memory) fall on the first cell, and are reported as ``first_cell``.
Timings on a shared machine are noisy; compare runs made in one session, as
ratios.

``grid`` is the figure ``abl run`` ends with (abl.run.busy): the grid's wall
time from the first launch to the last end, the sum of its cells' training-step
time, and the device's busy share (NVML utilisation on CUDA where available;
otherwise the share of the wall time some cell was in its training loop, said
as such in ``grid["line"]``).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def default_grid(steps: int, cells: int = 1) -> dict[str, Any]:
    return {"experiment": {"name": "bench-harness", "seeds": list(range(cells))}, "train": {"steps": steps}}


def run_harness_bench(steps: int = 200, overrides: list[str] | None = None,
                      workdir: Path | None = None, cells: int = 1) -> dict[str, Any]:
    """Run the grid and return the split of a cell's wall time (seconds) and ``overhead``."""
    from rich.console import Console

    from ..contracts.plugin_manager import get_registry
    from ..grid.gridfile import expand
    from ..grid.parsing import apply_override, parse_overrides
    from ..run.executors import LocalExecutor
    from ..run.runner import run_grid
    from ..store import reader
    from ..store import rundir

    raw = default_grid(steps, cells)
    for path, value in parse_overrides(list(overrides or [])):
        apply_override(raw, path, value)
    registry = get_registry()
    grid = expand(raw, registry, source="abl bench harness")
    if len({c.cell_key for c in grid.cells}) != 1:
        raise ValueError(f"abl bench harness times one cell (and its seeds); the overrides give "
                         f"{len({c.cell_key for c in grid.cells})} cells")
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        from ..store.workspace import Workspace

        ws = Workspace.at(Path(tmp) / "bench.duckdb")  # a scratch store and its folders
        db, runs = ws.db, ws.runs
        t0 = time.perf_counter()
        engine = LocalExecutor(speed_pass="never")  # the grid's own figures: no speed pass after it
        engine.prestart()  # as abl run does: the zygote imports while the token store is built
        failed = run_grid(grid, registry, db, runs, executor=engine, console=Console(quiet=True))
        grid_wall = time.perf_counter() - t0
        if failed:
            raise RuntimeError("the benchmark cell did not complete")
        by_run = {r.run_id: [(step, name, value) for name, rows in r.curves.items() for step, value in rows]
                  for r in reader.read_runs(db, run_ids=[c.run_id for c in grid.cells], metrics=(),
                                            curves=("tokens_per_s", "elapsed_s", "wall_s", "compile_s",
                                                    "eval_s", "post_eval_s"))}
        ends = sorted((rundir.read_json(runs / c.run_id / rundir.STATUS)["finished"], c.run_id)
                      for c in grid.cells)
    first = _split(grid.cells[0], by_run[ends[0][1]], grid_wall - (ends[-1][0] - ends[0][0]))
    whole = engine.grid_figure or {}  # what abl run ends with (abl.run.busy): wall, steps' time, busy share
    if len(ends) == 1:
        return {**first, "grid": whole}
    steady = [_split(grid.cells[0], by_run[rid], end - prev_end)
              for (prev_end, _), (end, rid) in zip(ends, ends[1:])]
    out = {k: statistics.median(s[k] for s in steady) for k in first
           if isinstance(first[k], float) and all(isinstance(s.get(k), float) for s in steady)}
    out.update(cell=first["cell"], steps=first["steps"], untimed_steps=first["untimed_steps"],
               compile_s=first["compile_s"], cells=len(ends), grid_wall_s=grid_wall,
               overhead=1 - out["steps_s"] / out["cell_wall_s"], first_cell=first, grid=whole)
    return out


def _split(cell, rows, cell_wall: float) -> dict[str, Any]:
    """One cell's wall time (as the parent saw it) split by its own metric rows."""
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
    wall_s = next(iter(by.get("wall_s", {}).values()))  # the worker's train(); the rest is outside it
    evals_s = sum(by.get("eval_s", {}).values()) + sum(by.get("post_eval_s", {}).values())
    return {
        "cell": cell.label, "steps": n_steps, "cell_wall_s": cell_wall, "steps_s": steps_s,
        "loop_other_s": loop_s - steps_s, "before_loop_s": loop_start,
        "after_loop_s": wall_s - elapsed[max(elapsed)], "process_s": cell_wall - wall_s,
        "compile_s": next(iter(by.get("compile_s", {}).values()), None),
        "untimed_steps": untimed, "median_step_s": median_dt,
        "evaluations_s": evals_s,
        "overhead": 1 - steps_s / cell_wall,
        "overhead_besides_evaluations": 1 - (steps_s + evals_s) / cell_wall,
    }
