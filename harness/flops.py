"""Measured FLOPs and device peaks, for checking the cost model and for MFU.

``count_step_flops`` runs one forward + backward under
``torch.utils.flop_counter.FlopCounterMode``. torch's counter has no formula
for the CPU flash-attention op that ``scaled_dot_product_attention`` uses on
CPU, so it would count attention as zero there; we register torch's own SDPA
formulas for that op (full T x T products, causal masking not subtracted,
exactly as torch counts its CUDA attention ops).

``cpu_peak_flops`` measures the CPU's fp32 matmul peak once per process (a
large matmul, best of a few); on CUDA the peak comes from a table of known
GPUs (see ``abl.bench`` when present) and is None for unknown devices.
"""

from __future__ import annotations

import time
from functools import lru_cache

import torch
import torch.utils.flop_counter as fc

aten = torch.ops.aten


def _cpu_sdpa_forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return fc.sdpa_flop_count(query, key, value)


def _cpu_sdpa_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return fc.sdpa_backward_flop_count(grad_out, query, key, value)


def _extra_formulas() -> dict:
    extra = {}
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

    Counted on the torch reference path: torch's counter sees only torch ops, so
    a Triton kernel's matmuls (flash attention, the fused LM-head loss) would
    count as zero. The arithmetic the kernels do is the references' arithmetic.
    """
    from .kernels import using

    was_training = model.training
    model.train()
    with using("torch"), flop_counter() as counter:
        with autocast():
            _, loss, _ = model(x, y, make_ctx())
        loss.backward()
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return int(counter.get_total_flops())


@lru_cache(maxsize=1)
def cpu_peak_flops(n: int = 1024, repeats: int = 5) -> float:
    """Best observed fp32 matmul FLOP/s on this CPU with torch's current thread count."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def device_peak_flops(device: torch.device, dtype: torch.dtype) -> tuple[float | None, str]:
    """(peak FLOP/s, how it was obtained) for MFU."""
    if device.type == "cpu":
        return cpu_peak_flops(), "measured: fp32 1024^3 matmul at start-up"
    try:
        from .bench import gpu_peak  # the kernel benchmark's table of known GPUs
    except ImportError:
        return None, "unknown device"
    name = torch.cuda.get_device_name(device)
    peak = gpu_peak(name, dtype)
    return (peak, f"table: {name}") if peak else (None, f"unknown device {name}")
