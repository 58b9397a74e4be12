"""One training run: data, model, AdamW, warm-up + cosine schedule, precision, eval, metrics.

Metrics go to a ``MetricSink`` (in the worker: an append-only JSONL file that
is flushed as each line is written); the trainer never touches the database.

Recorded names:
- every step: train_loss, lr, grad_norm, tokens_per_s, elapsed_s (+ any a
  component or the precision policy adds); step 2 runs under the tensor
  tracker (harness/memory.py) and records peak_tensor_bytes and its parts
  instead of tokens_per_s;
- every evaluation: val_loss;
- once: n_params, n_params_non_embedding, peak_mem_bytes, wall_s.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from .config import Cell
from .data import Batches, TokenData
from .kernels import enable_interpreter as enable_triton_interpreter
from .memory import step_memory
from .kernels import set_backend as set_kernel_backend
from .model import DecoderLM, ForwardContext
from .precision import Precision
from .provenance import device_name
from .registry import Registry


class Diverged(Exception):
    """The loss became non-finite or exceeded ``train.diverge_loss``."""


class MetricSink(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"train.device={name!r} but no CUDA device is available")
    return dev


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


def save_checkpoint(path: Path, step: int, model, optimizer, precision: Precision,
                    data_states: list[torch.Tensor]) -> None:
    """Everything needed to continue bit-for-bit: written to a temp file, then renamed.

    ``data_states`` holds the data-order generator state of every rank.
    """
    import random

    import numpy as np

    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "precision": precision.state_dict(),
        "data_rng": data_states,
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy_rng": np.random.get_state(),
        "python_rng": random.getstate(),
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, model, optimizer, precision: Precision, batches: Batches, rank: int = 0) -> int:
    """Restore a checkpoint written by save_checkpoint; returns its step."""
    import random

    import numpy as np

    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    precision.load_state_dict(state["precision"])
    batches.gen.set_state(state["data_rng"][rank])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])
    return int(state["step"])


def checkpoint_step(path: Path) -> int | None:
    """The step of the checkpoint at ``path`` (None if there is none or it is unreadable)."""
    if not path.exists():
        return None
    try:
        return int(torch.load(path, map_location="cpu", weights_only=False)["step"])
    except Exception:  # noqa: BLE001 - a torn checkpoint is as good as none
        return None


def measure_costs(core: DecoderLM, cell: Cell, registry: Registry, batches: Batches, precision: Precision,
                  device: torch.device, kernels: str, world: int) -> dict[str, float]:
    """FLOPs of one training step counted by torch (on a validation batch, so the
    training data order is untouched), and the device peak used for MFU."""
    from .flops import count_step_flops
    from .provenance import peak_flops

    x, y = next(iter(batches.val_batches(1)))
    x, y = x.to(device), y.to(device)
    measured = count_step_flops(core, x, y, lambda: ForwardContext(position=core.position, kernels=kernels,
                                                                      need_logits=False),
                                lambda: precision.autocast(device))
    out: dict[str, float] = {"flops_per_step_measured": float(measured * world)}
    peak = peak_flops(device, precision.peak_format())
    if peak:
        out["device_peak_flops"] = float(peak * world)
    from .costmodel import predict
    from .registry import RegistryError

    try:
        pred = predict(cell, registry, vocab_size=cell.model.vocab_size)
    except RegistryError as exc:  # a component without a cost model: say so, record the rest
        out["_note"] = f"no cost prediction: {exc}"  # type: ignore[assignment]
        return out
    out["flops_per_step_predicted"] = float(pred["flops_per_step"])
    out["useful_flops_per_step"] = float(pred["useful_flops_per_step"])
    out["n_params_predicted"] = float(pred["n_params"])
    return out


def _to_float(v: Any) -> float:
    return float(v.item()) if isinstance(v, torch.Tensor) else float(v)


class Distributed:
    """DDP bookkeeping for a cell spanning several processes (torchrun sets WORLD_SIZE).

    One process per GPU with NCCL on CUDA, gloo on CPU. ``train.batch_size`` is
    the global batch: each rank draws ``batch_size / world`` sequences from its
    own seeded stream. Only rank 0 evaluates, logs and checkpoints. With one
    process every method is a no-op.
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

            dist.destroy_process_group()


def train(cell: Cell, registry: Registry, sink: MetricSink,
          on_info: Callable[[dict], None] | None = None,
          checkpoint_path: Path | None = None) -> dict[str, Any]:
    """Train one cell. Returns the once-per-run summary. Raises Diverged.

    ``summary["notes"]`` lists human-readable remarks about the run (e.g. an
    evaluation that could not run and why); the worker stores them with it.

    With ``train.checkpoint_every`` and a ``checkpoint_path``, the full
    training state (model, optimizer, precision, RNGs, data order, step) is
    saved atomically every N steps, and training resumes from it if the file
    exists when ``train`` starts.
    """
    t_start = time.perf_counter()
    tc, mc = cell.train, cell.model
    if tc.threads:
        torch.set_num_threads(tc.threads)
    dist = Distributed()
    device = dist.setup(resolve_device(tc.device))
    kernels = tc.kernels if tc.kernels != "auto" else ("triton" if device.type == "cuda" else "torch")
    set_kernel_backend(kernels)
    if kernels == "triton" and device.type == "cpu" and not enable_triton_interpreter():
        raise ValueError("train.kernels = \"triton\" on CPU needs the Triton interpreter, but triton was "
                         "imported in this process before it could be switched on; set TRITON_INTERPRET=1 "
                         "in the environment, or use train.kernels = \"torch\"")
    seed_everything(cell.seed)
    torch.use_deterministic_algorithms(tc.deterministic, warn_only=False)

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
    core = DecoderLM(mc, cell.components, registry, kernels=kernels).to(device)
    precision.setup(core, device)
    optimizer = make_optimizer(core, tc)
    model = dist.wrap(core, device)
    batches = Batches(data, mc.context, tc.batch_size // dist.world, cell.seed, stream=dist.rank)

    n_params = core.n_params()
    info = {
        "device": device_name(device),
        "device_type": device.type,
        "kernels": kernels,
        "data_fingerprint": data.fingerprint,
        "data_description": data.description,
        "tokenizer": data.tokenizer,
        "vocab_size": mc.vocab_size,
        "peak_mem_kind": "cuda_max_allocated" if device.type == "cuda" else "cpu_peak_rss",
        "device_count": torch.cuda.device_count() if device.type == "cuda" else 1,
        "processes": dist.world,
        "seed": cell.seed,
        "determinism": {
            "use_deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "data_order": "depends only on the seed (and train.devices)",
        },
        **precision.info(),
    }
    if on_info and dist.is_main:
        on_info(info)

    params = [p for p in model.parameters() if p.requires_grad]
    tokens_per_step = tc.batch_size * mc.context
    start_step = 1
    notes: list[str] = []
    if kernels == "triton" and device.type == "cpu":
        notes.append("Triton kernels ran in the Triton interpreter on CPU (a correctness path: its "
                     "timings say nothing about the kernels' speed)")
    costs: dict[str, float] = {}
    step_times: list[float] = []
    if checkpoint_path is not None and checkpoint_path.exists():
        start_step = load_checkpoint(checkpoint_path, core, optimizer, precision, batches, dist.rank) + 1
    else:
        costs = measure_costs(core, cell, registry, batches, precision, device, kernels, dist.world)
        if "_note" in costs:
            notes.append(str(costs.pop("_note")))
        sink.log(0, {"n_params": n_params, "n_params_non_embedding": core.n_params(non_embedding=True), **costs})
    model.train()
    for step in range(start_step, tc.steps + 1):
        t0 = time.perf_counter()
        lr = lr_at(step - 1, tc)
        for g in optimizer.param_groups:
            g["lr"] = lr
        x, y = batches.next_train()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        # one step (the second: the optimizer state exists by then) is run under the
        # tensor-memory tracker; it is slower, so it gives no throughput figure
        tracked = dist.world == 1 and step == min(2, tc.steps)
        with step_memory(tracked, core, optimizer, x, y) as mem:
            ctx = ForwardContext(position=core.position, kernels=kernels, need_logits=False)
            with precision.autocast(device):
                _, loss, ctx = model(x, y, ctx)
            train_loss = dist.mean(_to_float(ctx.metrics["ce_loss"]), device)
            if not math.isfinite(train_loss) or train_loss > tc.diverge_loss:
                sink.log(step, {"train_loss": train_loss, "lr": lr})
                raise Diverged(f"diverged at step {step}: train_loss={train_loss}")
            optimizer.zero_grad(set_to_none=True)
            precision.backward(loss)
            step_metrics = precision.step(optimizer, params, tc.grad_clip)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        row = {"train_loss": train_loss, "lr": lr, "elapsed_s": time.perf_counter() - t_start}
        if tracked:
            if mem.peak is not None:
                row["peak_tensor_bytes"] = mem.peak
                row.update({f"peak_tensor_{k}_bytes": v for k, v in mem.breakdown.items() if v})
            elif mem.why:
                notes.append(mem.why)
        else:
            step_times.append(dt)
            row["tokens_per_s"] = tokens_per_step / dt
        row.update({k: _to_float(v) for k, v in step_metrics.items()})
        row.update({k: _to_float(v) for k, v in ctx.metrics.items() if k != "ce_loss"})
        if len(ctx.aux_losses):
            row["aux_loss"] = sum(_to_float(v) for v in ctx.aux_losses.values())
        if dist.is_main and (step % tc.eval_every == 0 or step == tc.steps):
            row["val_loss"] = evaluate(core, batches, tc.eval_batches, precision, device, kernels)
        sink.log(step, row)
        if checkpoint_path is not None and tc.checkpoint_every and step % tc.checkpoint_every == 0 \
                and step < tc.steps:
            data_states = dist.gather(batches.gen.get_state())
            if dist.is_main:
                save_checkpoint(checkpoint_path, step, core, optimizer, precision, data_states)

    # ---- post-training evaluations (decode speed, length extrapolation, ...) go here;
    # each logs its metrics to ``sink`` at step tc.steps and appends to ``notes``.
    if dist.is_main:
        from .decode import post_training_evaluations

        post, post_notes = post_training_evaluations(core, cell, registry, batches, precision, device, kernels)
        sink.log(tc.steps, post)
        notes += post_notes

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
    if costs.get("useful_flops_per_step") and costs.get("device_peak_flops") and step_times:
        # model FLOPs utilisation: variant-aware useful FLOPs over the median step time
        median_dt = sorted(step_times)[len(step_times) // 2]
        summary["mfu"] = costs["useful_flops_per_step"] / median_dt / costs["device_peak_flops"]
    # n_params was recorded at step 0; the summary row carries only what is new
    sink.log(tc.steps, {k: v for k, v in summary.items() if k != "n_params"})
    summary["notes"] = notes
    dist.close()
    return summary
