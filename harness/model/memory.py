"""Peak live tensor bytes of one training step, the same way on every device.

``peak_mem_bytes`` is what the device reports: CUDA's peak allocated bytes,
or on CPU the process's peak resident set, which also holds the interpreter,
the libraries, allocator slack and everything allocated before training. It
cannot be compared with a prediction of tensor memory, so each run also
records ``peak_tensor_bytes``: the largest total size of live tensor storages
during one whole training step (forward, backward, optimizer step), counted by
torch's ``MemTracker`` dispatch mode. Parameters, gradients, optimizer state,
saved activations and temporaries all count; storages shared by views count
once. This is what ``abl.model.costmodel``'s ``train_peak_bytes`` predicts.
"""

from __future__ import annotations

import contextlib
from typing import Any


class StepMemory:
    """Context manager around one training step; ``peak`` (bytes, or None) after it.

    ``externals`` are objects created before the step whose tensors must count
    (the model, the optimizer, the batch). When torch's tracker is unavailable
    (a build without torch.distributed), ``peak`` stays None and ``why`` says so.
    """

    def __init__(self, *externals: Any):
        self.externals = externals
        self.peak: int | None = None
        self.breakdown: dict[str, int] = {}
        self.why: str | None = None
        self._tracker: Any = None  # torch's MemTracker once entered (an optional import)

    def __enter__(self):
        try:
            from torch.distributed._tools.mem_tracker import MemTracker
        except Exception as exc:  # noqa: BLE001 - an optional measurement
            self.why = f"peak_tensor_bytes not measured: torch's MemTracker is unavailable ({exc!r})"
            return self
        self._tracker = MemTracker()
        self._tracker.track_external(*self.externals)
        self._tracker.__enter__()
        return self

    def __exit__(self, *exc):
        if self._tracker is None:
            return False
        self._tracker.__exit__(*exc)
        snapshot = self._tracker.get_tracker_snapshot("peak")
        total = 0
        parts: dict[str, int] = {}
        for per_device in snapshot.values():
            for key, value in per_device.items():
                name = getattr(key, "value", key)
                if name == "Total":
                    total += int(value)
                else:
                    parts[str(name).lower()] = parts.get(str(name).lower(), 0) + int(value)
        self.peak, self.breakdown = total, parts
        return False


def step_memory(enabled: bool, *externals: Any):
    """``StepMemory(*externals)`` when enabled, else a context that measures nothing."""
    return StepMemory(*externals) if enabled else contextlib.nullcontext()
