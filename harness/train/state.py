"""What one training run holds (``TrainingRun``, built by abl.train.loop.prepare), the sink its metrics go
to, and how a run ends early (``Diverged``): the types every room of abl.train shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..contracts.config import Cell
from ..contracts.precision import Precision
from ..contracts.registry import Registry
from ..data.corpus import Batches, TokenData
from ..data.tasks import Task
from ..kernels import KernelBackend
from ..model.decoder import DecoderLM
from ..model.shapecache import ShapeCache, StepTimes
from .ddp import Distributed


class Diverged(Exception):
    """The loss became non-finite or exceeded ``train.diverge_loss``."""


class MetricSink(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...



# ---------------------------------------------------------------- one run


@dataclass
class TrainingRun:
    """Everything one training run holds, built by ``prepare``."""

    cell: Cell
    registry: Registry
    dist: Distributed
    device: torch.device
    kernels: KernelBackend
    data: TokenData | Task
    precision: Precision
    core: DecoderLM  # the model itself
    model: torch.nn.Module  # what a training step calls: ``core``, or ``core`` wrapped for DDP
    optimizer: torch.optim.Optimizer
    batches: Batches
    baseline_rss_bytes: int
    shapes: ShapeCache = field(default_factory=lambda: ShapeCache(None, ""))
    # train.compile's payback: the shape's eager and compiled step times (abl.train.compiled.record_step_times)
    timings: StepTimes = field(default_factory=lambda: StepTimes(None, ""))
    compile_s: float | None = None  # this run's compile warm-up, when it compiled
    notes: list[str] = field(default_factory=list)
    share: dict[str, float] = field(default_factory=dict)  # LoopShare.metrics of the loop
    params: list[torch.nn.Parameter] = field(init=False)  # what the optimizer steps and grad clipping sees

    def __post_init__(self) -> None:
        self.params = [p for p in self.model.parameters() if p.requires_grad]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.batches.next_train()
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def synchronize(self) -> None:
        """Wait for the device, so a step's wall time is the step's."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
