"""How well a grid used the machine: its wall time, its cells' training-step time, the device's busy share.

``grid_figure`` is the line ``abl run`` ends with (and ``abl bench harness``
reports):

- ``wall_s``: from the first cell's launch to the last cell's end, as the
  parent saw them;
- ``steps_s``: the sum over the cells of their training steps' own wall time
  (each step's time is ``tokens_per_step / tokens_per_s`` as the trainer timed
  it; a step without a timing, the memory-tracked one, counts at the cell's
  median step), as ``abl bench harness`` splits a cell;
- ``busy``: on CUDA, the mean of NVML's GPU utilisation (the share of each
  sample period in which a kernel ran on the device, ``nvmlDeviceGetUtilizationRates``)
  sampled every ``SAMPLE_S`` while the cells ran, over the GPUs the grid
  used, where the NVML bindings (``nvidia-ml-py``) are installed; elsewhere
  (CPU, or no NVML) the share of the wall time in which at least one cell was
  in its training loop (each cell's loop placed on the clock from its run
  folder), which is said as such: it is not a device utilisation.
"""

from __future__ import annotations

import os
import statistics
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAMPLE_S = 0.5


class Sampler:
    """NVML's utilisation of some GPUs, sampled in a thread of the parent (which holds no CUDA context:
    NVML is not CUDA)."""

    def __init__(self, handles: list[Any], nvml: Any) -> None:
        self.handles, self.nvml = handles, nvml
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="abl-nvml", daemon=True)

    @classmethod
    def start(cls, gpus: list[int]) -> "Sampler | None":
        """A running sampler of the visible GPUs ``gpus``; None without NVML (not installed, no driver)."""
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            handles = [nvml_handle(pynvml, g) for g in gpus]
        except Exception:  # noqa: BLE001 - pynvml.NVMLError and its many subclasses: no figure
            return None
        sampler = cls(handles, pynvml)
        sampler._thread.start()
        return sampler

    def sample(self) -> None:
        for h in self.handles:
            try:
                self.samples.append(float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu) / 100.0)
            except Exception:  # noqa: BLE001 - a sample that cannot be read is left out
                continue

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * SAMPLE_S)
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass

    @property
    def busy(self) -> float | None:
        return statistics.fmean(self.samples) if self.samples else None


def nvml_handle(nvml: Any, visible_index: int) -> Any:
    """The NVML handle of the ``visible_index``-th GPU CUDA sees: NVML numbers every GPU of the machine,
    so an index into ``CUDA_VISIBLE_DEVICES`` (a number or a UUID) is mapped to it first."""
    vis = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible_index < len(vis):
        entry = vis[visible_index]
        if entry.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(entry))
        return nvml.nvmlDeviceGetHandleByUUID(entry)
    return nvml.nvmlDeviceGetHandleByIndex(visible_index)


# ---------------------------------------------------------------- the figure


def steps_seconds(rows: list[tuple[int, str, float]], tokens_per_step: int, steps: int) -> float | None:
    """A cell's training steps' own wall time from its metric rows (see the module docstring)."""
    dts = {int(s): tokens_per_step / v for s, n, v in rows if n == "tokens_per_s" and v and v > 0}
    if not dts:
        return None
    median = statistics.median(dts.values())
    untimed = sum(1 for s in range(1, steps + 1) if s not in dts)
    return sum(dts.values()) + median * untimed


def loop_interval(rows: list[tuple[int, str, float]], finished: float | None,
                  tokens_per_step: int) -> tuple[float, float] | None:
    """(start, end) on the clock of a cell's training loop: its end is the worker's finish time less what
    ``train`` did after the last step (``wall_s`` - the last ``elapsed_s``), its start that end less the
    loop's span (the elapsed time from the first step's end to the last's, plus the first step's own time,
    or the median step's when the first was not timed)."""
    elapsed = {int(s): v for s, n, v in rows if n == "elapsed_s"}
    wall = [v for _, n, v in rows if n == "wall_s"]
    if not elapsed or not wall or finished is None:
        return None
    last, first = max(elapsed), min(elapsed)
    end = float(finished) - max(0.0, wall[-1] - elapsed[last])
    dts = {int(s): tokens_per_step / v for s, n, v in rows if n == "tokens_per_s" and v and v > 0}
    first_dt = dts.get(first, statistics.median(dts.values()) if dts else 0.0)
    return end - (elapsed[last] - elapsed[first]) - first_dt, end


def covered(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] inside the union of ``intervals``."""
    total, reach = 0.0, start
    for a, b in sorted((max(a, start), min(b, end)) for a, b in intervals):
        if b <= reach:
            continue
        total += b - max(a, reach)
        reach = b
    return total


@dataclass
class GridFigure:
    cells: int
    wall_s: float
    steps_s: float
    busy: float | None
    busy_source: str  # "nvml" or "loop" (the share of the wall time some cell was in its loop)
    devices: str  # "cpu" or "N GPU(s)"
    packed: int  # the most cells that shared a GPU at once (1: none did)

    def line(self) -> str:
        busy = "busy: unknown"
        if self.busy is not None and self.busy_source == "nvml":
            busy = f"GPU busy {self.busy:.0%} (NVML utilisation, sampled every {SAMPLE_S:g} s over {self.devices})"
        elif self.busy is not None:
            where = "the CPU" if self.devices == "cpu" else f"{self.devices}, no NVML"
            busy = (f"cells training {self.busy:.0%} of the wall time (the share of it in which some cell was in "
                    f"its training loop, on {where}; not a device utilisation)")
        packed = f"; up to {self.packed} cells per GPU at once" if self.packed > 1 else ""
        return (f"whole grid done: {self.cells} cell(s) in {self.wall_s:.1f} s wall; their training steps "
                f"{self.steps_s:.1f} s in all ({self.steps_s / self.wall_s:.2f}x the wall time); {busy}{packed}"
                if self.wall_s > 0 else f"whole grid done: {self.cells} cell(s), no wall time")

    def as_dict(self) -> dict[str, Any]:
        return {"cells": self.cells, "grid_wall_s": self.wall_s, "grid_steps_s": self.steps_s,
                "busy_fraction": self.busy, "busy_source": self.busy_source, "devices": self.devices,
                "cells_per_gpu_max": self.packed}


def grid_figure(jobs: list[Any], executor: Any) -> GridFigure | None:
    """The figure of the jobs an executor ran (None when none started). Reads each job's run folder."""
    from ..store import rundir

    started = [j for j in jobs if j.handle is not None]
    if not started:
        return None
    import time

    t0 = min(j.started for j in started)
    t1 = max((j.ended or time.time()) for j in started)
    steps_total, intervals = 0.0, []
    for j in started:
        rows = rundir.read_metrics(Path(j.run_dir) / rundir.METRICS)
        s = steps_seconds(rows, j.cell.train.batch_size * j.cell.model.context, j.cell.train.steps)
        steps_total += s or 0.0
        st = rundir.read_status(Path(j.run_dir)) or {}
        iv = loop_interval(rows, st.get("finished"), j.cell.train.batch_size * j.cell.model.context)
        if iv is not None:
            intervals.append(iv)
    wall = max(0.0, t1 - t0)
    sampler = getattr(executor, "sampler", None)
    use_gpus = bool(getattr(executor, "use_gpus", False))
    gpus = len(getattr(executor, "gpus", []) or [])
    devices = f"{gpus} GPU(s)" if use_gpus else "cpu"
    if sampler is not None and sampler.busy is not None:
        busy, source = sampler.busy, "nvml"
    else:
        busy, source = (covered(intervals, t0, t1) / wall if wall > 0 and intervals else None), "loop"
    return GridFigure(cells=len(started), wall_s=wall, steps_s=steps_total, busy=busy, busy_source=source,
                      devices=devices, packed=max((j.packed for j in started), default=1))
