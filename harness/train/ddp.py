"""One cell over several processes: DistributedDataParallel bookkeeping (a no-op with one process)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch


class Distributed:
    """DDP bookkeeping for a cell spanning several processes (torchrun sets WORLD_SIZE).

    One process per GPU with NCCL on CUDA, gloo on CPU. ``train.batch_size`` is
    the global batch: each rank draws ``batch_size / world`` sequences from its
    own seeded stream. Validation scores the same windows as one process would
    (abl.train.loop.evaluate: each rank scores a share and the sums are
    all-reduced); only rank 0 runs the post-training evaluations, logs and
    checkpoints. With one process every method is a no-op.
    """

    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.enabled = self.world > 1
        self.is_main = self.rank == 0

    def setup(self, device: torch.device) -> torch.device:
        if not self.enabled:
            return device
        import torch.distributed as dist

        if device.type == "cuda":
            device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        return device

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        if not self.enabled:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    def mean(self, value: float, device: torch.device) -> float:
        if not self.enabled:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return float(t.item()) / self.world

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``t`` over the processes (``t`` itself with one)."""
        if not self.enabled:
            return t
        import torch.distributed as dist

        dist.all_reduce(t)
        return t

    def gather(self, obj: Any) -> list[Any]:
        if not self.enabled:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.enabled:
            import torch.distributed as dist

            # gloo's worker thread frees each finished collective (and its tensors) after the
            # collective returned; a tensor made in Python needs the GIL for that. The group's
            # destructor, run when the DDP model is dropped after this, joins that thread while
            # holding the GIL: were the thread still waiting for it, the rank would hang at exit
            # (seen under load, py-spy on the stuck rank). Sleeping gives the thread the GIL first.
            time.sleep(0.25)
            dist.destroy_process_group()

