"""One training run: data, model, AdamW, warm-up + cosine schedule, precision, eval, metrics.

``train`` reads as its parts: ``prepare`` the run (device, kernel backend,
data, precision, model, optimizer), ``begin`` it (resume from a checkpoint,
or measure and record its costs at step 0), ``train_loop`` (one
``train_step`` per step, with memory tracking, evaluation and checkpoints),
then the post-training evaluations (abl.train.evaluations, each switchable under
``[eval]``) and the summary (peak memory, ``mfu``).

The loop lives here; its parts have rooms of their own: what a run holds
(abl.train.state), the optimizer and the schedule (abl.train.optim),
checkpoints (abl.train.checkpoint), what the run measures about itself:
costs, memory, the machine's share, MFU (abl.train.measure), several
processes (abl.train.ddp) and ``train.compile`` (abl.train.compiled).

Metrics go to a ``MetricSink`` (in the worker: an append-only JSONL file that
is flushed as each line is written); the trainer never touches the database.

Recorded names:
- every step: train_loss, lr, grad_norm, tokens_per_s, elapsed_s (+ any a
  component or the precision policy adds); step 2 runs under the tensor
  tracker (harness/model/memory.py) and records peak_tensor_bytes and its parts
  instead of tokens_per_s (eager cells only);
- last step: train_tokens_per_s, the cell's true rate (every token trained
  in the loop over the loop's wall time, evaluations and checkpoints
  included; the per-step median of tokens_per_s is the kernel-speed figure);
- with train.compile: compile_s (before the first step, apart from every
  step time);
- every evaluation: val_loss, and val_bpb (bits per byte) on the validation text's fixed
  byte spans, the same bytes under every tokenizer (abl.train.spanscore; pre-tokenised data
  that says which bytes its tokens cover: over its windows' bytes) (on a task dataset, the loss on its marked positions, plus the
  task's accuracy metrics: abl.data.tasks);
- once: n_params, n_params_non_embedding and the measured/predicted costs
  (step 0); the post-training evaluations' metrics, peak_mem_bytes,
  baseline_rss_bytes, wall_s and mfu (last step);
- last step, what the machine gave the loop (``LoopShare``): cpu_util, the
  process's CPU seconds over the loop / (the loop's wall seconds x the torch
  threads the run was given), and load_per_core, the mean 1-minute load
  average sampled at the loop's start, each evaluation step and its end, over
  the CPU count. At ingest they become ``contended`` (abl.analysis.health).
"""

from __future__ import annotations

import math
import time
from importlib import import_module
from pathlib import Path
from typing import Any, Callable

import torch

from ..analysis import health
from ..analysis.health import unigram_floor
from ..contracts.config import Cell
from ..contracts.precision import Precision
from ..contracts.registry import Registry
from ..data.corpus import Batches, TokenData
from ..data.tasks import IGNORE_INDEX, Task
from ..kernels import resolve as resolve_kernels
from ..model.decoder import DecoderLM, ForwardContext
from ..model.memory import step_memory
from ..model.shapecache import ShapeCache, StepTimes, shape_key, timing_key
from ..store.provenance import device_name
from . import spanscore
from .checkpoint import load_checkpoint, save_checkpoint
from .compiled import Compiled, compile_warmup, record_step_times
from .ddp import Distributed
from .evaluations import TrainedRun, run_evaluations, scored_targets_fingerprints
from .measure import LoopShare, cpu_peak_rss_bytes, measure_costs, memory_metrics, mfu, mfu_costs, peak_mem_bytes
from .optim import lr_at, make_optimizer, set_lr
from .state import Diverged, MetricSink, TrainingRun
from .taskdata import make_batches, task_metrics


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"train.device={name!r} but no CUDA device is available")
    return dev


def seed_everything(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@torch.no_grad()
def evaluate(model: DecoderLM, batches: Batches, n_batches: int, precision: Precision,
             device: torch.device, dist: Distributed | None = None) -> float:
    """Mean over ``n_batches`` fixed validation batches (the same for every cell) of each batch's mean
    cross-entropy on its scored targets.

    A batch is ``batches.val_batch_size`` windows, the global ``train.batch_size``, whatever the
    number of processes, so a multi-process cell is scored on the windows of its single-process twin:
    each process scores every ``world``-th piece of ``batches.batch_size`` windows, and the per-batch
    sums of loss and scored targets are all-reduced (every process must call it).
    """
    rank, world = (dist.rank, dist.world) if dist is not None else (0, 1)
    pieces = max(1, batches.val_batch_size // batches.batch_size)  # pieces of one batch
    sums = torch.zeros(n_batches, 2, dtype=torch.float64)  # per batch: loss x targets, targets
    model.eval()
    for i, (x, y) in enumerate(batches.val_batches(n_batches)):
        if i % world != rank:
            continue
        x, y = x.to(device), y.to(device)
        with precision.autocast(device):
            ctx = ForwardContext(position=model.position)
            model(x, y, ctx)
        scored = int((y != IGNORE_INDEX).sum())
        if not scored:  # a piece with no answer position: its mean loss is undefined
            continue
        sums[i // pieces] += torch.tensor([float(ctx.metrics["ce_loss"]) * scored, scored], dtype=torch.float64)
    model.train()
    if dist is not None and dist.enabled:
        sums = dist.sum(sums.to(device)).cpu()
    return float((sums[:, 0] / sums[:, 1].clamp(min=1)).mean())


def _to_float(v: Any) -> float:
    return float(v.item()) if isinstance(v, torch.Tensor) else float(v)


# ---------------------------------------------------------------- one run, in parts


def fused_where_supported(optimizer: torch.optim.Optimizer, device: torch.device) -> torch.optim.Optimizer:
    """``optimizer`` rebuilt as fused AdamW (one kernel steps every parameter) on CUDA when every
    parameter's dtype has the fused kernel; else as it is. Not on CPU: torch's fused CPU AdamW
    differs from the default one in the last bits, and the CPU runs' results come from the
    default one. info.json records which stepped the run ("optimizer")."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if device.type != "cuda" or type(optimizer) is not torch.optim.AdamW or not params or any(
            p.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64) for p in params):
        return optimizer
    flags = ("foreach", "fused", "capturable", "differentiable")  # the new defaults' (fused)
    groups = [{k: v for k, v in g.items() if k not in flags} for g in optimizer.param_groups]
    d = optimizer.defaults
    return torch.optim.AdamW(groups, lr=d["lr"], betas=d["betas"], eps=d["eps"], weight_decay=d["weight_decay"],
                             amsgrad=d["amsgrad"], maximize=d["maximize"], fused=True)


def optimizer_info(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {"name": type(optimizer).__name__, "fused": bool(optimizer.defaults.get("fused"))}


def load_data(cell: Cell, registry: Registry) -> TokenData | Task:
    """The cell's tokens (mapped from the token store the parent prepared) or its task (a
    generator of examples, abl.data.tasks), checked against the context; fills ``model.vocab_size``
    when it is 0."""
    from ..data.tasks import is_task_factory
    from ..data.tokenstore import cell_tokens

    mc = cell.model
    ds = cell.components["dataset"]
    factory = registry.get("dataset", ds["name"]).factory
    data: TokenData | Task = factory(**ds["params"]) if is_task_factory(factory) else cell_tokens(cell, registry)
    data.check(mc.context)
    if mc.vocab_size == 0:
        mc.vocab_size = data.vocab_size
    elif mc.vocab_size < data.vocab_size:
        raise ValueError(f"model.vocab_size={mc.vocab_size} < the dataset's {data.vocab_size}")
    return data


def prepare(cell: Cell, registry: Registry, shape_cache: Path | None = None) -> TrainingRun:
    """Device, kernel backend, seeds, data, precision, model, optimizer, batches: ready for step 1."""
    tc, mc = cell.train, cell.model
    if tc.threads > 0:  # 0: the executor chose them (OMP_NUM_THREADS; abl.run.threads); -1: torch's default
        torch.set_num_threads(tc.threads)
    dist = Distributed()
    device = dist.setup(resolve_device(tc.device))
    # before anything imports triton: on CPU it may switch the interpreter on
    kernels = resolve_kernels(tc.kernels, device)
    seed_everything(cell.seed)
    torch.use_deterministic_algorithms(tc.deterministic, warn_only=False)
    data = load_data(cell, registry)
    pc = cell.components["precision"]
    precision: Precision = registry.get("precision", pc["name"]).factory(**pc["params"])
    if tc.kernels == "auto" and device.type == "cuda":  # each op on its faster verified path at these shapes
        from ..kernels.autoselect import workload_of
        kernels = resolve_kernels("auto", device, workload_of(mc, tc.batch_size // dist.world, precision.compute_dtype),
                                  shape_cache)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        if kernels.triton and shape_cache is not None:  # every cell of this store: the same attention tiles
            import_module("abl.kernels.flash_attention").use_tile_cache(shape_cache / "attention-tiles.json")
    baseline_rss = cpu_peak_rss_bytes()
    core = DecoderLM(mc, cell.components, registry, kernel_backend=kernels).to(device)
    precision.setup(core, device)
    optimizer = fused_where_supported(make_optimizer(core, tc), device)
    model = Compiled(core) if tc.compile else dist.wrap(core, device)
    run = TrainingRun(cell=cell, registry=registry, dist=dist, device=device, kernels=kernels, data=data,
                      precision=precision, core=core, model=model, optimizer=optimizer,
                      batches=make_batches(data, mc.context, tc.batch_size // dist.world, cell.seed,
                                           stream=dist.rank, val_batch_size=tc.batch_size),
                      baseline_rss_bytes=baseline_rss,
                      shapes=ShapeCache(shape_cache, shape_key(cell, tc.batch_size // dist.world, dist.world,
                                                               kernels.key, device_name(device),
                                                               torch.__version__)),
                      timings=StepTimes(shape_cache, timing_key(cell, tc.batch_size // dist.world, dist.world,
                                                                kernels.key, torch.__version__)))
    run.notes += spanscore.notes(data)
    if kernels.interpreted:
        run.notes.append("Triton kernels ran in the Triton interpreter on CPU (a correctness path: its "
                         "timings say nothing about the kernels' speed)")
    return run


def run_info(run: TrainingRun) -> dict[str, Any]:
    """The environment stored with the run (info.json)."""
    device, mc = run.device, run.cell.model
    scored = scored_targets_fingerprints(
        run.batches, run.cell, str(run.data.meta.get("corpus_fingerprint", "")) if isinstance(run.data, TokenData)
        else "")
    spans = spanscore.info(run.data, run.cell)
    if spans:  # val_bpb is scored on fixed byte spans of the text: the same bytes under every tokenizer
        scored["val_bpb"] = spans["val_bpb_spans"]["sha256"]
    return {
        "device": device_name(device),
        "device_type": device.type,
        "kernels": run.kernels.name,
        **run.kernels.info(),  # auto's per-op choices (abl.kernels.autoselect)
        "data_fingerprint": run.data.fingerprint,
        "data_description": run.data.description,
        "tokenizer": run.data.tokenizer,
        # tokenizer params and fingerprint, corpus fingerprint, token store entry (a task has none)
        **(run.data.meta if isinstance(run.data, TokenData) else {}),
        "vocab_size": mc.vocab_size,
        # what its validation figures are scored on (abl.analysis.verdicts flags a comparison across them)
        "scored_targets": scored,
        # abl.analysis.health; a task's loss is on its answer positions only, where a unigram floor means nothing
        "unigram_floor": unigram_floor(run.data.train, run.data.val, mc.vocab_size)
        if isinstance(run.data, TokenData) else None,
        "peak_mem_kind": "cuda_max_allocated" if device.type == "cuda" else "cpu_peak_rss",
        "device_count": torch.cuda.device_count() if device.type == "cuda" else 1,
        "processes": run.dist.world,
        "optimizer": optimizer_info(run.optimizer),  # fused AdamW on CUDA (fused_where_supported)
        "shape_cache": {part: "reused" if run.shapes.has(part) else "measured" for part in ("flops", "memory")},
        "seed": run.cell.seed,
        "determinism": {
            "use_deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "data_order": "depends only on the seed (and train.devices)",
        },
        **run.precision.info(),
        **spans,
    }


def begin(run: TrainingRun, sink: MetricSink, checkpoint_path: Path | None) -> tuple[int, dict[str, float]]:
    """Resume from the checkpoint at ``checkpoint_path`` if there is one; else measure the
    run's costs and record them with the parameter counts at step 0.

    Returns (the first step to run, the costs). A resumed run recorded its costs
    when it started; it gets back the two that ``mfu`` needs, without recording them again.
    """
    if checkpoint_path is not None and checkpoint_path.exists():
        step = load_checkpoint(checkpoint_path, run.core, run.optimizer, run.precision, run.batches, run.dist.rank)
        return step + 1, mfu_costs(run)
    cached = run.shapes.get("flops")
    costs = measure_costs(run.core, run.cell, run.registry, run.batches, run.precision, run.device, run.dist.world,
                          counted=cached["flops_per_step_measured"] if cached else None)
    if cached is None:
        run.shapes.put("flops", {"flops_per_step_measured": costs["flops_per_step_measured"]})
    if "_note" in costs:
        run.notes.append(str(costs.pop("_note")))
    sink.log(0, {"n_params": run.core.n_params(), "n_params_non_embedding": run.core.n_params(non_embedding=True),
                 **costs})
    return 1, costs


def train_step(run: TrainingRun, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any],
                                                                            ForwardContext]:
    """Forward, backward, optimizer step. Returns (this process's training loss, a device tensor
    not read yet; the precision policy's step metrics; the forward's context). Nothing reads a
    device value between forward and backward: a ``float(loss)`` there would stall the host until
    the forward has run before it could queue the backward (``check_divergence`` reads it later)."""
    tc = run.cell.train
    ctx = ForwardContext(position=run.core.position, need_logits=False)
    with run.precision.autocast(run.device):
        _, loss, ctx = run.model(x, y, ctx)
    run.optimizer.zero_grad(set_to_none=True)
    run.precision.backward(loss)
    return ctx.metrics["ce_loss"].detach(), run.precision.step(run.optimizer, run.params, tc.grad_clip), ctx


def check_divergence(run: TrainingRun, sink: MetricSink, step: int, lr: float, loss: torch.Tensor) -> float:
    """The step's training loss averaged over ranks, read once the step is done (where the loop
    waits for the device anyway, to time it). Raises Diverged, after recording it, when it is
    non-finite or above ``train.diverge_loss``: at the step it happened, as before, but after
    that step's backward and update (applied; the run stops there, nothing is checkpointed)."""
    train_loss = run.dist.mean(_to_float(loss), run.device)
    if not math.isfinite(train_loss) or train_loss > run.cell.train.diverge_loss:
        sink.log(step, {"train_loss": train_loss, "lr": lr})
        raise Diverged(f"diverged at step {step}: train_loss={train_loss}")
    return train_loss


def memory_tracked(run: TrainingRun, step: int) -> bool:
    """Is ``step`` the one run under the tensor-memory tracker? The second (the optimizer
    state exists by then), in single-process eager cells only (a compiled step's
    memory is inductor's, not the eager model's the cost model predicts)."""
    return run.dist.world == 1 and not run.cell.train.compile and step == min(2, run.cell.train.steps)


def reported_metrics(step_metrics: dict[str, Any], ctx: ForwardContext) -> dict[str, float]:
    """What the precision policy and the components reported for a step (aux losses summed)."""
    row = {k: _to_float(v) for k, v in step_metrics.items()}
    row.update({k: _to_float(v) for k, v in ctx.metrics.items() if k != "ce_loss"})
    if len(ctx.aux_losses):
        row["aux_loss"] = sum(_to_float(v) for v in ctx.aux_losses.values())
    return row


def maybe_checkpoint(run: TrainingRun, checkpoint_path: Path | None, step: int) -> None:
    """Every ``train.checkpoint_every`` steps but the last (the finished run needs none)."""
    every, last = run.cell.train.checkpoint_every, run.cell.train.steps
    if checkpoint_path is None or not every or step % every or step >= last:
        return
    data_states = run.dist.gather(run.batches.gen.get_state())  # every rank takes part
    if run.dist.is_main:
        save_checkpoint(checkpoint_path, step, run.core, run.optimizer, run.precision, data_states)


def train_loop(run: TrainingRun, sink: MetricSink, start_step: int, t_start: float,
               checkpoint_path: Path | None) -> list[float]:
    """Steps ``start_step`` .. ``train.steps``; returns the wall times of the steps timed for throughput."""
    tc = run.cell.train
    tokens_per_step = tc.batch_size * run.cell.model.context
    step_times: list[float] = []
    run.model.train()
    if tc.compile and start_step <= tc.steps:
        run.compile_s = compile_warmup(run)
        sink.log(start_step - 1, {"compile_s": run.compile_s})
    cached_memory = run.shapes.get("memory") if any(
        memory_tracked(run, s) for s in range(start_step, tc.steps + 1)) else None
    t_loop = time.perf_counter()
    share = LoopShare()
    for step in range(start_step, tc.steps + 1):
        t0 = time.perf_counter()
        lr = set_lr(run.optimizer, lr_at(step - 1, tc))
        x, y = run.next_batch()
        tracked = memory_tracked(run, step) and cached_memory is None
        with step_memory(tracked, run.core, run.optimizer, x, y) as mem:
            loss, step_metrics, ctx = train_step(run, x, y)
        run.synchronize()
        dt = time.perf_counter() - t0
        train_loss = check_divergence(run, sink, step, lr, loss)
        row = {"train_loss": train_loss, "lr": lr, "elapsed_s": time.perf_counter() - t_start}
        if tracked:  # the tracker slows the step: it gives no throughput figure
            measured = memory_metrics(mem, run.notes)
            run.shapes.put("memory", measured)
            row.update(measured)
        else:
            if cached_memory is not None and memory_tracked(run, step):
                row.update(cached_memory)  # an identical shape's tracked step (abl.model.shapecache)
            step_times.append(dt)
            row["tokens_per_s"] = tokens_per_step / dt
        row.update(reported_metrics(step_metrics, ctx))
        if step % tc.eval_every == 0:
            share.sample()
        evaluating = step % tc.eval_every == 0 or step == tc.steps
        t_eval = time.perf_counter()
        # every process scores its share of the validation windows; rank 0 records
        val_loss = evaluate(run.core, run.batches, tc.eval_batches, run.precision, run.device,
                            run.dist) if evaluating else None
        if run.dist.is_main and val_loss is not None:  # None: not an evaluation step
            row["val_loss"] = val_loss
            bpb = spanscore.val_bpb(run, row["val_loss"])  # the same bytes under every tokenizer
            if bpb is not None:
                row["val_bpb"] = bpb
            row.update(task_metrics(run.core, run.batches, tc.eval_batches, run.precision, run.device,
                                    run.cell.data.dataset))
            row["eval_s"] = time.perf_counter() - t_eval  # what the grid's evaluation cost (abl bench harness)
        if step == tc.steps:  # the cell's true rate: every token of the loop over its wall time
            row["train_tokens_per_s"] = (tc.steps - start_step + 1) * tokens_per_step / (time.perf_counter() - t_loop)
        sink.log(step, row)
        maybe_checkpoint(run, checkpoint_path, step)
    if start_step <= tc.steps:
        run.share = share.metrics()
    return step_times


def post_training(run: TrainingRun, sink: MetricSink) -> None:
    """The switched-on post-training evaluations (rank 0), logged at the last step."""
    if not run.dist.is_main:
        return
    trained = TrainedRun(model=run.core, cell=run.cell, registry=run.registry, batches=run.batches,
                         precision=run.precision, device=run.device)
    t0 = time.perf_counter()
    metrics, notes = run_evaluations(trained, run.cell.eval)
    if metrics:
        metrics["post_eval_s"] = time.perf_counter() - t0
        sink.log(run.cell.train.steps, metrics)
    run.notes += notes


def train(cell: Cell, registry: Registry, sink: MetricSink,
          on_info: Callable[[dict], None] | None = None,
          checkpoint_path: Path | None = None, shape_cache: Path | None = None) -> dict[str, Any]:
    """Train one cell. Returns the once-per-run summary. Raises Diverged.

    ``summary["notes"]`` lists human-readable remarks about the run (e.g. an
    evaluation that could not run and why); the worker stores them with it.

    With ``train.checkpoint_every`` and a ``checkpoint_path``, the full
    training state (model, optimizer, precision, RNGs, data order, step) is
    saved atomically every N steps, and training resumes from it if the file
    exists when ``train`` starts.

    ``shape_cache``: a folder of abl.model.shapecache entries (the worker passes its
    store's); FLOP counting and memory tracking are then done once per model
    shape and reused.
    """
    t_start = time.perf_counter()
    run = prepare(cell, registry, shape_cache)
    try:
        if on_info and run.dist.is_main:
            on_info(run_info(run))
        start_step, costs = begin(run, sink, checkpoint_path)
        step_times = train_loop(run, sink, start_step, t_start, checkpoint_path)
        post_training(run, sink)
        summary: dict[str, Any] = {
            "n_params": run.core.n_params(),
            "peak_mem_bytes": peak_mem_bytes(run.device),
            "baseline_rss_bytes": run.baseline_rss_bytes,
            "wall_s": time.perf_counter() - t_start,
            **run.share,
        }
        utilisation = mfu(costs, step_times)
        if utilisation is not None and utilisation > 1 and run.device.type == "cpu":
            # the cached CPU peak was measured while the machine was busier than now: measure it again
            from ..store.cpupeak import matmul_flops

            fresh = matmul_flops(run.precision.peak_format(), refresh=True)
            if fresh:
                costs["device_peak_flops"] = fresh * run.dist.world
                utilisation = mfu(costs, step_times)
                sink.log(cell.train.steps, {"device_peak_flops": costs["device_peak_flops"]})
        if utilisation is None and run.device.type == "cpu" and costs.get("useful_flops_per_step") \
                and not costs.get("device_peak_flops"):
            from ..store.cpupeak import MATMUL_DTYPES

            if run.precision.peak_format() in MATMUL_DTYPES:  # a CPU matmul format: its peak was contended
                run.notes.append("mfu not recorded: the machine was too busy to measure this CPU's peak")
        if utilisation is not None and run.device.type == "cpu" and health.contended(
                run.share.get("load_per_core"), run.share.get("cpu_util"), on_cpu=True):
            # its steps shared the cores with other jobs: their time says nothing about this CPU's peak
            run.notes.append(f"mfu not recorded: the machine was contended during training (load "
                             f"{run.share.get('load_per_core', float('nan')):.2f} per core, "
                             f"{run.share.get('cpu_util', float('nan')):.0%} of its threads' CPU time)")
        elif utilisation is not None and utilisation > 1:  # never stored: a peak that does not hold
            run.notes.append(f"mfu not recorded: {utilisation:.3f} exceeds 1, so the device peak "
                             f"({costs.get('device_peak_flops', 0):.3g} FLOP/s) does not hold on this machine")
        elif utilisation is not None:
            summary["mfu"] = utilisation
        if run.dist.is_main:  # the shape's step times, and whether this cell's compile paid back
            payback = record_step_times(run, step_times, run.compile_s)
            if payback:
                run.notes.append(payback)
        # n_params was recorded at step 0; the summary row carries only what is new
        sink.log(cell.train.steps, {k: v for k, v in summary.items() if k != "n_params"})
        summary["notes"] = run.notes
        return summary
    finally:
        run.dist.close()
