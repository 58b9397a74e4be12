"""Costs measured instead of predicted, for a cell with a component that declares no cost function.

``register(..., cost=fn)`` is optional for a plugin. Without it the cost model
(abl.model.costmodel) cannot add the cell up from its parts, so the cell is
built once per shape on the CPU and measured:

- parameters: counted on the built model (exact, as the cost model's are);
- FLOPs: one forward and one backward on a random batch of the cell's shape
  under ``torch.utils.flop_counter.FlopCounterMode`` (abl.model.flops), on the
  torch reference path. These are the FLOPs as executed: there is no separate
  "useful" count, so MFU uses them as they are;
- memory: the peak of live tensor storages over one whole training step
  (forward, backward, an AdamW step; the second, once the optimizer's state
  exists, as a run tracks it) by torch's ``MemTracker`` (abl.model.memory),
  which is what a run records as ``peak_tensor_bytes``.
  With it unavailable the peak is left out.

The step runs on fake tensors (torch's ``FakeTensorMode``: shapes, dtypes and
storages without their memory), so measuring a cell far larger than this
machine allocates nothing of it: memory admission (abl.run.admission) measures
a cell that cannot fit before refusing it. The figures are those of real
tensors (the same ops, the same storage sizes). A model that cannot run on fake
tensors (an op whose output depends on the data, such as ``.item()``) is
measured on real CPU tensors instead.

The decoding cache is not measured (no figure rather than a wrong one). Every
figure of one shape (the model config with its vocabulary, the components other
than the dataset, the batch) is measured once per process: the seeds of a grid
and cells that differ only in their data or learning rate share it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..contracts.config import config_hash
from ..contracts.registry import Registry

_measured: dict[str, dict[str, Any]] = {}

SOURCE_NOTE = ("measured: a component declares no cost function, so FLOPs and memory come from one training "
               "step of the built model on the CPU (torch's FLOP counter and MemTracker, on fake tensors)")


def _shape(model, components: dict[str, Any], batch_size: int) -> str:
    return config_hash({"model": dataclasses.asdict(model),
                        "components": {k: v for k, v in components.items() if k != "dataset"},
                        "batch_size": batch_size})


def measure_model(model, components: dict[str, Any], registry: Registry, *, batch_size: int,
                  activation_bytes: int) -> dict[str, Any]:
    """The keys of ``abl.model.costmodel.predict_model`` that can be measured, plus
    ``cost_source = "measured"``; the others are None. ``model.vocab_size`` must be set."""
    key = _shape(model, components, batch_size)
    if key not in _measured:
        _measured[key] = _measure(model, components, registry, batch_size, activation_bytes)
    return dict(_measured[key])


def _measure(model, components: dict[str, Any], registry: Registry, batch_size: int,
             activation_bytes: int) -> dict[str, Any]:
    """One shape's figures: on fake tensors (no memory of the model's), else on real ones."""
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ImportError:  # a torch without fake tensors: real ones
        return _measure_step(model, components, registry, batch_size, activation_bytes)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            return _measure_step(model, components, registry, batch_size, activation_bytes)
    except Exception:  # noqa: BLE001 - e.g. a data-dependent op; real tensors raise what is really wrong
        return _measure_step(model, components, registry, batch_size, activation_bytes)


def _measure_step(model, components: dict[str, Any], registry: Registry, batch_size: int,
                  activation_bytes: int) -> dict[str, Any]:
    import torch

    from ..kernels import TORCH
    from .decoder import DecoderLM, ForwardContext
    from .flops import flop_counter
    from .memory import StepMemory

    cpu = torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        core = DecoderLM(model, components, registry, kernel_backend=TORCH)
    spec = components["precision"]
    precision = registry.get("precision", spec["name"]).factory(**dict(spec.get("params") or {}))
    precision.setup(core, cpu)
    core.train()
    v, t = model.vocab_size, model.context
    x = torch.randint(0, v, (batch_size, t), generator=gen)
    y = torch.randint(0, v, (batch_size, t), generator=gen)

    def ctx() -> ForwardContext:
        return ForwardContext(position=core.position, need_logits=False)

    with flop_counter() as fwd_counter, precision.autocast(cpu):
        _, loss, _ = core(x, y, ctx())
    with flop_counter() as bwd_counter:
        loss.backward()
    core.zero_grad(set_to_none=True)
    params = [p for p in core.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)

    def step() -> None:  # as abl.train.loop's step: forward, then the old gradients go, backward, update
        with precision.autocast(cpu):
            _, loss, _ = core(x, y, ctx())
        optimizer.zero_grad(set_to_none=True)
        precision.backward(loss)
        precision.step(optimizer, params, 0.0)

    step()  # the optimizer's state exists from here on, as on a run's tracked (second) step
    with StepMemory(core, optimizer, x, y) as mem:
        step()
    tokens = batch_size * t
    fwd, bwd = float(fwd_counter.get_total_flops()), float(bwd_counter.get_total_flops())
    n_params = core.n_params()
    n_non_emb = core.n_params(non_embedding=True)
    static = 4 * n_params * 4 + (activation_bytes * n_params if activation_bytes < 4 else 0)
    peak = float(mem.peak) if mem.peak is not None else None
    return {
        "cost_source": "measured",
        "cost_note": SOURCE_NOTE + ("" if peak is not None else f"; {mem.why}"),
        "vocab_size": v,
        "tokens_per_step": tokens,
        "activation_dtype_bytes": activation_bytes,
        "n_params": n_params,
        "n_params_embedding": n_params - n_non_emb,
        "n_params_non_embedding": n_non_emb,
        "flops_per_token": fwd / tokens,
        "useful_flops_per_token": fwd / tokens,
        "train_flops_per_token": (fwd + bwd) / tokens,
        "useful_train_flops_per_token": (fwd + bwd) / tokens,
        "flops_6n_per_token": 6.0 * n_non_emb,
        "forward_flops_per_step": fwd,
        "flops_per_step": fwd + bwd,
        "useful_flops_per_step": fwd + bwd,
        "activation_bytes_per_token": None,
        "activation_bytes_per_step": None,
        "kv_cache_bytes_per_token": None,
        "state_bytes_per_sequence": None,
        "decode_cache_bytes_per_sequence": None,
        "static_bytes": static,
        "train_peak_bytes": peak,
        "parts": [],
    }
