"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight (+ bias).

Zhang & Sennrich 2019, arXiv:1910.07467, sec. 3, eq. 4. The statistic and the
arithmetic are fp32 whatever the input dtype; y has x's dtype.

Backward, with xhat = x * rstd and g = dy * weight (per row of length N):
    dx = rstd * (g - xhat * mean(g * xhat))
    dweight = sum_rows dy * xhat,   dbias = sum_rows dy
dweight/dbias are reduced in two steps: each program sums a strip of rows into
an fp32 partial, then torch sums the partials.

The launchers are custom ops (``abl::rmsnorm_fwd``, ``abl::rmsnorm_bwd``; ``abl.kernels.registration.kernel_op``) with the backward registered as their autograd formula, so ``torch.compile`` traces
the op into one graph (no graph break) on a GPU and in the interpreter alike.
"""

from typing import Optional

import torch
from torch.library import wrap_triton

from . import use_triton
from .registration import kernel_op, no_tensor
from .utils import as_rows, cdiv, check_launch, next_pow2, reduction_programs, tl, triton

# ---------------------------------------------------------------- kernels


@triton.jit
def _rmsnorm_fwd_kernel(X, Y, W, B, RSTD, stride_x, stride_y, N, eps,
                        HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr):
    eps = tl.cast(eps, tl.float32)  # fp64 when torch.compile launches it (a Python float)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    y = x * rstd
    if HAS_WEIGHT:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + row, rstd)


@triton.jit
def _rmsnorm_bwd_kernel(DY, X, W, RSTD, DX, DW, DB, stride_dy, stride_x, stride_dx, M, N,
                        rows_per_program, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                        BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for row in range(row_start, row_end):
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        xhat = x * rstd
        if HAS_WEIGHT:
            g = dy * w
        else:
            g = dy
        c = tl.sum(g * xhat, axis=0) / N
        dx = (g - xhat * c) * rstd
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
    if HAS_WEIGHT:
        tl.store(DW + pid * N + cols, dw, mask=mask)
    if HAS_BIAS:
        tl.store(DB + pid * N + cols, db, mask=mask)


# ---------------------------------------------------------------- launchers


def _num_warps(block_n: int) -> int:
    return min(16, max(1, block_n // 256))


def _rmsnorm_fwd_fake(x2, weight, bias, eps):
    m, n = x2.shape
    return x2.new_empty((m, n)), x2.new_empty(m, dtype=torch.float32)


@kernel_op("abl::rmsnorm_fwd", _rmsnorm_fwd_fake)
def rmsnorm_fwd(x2: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x2 [M, N] -> (y [M, N], rstd [M] fp32)."""
    check_launch(x2, weight, bias)
    x2 = as_rows(x2)
    m, n = x2.shape
    block_n = next_pow2(n)
    y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    rstd = torch.empty(m, dtype=torch.float32, device=x2.device)
    if m:
        wrap_triton(_rmsnorm_fwd_kernel)[(m,)](
            x2, y, weight if weight is not None else x2, bias if bias is not None else x2, rstd,
            x2.stride(0), y.stride(0), n, eps,
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, BLOCK_N=block_n,
            num_warps=_num_warps(block_n))
    return y, rstd


def _rmsnorm_bwd_fake(dy2, x2, weight, bias, rstd):
    n = x2.shape[1]
    return (x2.new_empty(x2.shape), x2.new_empty(n, dtype=torch.float32) if weight is not None else no_tensor(x2),
            x2.new_empty(n, dtype=torch.float32) if bias is not None else no_tensor(x2))


@kernel_op("abl::rmsnorm_bwd", _rmsnorm_bwd_fake)
def rmsnorm_bwd(dy2: torch.Tensor, x2: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (dx [M, N] in x's dtype, dweight [N] fp32, dbias [N] fp32); a gradient whose
    parameter is None is an empty tensor."""
    check_launch(dy2, x2, weight, bias)
    dy2, x2 = as_rows(dy2), as_rows(x2)
    m, n = x2.shape
    block_n = next_pow2(n)
    dx = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    progs = reduction_programs(x2, m)
    partials = torch.empty if m else torch.zeros  # no rows: no program writes them
    dw = partials((progs, n), dtype=torch.float32, device=x2.device) if weight is not None else None
    db = partials((progs, n), dtype=torch.float32, device=x2.device) if bias is not None else None
    if m:
        wrap_triton(_rmsnorm_bwd_kernel)[(progs,)](
            dy2, x2, weight if weight is not None else x2, rstd, dx,
            dw if dw is not None else rstd, db if db is not None else rstd,
            dy2.stride(0), x2.stride(0), dx.stride(0), m, n, cdiv(m, progs),
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, BLOCK_N=block_n,
            num_warps=_num_warps(block_n))
    return (dx, dw.sum(0) if dw is not None else no_tensor(x2), db.sum(0) if db is not None else no_tensor(x2))


# ---------------------------------------------------------------- autograd


def _rmsnorm_setup(ctx, inputs, output):
    x2, weight, bias, _ = inputs
    ctx.save_for_backward(x2, weight, bias, output[1])


def _rmsnorm_backward(ctx, dy, _drstd):
    x2, weight, bias, rstd = ctx.saved_tensors
    dx, dw, db = rmsnorm_bwd(dy, x2, weight, bias, rstd)
    return (dx, dw.to(weight.dtype) if weight is not None else None,
            db.to(bias.dtype) if bias is not None else None, None)


rmsnorm_fwd.register_autograd(_rmsnorm_backward, setup_context=_rmsnorm_setup)


def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
            eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dim with the Triton kernels.

    Args:
        x: ``[..., N]`` (any float dtype; arithmetic in fp32).
        weight: ``[N]`` gain, or None.
        bias: ``[N]`` shift, or None.
        eps: added to the mean square inside the square root.

    Returns:
        ``[..., N]`` in x's dtype. Differentiable in x, weight and bias.
    """
    y, _ = rmsnorm_fwd(as_rows(x), weight, bias, eps)
    return y.view(x.shape)


# ---------------------------------------------------------------- reference


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor | None = None,
                      bias: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """The plain torch definition (the ground truth in tests; the op's torch path).

    The statistic and the products are fp32 (a bf16 / fp16 gain is promoted by the product).
    """
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y.to(x.dtype)


# ---------------------------------------------------------------- the op


def rmsnorm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
            eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dim on the active kernel backend (``abl.kernels.use_triton``):
    ``rmsnorm_triton`` under triton, ``rmsnorm_reference`` otherwise. Arguments as ``rmsnorm_triton``."""
    if use_triton("rmsnorm"):
        return rmsnorm_triton(x, weight, bias, eps)
    return rmsnorm_reference(x, weight, bias, eps)
