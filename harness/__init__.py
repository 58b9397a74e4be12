"""abl: a plugin-based benchmark and ablation harness for decoder-only LMs.

The public surface for plugin authors is this package: everything a plugin
needs is importable as ``from abl import ...``. Names load on first use, so
``import abl`` (and ``abl --help``) does not import torch.

Registering components
    ``hookimpl`` (mark a hook implementation), ``Arg`` (a factory parameter's doc,
    choices and bounds: ``eps: Annotated[float, Arg("doc", min=0.0)] = 1e-5``; the
    signature is the parameter's one declaration), ``params_of`` (a signature's
    parameters, for a wrapper that passes ``**kwargs`` on), ``Param`` (a typed component
    parameter, for ``params=``, checked against the signature), ``RegistryError``,
    ``AXES`` (each axis and its factory signature).
    ``register(axis, name, factory, params=, doc=, cost=, reference=, check=,
    width=, own_init=)``: ``width`` names the float parameter ``train.match``
    turns to resize an FFN; ``own_init=True`` keeps the component's own weight init.
The model skeleton's interfaces
    ``ModelConfig``, ``ForwardContext`` (per-forward state: position, decode
    cache, aux losses, metrics), ``PositionEncoding`` (the one interface between
    positions and mixers), ``residual_out`` (depth-scaled init of a projection
    into the residual stream), ``own_init`` (mark a module whose init the
    component keeps; ``register(..., own_init=True)`` does it for a whole
    component), ``KVCache`` (the decode cache a mixer appends to).
Attention
    ``softmax_attention`` (the attention core a mixer calls: causal and
    sliding-window masks, GQA, the position's score bias, soft-capping, and the
    dispatch to the FlashAttention kernel / torch's SDPA), ``visible`` (its
    causal / sliding-window mask).
Kernels
    The ops are ``abl.kernels.<module>.<op>`` (e.g. ``abl.kernels.rmsnorm.rmsnorm``):
    each picks its Triton kernel or its torch reference from the active backend,
    so a component calls the op. ``use_triton()`` says which backend is active.
Architecture recipes
    ``Setting(path, value, source)`` (one line of a recipe), ``Scaled`` (a value computed
    from the cell's model config), ``per_head``, ``of_context``, ``of_width`` (the common ones);
    the ``register_recipes`` hook registers them (abl.contracts.recipes).
Costs
    ``Cost``, ``linear_flops``, ``linear_params`` (analytic cost functions).
Precision policies
    ``Precision`` (base class; ``compute_dtype`` is the policy's one dtype answer).
Data
    ``TextCorpus`` (text documents, what a text dataset returns), ``TokenData``
    (token ids), ``DataError``, ``from_documents``, ``from_text_file``,
    ``from_token_bin``, ``byte_tokens``; ``Tokenizer`` (base class of the
    ``tokenizer`` axis).
Tasks (synthetic probes)
    ``Task`` (a dataset that generates examples with marked answer positions),
    ``Examples``, ``IGNORE_INDEX`` (the target of a position that does not count).
Post-training evaluations
    ``register_evaluation`` (add a named step run after training; a grid can
    switch it off under ``[eval]``); the hook ``register_evaluations`` does it from a
    plugin. ``TrainedRun`` (what an evaluation is handed); the measurements abl's own
    evaluations make, for a plugin's to reuse: ``decode_metrics``,
    ``extrapolation_metrics`` (at ``EXTRAPOLATION_SCALES``), ``probe_metrics``.
Executors (hook ``register_executors``)
    ``Executor`` (base class: ``launch``, ``poll``, ``stop``, the declared
    capabilities ``local``, ``slots``, ``use_gpus``, ``free_gpus``, and ``ended``:
    how the engine ended a job, ``TIME_LIMIT``, ``STOPPED``, ``OUT_OF_MEMORY`` or
    ``ERROR`` with the engine's own words, stored as its status), ``ExecutorOptions``
    (what its factory gets), ``Job`` (one cell to run), ``LocalExecutor``,
    ``worker_command`` (the command that trains a job's cell), ``run_worker_process``
    (run it to the end, on a cluster's node).
Metrics (hook ``register_metrics``)
    ``Metric``, ``Family`` (a metric and a pattern entry of the catalogue);
    ``BUILT_IN_METRICS``, ``BUILT_IN_FAMILIES`` (abl's own, which abl.plugins.metrics registers).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_PUBLIC: dict[str, str] = {
    "hookimpl": "abl.contracts.hookspecs",
    "hookspec": "abl.contracts.hookspecs",
    "Param": "abl.contracts.registry",
    "Arg": "abl.contracts.params",
    "params_of": "abl.contracts.registry",
    "RegistryError": "abl.contracts.registry",
    "AXES": "abl.contracts.registry",
    "ModelConfig": "abl.contracts.config",
    "ForwardContext": "abl.model.decoder",
    "PositionEncoding": "abl.model.decoder",
    "residual_out": "abl.model.decoder",
    "own_init": "abl.model.decoder",
    "KVCache": "abl.model.decoder",
    "softmax_attention": "abl.model.attention",
    "visible": "abl.model.attention",
    "use_triton": "abl.kernels",
    "Setting": "abl.contracts.recipes",
    "Scaled": "abl.contracts.recipes",
    "per_head": "abl.contracts.recipes",
    "of_context": "abl.contracts.recipes",
    "of_width": "abl.contracts.recipes",
    "Cost": "abl.contracts.cost",
    "linear_flops": "abl.contracts.cost",
    "linear_params": "abl.contracts.cost",
    "Precision": "abl.contracts.precision",
    "TokenData": "abl.data.corpus",
    "TextCorpus": "abl.data.corpus",
    "Tokenizer": "abl.data.tokenstore",
    "DataError": "abl.data.corpus",
    "from_documents": "abl.data.corpus",
    "from_text_file": "abl.data.corpus",
    "from_token_bin": "abl.data.corpus",
    "byte_tokens": "abl.data.corpus",
    "register_evaluation": "abl.train.evaluations",
    "TrainedRun": "abl.train.evaluations",
    "decode_metrics": "abl.model.decode",
    "extrapolation_metrics": "abl.model.decode",
    "EXTRAPOLATION_SCALES": "abl.model.decode",
    "probe_metrics": "abl.train.taskdata",
    "Executor": "abl.run.executors",
    "ExecutorOptions": "abl.run.executors",
    "Job": "abl.run.executors",
    "LocalExecutor": "abl.run.executors",
    "worker_command": "abl.run.executors",
    "run_worker_process": "abl.run.executors",
    "Metric": "abl.analysis.metrics",
    "Family": "abl.analysis.metrics",
    "BUILT_IN_METRICS": "abl.analysis.metrics",
    "BUILT_IN_FAMILIES": "abl.analysis.metrics",
    "Task": "abl.data.tasks",
    "Examples": "abl.data.tasks",
    "IGNORE_INDEX": "abl.data.tasks",
}

__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'abl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and editors
    from .contracts.config import ModelConfig
    from .contracts.cost import Cost, linear_flops, linear_params
    from .contracts.hookspecs import hookimpl, hookspec
    from .contracts.precision import Precision
    from .contracts.recipes import Scaled, Setting, of_context, of_width, per_head
    from .contracts.params import Arg
    from .contracts.registry import AXES, Param, RegistryError, params_of
    from .data.corpus import (
        DataError,
        TextCorpus,
        TokenData,
        byte_tokens,
        from_documents,
        from_text_file,
        from_token_bin,
    )
    from .data.tasks import IGNORE_INDEX, Examples, Task
    from .data.tokenizer import Tokenizer
    from .kernels import use_triton
    from .model.attention import softmax_attention, visible
    from .model.decoder import ForwardContext, KVCache, PositionEncoding, own_init, residual_out
    from .analysis.metrics import BUILT_IN_FAMILIES, BUILT_IN_METRICS, Family, Metric
    from .model.decode import EXTRAPOLATION_SCALES, decode_metrics, extrapolation_metrics
    from .run.evaluations import TrainedRun, register_evaluation
    from .run.executors import Executor, ExecutorOptions, Job, LocalExecutor, run_worker_process, worker_command
    from .run.taskdata import probe_metrics
