"""Learning health of a run: did it learn anything, and how unstable was its loss?

Three figures per run, beside its losses in the store:

- ``unigram_floor``: the cross-entropy (nats per token) of the validation
  split under the training split's unigram distribution (token frequencies,
  add-one smoothed). It is the loss of a model that learned token
  frequencies and nothing about context: the dataset's unigram-entropy floor.
  The trainer computes it from the run's own data and stores it in the run's
  ``info.json`` (a data fact, like the fingerprint), so it follows the
  dataset and its tokenizer.
- ``did_not_learn``: 1 when the final ``val_loss`` is within
  ``DID_NOT_LEARN_MARGIN`` nats of that floor (or above it), else 0. Such a
  run finished but only found token frequencies (a post-LN stack at a high
  learning rate without warm-up is the classic case); the statistics never
  rank it as a normal result (abl.analysis.stats.analyse).
- ``loss_spikes`` and ``max_loss_spike``: a spike is a training step whose
  ``train_loss`` exceeds the median of the previous ``SPIKE_WINDOW`` steps by
  more than ``max(SPIKE_MIN_NATS, SPIKE_REL * that median, SPIKE_SIGMAS *
  their robust standard deviation)`` (the last term keeps the batch-to-batch
  noise of small batches from counting); consecutive spiking steps are one
  spike. ``max_loss_spike`` is the largest such excess
  over the whole run (0 when the loss never rose above its recent median).

And whether its speed figures were measured on a contended machine:

- ``contended`` (``abl.analysis.sections.CONTENDED``): 1 when the mean 1-minute load
  average per core over the training loop (``load_per_core``) exceeded
  ``MAX_LOAD_PER_CORE`` (1.25: a grid that fills every core with its own
  workers shows about 1 per core from them and the parent's polling, which is
  the intended use, not contention), or, for a run on the CPU, when the process got less
  than ``MIN_CPU_UTIL`` of the CPU seconds its threads could have used
  (``cpu_util``); else 0. On a GPU the CPU share says nothing about the
  device's speed, so only the load counts there. A run recorded before these
  two metrics existed gets no ``contended`` row (it is simply not marked).

All of them become metric rows when the run's folder is ingested
(``derived_rows``), so a store rebuilt from the folders gets them too. Pure numpy; nothing here imports torch.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from .sections import CONTENDED

DID_NOT_LEARN_MARGIN = 0.1  # nats
# a model on a task's plateau scores around its no-recall baseline, above it on about half the evaluations
# (256 examples x 2 answers: a binomial standard error near 0.02): within this margin it did not learn
DID_NOT_LEARN_ACCURACY_MARGIN = 0.02
NO_RECALL_BASELINE = "no_recall_baseline"  # the metric suffix of a task's baseline (abl.data.tasks.baseline_metric)
SPIKE_WINDOW = 10
SPIKE_MIN_NATS = 0.1
SPIKE_REL = 0.1
SPIKE_SIGMAS = 6.0  # robust standard deviations of the window (1.4826 x median absolute deviation)

MAX_LOAD_PER_CORE = 1.25  # clearly more runnable threads than cores, on average over the loop
MIN_CPU_UTIL = 0.75  # a CPU run that got less than this share of its threads' time waited for the CPU

HEALTH_METRICS = ("unigram_floor", "did_not_learn", "loss_spikes", "max_loss_spike")


def contended(load_per_core: float | None, cpu_util: float | None, on_cpu: bool) -> bool | None:
    """Whether a run's loop shared its machine (the rule in the module docstring); None without a figure."""
    figures = [v for v in (load_per_core, cpu_util if on_cpu else None) if v is not None and math.isfinite(v)]
    if not figures:
        return None
    if load_per_core is not None and math.isfinite(load_per_core) and load_per_core > MAX_LOAD_PER_CORE:
        return True
    return bool(on_cpu and cpu_util is not None and math.isfinite(cpu_util) and cpu_util < MIN_CPU_UTIL)


def unigram_floor(train: np.ndarray, val: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy (nats) of ``val`` under the add-one smoothed unigram distribution of ``train``."""
    counts = np.bincount(np.asarray(train, dtype=np.int64), minlength=vocab_size).astype(float) + 1.0
    logp = np.log(counts / counts.sum())
    val_counts = np.bincount(np.asarray(val, dtype=np.int64), minlength=vocab_size).astype(float)
    return float(-(val_counts[:len(logp)] * logp[:len(val_counts)]).sum() / max(1.0, val_counts.sum()))


def did_not_learn(final_val_loss: float, floor: float, margin: float = DID_NOT_LEARN_MARGIN) -> bool:
    """True when the final validation loss is no more than ``margin`` nats below the unigram floor."""
    return not (final_val_loss < floor - margin)


def at_baseline(accuracy: float, baseline: float, margin: float = DID_NOT_LEARN_ACCURACY_MARGIN) -> bool:
    """True when a task accuracy is no more than ``margin`` above the task's no-recall baseline."""
    return not (accuracy > baseline + margin)


def _task_did_not_learn(rows: list[tuple[int, str, float]]) -> bool | None:
    """A task run's flag from its final accuracy and no-recall baseline (None: no such pair of metrics)."""
    last: dict[str, tuple[int, float]] = {}
    for step, name, value in rows:
        if value is not None and math.isfinite(value) and (name not in last or step >= last[name][0]):
            last[name] = (step, value)
    suffix = "_" + NO_RECALL_BASELINE
    for name, (_, floor) in last.items():
        prefix = name[:-len(suffix)]
        if name.endswith(suffix) and not prefix.startswith("probe_") and f"{prefix}_accuracy" in last:
            return at_baseline(last[f"{prefix}_accuracy"][1], floor)
    return None


def loss_spikes(losses: Iterable[float], window: int = SPIKE_WINDOW, min_nats: float = SPIKE_MIN_NATS,
                rel: float = SPIKE_REL, sigmas: float = SPIKE_SIGMAS) -> tuple[int, float]:
    """(number of spikes, largest excess over the running median) of a training-loss series in step order."""
    x = np.asarray([v for v in losses if v is not None and math.isfinite(v)], dtype=float)
    count, biggest, inside = 0, 0.0, False
    for t in range(1, len(x)):
        w = x[max(0, t - window):t]
        ref = float(np.median(w))
        noise = 1.4826 * float(np.median(np.abs(w - ref)))
        excess = x[t] - ref
        biggest = max(biggest, excess)
        spiking = excess > max(min_nats, rel * abs(ref), sigmas * noise)
        if spiking and not inside:
            count += 1
        inside = spiking
    return count, float(biggest)


def derived_rows(rows: list[tuple[int, str, float]], info: dict | None = None) -> list[tuple[int, str, float]]:
    """The health rows of a run from its metric rows and its info.json (see the module docstring),
    at its last step."""
    if not rows:
        return []
    last = max(step for step, _, _ in rows)
    train = sorted((s, v) for s, n, v in rows if n == "train_loss")
    out: list[tuple[int, str, float]] = []
    given = (info or {}).get("unigram_floor")
    if isinstance(given, (int, float)) and not any(n == "unigram_floor" for _, n, _ in rows):
        rows = [*rows, (last, "unigram_floor", float(given))]
        out.append((last, "unigram_floor", float(given)))
    if train:
        n, biggest = loss_spikes(v for _, v in train)
        out += [(last, "loss_spikes", float(n)), (last, "max_loss_spike", biggest)]
    val = [(s, v) for s, n, v in rows if n == "val_loss" and v is not None]
    floor = [v for _, n, v in rows if n == "unigram_floor" and v is not None]
    task_flag = _task_did_not_learn(rows)
    if task_flag is not None:
        out.append((last, "did_not_learn", float(task_flag)))
    elif val and floor:
        final = max(val)[1]
        if math.isfinite(final):
            out.append((last, "did_not_learn", float(did_not_learn(final, floor[-1]))))
    share = {n: v for _, n, v in sorted(rows, key=lambda r: r[0]) if n in ("load_per_core", "cpu_util")}
    on_cpu = (info or {}).get("device_type", "cpu") == "cpu"
    busy = contended(share.get("load_per_core"), share.get("cpu_util"), on_cpu)
    if busy is not None and not any(n == CONTENDED for _, n, _ in rows):
        out.append((last, CONTENDED, float(busy)))
    return out
