"""Post-training evaluations: named steps run once on the trained model.

Each evaluation is registered (``register_evaluation``) under a name that is
also its switch in the grid's ``[eval]`` table (``abl.contracts.config.EvalConfig``):
``eval.decode = false``, or ``--set eval.extrapolation=false``, leaves it out,
and a switched-off evaluation records none of its metrics. The trainer runs
the switched-on ones in registration order on rank 0, after the last step,
and logs what they return at that step.

An evaluation is ``fn(run: TrainedRun) -> (metrics, notes)``: float metrics,
and human-readable notes for whatever it could not measure. It must not fail
the trained run: ``run_evaluations`` turns an exception into a note.

- ``decode``: prefill_tokens_per_s, decode_tokens_per_s, kv_bytes_per_token,
  kv_bytes_per_token_measured, kv_cache_bytes_measured, decode_agreement;
- ``extrapolation``: val_loss_x1, val_loss_x2, val_loss_x4, on the same target tokens with 1, 2 and 4 times
  the trained context before them (abl.model.decode); text data only (a task's loss is on its answer positions:
  the grid's validation refuses it there);
- ``probes``: its switch is the list ``eval.probes`` of task names (empty: off);
  probe_<name>_accuracy, probe_<name>_example_accuracy, probe_<name>_loss and
  per-slice probe_<name>_accuracy_<slice> (abl.data.tasks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..contracts.config import Cell, EvalConfig
from ..contracts.precision import Precision
from ..contracts.registry import Registry
from ..data.corpus import Batches, targets_fingerprint
from ..model.decode import (
    EXTRAPOLATION_SCALES,
    decode_metrics,
    extrapolation_ends,
    extrapolation_metrics,
    scored_targets,
)
from ..model.decoder import DecoderLM

Result = tuple[dict[str, float], list[str]]


@dataclass(frozen=True)
class TrainedRun:
    """What an evaluation is handed: the trained model and the run it came from."""

    model: DecoderLM
    cell: Cell
    registry: Registry
    batches: Batches  # the run's data: its validation stream and per-rank batch size
    precision: Precision
    device: torch.device


EvalFn = Callable[[TrainedRun], Result]


@dataclass(frozen=True)
class Evaluation:
    name: str  # also the eval.<name> switch
    fn: EvalFn
    metrics: tuple[str, ...]  # every name it may record
    doc: str = ""


EVALUATIONS: dict[str, Evaluation] = {}


def register_evaluation(name: str, metrics: tuple[str, ...]) -> Callable[[EvalFn], EvalFn]:
    """Decorator: register ``fn(run) -> (metrics, notes)`` as the post-training evaluation ``name``.

    ``metrics`` names everything it may record. Its switch is the boolean
    ``eval.<name>`` (a field of ``abl.contracts.config.EvalConfig``); an evaluation
    with no such field has no switch and runs in every cell.
    """

    def register(fn: EvalFn) -> EvalFn:
        if name in EVALUATIONS:
            raise ValueError(f"post-training evaluation {name!r} is registered twice")
        doc = (fn.__doc__ or "").strip().split("\n")[0]
        EVALUATIONS[name] = Evaluation(name, fn, tuple(metrics), doc)
        return fn

    return register


@register_evaluation("decode", metrics=("prefill_tokens_per_s", "decode_tokens_per_s", "kv_bytes_per_token",
                               "kv_bytes_per_token_measured", "kv_cache_bytes_measured", "decode_agreement"))
def decode(run: TrainedRun) -> Result:
    """Cached greedy decoding at the trained context: speed, cache bytes, agreement with recomputation."""
    cell = run.cell
    return decode_metrics(run.model, cell.model, cell.components, run.registry, run.batches.val, run.device,
                          run.precision)


@register_evaluation("extrapolation", metrics=tuple(f"val_loss_x{k}" for k in EXTRAPOLATION_SCALES))
def extrapolation(run: TrainedRun) -> Result:
    """Validation loss on the same targets with 1, 2 and 4 times the trained context before them."""
    if getattr(run.batches, "task", None) is not None:  # a TaskBatches (abl.run.taskdata)
        return {}, ["extrapolation metrics not recorded: the dataset is a task, whose val_loss is on its answer "
                    "positions only (set eval.extrapolation = false)"]
    # as many targets as the regular evaluation scores (its global batch, whatever the number of
    # processes), in forwards no larger than a training step's
    return extrapolation_metrics(run.model, run.batches.val, run.cell.model.context,
                                 run.cell.train.eval_batches * run.batches.val_batch_size, run.batches.batch_size,
                                 run.device, run.precision)


@register_evaluation("probes", metrics=())  # the names depend on the probes: probe_<name>_accuracy, ...
def probes(run: TrainedRun) -> Result:
    """Accuracy (and loss on the answer positions) of the trained model on each task of eval.probes."""
    from .taskdata import probe_metrics

    # the global batch: a multi-process cell probes the examples of its single-process twin
    return probe_metrics(run.model, run.cell, run.registry, run.batches.val_batch_size, run.cell.train.eval_batches,
                         run.precision, run.device)


def scored_targets_fingerprints(batches: Batches, cell: Cell, corpus: str = "") -> dict[str, str]:
    """What a run's validation figures are scored on, as fingerprints (abl.data.corpus.targets_fingerprint),
    stored in its info.json as ``scored_targets``; the analysis flags a comparison across different ones
    (abl.analysis.verdicts). Keys: ``val_loss`` (the target ids of the regular evaluation, which a task's
    accuracy metrics share), ``val_bpb`` (the byte spans of ``corpus`` those targets cover) and
    ``extrapolation`` (the target ids every ``val_loss_x<k>`` scores), each only where it is recorded."""
    n = cell.train.eval_batches
    out = {"val_loss": targets_fingerprint(batches.val_targets(n))}
    spans = batches.val_byte_spans(n) if getattr(batches, "val_bytes", None) is not None else None
    if spans is not None:
        out["val_bpb"] = targets_fingerprint(spans, of=corpus)
    ends = extrapolation_ends(len(batches.val), cell.model.context, n * batches.val_batch_size)
    if cell.eval.extrapolation and getattr(batches, "task", None) is None and ends is not None:
        out["extrapolation"] = targets_fingerprint(scored_targets(batches.val, cell.model.context, ends))
    return out


def switched_on(switches: EvalConfig) -> list[Evaluation]:
    """The registered evaluations to run, in registration order: those whose ``eval.<name>``
    is true, and those without a switch."""
    return [e for e in EVALUATIONS.values() if getattr(switches, e.name, True)]


@torch.no_grad()
def run_evaluations(run: TrainedRun, switches: EvalConfig) -> Result:
    """Run every switched-on evaluation; never raises for one of them.

    The model is in eval mode meanwhile and is left in the mode it had.
    """
    metrics: dict[str, float] = {}
    notes: list[str] = []
    model = run.model
    was_training = model.training
    model.eval()
    try:
        for ev in switched_on(switches):
            try:
                m, n = ev.fn(run)
            except Exception as exc:  # noqa: BLE001 - an evaluation must not fail the trained run
                notes.append(f"{ev.name} metrics not recorded: {type(exc).__name__}: {exc}")
                continue
            metrics.update(m)
            notes += n
    finally:
        model.train(was_training)
    return metrics, notes
