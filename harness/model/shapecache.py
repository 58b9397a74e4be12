"""Per-store cache of what depends only on a model's shape: counted FLOPs, tracked memory.

Counting a training step's FLOPs (an extra forward and backward under torch's
FLOP counter) and tracking its live tensor memory (a step under torch's
MemTracker) give the same answer for every cell whose model, batch and
number format are the same: the seeds of a grid, or cells that differ only in
the learning rate or the data. The first such cell of a store measures and
writes ``shapes/<key>.json`` beside the database; the others read it and say so in
their ``info.json`` (``shape_cache``).

The key holds everything the figures depend on: the resolved model config
(vocabulary included), every component except the dataset, the per-process
batch, the number of processes, the kernel backend, ``train.compile``, the
device and the torch version.

The same folder keeps each shape's step times for ``train.compile``'s payback
(``StepTimes``, ``steps-<timing key>.json``: an eager cell's median step, a
compiled one's median step and ``compile_s``; docs/recorded.md).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .. import files
from ..contracts.config import Cell, config_hash, stored_model

NOT_SHAPE = ("dataset",)  # components that change the data, never the model's shape


def shape_key(cell: Cell, batch_per_rank: int, world: int, kernels: str, device: str, torch_version: str) -> str:
    return config_hash({
        # the recipe's name changes no shape (its settings are in the fields and components)
        "model": {k: v for k, v in stored_model(cell.model).items() if k != "recipe"},
        "components": {k: v for k, v in cell.components.items() if k not in NOT_SHAPE},
        "batch_per_rank": batch_per_rank, "context": cell.model.context, "world": world,
        "kernels": kernels, "compile": cell.train.compile, "device": device, "torch": torch_version,
    })


def _read_dict(path: Path | None) -> dict[str, Any]:
    """A cache file's JSON object; {} when there is none, or it is unreadable or not an object."""
    if path is None:
        return {}
    loaded = files.read_json(path, {})  # a FIFO or folder there never blocks the worker
    return loaded if isinstance(loaded, dict) else {}


class ShapeCache:
    """One shape's cached figures (``flops``: dict of cost rows; ``memory``: dict of memory rows)."""

    def __init__(self, root: Path | None, key: str):
        self.path = None if root is None else root / f"{key}.json"
        self.data: dict[str, Any] = _read_dict(self.path)
        self.reused: list[str] = []

    def has(self, part: str) -> bool:
        value = self.data.get(part)
        return isinstance(value, dict) and bool(value) and all(isinstance(v, (int, float)) for v in value.values())

    def get(self, part: str) -> dict[str, float] | None:
        if not self.has(part):
            return None
        self.reused.append(part)
        return {k: float(v) for k, v in self.data[part].items()}

    def put(self, part: str, values: dict[str, float]) -> None:
        if self.path is None or not values:
            return
        self.data[part] = values
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            files.write_json(self.path, self.data, indent=None)
        except OSError:  # a cache that cannot be written only costs time
            pass


# ``train.compile``'s payback (issue 27, 4): the step times of a shape's eager and compiled cells and
# its compile time, in ``shapes/steps-<timing key>.json``. The timing key is the shape key less
# ``train.compile`` and the device, so a compiled cell and its eager twin share one file; inside it the
# figures are kept per device string (a CPU's names its thread count: figures at another thread
# count are another machine's), each the latest uncontended cell's:
#   {"<device>": {"eager": {"step_s": s}, "compiled": {"step_s": s, "compile_s": s}}}
STEP_TIMES_PREFIX = "steps-"
MODES = {"eager": ("step_s",), "compiled": ("step_s", "compile_s")}


def timing_key(cell: Cell, batch_per_rank: int, world: int, kernels: str, torch_version: str,
               vocab_size: int | None = None) -> str:
    """``vocab_size``: the dataset's, for a cell whose ``model.vocab_size`` is still 0 (its worker fills it in)."""
    model = {k: v for k, v in stored_model(cell.model).items() if k != "recipe"}
    model["vocab_size"] = vocab_size or cell.model.vocab_size
    return config_hash({
        "model": model,
        "components": {k: v for k, v in cell.components.items() if k not in NOT_SHAPE},
        "batch_per_rank": batch_per_rank, "context": cell.model.context, "world": world,
        "kernels": kernels, "torch": torch_version,
    })


class StepTimes:
    """One shape's median step seconds, eager and compiled, and its compile seconds, per device."""

    def __init__(self, root: Path | None, key: str):
        self.path = None if root is None else root / f"{STEP_TIMES_PREFIX}{key}.json"
        self.data: dict[str, Any] = _read_dict(self.path)

    def devices(self) -> list[str]:
        return [d for d in self.data if isinstance(d, str)]

    def get(self, device: str, mode: str) -> dict[str, float] | None:
        """The figures of ``mode`` ("eager" or "compiled") on ``device``; None unless all are positive numbers."""
        entry = self.data.get(device)
        values = entry.get(mode) if isinstance(entry, dict) else None
        if not isinstance(values, dict):
            return None
        out = {}
        for name in MODES[mode]:
            v = values.get(name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                return None
            out[name] = float(v)
        return out

    def put(self, device: str, mode: str, values: dict[str, float]) -> None:
        if self.path is None:
            return
        # read again just before writing: a twin that finished meanwhile keeps its figures
        fresh = StepTimes(self.path.parent, self.path.name[len(STEP_TIMES_PREFIX):-len(".json")]).data
        entry = fresh.get(device)
        fresh[device] = {**(entry if isinstance(entry, dict) else {}), mode: {k: float(values[k]) for k in MODES[mode]}}
        self.data = fresh
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            files.write_json(self.path, self.data, indent=None)
        except OSError:  # a cache that cannot be written only loses a note
            pass


def payback_note(steps: int, eager_step_s: float, compiled_step_s: float, compile_s: float) -> str | None:
    """None when ``steps`` compiled steps save at least the compile time; else what it costs, what
    the steps save and how many steps would repay it."""
    per_step = eager_step_s - compiled_step_s
    speeds = f"{eager_step_s * 1e3:.3g} ms a step eager, {compiled_step_s * 1e3:.3g} ms compiled"
    if per_step <= 0:
        return (f"compiling costs {compile_s:.1f} s and its {steps} steps save nothing ({speeds}): "
                "no number of steps repays it")
    # rounded first: 30 s / (30 ms - 20 ms) is 3000 steps, not the 3001 of binary floating point
    needed = math.ceil(round(compile_s / per_step, 6))
    if steps >= needed:
        return None
    return (f"compiling costs {compile_s:.1f} s and its {steps} steps save {steps * per_step:.1f} s ({speeds}): "
            f"{needed} steps would repay it")
