"""``train.compile``: the training forward through ``torch.compile``, compiled before the first timed step."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..contracts.config import Cell
from ..model.decoder import DecoderLM, ForwardContext
from ..contracts.registry import Registry
from ..model.shapecache import STEP_TIMES_PREFIX, StepTimes, payback_note, timing_key

if TYPE_CHECKING:
    from .train import TrainingRun


class Compiled(torch.nn.Module):
    """``train.compile``: the training forward (model and loss) through ``torch.compile``.

    The model's kernel backend is activated outside the compiled region, and the
    backend queries (``abl.kernels.active`` / ``use_triton``) are constants to
    dynamo: a cell's backend is fixed for its whole run. Evaluation, decoding
    and FLOP counting call the eager model.
    """

    def __init__(self, core: DecoderLM):
        super().__init__()
        from abl import kernels

        for query in (kernels.active, kernels.use_triton):
            torch.compiler.assume_constant_result(query)
        self.core = core
        self.compiled = torch.compile(core._forward)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, ctx: ForwardContext | None = None):
        with self.core.kernel_backend.activate():
            return self.compiled(idx, targets, ctx)


def compile_warmup(run: TrainingRun) -> float:
    """Compile before the first timed step: one forward and backward on a validation
    batch, after which the model, its gradients and every RNG are as they were.
    Returns the seconds it took (``compile_s``)."""
    import random

    import numpy as np

    t0 = time.perf_counter()
    saved_model = {k: v.detach().clone() for k, v in run.core.state_dict().items()}
    saved_precision = run.precision.state_dict()
    rng = (torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
           np.random.get_state(), random.getstate())
    x, y = next(iter(run.batches.val_batches(1)))
    x, y = x[: run.batches.batch_size].to(run.device), y[: run.batches.batch_size].to(run.device)
    ctx = ForwardContext(position=run.core.position, need_logits=False)
    with run.precision.autocast(run.device):
        _, loss, _ = run.model(x, y, ctx)
    loss.backward()
    run.optimizer.zero_grad(set_to_none=True)
    run.core.load_state_dict(saved_model)
    run.precision.load_state_dict(saved_precision)
    torch.set_rng_state(rng[0])
    if rng[1] is not None:
        torch.cuda.set_rng_state_all(rng[1])
    np.random.set_state(rng[2])
    random.setstate(rng[3])
    run.synchronize()
    return time.perf_counter() - t0



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


def record_step_times(run: TrainingRun, step_times: list[float], compile_s: float | None) -> str | None:
    """After the loop: the median step time of this cell (and its compile time, compiled) in its
    shape's entry, unless its steps shared the machine; for a compiled cell whose eager twin's step
    time is known on this device, the payback note when its steps did not repay the compile."""
    import statistics

    from ..analysis import health
    from ..store.provenance import device_name

    if not step_times or health.contended(run.share.get("load_per_core"), run.share.get("cpu_util"),
                                          on_cpu=run.device.type == "cpu"):
        return None  # a busy machine's step times would mislead every later cell of this shape
    device, step_s = device_name(run.device), statistics.median(step_times)
    if not run.cell.train.compile:
        run.timings.put(device, "eager", {"step_s": step_s})
        return None
    if compile_s is None:  # resumed after its last step: it compiled nothing
        return None
    run.timings.put(device, "compiled", {"step_s": step_s, "compile_s": compile_s})
    eager = run.timings.get(device, "eager")
    if eager is None:
        return None
    note = payback_note(len(step_times), eager["step_s"], step_s, compile_s)
    return f"{note} (eager: an earlier cell of this shape on {device})" if note else None
