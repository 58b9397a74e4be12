"""One training run: data, model, AdamW, warm-up + cosine schedule, precision, eval, metrics.

Metrics go to a ``MetricSink`` (in the worker: an append-only JSONL file that
is flushed as each line is written); the trainer never touches the database.

Recorded names:
- every step: train_loss, lr, grad_norm, tokens_per_s, elapsed_s (+ any a
  component or the precision policy adds);
- every evaluation: val_loss;
- once: n_params, n_params_non_embedding, peak_mem_bytes, wall_s.
"""

from __future__ import annotations

import contextlib
import math
import platform
import resource
import sys
import time
from typing import Any, Callable, Protocol

import torch

from .config import Cell
from .data import Batches, TokenData
from .kernels import set_backend as set_kernel_backend
from .model import DecoderLM, ForwardContext
from .registry import Registry


class Diverged(Exception):
    """The loss became non-finite or exceeded ``train.diverge_loss``."""


class Precision:
    """Base class of precision policies (the ``precision`` axis).

    Subclasses override what differs: ``autocast`` for mixed precision,
    ``backward``/``step`` for loss scaling, ``setup`` to swap modules (fp8).
    ``emulated`` must be True when a feature runs as an emulation (e.g. fp8 on
    a device without fp8 matmuls); ``info()`` is stored with the run.
    """

    name = "base"
    emulated = False

    def setup(self, model: torch.nn.Module, device: torch.device) -> None:
        """Called once after the model is on its device, before the optimizer exists."""

    def autocast(self, device: torch.device):
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, optimizer, params, grad_clip: float) -> dict[str, Any]:
        """Clip, step, and return step metrics (at least grad_norm)."""
        max_norm = grad_clip if grad_clip > 0 else float("inf")
        gn = torch.nn.utils.clip_grad_norm_(params, max_norm)
        optimizer.step()
        return {"grad_norm": gn}

    def info(self) -> dict[str, Any]:
        return {"precision": self.name, "emulated": self.emulated}


class MetricSink(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"train.device={name!r} but no CUDA device is available")
    return dev


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def lr_at(step: int, cfg) -> float:
    """Linear warm-up to lr over warmup_steps, then cosine down to lr * min_lr_ratio."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not norms, biases, gains, scalars)."""
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)


def cpu_peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def seed_everything(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@torch.no_grad()
def evaluate(model: DecoderLM, batches: Batches, n_batches: int, precision: Precision,
             device: torch.device, kernels: str) -> float:
    model.eval()
    total = 0.0
    for x, y in batches.val_batches(n_batches):
        x, y = x.to(device), y.to(device)
        with precision.autocast(device):
            ctx = ForwardContext(position=model.position, kernels=kernels)
            model(x, y, ctx)
        total += float(ctx.metrics["ce_loss"])
    model.train()
    return total / n_batches


def _to_float(v: Any) -> float:
    return float(v.item()) if isinstance(v, torch.Tensor) else float(v)


def train(cell: Cell, registry: Registry, sink: MetricSink,
          on_info: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Train one cell. Returns the once-per-run summary. Raises Diverged.

    ``summary["notes"]`` lists human-readable remarks about the run (e.g. an
    evaluation that could not run and why); the worker stores them with it.
    """
    t_start = time.perf_counter()
    tc, mc = cell.train, cell.model
    if tc.threads:
        torch.set_num_threads(tc.threads)
    device = resolve_device(tc.device)
    kernels = tc.kernels if tc.kernels != "auto" else ("triton" if device.type == "cuda" else "torch")
    set_kernel_backend(kernels)
    seed_everything(cell.seed)

    ds = cell.components["dataset"]
    data: TokenData = registry.get("dataset", ds["name"]).factory(**ds["params"])
    data.check(mc.context)
    if mc.vocab_size == 0:
        mc.vocab_size = data.vocab_size
    elif mc.vocab_size < data.vocab_size:
        raise ValueError(f"model.vocab_size={mc.vocab_size} < the dataset's {data.vocab_size}")

    pc = cell.components["precision"]
    precision: Precision = registry.get("precision", pc["name"]).factory(**pc["params"])

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    baseline_rss = cpu_peak_rss_bytes()
    model = DecoderLM(mc, cell.components, registry, kernels=kernels).to(device)
    precision.setup(model, device)
    optimizer = make_optimizer(model, tc)
    batches = Batches(data, mc.context, tc.batch_size, cell.seed)

    n_params = model.n_params()
    info = {
        "device": device_name(device),
        "device_type": device.type,
        "kernels": kernels,
        "data_fingerprint": data.fingerprint,
        "data_description": data.description,
        "tokenizer": data.tokenizer,
        "vocab_size": mc.vocab_size,
        "peak_mem_kind": "cuda_max_allocated" if device.type == "cuda" else "cpu_peak_rss",
        **precision.info(),
    }
    if on_info:
        on_info(info)
    sink.log(0, {"n_params": n_params, "n_params_non_embedding": model.n_params(non_embedding=True)})

    params = [p for p in model.parameters() if p.requires_grad]
    tokens_per_step = tc.batch_size * mc.context
    model.train()
    for step in range(1, tc.steps + 1):
        t0 = time.perf_counter()
        lr = lr_at(step - 1, tc)
        for g in optimizer.param_groups:
            g["lr"] = lr
        x, y = batches.next_train()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        ctx = ForwardContext(position=model.position, kernels=kernels)
        with precision.autocast(device):
            _, loss, ctx = model(x, y, ctx)
        train_loss = _to_float(ctx.metrics["ce_loss"])
        if not math.isfinite(train_loss) or train_loss > tc.diverge_loss:
            sink.log(step, {"train_loss": train_loss, "lr": lr})
            raise Diverged(f"diverged at step {step}: train_loss={train_loss}")
        optimizer.zero_grad(set_to_none=True)
        precision.backward(loss)
        step_metrics = precision.step(optimizer, params, tc.grad_clip)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        row = {"train_loss": train_loss, "lr": lr, "tokens_per_s": tokens_per_step / dt,
               "elapsed_s": time.perf_counter() - t_start}
        row.update({k: _to_float(v) for k, v in step_metrics.items()})
        row.update({k: _to_float(v) for k, v in ctx.metrics.items() if k != "ce_loss"})
        if len(ctx.aux_losses):
            row["aux_loss"] = sum(_to_float(v) for v in ctx.aux_losses.values())
        if step % tc.eval_every == 0 or step == tc.steps:
            row["val_loss"] = evaluate(model, batches, tc.eval_batches, precision, device, kernels)
        sink.log(step, row)

    notes: list[str] = []
    # ---- post-training evaluations (decode speed, length extrapolation, ...) go here;
    # each logs its metrics to ``sink`` at step tc.steps and appends to ``notes``.

    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = cpu_peak_rss_bytes()
    summary = {
        "n_params": n_params,
        "peak_mem_bytes": peak,
        "baseline_rss_bytes": baseline_rss,
        "wall_s": time.perf_counter() - t_start,
    }
    sink.log(tc.steps, summary)
    summary["notes"] = notes
    return summary
