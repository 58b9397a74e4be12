"""``abl bench seeds``: the seeds of one grid point trained as one model, against the same seeds trained apart
(issue 37, item 4: whether it pays, measured before it is built into ``abl run``).

Cells that differ only in their seed have the same shapes, so their models can be stacked
(``torch.func.stack_module_state``) and trained as one: one vmapped forward and backward
(``torch.func.vmap`` over ``functional_call``, the model-ensembling recipe of PyTorch's ``torch.func``
tutorial) and one AdamW step over the stacked parameters, each seed's gradient clipped by its own norm.
Three ways of training ``seeds`` models are timed on the current device, per step of all of them (the
median over ``steps`` timed steps after ``warmup``):

- ``apart``: the models one after another in one process (a warm worker training the cells in turn);
- ``concurrent``: one process per model, all stepping at once (what ``abl run`` packs on one device,
  ``--cells-per-gpu``); a step is the slowest process's median step;
- ``stacked``: the vmapped model.

The losses of the first ``check`` steps of ``apart`` and ``stacked``, from the same initial weights and
batches, say whether training stacked changes the numbers (``max_abs_diff``; ``bitwise``). ``unbatched_ops``
names the operations that have no batching rule on this device: vmap runs them once per seed in a loop.

The precision policy's autocast is kept; a policy that scales the loss or steps its own way is not stacked
(said in ``stacked_error``), nor is a model whose operations have no batching rule (a Triton kernel;
``--set train.kernels=torch`` runs torch's own). On a shared machine the figures are noisy: compare the
ratios of one run, with the machine's load (``load``) beside them.
"""

from __future__ import annotations

import copy
import multiprocessing
import os
import queue
import re
import statistics
import time
import warnings
from typing import Any


def seed_cells(seeds: int, overrides: list[str] | None = None) -> list:
    """The default cell of ``abl bench harness`` (with ``overrides``) at seeds 0..seeds-1."""
    from ..contracts.plugin_manager import get_registry
    from ..grid.gridfile import expand
    from ..grid.parsing import apply_override, parse_overrides
    from .harness import default_grid

    raw = default_grid(1, seeds)
    for path, value in parse_overrides(list(overrides or [])):
        apply_override(raw, path, value)
    grid = expand(raw, get_registry(), source="abl bench seeds")
    if len({c.cell_key for c in grid.cells}) != 1:
        raise ValueError(f"abl bench seeds trains the seeds of one cell; the overrides give "
                         f"{len({c.cell_key for c in grid.cells})} cells")
    return grid.cells


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _prepared(cells: list) -> list:
    from ..contracts.plugin_manager import get_registry
    from ..train.loop import prepare

    return [prepare(c, get_registry()) for c in cells]


def _apart_step(runs: list) -> list[float]:
    from ..train.loop import train_step

    losses = [train_step(r, *r.batches.next_train())[0] for r in runs]
    return [float(v) for v in losses]


class Stacked:
    """The models of ``runs`` (one grid point, several seeds) as one: stacked parameters, one vmapped step."""

    def __init__(self, runs: list) -> None:
        import torch
        from torch.func import functional_call, grad_and_value, stack_module_state, vmap

        from ..contracts.precision import Precision
        from ..model.decoder import ForwardContext

        first = runs[0]
        policy = type(first.precision)
        if policy.step is not Precision.step or policy.backward is not Precision.backward:
            raise ValueError(f"the precision policy {first.precision.name!r} scales the loss or steps its own way; "
                             f"its step is not stacked")
        self.runs, self.device, self.precision = runs, first.device, first.precision
        self.params, self.buffers = stack_module_state([r.core for r in runs])
        self.skeleton = copy.deepcopy(first.core)  # functional_call puts each seed's tensors in it
        dims = {n: p.dim() for n, p in first.core.named_parameters()}
        tc = first.cell.train
        self.clip = tc.grad_clip if tc.grad_clip > 0 else float("inf")
        # abl.train.optim.make_optimizer's groups: weight decay on matrices only (their dimension before stacking)
        groups = [{"params": [p for n, p in self.params.items() if dims[n] >= 2], "weight_decay": tc.weight_decay},
                  {"params": [p for n, p in self.params.items() if dims[n] < 2], "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=tc.adam_eps)
        skeleton = self.skeleton

        def loss_of(params, buffers, x, y):
            ctx = ForwardContext(position=skeleton.position, need_logits=False)
            _, loss, ctx = functional_call(skeleton, (params, buffers), (x, y, ctx))
            return loss, ctx.metrics["ce_loss"].detach()

        self.step_fn = vmap(grad_and_value(loss_of, has_aux=True), randomness="different")

    def step(self) -> list[float]:
        import torch

        xs, ys = zip(*(r.batches.next_train() for r in self.runs))
        x, y = torch.stack(xs).to(self.device), torch.stack(ys).to(self.device)
        with self.precision.autocast(self.device):
            grads, (_, ce) = self.step_fn(self.params, self.buffers, x, y)
        k = x.shape[0]
        scale = self.clip_scales(grads, k)
        for n, p in self.params.items():
            g = grads[n]
            p.grad = g * scale.to(g.dtype).reshape(k, *([1] * (g.dim() - 1)))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return [float(v) for v in ce]


    def clip_scales(self, grads: dict, k: int):
        """Each seed's gradient scale: ``clip_grad_norm_``'s, from that seed's own norm over all its parameters."""
        import torch

        norms = torch.stack([g.detach().float().reshape(k, -1).pow(2).sum(1) for g in grads.values()]).sum(0).sqrt()
        return (self.clip / (norms + 1e-6)).clamp(max=1.0)


def _timed(step, device, warmup: int, steps: int) -> tuple[float, list[list[float]]]:
    """The median wall time of ``step`` over ``steps`` timed calls after ``warmup``, and every call's losses."""
    losses, times = [], []
    for i in range(warmup + steps):
        _sync(device)
        t = time.perf_counter()
        losses.append(step())
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return statistics.median(times), losses


def _one_process(cell, warmup: int, steps: int, barrier, out) -> None:
    """A child of the concurrent way: one model, timed once every child is ready."""
    try:
        (run,) = _prepared([cell])
        for _ in range(warmup):
            _apart_step([run])
        _sync(run.device)
        barrier.wait(timeout=600)
        out.put(_timed(lambda: _apart_step([run]), run.device, 0, steps)[0])
    except Exception as exc:  # noqa: BLE001 - the parent reports it; a child never hangs it
        barrier.abort()
        out.put(f"{type(exc).__name__}: {exc}")


def _concurrent(cells: list, warmup: int, steps: int) -> tuple[float | None, str | None]:
    ctx = multiprocessing.get_context("spawn")  # a fresh process per model, CUDA-safe
    barrier, out = ctx.Barrier(len(cells)), ctx.Queue()
    procs = [ctx.Process(target=_one_process, args=(c, warmup, steps, barrier, out), daemon=True) for c in cells]
    for p in procs:
        p.start()
    got: list = []
    while len(got) < len(procs):
        try:
            got.append(out.get(timeout=1.0))
        except queue.Empty:
            ended = [p.exitcode for p in procs if p.exitcode is not None]
            if len(ended) == len(procs) and out.empty():  # a child that died before its figure: never wait for ever
                barrier.abort()
                got.append(f"a process ended without its figure (exit codes {sorted(ended)})")
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
    errors = [g for g in got if isinstance(g, str)]
    if errors:
        return None, errors[0]
    return max(float(g) for g in got), None


def run_seeds_bench(seeds: int = 4, steps: int = 20, warmup: int = 3, check: int = 3,
                    overrides: list[str] | None = None, concurrent: bool = True) -> dict[str, Any]:
    """Time the three ways (module docstring) and compare the first ``check`` steps' losses."""
    cells = seed_cells(seeds, overrides)
    runs = _prepared(cells)
    device = runs[0].device
    apart_s, apart_losses = _timed(lambda: _apart_step(runs), device, warmup, steps)
    out: dict[str, Any] = {
        "cell": str(cells[0].label), "seeds": seeds, "steps": steps, "warmup": warmup,
        "device": str(device), "kernels": runs[0].kernels.name, "precision": runs[0].precision.name,
        "apart_step_s": apart_s, "stacked_step_s": None, "stacked_error": None,
        "concurrent_step_s": None, "concurrent_error": None if concurrent else "not run",
    }
    del runs
    try:
        stacked = Stacked(_prepared(cells))  # from the same initial weights and batches as apart's
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            stacked_s, stacked_losses = _timed(stacked.step, device, warmup, steps)
        # an op without a batching rule runs once per seed in a loop (torch's "performance drop" warning)
        out["unbatched_ops"] = sorted({m.group(1) for w in caught
                                       if (m := re.search(r"batching rule for (\S+?)\.", str(w.message)))})
    except Exception as exc:  # noqa: BLE001 - an op without a batching rule, a policy not stacked: said, not raised
        out["stacked_error"] = f"{type(exc).__name__}: {exc}"
    else:
        n = min(check, len(apart_losses))
        diffs = [abs(a - b) for i in range(n) for a, b in zip(apart_losses[i], stacked_losses[i])]
        out.update(stacked_step_s=stacked_s, speedup_vs_apart=apart_s / stacked_s,
                   loss_check={"steps": n, "max_abs_diff": max(diffs), "bitwise": max(diffs) == 0.0})
    if concurrent:
        out["concurrent_step_s"], out["concurrent_error"] = _concurrent(cells, warmup, steps)
        if out["concurrent_step_s"] and out["stacked_step_s"]:
            out["speedup_vs_concurrent"] = out["concurrent_step_s"] / out["stacked_step_s"]
    out["load"] = os.getloadavg()[0]
    return out
