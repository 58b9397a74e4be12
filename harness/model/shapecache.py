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
"""

from __future__ import annotations

import json
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


class ShapeCache:
    """One shape's cached figures (``flops``: dict of cost rows; ``memory``: dict of memory rows)."""

    def __init__(self, root: Path | None, key: str):
        self.path = None if root is None else root / f"{key}.json"
        self.data: dict[str, Any] = {}
        if self.path is not None:
            try:
                loaded = json.loads(self.path.read_text())
                self.data = loaded if isinstance(loaded, dict) else {}
            except (OSError, ValueError):
                self.data = {}
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
