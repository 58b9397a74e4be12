"""Measured FLOPs of one training step, for checking the cost model and for MFU.

``count_step_flops`` runs one forward + backward under
``torch.utils.flop_counter.FlopCounterMode``. torch's counter has no formula
for the CPU flash-attention op that ``scaled_dot_product_attention`` uses on
CPU, so it would count attention as zero there; we register torch's own SDPA
formulas for that op (full T x T products, causal masking not subtracted,
exactly as torch counts its CUDA attention ops).

The device peak that MFU divides by is ``abl.store.provenance.peak_flops``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.utils.flop_counter as fc

aten = torch.ops.aten


def _cpu_sdpa_forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return fc.sdpa_flop_count(query, key, value)


def _cpu_sdpa_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return fc.sdpa_backward_flop_count(grad_out, query, key, value)


def _extra_formulas() -> dict:
    extra: dict[Any, Callable[..., int]] = {}
    fwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if fwd is not None:
        extra[fwd] = _cpu_sdpa_forward
    if bwd is not None:
        extra[bwd] = _cpu_sdpa_backward
    return extra


def flop_counter() -> fc.FlopCounterMode:
    return fc.FlopCounterMode(display=False, custom_mapping=_extra_formulas())


def count_step_flops(model, x, y, make_ctx, autocast) -> int:
    """FLOPs of one training step's forward + backward (gradients are discarded).

    ``model`` is a ``DecoderLM``. Counted on the torch reference path whatever
    its kernel backend: torch's counter sees only torch ops, so a Triton
    kernel's matmuls (flash attention, the fused LM-head loss) would count as
    zero. The arithmetic the kernels do is the references' arithmetic.
    """
    from ..kernels import TORCH

    was_training = model.training
    model.train()
    with model.using_kernels(TORCH), flop_counter() as counter:
        with autocast():
            _, loss, _ = model(x, y, make_ctx())
        loss.backward()
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return int(counter.get_total_flops())
