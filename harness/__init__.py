"""abl: a plugin-based benchmark and ablation harness for decoder-only LMs.

The public surface for plugin authors is this package: everything a plugin
needs is importable as ``from abl import ...``. Names load on first use, so
``import abl`` (and ``abl --help``) does not import torch.

Registering components
    ``hookimpl`` (mark a hook implementation), ``Param`` (a typed component
    parameter), ``RegistryError``, ``AXES`` (each axis and its factory signature).
The model skeleton's interfaces
    ``ModelConfig``, ``ForwardContext`` (per-forward state: position, decode
    cache, aux losses, metrics), ``PositionEncoding`` (the one interface between
    positions and mixers), ``residual_out`` (depth-scaled init of a projection
    into the residual stream), ``KVCache`` (the decode cache a mixer appends to).
Kernels
    ``use_triton()`` (whether the active kernel backend is Triton; a component
    with a kernel asks it in ``forward``).
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
    switch it off under ``[eval]``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_PUBLIC: dict[str, str] = {
    "hookimpl": "abl.hookspecs",
    "hookspec": "abl.hookspecs",
    "Param": "abl.registry",
    "RegistryError": "abl.registry",
    "AXES": "abl.registry",
    "ModelConfig": "abl.config",
    "ForwardContext": "abl.model",
    "PositionEncoding": "abl.model",
    "residual_out": "abl.model",
    "KVCache": "abl.model",
    "use_triton": "abl.kernels",
    "Cost": "abl.cost",
    "linear_flops": "abl.cost",
    "linear_params": "abl.cost",
    "Precision": "abl.precision",
    "TokenData": "abl.data",
    "TextCorpus": "abl.data",
    "Tokenizer": "abl.tokenstore",
    "DataError": "abl.data",
    "from_documents": "abl.data",
    "from_text_file": "abl.data",
    "from_token_bin": "abl.data",
    "byte_tokens": "abl.data",
    "register_evaluation": "abl.evaluations",
    "Task": "abl.tasks",
    "Examples": "abl.tasks",
    "IGNORE_INDEX": "abl.tasks",
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
    from .config import ModelConfig
    from .cost import Cost, linear_flops, linear_params
    from .data import DataError, TextCorpus, TokenData, byte_tokens, from_documents, from_text_file, from_token_bin
    from .evaluations import register_evaluation
    from .hookspecs import hookimpl, hookspec
    from .kernels import use_triton
    from .model import ForwardContext, KVCache, PositionEncoding, residual_out
    from .precision import Precision
    from .registry import AXES, Param, RegistryError
    from .tokenstore import Tokenizer
    from .tasks import IGNORE_INDEX, Examples, Task
