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
- ``extrapolation``: val_loss_x2, val_loss_x4 (1x is the final val_loss; what each means: abl.model.decode);
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
from ..data.corpus import Batches
from ..model.decode import EXTRAPOLATION_SCALES, decode_metrics, extrapolation_metrics
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
    """Validation loss on windows of 2 and 4 times the trained context (1x is the final val_loss)."""
    bs = run.batches.batch_size
    # as many tokens per length as the regular evaluation: at 1x these windows are its val_loss
    return extrapolation_metrics(run.model, run.batches.val, run.cell.model.context,
                                 run.cell.train.eval_batches * bs, bs, run.device, run.precision)


@register_evaluation("probes", metrics=())  # the names depend on the probes: probe_<name>_accuracy, ...
def probes(run: TrainedRun) -> Result:
    """Accuracy (and loss on the answer positions) of the trained model on each task of eval.probes."""
    from .taskdata import probe_metrics

    return probe_metrics(run.model, run.cell, run.registry, run.batches.batch_size, run.cell.train.eval_batches,
                         run.precision, run.device)


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
