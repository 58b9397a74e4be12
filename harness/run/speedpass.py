"""Speed measured alone: packed cells' speed is marked contended, and each of their shapes is timed alone.

Loss figures do not depend on how many cells share a device; speed figures
do. So (issue 37, item 3):

- a cell that shared its GPU with another cell of the grid (the local
  executor's ``Job.packed`` > 1) gets ``contended`` = 1 and ``packed_cells``
  (the most cells on its GPU at once) appended to its run folder's metrics
  before the parent stores it (``mark_packed``): its speed figures are shown
  as contended, as those of a run on a busy CPU are (abl.analysis.health);
- after the grid, a **speed pass** times each distinct shape of the
  completed cells that shared a GPU (``--speed-pass auto``), or of every
  completed cell (``always``), alone on the device (on CUDA a GPU whose
  free memory after the grid holds the shape's predicted need alone, as
  placement judges it: ``gpus_for``; a shape no GPU holds is not timed, and
  the pass says so): one child process per shape trains the cell's configuration for ``WARMUP_STEPS`` untimed
  steps and ``TIMED_STEPS`` timed ones (no evaluations, no checkpoint, no
  run folder written), and its median step gives ``alone_tokens_per_s`` and
  ``alone_mfu`` (useful FLOPs per step over the median step time over the
  device peak, as abl.train.measure.mfu). They are stored in the store's
  ``speed_pass`` table, one row per run of the shape
  (abl.store.database.store_speed_pass), and abl.store.reader gives them as
  those two metrics of every run of the shape, so the summary, ``abl
  compare``, the report and the dashboard show them beside the packed
  figures. The pass never touches a run's own metrics: its loss figures stay
  what the packed run recorded.

A shape is what fixes a step's speed: the model's fields and components, the
batch, the context, the processes, the kernels, ``train.compile``, the
precision and the device (``speed_shape``; the cost model's shape key,
abl.model.shapecache.shape_key, plus the precision and the whole batch).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..contracts.config import Cell, config_hash, stored_model
from ..store import rundir

WARMUP_STEPS = 5  # untimed: allocator, autotuning, kernel caches (a compiled cell compiles before them)
TIMED_STEPS = 20
TIMEOUT_S = 600  # a shape whose pass takes longer is left without figures, said so
MODES = ("auto", "always", "never")
CONTENDED = "contended"  # abl.analysis.sections.CONTENDED, spelt here so the worker side needs no analysis import


def mark_packed(run_dir: Path, cells: int) -> None:
    """Append ``packed_cells`` and ``contended`` = 1 at the run's last step (its worker has ended)."""
    path = Path(run_dir) / rundir.METRICS
    rows = rundir.read_metrics(path)
    if not rows:
        return
    last = max(step for step, _, _ in rows)
    try:
        with open(path, "a") as f:
            f.write(json.dumps({"step": last, "packed_cells": float(cells), CONTENDED: 1.0}) + "\n")
    except OSError:
        pass  # a folder that cannot be written keeps its figures unmarked; the store still ingests it


def speed_shape(cell: Cell) -> str:
    """What fixes a step's speed (the module docstring); seeds and data order do not."""
    return config_hash({
        "model": {k: v for k, v in stored_model(cell.model).items() if k != "recipe"},
        "components": cell.components, "batch_size": cell.train.batch_size, "context": cell.model.context,
        "devices": cell.train.devices, "kernels": cell.train.kernels, "compile": cell.train.compile,
        "precision": cell.train.precision, "device": cell.train.device,
    })


def shapes_to_time(jobs: list[Any], mode: str) -> dict[str, list[Any]]:
    """speed shape -> the completed jobs of it, for the shapes the pass times under ``mode``: ``auto`` the
    shapes with a completed cell that shared its GPU (``Job.packed`` > 1; a busy CPU stays busy for the pass,
    so contention on the CPU alone never starts one), ``always`` every shape, ``never`` none. Cells of
    several processes (``train.devices`` > 1) are never timed: the pass trains in one process."""
    from ..contracts.status import COMPLETED

    if mode == "never":
        return {}
    done = [j for j in jobs  # one process per cell: a multi-device cell's DDP step is not one process's
            if j.handle is not None and j.cell.train.devices <= 1
            and (rundir.read_status(j.run_dir) or {}).get("status") == COMPLETED]
    by_shape: dict[str, list[Any]] = {}
    for j in done:
        by_shape.setdefault(speed_shape(j.cell), []).append(j)
    if mode == "always":
        return by_shape
    return {k: js for k, js in by_shape.items() if any(j.packed > 1 for j in js)}


def child_env(executor: Any, cell: Cell, gpus: list[int] | None = None) -> dict[str, str]:
    """The environment of a shape's timing child: its GPUs (``gpus``, from ``gpus_for``; None: the first the
    executor has) or, on the CPU, the threads a cell alone on this machine gets (abl.run.threads)."""
    from . import threads

    env = dict(os.environ)
    if getattr(executor, "use_gpus", False):
        gpus = gpus or list(getattr(executor, "gpus", []) or [0])[:max(1, cell.train.devices)]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    else:
        env.setdefault("TRITON_INTERPRET", "1")
        n, _ = threads.for_cell(cell.train.threads, 1)
        if n is not None:
            env["OMP_NUM_THREADS"] = str(n)
    return env


def free_now(executor: Any) -> dict[int, int] | None:
    """Each of the executor's GPUs' free bytes after the grid (asked in a child process,
    abl.run.admission.gpu_free_bytes), else the figures its placement had from before the grid; None when
    neither is known."""
    from . import admission

    return admission.gpu_free_bytes(list(executor.gpus)) or getattr(executor.placement, "free", None)


def gpus_for(executor: Any, cell: Cell, free: Any) -> tuple[list[int] | None, str]:
    """The GPUs a shape's timing child gets, and why none when it gets none: ``train.devices`` of the
    executor's GPUs whose free memory (``free``: a callable giving ``free_now``'s figures, asked at most once)
    holds the cell's need alone, by placement's rule (abl.run.admission.Placement.fits_alone), the most free
    memory first. Its first GPUs, as before, when its need or the free memory is unknown (nothing to judge
    by); (None, why) when no such GPUs exist now."""
    from .admission import Placement, fmt

    gpus, k = list(getattr(executor, "gpus", []) or [0]), max(1, cell.train.devices)
    placement = getattr(executor, "placement", None)
    need = placement.need(cell.run_id) if placement is not None else None
    figures = free() if need is not None else None
    if need is None or not figures:
        return gpus[:k], ""
    alone = Placement(gpus, free=figures, needs={cell.run_id: need})
    ok = sorted((g for g in gpus if alone.fits_alone(g, cell.run_id)), key=lambda g: (-figures.get(g, 0), g))
    if len(ok) >= k:
        return sorted(ok[:k]), ""
    where = ", ".join(f"GPU {g}: {fmt(figures.get(g, 0))}" for g in gpus)
    what = "no GPU's free memory holds it alone" if k == 1 else f"no {k} GPUs' free memory each hold a process"
    return None, (f"{what}: it needs {fmt(need)} per process (its predicted peak, as placement counts it), "
                  f"free now {where}")


def time_shape(run_dir: Path, env: dict[str, str], timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    """Time the cell of ``run_dir`` alone in a child process: its figures, or ``{"error": why}``."""
    from ..pyexec import child_env as clean_env
    from ..pyexec import python

    import tempfile

    with tempfile.TemporaryDirectory(prefix="abl-speedpass-") as tmp:  # the run folder is left as it is
        out = Path(tmp) / "speedpass.json"
        try:
            proc = subprocess.run(python("-m", "abl.run.speedpass", str(run_dir), str(out)), capture_output=True,
                                  text=True, timeout=timeout_s, stdin=subprocess.DEVNULL, env=clean_env(env))
        except subprocess.TimeoutExpired:
            return {"error": f"did not finish within {timeout_s:.0f} s"}
        except OSError as exc:
            return {"error": str(exc)}
        result = rundir.read_json(out, None)
    if proc.returncode != 0 or not isinstance(result, dict):
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()
        return {"error": tail[-1] if tail else f"exit status {proc.returncode}"}
    return result


def run_speed_pass(jobs: list[Any], executor: Any, db_path: Path, console: Any = None) -> list[str]:
    """Time each shape ``executor.speed_pass`` asks for, store the figures, and return the lines to print."""
    from ..store import database as store

    mode = getattr(executor, "speed_pass", "auto")
    if not getattr(executor, "local", False) or mode not in MODES:
        return []
    todo = shapes_to_time(jobs, mode)
    if not todo:
        return []
    from ..analysis.metrics import MEASURED_ALONE, metric

    shown = " and ".join(metric(m).label for m in MEASURED_ALONE)
    lines: list[str] = []
    rows: list[list[Any]] = []
    why = "asked for (--speed-pass always)" if mode == "always" else "its cells shared a GPU"
    known: list[dict[int, int] | None] = []  # the GPUs' free memory, asked once for the whole pass

    def free() -> dict[int, int] | None:
        if not known:
            known.append(free_now(executor))
        return known[0]

    for shape, js in todo.items():
        first = js[0]
        gpus, none = gpus_for(executor, first.cell, free) if getattr(executor, "use_gpus", False) else (None, "")
        if gpus is None and none:  # it would run out of memory, or push another job out of its GPU
            lines.append(f"speed pass: {first.cell.label}: no figures ({none})")
            continue
        if console is not None:
            console.print(f"speed pass: timing {first.cell.label} alone ({WARMUP_STEPS} + {TIMED_STEPS} steps) ...",
                          soft_wrap=True, markup=False)
        result = time_shape(first.run_dir, child_env(executor, first.cell, gpus))
        if "error" in result:
            lines.append(f"speed pass: {first.cell.label}: no figures ({result['error']})")
            continue
        if result.get("contended"):  # the pass itself shared the machine: its figures would not be "alone"
            lines.append(f"speed pass: {first.cell.label}: no figures (the machine was busy during the pass: "
                         f"{result['contended']})")
            continue
        created = time.time()
        for j in js:
            rows.append([j.cell.run_id, shape, first.cell.run_id, result.get("tokens_per_s"), result.get("mfu"),
                         int(result.get("warmup_steps", WARMUP_STEPS)), int(result.get("timed_steps", 0)),
                         result.get("device"), created, why])
        mfu = f", MFU {result['mfu']:.1%}" if result.get("mfu") is not None else ""
        lines.append(f"speed pass: {first.cell.label}: {result['tokens_per_s']:,.0f} tokens/s{mfu} alone on "
                     f"{result.get('device')} (median of {result.get('timed_steps')} steps after "
                     f"{result.get('warmup_steps')}); shown as {shown} for its {len(js)} run(s)")
    store.store_speed_pass(db_path, rows)
    return lines


def after_grid(executor: Any, jobs: list[Any], db_path: Path, console: Any) -> dict[str, Any] | None:
    """What ``abl run`` prints once its cells have ended: the whole grid's figure (abl.run.busy, kept as the
    executor's ``grid_figure`` too), then the speed pass's lines. Returns the figure as a dict (None when no
    cell started)."""
    from .busy import grid_figure

    figure = grid_figure(jobs, executor)
    if figure is not None:
        console.print(figure.line(), soft_wrap=True, markup=False)
        executor.grid_figure = {**figure.as_dict(), "line": figure.line()}
    for line in run_speed_pass(jobs, executor, db_path, console):
        console.print(line, soft_wrap=True, markup=False)
    return executor.grid_figure if figure is not None else None


# ---------------------------------------------------------------- the timing child


def measure(run_dir: Path) -> dict[str, Any]:
    """Train the cell of ``run_dir`` for WARMUP_STEPS + TIMED_STEPS steps, writing nothing there, and return
    its median timed step's figures."""
    import dataclasses

    from ..contracts.config import cell_from_config
    from ..contracts.plugin_manager import get_registry
    from ..data.tokenstore import bind
    from ..train.loop import begin, prepare, train_loop
    from ..train.measure import mfu
    from ..store.workspace import Workspace
    from .worker import prepare_kernels

    bind(run_dir)
    prepare_kernels(run_dir)
    registry = get_registry()
    cell = cell_from_config(json.loads((run_dir / rundir.CONFIG).read_text()), registry)
    steps = WARMUP_STEPS + TIMED_STEPS
    cell = dataclasses.replace(cell, train=dataclasses.replace(
        cell.train, steps=steps, eval_every=steps, eval_batches=1, checkpoint_every=0))
    ws = Workspace.of_run_dir(run_dir)  # the store's shapes folder: FLOP counts measured before, as the worker
    run = prepare(cell, registry, ws.shapes if ws is not None else None)
    try:
        sink = rundir.NullSink()
        _, costs = begin(run, sink, None)
        times = train_loop(run, sink, 1, time.perf_counter(), None)
    finally:
        run.dist.close()
    from ..analysis import health

    timed = times[WARMUP_STEPS:] if len(times) > WARMUP_STEPS else times
    share = run.share  # what the machine gave the loop (abl.train.measure.LoopShare), as a cell's is judged
    busy = health.contended(share.get("load_per_core"), share.get("cpu_util"), run.device.type == "cpu")
    contended = (f"load {share.get('load_per_core', float('nan')):.2f} per core, "
                 f"{share.get('cpu_util', float('nan')):.0%} of its threads' CPU time") if busy else ""
    median = statistics.median(timed)
    device = str(run.device)
    if run.device.type == "cuda":
        import torch

        device = f"{device} ({torch.cuda.get_device_name(run.device)})"
    return {"tokens_per_s": cell.train.batch_size * cell.model.context / median, "mfu": mfu(costs, timed),
            "warmup_steps": len(times) - len(timed), "timed_steps": len(timed), "device": device,
            "contended": contended}


def main() -> None:
    if len(sys.argv) != 3:
        print("usage: python -m abl.run.speedpass RUN_DIR OUT_JSON", file=sys.stderr)
        sys.exit(2)
    result = measure(Path(sys.argv[1]))
    rundir.write_json(Path(sys.argv[2]), result)


if __name__ == "__main__":
    main()
