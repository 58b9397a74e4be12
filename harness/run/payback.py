"""Before a grid runs: whether its compiled cells can repay their compile time (``train.compile``), from the
step times earlier cells of their shapes measured (abl.train.compiled.record_step_times writes them), and
the device a cell that has not started will record."""

from __future__ import annotations

from pathlib import Path

import torch

from ..contracts.config import Cell
from ..contracts.registry import Registry
from ..model.shapecache import STEP_TIMES_PREFIX, StepTimes, payback_note, timing_key


def on_gpu(cell: Cell, use_gpus: bool | None) -> bool:
    """Whether ``cell`` will train on a GPU (``use_gpus``: whether the executor gives GPUs; None: whether
    torch sees one)."""
    return cell.train.device == "cuda" or (
        cell.train.device == "auto" and (torch.cuda.is_available() if use_gpus is None else use_gpus))


def expected_device(cell: Cell, use_gpus: bool | None, slots: int) -> str | None:
    """The device string a cell that has not started will record (abl.store.provenance.device_name):
    on a CPU, with the threads abl.run.threads would give it now (train.threads, OMP_NUM_THREADS,
    else the rule). None on a GPU: its name is known to the worker only (the parent starts no CUDA)."""
    from . import threads
    from ..store.provenance import cpu_name

    if on_gpu(cell, use_gpus):
        return None
    n, _ = threads.for_cell(cell.train.threads, slots)
    return cpu_name(n if n is not None else torch.get_num_threads())


def timings_for(cell: Cell, registry: Registry, shapes_dir: Path | None, gpu: bool) -> StepTimes:
    """The step-time entry of ``cell``'s shape (one process: train.compile runs on one)."""
    from ..kernels import resolve
    from ..model.costmodel import dataset_vocab_size

    name = cell.train.kernels if cell.train.kernels != "auto" else resolve("auto", "cuda" if gpu else "cpu").name
    return StepTimes(shapes_dir, timing_key(cell, cell.train.batch_size, 1, name, torch.__version__,
                                            vocab_size=dataset_vocab_size(cell, registry)))


def planned_payback_notes(cells: list[Cell], registry: Registry, shapes_dir: Path | None, use_gpus: bool | None = None,
                          slots: int = 1) -> list[str]:
    """Before a grid runs: one note per compiled cell whose steps cannot repay its compile time, from
    the figures its shape's earlier cells measured (abl.model.shapecache.StepTimes). A cell whose
    shape has no eager or no compiled figure yet on this device gives no note: it is measured as it
    runs, and the compiled cell's own summary says so when its eager twin's figure exists by then."""
    notes: list[str] = []
    seen: set[str] = set()
    if shapes_dir is None or not any(shapes_dir.glob(f"{STEP_TIMES_PREFIX}*.json")):
        return notes  # nothing measured yet (and no dataset loaded for its vocabulary)
    for cell in cells:
        if not cell.train.compile or cell.cell_key in seen:
            continue
        seen.add(cell.cell_key)
        timings = timings_for(cell, registry, shapes_dir, on_gpu(cell, use_gpus))
        device = expected_device(cell, use_gpus, slots)
        if device is None:  # a GPU: the one GPU name with both figures, if exactly one has them
            both = [d for d in timings.devices() if not d.startswith("cpu")
                    and timings.get(d, "eager") and timings.get(d, "compiled")]
            device = both[0] if len(both) == 1 else None
        eager = timings.get(device, "eager") if device else None
        compiled = timings.get(device, "compiled") if device else None
        if eager is None or compiled is None:
            continue
        note = payback_note(cell.train.steps, eager["step_s"], compiled["step_s"], compiled["compile_s"])
        if note:
            notes.append(f"{cell.label}: {note} (measured on {device} by earlier cells of this shape)")
    return notes
