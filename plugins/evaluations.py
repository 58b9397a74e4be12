"""Built-in post-training evaluations, registered through the hook ``register_evaluations`` like any
plugin's (abl.train.evaluations runs them in this order after the last step; each is switched by
``eval.<name>``):

- ``decode``: prefill_tokens_per_s, decode_tokens_per_s, kv_bytes_per_token,
  kv_bytes_per_token_measured, kv_cache_bytes_measured, decode_agreement (abl.model.decode);
- ``extrapolation``: val_loss_x1, val_loss_x2, val_loss_x4 on the same targets with 1, 2 and 4 times the
  trained context before them (Press et al. 2022, "Train Short, Test Long", arXiv:2108.12409);
- ``probes``: probe_<name>_accuracy, probe_<name>_loss, ... for each task of ``eval.probes`` (abl.data.tasks).
"""

from __future__ import annotations

from abl import (
    EXTRAPOLATION_SCALES,
    TrainedRun,
    decode_metrics,
    extrapolation_metrics,
    hookimpl,
    probe_metrics,
)

Result = tuple[dict[str, float], list[str]]  # (metrics, notes), as abl.train.evaluations runs them


def decode(run: TrainedRun) -> Result:
    """Cached greedy decoding at the trained context: speed, cache bytes, agreement with recomputation."""
    cell = run.cell
    return decode_metrics(run.model, cell.model, cell.components, run.registry, run.batches.val, run.device,
                          run.precision)


def extrapolation(run: TrainedRun) -> Result:
    """Validation loss on the same targets with 1, 2 and 4 times the trained context before them."""
    if getattr(run.batches, "task", None) is not None:  # a TaskBatches (abl.train.taskdata)
        return {}, ["extrapolation metrics not recorded: the dataset is a task, whose val_loss is on its answer "
                    "positions only (set eval.extrapolation = false)"]
    # as many targets as the regular evaluation scores (its global batch, whatever the number of
    # processes), in forwards no larger than a training step's
    return extrapolation_metrics(run.model, run.batches.val, run.cell.model.context,
                                 run.cell.train.eval_batches * run.batches.val_batch_size, run.batches.batch_size,
                                 run.device, run.precision)


def probes(run: TrainedRun) -> Result:
    """Accuracy (and loss on the answer positions) of the trained model on each task of eval.probes."""
    # the global batch: a multi-process cell probes the examples of its single-process twin
    return probe_metrics(run.model, run.cell, run.registry, run.batches.val_batch_size, run.cell.train.eval_batches,
                         run.precision, run.device)


@hookimpl
def register_evaluations(register):
    register("decode", decode, metrics=("prefill_tokens_per_s", "decode_tokens_per_s", "kv_bytes_per_token",
                                        "kv_bytes_per_token_measured", "kv_cache_bytes_measured", "decode_agreement"))
    register("extrapolation", extrapolation, metrics=tuple(f"val_loss_x{k}" for k in EXTRAPOLATION_SCALES))
    register("probes", probes)  # the names depend on the probes: probe_<name>_accuracy, ...
