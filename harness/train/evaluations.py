"""Post-training evaluations: named steps run once on the trained model.

Each evaluation is registered by a plugin through the hook
``register_evaluations`` (the built-ins below by abl.plugins.evaluations; the
decorator ``register_evaluation`` registers one in-process, after them) under
a name that is also its switch in the grid's ``[eval]`` table (``abl.contracts.config.EvalConfig``):
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
from ..contracts.named_hooks import collect_named, first_line
from ..contracts.precision import Precision
from ..contracts.registry import Registry
from ..data.corpus import Batches, targets_fingerprint
from ..model.decode import extrapolation_ends, scored_targets
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
    plugin: str = "(registered in-process)"  # where it came from (abl plugins)
    package: str = "-"
    version: str = "-"


# those registered in-process with ``register_evaluation``, run after the plugins' own
EVALUATIONS: dict[str, Evaluation] = {}
_from_plugins: dict[str, Evaluation] | None = None


def _plugin_evaluations() -> dict[str, Evaluation]:
    """Every evaluation the plugins register (hook ``register_evaluations``), in load order; read once."""
    global _from_plugins
    if _from_plugins is None:
        _from_plugins = collect_named("register_evaluations", "post-training evaluations",
                                      "post-training evaluation", "function", _entry)
    return _from_plugins


def _entry(name: str, fn: EvalFn, metrics: tuple[str, ...] = (), doc: str = "", *, plugin: str, package: str,
           version: str) -> Evaluation:
    """A plugin's ``register(name, fn, metrics=(), doc="")`` as an Evaluation."""
    return Evaluation(name, fn, tuple(metrics), first_line(doc or fn.__doc__), plugin, package, version)


def registered() -> dict[str, Evaluation]:
    """Every post-training evaluation in the order they run: the plugins' (built-ins first), then those
    registered in-process."""
    plugins = _plugin_evaluations()
    return {**plugins, **{k: v for k, v in EVALUATIONS.items() if k not in plugins}}


def register_evaluation(name: str, metrics: tuple[str, ...]) -> Callable[[EvalFn], EvalFn]:
    """Decorator: register ``fn(run) -> (metrics, notes)`` as the post-training evaluation ``name``.

    ``metrics`` names everything it may record. Its switch is the boolean
    ``eval.<name>`` (a field of ``abl.contracts.config.EvalConfig``); an evaluation
    with no such field has no switch and runs in every cell.
    """

    def register(fn: EvalFn) -> EvalFn:
        if name in registered():
            raise ValueError(f"post-training evaluation {name!r} is registered twice")
        EVALUATIONS[name] = Evaluation(name, fn, tuple(metrics), first_line(fn.__doc__))
        return fn

    return register


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
    return [e for e in registered().values() if getattr(switches, e.name, True)]


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
