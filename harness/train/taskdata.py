"""Batches and accuracy metrics of tasks (abl.data.tasks): what the trainer and the evaluations call.

``make_batches`` gives the trainer ``TaskBatches`` for a task (``Batches`` for
token data); ``task_metrics`` is called at every evaluation; ``probe_metrics``
is the ``probes`` post-training evaluation (``eval.probes``).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch

from ..contracts.registry import Registry
from ..data.corpus import Batches
from ..data.tasks import IGNORE_INDEX, Examples, Task, baseline_metric, metric_prefix
from ..model.decoder import ForwardContext

VAL_STREAM = 0x7A5C  # the validation examples' RNG stream tag (independent of the training seed)
MIN_VAL_STREAM_EXAMPLES = 8  # examples in ``TaskBatches.val``, the flat stream decode/extrapolation read


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

    def __init__(self, task: Task, context: int, batch_size: int, seed: int, stream: int = 0,
                 val_batch_size: int | None = None):
        self.torch = torch
        self.task = task
        self.context = context
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size or batch_size  # an evaluation batch: the global batch (abl.data.corpus)
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
        x, y = self._tensors(self.validation(n_batches * self.val_batch_size))
        for i in range(0, x.size(0), self.batch_size):
            yield x[i:i + self.batch_size], y[i:i + self.batch_size]

    def val_targets(self, n_batches: int):
        return self._tensors(self.validation(n_batches * self.val_batch_size))[1]


def make_batches(data: Any, context: int, batch_size: int, seed: int, stream: int = 0,
                 val_batch_size: int | None = None) -> Batches:
    """The trainer's batches: ``TaskBatches`` for a task, ``Batches`` for token data."""
    if isinstance(data, Task):
        return TaskBatches(data, context, batch_size, seed, stream, val_batch_size)
    return Batches(data, context, batch_size, seed, stream, val_batch_size)


# ---------------------------------------------------------------- accuracy


def _batched(x: torch.Tensor, y: torch.Tensor, bs: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for i in range(0, x.size(0), bs):
        yield x[i:i + bs], y[i:i + bs]


def accuracy_metrics(model: Any, batches: TaskBatches, n_examples: int, precision: Any, device: Any,
                     prefix: str, with_loss: bool = False) -> dict[str, float]:
    """Greedy exact-match accuracy of ``model`` on every evaluation slice of ``batches.task``.

    Returns ``<prefix>_accuracy`` (every marked position of every slice),
    ``<prefix>_example_accuracy`` (examples with every marked position right),
    ``<prefix>_accuracy_<slice>`` per named slice, the task's no-recall
    baseline when it declares one (``<prefix>_no_recall_baseline``, pooled
    over the slices by their marked positions as the accuracy is, and
    ``..._<slice>`` per named slice) and, with ``with_loss``,
    ``<prefix>_loss`` (mean cross-entropy on the marked positions of the
    training distribution's validation examples).
    """
    import torch.nn.functional as F

    was_training = model.training
    model.eval()
    right = marked = good = examples = 0
    out: dict[str, float] = {}
    floors: list[tuple[float | None, int]] = []  # (the slice's baseline, its marked positions)
    try:
        with torch.no_grad():
            for i, (name, slice_params) in enumerate(batches.task.slices()):
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
                floor = batches.task.no_recall_baseline(batches.context, **slice_params)
                floors.append((floor, s_marked))
                if name:
                    out[f"{prefix}_accuracy_{name}"] = s_right / max(1, s_marked)
                    if floor is not None:
                        out[baseline_metric(prefix, name)] = float(floor)
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
    known = [(f, m) for f, m in floors if f is not None]
    if floors and len(known) == len(floors):  # every slice declares its baseline: pooled by answer positions
        out[baseline_metric(prefix)] = sum(f * m for f, m in known) / max(1, sum(m for _, m in known))
    return out


def task_metrics(model: Any, batches: Batches, n_batches: int, precision: Any, device: Any,
                 dataset: str) -> dict[str, float]:
    """The task's accuracy metrics at an evaluation (``n_batches`` batches per slice); {} for token data."""
    if not isinstance(batches, TaskBatches):
        return {}
    return accuracy_metrics(model, batches, n_batches * batches.val_batch_size, precision, device,
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
