"""Tasks: datasets whose examples mark the positions that count (their batches and metrics: abl.train.taskdata).

A dataset plugin may return a ``Task`` instead of a ``TokenData``: a generator
of fixed-length examples (``Examples``: inputs, and a target at each position
that counts, ``IGNORE_INDEX`` elsewhere). The trainer then draws its batches
from the task (``abl.train.taskdata.TaskBatches``, a drop-in for ``abl.data.corpus.Batches``), the loss
is taken on the marked positions only (the cross-entropy skips
``IGNORE_INDEX``, on the torch and the Triton paths alike), and every
evaluation also records the task's accuracy metrics (``abl.train.taskdata.task_metrics``):

- ``<name>_accuracy``: exact-match accuracy of the greedy prediction over
  every marked position of every evaluation slice;
- ``<name>_example_accuracy``: the share of examples with every marked
  position right;
- ``<name>_accuracy_<slice>``: the same per evaluation slice, for a task that
  defines named slices (e.g. MQAR's ``pairs_8``: accuracy by number of pairs);
- ``<name>_no_recall_baseline`` (and ``..._<slice>``): the task's declared
  no-recall baseline (``Task.no_recall_baseline``), pooled over the slices
  by their answer positions as the accuracy is. A run trained on the task
  whose accuracy ends at or near it is flagged "did not learn"
  (abl.analysis.health), as a text run at its unigram floor is.

``<name>`` is the dataset's registered name. A grid may also evaluate a model
trained on anything else on tasks after training: ``eval.probes = ["mqar"]``
(the ``probes`` evaluation, abl.train.evaluations) records the same metrics prefixed
``probe_`` (``probe_mqar_accuracy``, ...) plus ``probe_<name>_loss``, with the
probe's vocabulary cut to the model's when it is larger.

They are ordinary metric rows, so the store, the statistics engine, the report
and the dashboard treat them like any other metric. The sequence length of a
task is always the model's ``model.context``. Examples are deterministic: the
training stream depends only on the seed (as for text data), the validation
examples only on the task's parameters and the context (the same for every
cell). Nothing here names a task; the tasks are plugins (plugins/probes.py).

This module does not import torch (the config layer uses it); the batches and
the accuracy metrics are in abl.train.taskdata.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..analysis.health import NO_RECALL_BASELINE
from ..contracts.registry import Registry, RegistryError
from .corpus import DataError

IGNORE_INDEX = -100  # the target of a position that does not count (torch's cross-entropy default)
GENERATOR_VERSION = 1  # part of every task's fingerprint: bump when a generator's output changes


@dataclass
class Examples:
    """``n`` examples of length ``T``: ``inputs`` and ``targets``, int64 ``[n, T]``.

    ``targets[i, t]`` is what the model should predict at position ``t`` (the
    answer), or ``IGNORE_INDEX`` where position ``t`` does not count.
    """

    inputs: np.ndarray
    targets: np.ndarray

    @property
    def mask(self) -> np.ndarray:
        """bool ``[n, T]``: the positions that count (the loss and the accuracy are taken on them only)."""
        return self.targets != IGNORE_INDEX

    def __len__(self) -> int:
        return int(self.inputs.shape[0])


class Task:
    """A synthetic task: a dataset plugin whose factory is a ``Task`` subclass.

    Register the subclass itself as the dataset's factory
    (``register("dataset", "mqar", MQAR, params=..., check=MQAR.config_check)``)
    so that ``eval.probes`` can tell a task from a text dataset before
    anything runs. The constructor takes the registered parameters as keyword
    arguments, one of them ``vocab_size``, and hands them all to
    ``Task.__init__``. A subclass implements:

    - ``generate(n, seq_len, rng, **slice_params) -> Examples``: ``n``
      examples drawn with the numpy Generator ``rng``; with no slice
      parameters, the training distribution;
    - ``problems(seq_len) -> list[str]``: why the task cannot run at this
      sequence length (empty when it can);
    - optionally ``slices() -> [(name, slice_params)]``: the evaluation sets;
      the default is one unnamed set, the training distribution;
    - optionally ``no_recall_baseline(seq_len, **slice_params) -> float``:
      the accuracy a model reaches without the capability the task probes
      (MQAR: without matching a query to its key), the floor below which a
      run "did not learn"; the default, None, declares none.
    """

    tokenizer = "task"

    def __init__(self, vocab_size: int, **params: Any):
        self.vocab_size = int(vocab_size)
        self.params: dict[str, Any] = {"vocab_size": self.vocab_size, **params}

    # ------------------------------------------------------------ for subclasses

    def generate(self, n: int, seq_len: int, rng: np.random.Generator, **slice_params: Any) -> Examples:
        raise NotImplementedError

    def problems(self, seq_len: int) -> list[str]:
        return []

    def slices(self) -> list[tuple[str, dict[str, Any]]]:
        return [("", {})]

    def no_recall_baseline(self, seq_len: int, **slice_params: Any) -> float | None:
        return None

    # ------------------------------------------------------------ derived

    @property
    def fingerprint(self) -> str:
        """The task's identity: class, generator version and parameters (its data is generated)."""
        ident = {"task": f"{type(self).__module__}.{type(self).__qualname__}", "version": GENERATOR_VERSION,
                 "params": self.params}
        return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()

    @property
    def description(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"synthetic task {type(self).__name__}({args}), generated from the seed"

    def check(self, context: int) -> None:
        """Raise DataError if the task cannot run at sequence length ``context`` (TokenData's interface)."""
        errs = self.problems(context)
        if errs:
            raise DataError("; ".join(errs))

    def with_vocab(self, vocab_size: int) -> Task:
        """The same task over a vocabulary of ``vocab_size`` tokens."""
        return type(self)(**{**self.params, "vocab_size": vocab_size})

    @classmethod
    def config_check(cls, model_config: Any, params: dict[str, Any]) -> list[str]:
        """A registry ``check``: the task's problems at ``model.context`` (reported before any training)."""
        try:
            task = cls(**params)
        except (TypeError, ValueError) as exc:
            return [str(exc)]
        return task.problems(model_config.context)


def is_task_factory(factory: Callable) -> bool:
    return isinstance(factory, type) and issubclass(factory, Task)


def task_names(registry: Registry) -> list[str]:
    """The registered datasets that are tasks."""
    return sorted(name for (axis, name), c in registry.components.items()
                  if axis == "dataset" and is_task_factory(c.factory))


def metric_prefix(dataset: str, probe: bool = False) -> str:
    return f"probe_{dataset}" if probe else dataset


def baseline_metric(prefix: str, slice_name: str = "") -> str:
    """The metric holding a task's no-recall baseline: ``<prefix>_no_recall_baseline[_<slice>]``."""
    return f"{prefix}_{NO_RECALL_BASELINE}" + (f"_{slice_name}" if slice_name else "")


# ---------------------------------------------------------------- config: eval.probes


def resolve_probes(raw: dict, names: Any, model_config: Any, registry: Registry) -> tuple[list[dict], list[str]]:
    """``eval.probes`` -> ``[{"name", "params"}]`` (params from the grid's ``[dataset.<name>]`` table), or errors."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return [], [f"eval.probes must be a list of task names, e.g. [\"mqar\"], got {names!r}"]
    tables: dict = raw["dataset"] if isinstance(raw.get("dataset"), dict) else {}
    specs, errs = [], []
    for name in dict.fromkeys(names):
        try:
            comp = registry.get("dataset", name)
        except RegistryError as exc:
            errs.append(f"eval.probes: {exc}")
            continue
        if not is_task_factory(comp.factory):
            errs.append(f"eval.probes: dataset {name!r} is not a task (probes: {', '.join(task_names(registry))})")
            continue
        given = tables.get(name, {}) if isinstance(tables.get(name), dict) else {}
        params, e = comp.resolve_params(given, f"dataset.{name}")
        errs += e
        if not e and comp.check is not None:
            errs += [f"eval.probes: {name}: {m}" for m in registry.call_with_position(comp.check, model_config, params)
                     or []]
        specs.append({"name": name, "params": params})
    return specs, errs
