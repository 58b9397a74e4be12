"""What the SSD scan's forward (``abl.kernels.ssd_scan``) and backward (``abl.kernels.ssd_scan_bwd``)
kernels share: the product and rounding helpers of their precision rule (Dao & Gu 2024,
arXiv:2405.21060, sec. 6, computed as mamba_ssm's kernels do: ``tl.dot`` on operands in the
inputs' dtype, fp32 accumulation), the tile rule, and how the ops are registered (a
``torch.library.triton_op`` where Triton compiles, an opaque custom op under the interpreter).
"""

from __future__ import annotations

import torch

from .utils import HAS_TRITON, interpreting, next_pow2, tl, triton


@triton.jit
def mma(a, b, acc, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ b with fp32 accumulation. UPCAST (bf16 in the Triton interpreter, which
    multiplies bf16 tiles as their raw bits): the operands, already rounded to bf16, are widened
    first; exact, the same products the tensor cores form."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def narrow(v, DTYPE: tl.constexpr, UPCAST: tl.constexpr):
    """fp32 ``v`` rounded to DTYPE, to nearest even (the GPU's conversion). UPCAST: the
    interpreter's fp32 -> bf16 conversion truncates, so the rounding is done on the fp32 bits
    and the result stays fp32 (exactly a bf16 value: converting or widening it is exact)."""
    if UPCAST:
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    return v.to(DTYPE)


def unit_last(t):
    """``t`` with a unit last stride (a copy only where it has not)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def tile(n: int, cap: int) -> int:
    """A power-of-two tile for a dim of ``n``: at least 16 (the MMA's minimum), at most ``cap``."""
    return max(16, min(cap, next_pow2(n)))


def dot_precision(dtype) -> str:
    """fp32 operands: TF32 only where the run allows it (the tf32 precision policy), else exact.
    16-bit operands take the tensor cores' native MMA whatever this says."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def upcast(dtype) -> bool:
    """bf16 in the Triton interpreter: the products widen their operands (``mma``), the roundings
    are done on fp32 bits (``narrow``)."""
    return dtype == torch.bfloat16 and interpreting()


if HAS_TRITON and not interpreting():
    # compiled kernels: a triton_op, which torch.compile can open up (its kernels launch through
    # wrap_triton, so Inductor sees them)
    from torch.library import triton_op as op_decorator
    from torch.library import wrap_triton as wrap_triton
else:
    # the interpreter (or no triton: the launch raises in check_launch): an opaque custom op. The
    # interpreter runs kernels on real tensors only, so tracing must not open the op up (a
    # triton_op is decomposed into its kernel launches under FakeTensors); wrap_triton would hand
    # the interpreted kernel back as is anyway
    op_decorator = torch.library.custom_op  # type: ignore[assignment]

    def wrap_triton(kernel):  # type: ignore[no-redef]
        return kernel
