"""``train.compile``: the training forward through ``torch.compile``, compiled before the first timed step."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from ..model.decoder import DecoderLM, ForwardContext

if TYPE_CHECKING:
    from .train import TrainingRun


class Compiled(torch.nn.Module):
    """``train.compile``: the training forward (model and loss) through ``torch.compile``.

    The model's kernel backend is activated outside the compiled region, and the
    backend queries (``abl.kernels.active`` / ``use_triton``) are constants to
    dynamo: a cell's backend is fixed for its whole run. Evaluation, decoding
    and FLOP counting call the eager model.
    """

    def __init__(self, core: DecoderLM):
        super().__init__()
        from abl import kernels

        for query in (kernels.active, kernels.use_triton):
            torch.compiler.assume_constant_result(query)
        self.core = core
        self.compiled = torch.compile(core._forward)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, ctx: ForwardContext | None = None):
        with self.core.kernel_backend.activate():
            return self.compiled(idx, targets, ctx)


def compile_warmup(run: TrainingRun) -> float:
    """Compile before the first timed step: one forward and backward on a validation
    batch, after which the model, its gradients and every RNG are as they were.
    Returns the seconds it took (``compile_s``)."""
    import random

    import numpy as np

    t0 = time.perf_counter()
    saved_model = {k: v.detach().clone() for k, v in run.core.state_dict().items()}
    saved_precision = run.precision.state_dict()
    rng = (torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
           np.random.get_state(), random.getstate())
    x, y = next(iter(run.batches.val_batches(1)))
    x, y = x[: run.batches.batch_size].to(run.device), y[: run.batches.batch_size].to(run.device)
    ctx = ForwardContext(position=run.core.position, need_logits=False)
    with run.precision.autocast(run.device):
        _, loss, _ = run.model(x, y, ctx)
    loss.backward()
    run.optimizer.zero_grad(set_to_none=True)
    run.core.load_state_dict(saved_model)
    run.precision.load_state_dict(saved_precision)
    torch.set_rng_state(rng[0])
    if rng[1] is not None:
        torch.cuda.set_rng_state_all(rng[1])
    np.random.set_state(rng[2])
    random.setstate(rng[3])
    run.synchronize()
    return time.perf_counter() - t0

