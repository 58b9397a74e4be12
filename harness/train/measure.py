"""What a training run measures about itself: costs, memory, the machine's share, MFU.

At step 0 the FLOPs of one training step (counted by torch) and the cost
model's predictions; on the tracked step the tensor memory's peak and parts;
over the loop the CPU share and load it got (``LoopShare``); at the end the
peak memory and the model FLOPs utilisation (MFU: useful FLOPs per second over
the device peak, Chowdhery et al. 2022, "PaLM", arXiv:2204.02311, section 4.1 and appendix B).
"""

from __future__ import annotations

import os
import resource
import sys
import time

import torch

from ..contracts.config import Cell
from ..contracts.precision import Precision
from ..contracts.registry import Registry
from ..data.corpus import Batches
from ..model.decoder import DecoderLM, ForwardContext
from ..model.memory import StepMemory
from .state import TrainingRun


def cpu_peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def peak_mem_bytes(device: torch.device) -> int:
    """CUDA's peak allocated bytes, or on CPU the process's peak resident set (docs/recorded.md)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return cpu_peak_rss_bytes()


def mfu_peak(device: torch.device, precision: Precision, world: int) -> float | None:
    """The peak FLOP/s MFU divides by: the device's, in the format the policy's matmuls
    run in (after ``precision.setup``), times the processes of the cell; None if unknown."""
    from ..store.provenance import peak_flops

    peak = peak_flops(device, precision.peak_format())
    return float(peak * world) if peak else None


def measure_costs(core: DecoderLM, cell: Cell, registry: Registry, batches: Batches, precision: Precision,
                  device: torch.device, world: int, counted: float | None = None) -> dict[str, float]:
    """FLOPs of one training step counted by torch (on a validation batch, so the
    training data order is untouched; ``counted``: the count of an identical
    shape, abl.model.shapecache), the device peak used for MFU, and the cost model's
    predictions. A ``_note`` entry says why predictions are missing."""
    from ..model.flops import count_step_flops

    if counted is None:
        x, y = next(iter(batches.val_batches(1)))
        x, y = x.to(device), y.to(device)
        measured = count_step_flops(core, x, y, lambda: ForwardContext(position=core.position, need_logits=False),
                                    lambda: precision.autocast(device))
        counted = float(measured * world)
    out: dict[str, float] = {"flops_per_step_measured": counted}
    peak = mfu_peak(device, precision, world)
    if peak is not None:
        out["device_peak_flops"] = peak
    from ..contracts.registry import RegistryError
    from ..model.costmodel import predict

    try:
        pred = predict(cell, registry, vocab_size=cell.model.vocab_size)
    except RegistryError as exc:  # a component without a cost model: MFU from the counted FLOPs, and say so
        out["useful_flops_per_step"] = counted
        out["_note"] = (f"no cost prediction ({exc}); MFU uses the FLOPs counted by torch as useful "  # type: ignore[assignment]
                        "FLOPs (as executed, recomputation included)")
        return out
    out["flops_per_step_predicted"] = float(pred["flops_per_step"])
    out["useful_flops_per_step"] = float(pred["useful_flops_per_step"])
    out["n_params_predicted"] = float(pred["n_params"])
    return out


def mfu_costs(run: TrainingRun) -> dict[str, float]:
    """useful_flops_per_step and device_peak_flops, as ``measure_costs`` gives them, without the flop count."""
    from ..contracts.registry import RegistryError
    from ..model.costmodel import predict

    out: dict[str, float] = {}
    peak = mfu_peak(run.device, run.precision, run.dist.world)
    if peak is not None:
        out["device_peak_flops"] = peak
    try:
        out["useful_flops_per_step"] = float(predict(run.cell, run.registry, vocab_size=run.cell.model.vocab_size)
                                             ["useful_flops_per_step"])
    except RegistryError:
        counted = run.shapes.data.get("flops") if run.shapes.has("flops") else None  # read, not "reused"
        if counted and counted.get("flops_per_step_measured"):  # as measure_costs: the counted FLOPs
            out["useful_flops_per_step"] = float(counted["flops_per_step_measured"])
    return out


def mfu(costs: dict[str, float], step_times: list[float]) -> float | None:
    """Model FLOPs utilisation: variant-aware useful FLOPs per step over the median step
    time, over the device peak. None without a prediction, a device peak or a timed step."""
    useful, peak = costs.get("useful_flops_per_step"), costs.get("device_peak_flops")
    if not (useful and peak and step_times):
        return None
    median_dt = sorted(step_times)[len(step_times) // 2]
    return useful / median_dt / peak


def memory_metrics(mem: StepMemory | None, notes: list[str]) -> dict[str, float]:
    """peak_tensor_bytes and its non-zero parts; a note when the tracker could not run."""
    if mem is None:
        return {}
    if mem.peak is None:
        if mem.why:
            notes.append(mem.why)
        return {}
    return {"peak_tensor_bytes": mem.peak,
            **{f"peak_tensor_{k}_bytes": v for k, v in mem.breakdown.items() if v}}


class LoopShare:
    """What the machine gave the training loop: CPU seconds per thread-second, and the load."""

    def __init__(self) -> None:
        self.threads = max(1, torch.get_num_threads())
        self.loads: list[float] = []
        self.t0, self.cpu0 = time.perf_counter(), time.process_time()
        self.sample()

    def sample(self) -> None:
        try:
            self.loads.append(float(os.getloadavg()[0]))
        except (OSError, AttributeError):  # no load average on this platform
            pass

    def metrics(self) -> dict[str, float]:
        """``cpu_util`` and ``load_per_core`` of the loop so far (the end's load sampled now)."""
        self.sample()
        wall, cpu = time.perf_counter() - self.t0, time.process_time() - self.cpu0
        out: dict[str, float] = {}
        if wall > 0:
            out["cpu_util"] = cpu / (wall * self.threads)
        if self.loads:
            out["load_per_core"] = sum(self.loads) / len(self.loads) / (os.cpu_count() or 1)
        return out

