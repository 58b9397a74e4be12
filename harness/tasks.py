"""Tasks: datasets whose examples mark the positions that count, and their accuracy metrics.

A dataset plugin may return a ``Task`` instead of a ``TokenData``: a generator
of fixed-length examples (``Examples``: inputs, and a target at each position
that counts, ``IGNORE_INDEX`` elsewhere). The trainer then draws its batches
from the task (``TaskBatches``, a drop-in for ``abl.data.Batches``), the loss
is taken on the marked positions only (the cross-entropy skips
``IGNORE_INDEX``, on the torch and the Triton paths alike), and every
evaluation also records the task's accuracy metrics (``task_metrics``):

- ``<name>_accuracy``: exact-match accuracy of the greedy prediction over
  every marked position of every evaluation slice;
- ``<name>_example_accuracy``: the share of examples with every marked
  position right;
- ``<name>_accuracy_<slice>``: the same per evaluation slice, for a task that
  defines named slices (e.g. MQAR's ``pairs_8``: accuracy by number of pairs).

``<name>`` is the dataset's registered name. A grid may also evaluate a model
trained on anything else on tasks after training: ``eval.probes = ["mqar"]``
(the ``probes`` evaluation, abl.evaluations) records the same metrics prefixed
``probe_`` (``probe_mqar_accuracy``, ...) plus ``probe_<name>_loss``, with the
probe's vocabulary cut to the model's when it is larger.

They are ordinary metric rows, so the store, the statistics engine, the report
and the dashboard treat them like any other metric. The sequence length of a
task is always the model's ``model.context``. Examples are deterministic: the
training stream depends only on the seed (as for text data), the validation
examples only on the task's parameters and the context (the same for every
cell). Nothing here names a task; the tasks are plugins (plugins/probes.py).

This module does not import torch at import time (the config layer uses it).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from .data import Batches, DataError
from .registry import Registry, RegistryError

if TYPE_CHECKING:  # pragma: no cover
    import torch

IGNORE_INDEX = -100  # the target of a position that does not count (torch's cross-entropy default)
GENERATOR_VERSION = 1  # part of every task's fingerprint: bump when a generator's output changes
VAL_STREAM = 0x7A5C  # the validation examples' RNG stream tag (independent of the training seed)
MIN_VAL_STREAM_EXAMPLES = 8  # examples in ``TaskBatches.val``, the flat stream decode/extrapolation read


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
      the default is one unnamed set, the training distribution.
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


# ---------------------------------------------------------------- config: eval.probes


def resolve_probes(raw: dict, names: Any, model_config: Any, registry: Registry) -> tuple[list[dict], list[str]]:
    """``eval.probes`` -> ``[{"name", "params"}]`` (params from the grid's ``[dataset.<name>]`` table), or errors."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return [], [f"eval.probes must be a list of task names, e.g. [\"mqar\"], got {names!r}"]
    tables = raw.get("dataset") if isinstance(raw.get("dataset"), dict) else {}
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


# ---------------------------------------------------------------- batches


def _rng(*entropy: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(list(entropy)))


class TaskBatches(Batches):
    """``Batches`` for a task: seeded training examples, fixed validation examples.

    Training: every batch is generated afresh from a numpy Generator whose
    seed is drawn from ``gen`` (the torch Generator ``Batches`` has, seeded
    the same way), so the stream depends only on the seed and a checkpoint of
    ``gen`` restores it. Validation: per evaluation slice, examples from a
    stream that depends only on the task and the context, so every cell sees
    the same ones. ``val`` is the inputs of a few validation examples laid
    end to end, the flat stream the decode and extrapolation evaluations read.
    """

    def __init__(self, task: Task, context: int, batch_size: int, seed: int, stream: int = 0):
        import torch

        self.torch = torch
        self.task = task
        self.context = context
        self.batch_size = batch_size
        self.gen = torch.Generator().manual_seed(10_007 * seed + 1 + 7_919 * stream)
        self._val: dict[tuple[int, int], Examples] = {}
        self.train = torch.empty(0, dtype=torch.long)
        flat = self.validation(MIN_VAL_STREAM_EXAMPLES).inputs.reshape(-1)
        self.val = torch.from_numpy(np.ascontiguousarray(flat, dtype=np.int64))

    def _tensors(self, ex: Examples) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.torch
        return (t.from_numpy(np.ascontiguousarray(ex.inputs, dtype=np.int64)),
                t.from_numpy(np.ascontiguousarray(ex.targets, dtype=np.int64)))

    def next_train(self):
        seed = int(self.torch.randint(0, 2 ** 62, (1,), generator=self.gen).item())
        return self._tensors(self.task.generate(self.batch_size, self.context, np.random.default_rng(seed)))

    def validation(self, n: int, slice_index: int | None = None) -> Examples:
        """``n`` fixed validation examples of the training distribution (``slice_index`` None) or of a slice."""
        key = (-1 if slice_index is None else slice_index, n)
        if key not in self._val:
            kwargs = {} if slice_index is None else self.task.slices()[slice_index][1]
            self._val[key] = self.task.generate(n, self.context, _rng(VAL_STREAM, key[0] + 1), **kwargs)
        return self._val[key]

    def val_batches(self, n_batches: int):
        x, y = self._tensors(self.validation(n_batches * self.batch_size))
        for i in range(n_batches):
            yield x[i * self.batch_size:(i + 1) * self.batch_size], y[i * self.batch_size:(i + 1) * self.batch_size]


def make_batches(data: Any, context: int, batch_size: int, seed: int, stream: int = 0) -> Batches:
    """The trainer's batches: ``TaskBatches`` for a task, ``Batches`` for token data."""
    if isinstance(data, Task):
        return TaskBatches(data, context, batch_size, seed, stream)
    return Batches(data, context, batch_size, seed, stream)


# ---------------------------------------------------------------- accuracy


def _batched(x: torch.Tensor, y: torch.Tensor, bs: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for i in range(0, x.size(0), bs):
        yield x[i:i + bs], y[i:i + bs]


def accuracy_metrics(model: Any, batches: TaskBatches, n_examples: int, precision: Any, device: Any,
                     prefix: str, with_loss: bool = False) -> dict[str, float]:
    """Greedy exact-match accuracy of ``model`` on every evaluation slice of ``batches.task``.

    Returns ``<prefix>_accuracy`` (every marked position of every slice),
    ``<prefix>_example_accuracy`` (examples with every marked position right),
    ``<prefix>_accuracy_<slice>`` per named slice and, with ``with_loss``,
    ``<prefix>_loss`` (mean cross-entropy on the marked positions of the
    training distribution's validation examples).
    """
    import torch
    import torch.nn.functional as F

    from .model import ForwardContext

    was_training = model.training
    model.eval()
    right = marked = good = examples = 0
    out: dict[str, float] = {}
    try:
        with torch.no_grad():
            for i, (name, _) in enumerate(batches.task.slices()):
                x, y = batches._tensors(batches.validation(n_examples, i))
                s_right = s_marked = 0
                for xb, yb in _batched(x, y, batches.batch_size):
                    xb, yb = xb.to(device), yb.to(device)
                    with precision.autocast(device):
                        logits, _, _ = model(xb, None, ForwardContext(position=model.position))
                    mask = yb != IGNORE_INDEX
                    hit = (logits.argmax(-1) == yb) & mask
                    s_right += int(hit.sum())
                    s_marked += int(mask.sum())
                    good += int((hit | ~mask).all(dim=1).sum())
                    examples += int(xb.size(0))
                right, marked = right + s_right, marked + s_marked
                if name:
                    out[f"{prefix}_accuracy_{name}"] = s_right / max(1, s_marked)
            if with_loss:
                total = count = 0.0
                x, y = batches._tensors(batches.validation(n_examples))
                for xb, yb in _batched(x, y, batches.batch_size):
                    xb, yb = xb.to(device), yb.to(device)
                    with precision.autocast(device):
                        logits, _, _ = model(xb, None, ForwardContext(position=model.position))
                    total += float(F.cross_entropy(logits.float().flatten(0, 1), yb.flatten(),
                                                   ignore_index=IGNORE_INDEX, reduction="sum"))
                    count += int((yb != IGNORE_INDEX).sum())
                out[f"{prefix}_loss"] = total / max(1.0, count)
    finally:
        model.train(was_training)
    out[f"{prefix}_accuracy"] = right / max(1, marked)
    out[f"{prefix}_example_accuracy"] = good / max(1, examples)
    return out


def task_metrics(model: Any, batches: Batches, n_batches: int, precision: Any, device: Any,
                 dataset: str) -> dict[str, float]:
    """The task's accuracy metrics at an evaluation (``n_batches`` batches per slice); {} for token data."""
    if not isinstance(batches, TaskBatches):
        return {}
    return accuracy_metrics(model, batches, n_batches * batches.batch_size, precision, device,
                            metric_prefix(dataset))


def probe_metrics(model: Any, cell: Any, registry: Registry, batch_size: int, n_batches: int, precision: Any,
                  device: Any) -> tuple[dict[str, float], list[str]]:
    """``eval.probes``: the trained model on each probe task (``probe_<name>_*`` metrics), with notes."""
    metrics: dict[str, float] = {}
    notes: list[str] = []
    vocab, context = model.cfg.vocab_size, cell.model.context
    for spec in cell.config.get("probes", []):
        name = spec["name"]
        task: Task = registry.get("dataset", name).factory(**spec["params"])
        if task.vocab_size > vocab:
            task = task.with_vocab(vocab)
            notes.append(f"probe {name}: vocabulary cut from {spec['params'].get('vocab_size')} to the "
                         f"model's {vocab} tokens")
        errs = task.problems(context)
        if errs:
            notes.append(f"probe {name} not run: {'; '.join(errs)}")
            continue
        batches = TaskBatches(task, context, batch_size, cell.seed)
        metrics.update(accuracy_metrics(model, batches, n_batches * batch_size, precision, device,
                                        metric_prefix(name, probe=True), with_loss=True))
    return metrics, notes
