"""Shared plumbing for the kernel modules: the optional Triton import and launch checks.

Triton decides once, when it is imported, whether ``@triton.jit`` compiles for
the GPU or runs in its interpreter (``TRITON_INTERPRET=1``). The interpreter
runs the very same kernel source with numpy on CPU tensors; that is how the
tests exercise the kernels on machines without a GPU. So a process that wants
the interpreter must set the variable before anything imports triton
(``torch.compile`` imports it too).

Without triton installed (e.g. macOS), the kernel modules still import: the
stub below makes ``@triton.jit`` a no-op, every reference works, and calling a
Triton path raises a clear error.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
from typing import Iterator

try:  # pragma: no cover - exercised implicitly by every kernel module
    import triton
    import triton.language as tl

    HAS_TRITON = True
    TRITON_VERSION = triton.__version__
except ImportError:  # pragma: no cover
    HAS_TRITON = False
    TRITON_VERSION = None

    class _StubTriton:
        @staticmethod
        def jit(fn=None, **kwargs):
            return fn if fn is not None else (lambda f: f)

        @staticmethod
        def cdiv(a, b):
            return -(-a // b)

        @staticmethod
        def next_power_of_2(n):
            return 1 << (max(1, int(n)) - 1).bit_length()

    class _StubLanguage:
        constexpr = object
        float32 = float16 = bfloat16 = int64 = int32 = None

    triton = _StubTriton()  # type: ignore[assignment]
    tl = _StubLanguage()  # type: ignore[assignment]


# The error each dtype's kernels are held to against their torch reference: max |kernel - reference|
# over max |reference| (outputs and gradients are rounded to the input dtype at the end). The kernel
# tests (tests/kernels/) and ``abl selftest`` both check it; keyed by torch dtype name.
TOLERANCE = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 2.5e-2}

# The relative rule of FlashAttention's tests (tests/test_flash_attn.py: ``(out - out_ref).abs().max()
# <= 2 * (out_pt - out_ref).abs().max() + atol``): against an fp32 ground truth, the kernel may err by
# at most LOWP_MULTIPLE times what torch's own low-precision path (the reference run in the same low
# precision) errs on the same inputs, plus ERROR_FLOOR (about one rounding of the dtype) times
# max |truth|. A rounding difference passes; a race or a lost tile, which leaves torch's error where it
# is, does not. Both bounds hold at once: the rule and TOLERANCE. Keyed by the inputs' dtype.
LOWP_MULTIPLE = 2.0
ERROR_FLOOR = {"float32": 2e-5, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


@dataclasses.dataclass(frozen=True)
class ErrorCheck:
    """One comparison with the ground truth; errors are max |x - truth| / max |truth|."""

    error: float  # the kernel's
    torch_error: float | None  # torch's low-precision path's (None: not given, the fixed bound alone)
    fixed: float  # TOLERANCE of the dtype
    bound: float  # min(fixed, LOWP_MULTIPLE * torch_error + floor): what error is held to

    @property
    def ok(self) -> bool:
        return self.error <= self.bound

    def detail(self) -> str:
        rule = (f"; torch's low-precision path {self.torch_error:.3g}, so <= {LOWP_MULTIPLE:g}x that + floor"
                if self.torch_error is not None else "")
        return f"{self.error:.3g} vs fp32 truth, bound {self.bound:.3g} (fixed {self.fixed:g}{rule})"


def dtype_name(dtype) -> str:
    """"bfloat16" for torch.bfloat16 or "bfloat16"."""
    return str(dtype).removeprefix("torch.")


def max_relative_error(out, truth) -> float:
    """max |out - truth| / max |truth| in fp32 (inf when the shapes differ, or out is not finite
    where truth is)."""
    o, r = out.detach().float(), truth.detach().float()
    if o.shape != r.shape or (not o.isfinite().all() and r.isfinite().all()):
        return float("inf")
    if not o.numel():
        return 0.0
    return float((o - r).abs().max()) / max(float(r.abs().max()), 1e-6)


def check_error(out, truth, torch_out=None, dtype=None, fixed_dtype=None) -> ErrorCheck:
    """``out`` (the kernel's) against ``truth`` (the reference in fp32) under both bounds.

    ``torch_out``: torch's own path on the same low-precision inputs (None: the fixed bound alone).
    ``dtype``: the inputs' dtype (default ``out``'s), which picks the floor and the fixed bound;
    ``fixed_dtype``: another dtype's fixed bound (an fp32 loss of 16-bit logits is held to fp16's).
    """
    name = dtype_name(dtype if dtype is not None else out.dtype)
    fixed = TOLERANCE[dtype_name(fixed_dtype) if fixed_dtype is not None else name]
    err = max_relative_error(out, truth)
    if torch_out is None:
        return ErrorCheck(err, None, fixed, fixed)
    torch_err = max_relative_error(torch_out, truth)
    floor = ERROR_FLOOR[name]
    if name == "bfloat16" and interpreting():
        # the Triton interpreter stores fp32 as bf16 by dropping the low bits (toward zero), where a GPU
        # and torch round to nearest: its kernels' outputs are one rounding further off
        floor *= 2
    return ErrorCheck(err, torch_err, fixed, min(fixed, LOWP_MULTIPLE * torch_err + floor))


def interpreting() -> bool:
    """True when Triton kernels run in the interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


# Set by ``abl.kernels.compilecheck`` while it records the launches a GPU would make: the
# launchers then choose their CUDA configurations for CPU tensors (nothing runs; each launch
# is recorded and compiled for sm_90 without a driver).
_COMPILE_CHECK: contextvars.ContextVar[bool] = contextvars.ContextVar("abl_compile_check", default=False)


@contextlib.contextmanager
def compile_check() -> Iterator[None]:
    """Launchers pick what they would pick on a CUDA device (see ``on_gpu``), for any tensors."""
    token = _COMPILE_CHECK.set(True)
    try:
        yield
    finally:
        _COMPILE_CHECK.reset(token)


def checking_compiles() -> bool:
    """True inside ``compile_check()``: a launcher that tries several configurations in turn
    must launch every one it could pick, so that each is compiled and checked."""
    return _COMPILE_CHECK.get()


def on_gpu(x) -> bool:
    """True when a launch on ``x`` compiles for a GPU: its tiles, warps and stages are the
    CUDA ones (not the interpreter's small tiles). Launchers ask this, not ``x.device``."""
    return _COMPILE_CHECK.get() or (x.device.type == "cuda" and not interpreting())


class KernelUnavailable(RuntimeError):
    """A Triton kernel was asked for where it cannot run."""


def check_launch(*tensors) -> None:
    """Raise a clear error when the Triton kernels cannot run on these tensors."""
    if _COMPILE_CHECK.get():
        return
    if not HAS_TRITON:
        raise KernelUnavailable("the Triton kernels need the 'triton' package (Linux): "
                                "pip install triton, or use train.kernels = \"torch\"")
    devices = {t.device.type for t in tensors if t is not None}
    if len(devices) > 1:
        raise KernelUnavailable(f"tensors on several device types: {sorted(devices)}")
    if devices == {"cpu"} and not interpreting():
        raise KernelUnavailable(
            "Triton kernels need a CUDA device; on CPU they run only in the Triton interpreter "
            "(set TRITON_INTERPRET=1 before triton is imported; slow, for testing) - "
            "or use train.kernels = \"torch\" / \"auto\"")


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(int(n))


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def as_rows(x):
    """View ``x [..., N]`` as ``[M, N]`` with unit stride along N (copies only when it must)."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if n > 1 and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2


@functools.lru_cache(maxsize=8)
def sm_count(device_index: int) -> int:
    import torch

    if _COMPILE_CHECK.get():
        return 132  # an H100 SXM's
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def reduction_programs(x, rows: int) -> int:
    """How many programs share a row reduction (the dweight partial sums)."""
    if on_gpu(x):
        return max(1, min(rows, 4 * sm_count(x.device.index or 0)))
    return max(1, min(rows, 4))  # the interpreter runs programs one by one
