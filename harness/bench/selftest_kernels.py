"""``abl selftest``'s kernel section: every op of abl.kernels against its fp32 ground truth.

For each op in ``abl.kernels.OPS``, at several shapes and dtypes, the Triton
function, the op's reference on fp32 copies of the inputs (the ground truth)
and torch's own path in the inputs' precision get the same inputs
(abl.kernels.autoselect.make_inputs); the forward outputs are compared, then
the gradients of every differentiable input under the same random output
gradient. An error is max |kernel - truth| relative to max |truth|, held to
two bounds at once (abl.kernels.utils.check_error): the dtype's fixed
``TOLERANCE``, and FlashAttention's tests' rule, at most twice the error of
torch's low-precision path on the same inputs plus a floor of about one
rounding of the dtype. A race or a lost tile leaves torch's error where it is
and so fails the second, where the fixed bound can take it for rounding.

Shapes: on CPU the kernels run in the Triton interpreter (a correctness path,
numpy per program), so the shapes are small, with masked tails (sizes not
powers of two); ``quick`` keeps one shape per op and two dtypes. On CUDA the
shapes are training-sized. The checks here are the same comparisons as
tests/kernels/test_kernels_bounds.py, run where the user's device is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..kernels.autoselect import Inputs
from ..kernels.autoselect import check_op as _check_op
from ..kernels.autoselect import make_inputs as _make_inputs
from ..kernels.utils import TOLERANCE as _TOLERANCE
from ..kernels.utils import max_relative_error

# The fixed bound, relative to the largest magnitude of the truth (abl.kernels.utils).
TOLERANCE = {getattr(torch, name): tol for name, tol in _TOLERANCE.items()}
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
DTYPES = {v: k for k, v in DTYPE_NAMES.items()}
__all__ = ["Inputs", "SHAPES", "check_kernels", "check_op", "kernel_plan", "make_inputs", "relative_error"]


# op -> shapes: CPU (interpreter, small, with masked tails) and CUDA (training-sized)
SHAPES: dict[str, dict[str, list[tuple]]] = {
    "rmsnorm": {"cpu": [(7, 100), (16, 64)], "cuda": [(4096, 1024), (8192, 4096)]},
    "layernorm": {"cpu": [(7, 100), (16, 64)], "cuda": [(4096, 1024), (8192, 4096)]},
    "rope": {"cpu": [(1, 2, 9, 48), (2, 2, 17, 64)], "cuda": [(4, 16, 1024, 64), (2, 32, 2048, 128)]},
    "swiglu": {"cpu": [(7, 50), (16, 96)], "cuda": [(8192, 4096), (4096, 11008)]},
    "geglu": {"cpu": [(7, 50), (16, 96)], "cuda": [(8192, 4096), (4096, 11008)]},
    "cross_entropy": {"cpu": [(9, 300), (13, 1000)], "cuda": [(4096, 32000), (8192, 50304)]},
    "linear_cross_entropy": {"cpu": [(17, 32, 300), (12, 48, 1000)],
                             "cuda": [(4096, 1024, 32000), (8192, 768, 50304)]},
    "flash_attention": {"cpu": [(1, 2, 37, 32), (1, 2, 40, 64)],
                        "cuda": [(2, 16, 2048, 64), (2, 16, 2048, 128)]},
    "ssd_scan": {"cpu": [(1, 40, 2, 16, 16), (1, 37, 2, 24, 20)],
                 "cuda": [(2, 1024, 16, 64, 64), (2, 2048, 8, 64, 128)]},
}


def make_inputs(op: str, shape: tuple, dtype: torch.dtype, device: torch.device) -> Inputs:
    """The kernel, ground-truth and torch-path calls of ``op`` at ``shape`` (abl.kernels.autoselect)."""
    return _make_inputs(op, shape, dtype, device)


def check_op(op: str, shape: tuple, dtype: torch.dtype, device: torch.device) -> list[dict[str, Any]]:
    """Forward and backward of one op at one shape and dtype: two result rows (pass "fwd", "bwd"), each
    with ``error`` (vs the fp32 truth), ``torch_error`` (torch's low-precision path's), ``fixed`` (the
    dtype's TOLERANCE), ``tolerance`` (the bound held: the smaller of the two rules) and ``ok``."""
    return _check_op(op, shape, dtype, device)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref| (inf when the shapes differ or out has non-finite values ref lacks)."""
    return max_relative_error(out, ref)


def kernel_plan(device: torch.device, quick: bool) -> list[tuple[str, tuple, torch.dtype]]:
    """(op, shape, dtype) of every check: every op, its shapes for this device, the dtypes."""
    from ..kernels import OPS

    where = "cuda" if device.type == "cuda" else "cpu"
    dtypes = [torch.float32, torch.bfloat16] if quick else [torch.float32, torch.bfloat16, torch.float16]
    plan = []
    for op in OPS:
        shapes = SHAPES[op][where]
        for i, dtype in enumerate(dtypes):
            # quick: each dtype at one shape (alternating); full: every shape at every dtype
            for shape in ([shapes[i % len(shapes)]] if quick else shapes):
                plan.append((op, shape, dtype))
    return plan


def check_kernels(device: torch.device, quick: bool,
                  log: Callable[[str], None] = lambda m: None) -> tuple[list[dict[str, Any]], str | None]:
    """Every op's check rows, or ([], why) when the Triton kernels cannot run here."""
    from ..kernels.utils import HAS_TRITON, interpreting

    if not HAS_TRITON:
        return [], "triton is not installed: the kernels cannot run (the torch references still do)"
    if device.type == "cpu" and not interpreting():
        return [], ("the Triton interpreter is off (triton was imported before TRITON_INTERPRET=1 was set): "
                    "the kernels cannot run on CPU in this process")
    rows = []
    for op, shape, dtype in kernel_plan(device, quick):
        got = check_op(op, shape, dtype, device)
        for r in got:
            log(f"kernel {r['op']} {r['shape']} {r['dtype']} {r['pass']}: "
                + ("ok" if r["ok"] else f"FAILED ({r['detail']})"))
        rows += got
    return rows, None
