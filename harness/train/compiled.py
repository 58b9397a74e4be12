"""``train.compile``: the training forward through ``torch.compile``, compiled before the first timed step."""

from __future__ import annotations

import time

import torch

from ..model.decoder import DecoderLM, ForwardContext
from ..model.shapecache import payback_note
from .state import TrainingRun


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



def record_step_times(run: TrainingRun, step_times: list[float], compile_s: float | None) -> str | None:
    """After the loop: the median step time of this cell (and its compile time, compiled) in its
    shape's entry, unless its steps shared the machine; for a compiled cell whose eager twin's step
    time is known on this device, the payback note when its steps did not repay the compile."""
    import statistics

    from ..analysis import health
    from ..store.provenance import device_name

    if not step_times or health.contended(run.share.get("load_per_core"), run.share.get("cpu_util"),
                                          on_cpu=run.device.type == "cpu"):
        return None  # a busy machine's step times would mislead every later cell of this shape
    device, step_s = device_name(run.device), statistics.median(step_times)
    if not run.cell.train.compile:
        run.timings.put(device, "eager", {"step_s": step_s})
        return None
    if compile_s is None:  # resumed after its last step: it compiled nothing
        return None
    run.timings.put(device, "compiled", {"step_s": step_s, "compile_s": compile_s})
    eager = run.timings.get(device, "eager")
    if eager is None:
        return None
    note = payback_note(len(step_times), eager["step_s"], step_s, compile_s)
    return f"{note} (eager: an earlier cell of this shape on {device})" if note else None
