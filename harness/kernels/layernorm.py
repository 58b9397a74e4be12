"""LayerNorm: y = (x - mean) * r * weight + bias  (Ba et al. 2016, arXiv:1607.06450, sec. 3, eq. 4).

``eps_placement`` follows plugins/norms.py: "inside" r = 1/sqrt(var + eps)
(torch's ``F.layer_norm``), "outside" r = 1/(sqrt(var) + eps) (the other
placement found in implementations). var is the biased (1/N) estimate;
arithmetic is fp32.

Forward, one row per program, the row held in registers: two reductions, the
mean, then the sum of squares of the centred row (the two-pass variance: it
does not cancel catastrophically as sum(x^2) - N mean^2 does when |mean| >>
std; Chan, Golub & LeVeque 1983, "Algorithms for computing the sample variance",
The American Statistician 37(3)). r is one ``rsqrt`` ("inside"). The row's mean
and r are saved for the backward, and for "outside" also 1/sqrt(var), so the
backward never recomputes a statistic.

Backward (xhat = (x - mean) * r, g = dy * weight, means over the row):
    dx = r * (g - mean(g)) - k * xhat * mean(g * xhat)
with k = r for "inside" and k = 1/sqrt(var) for "outside" (both follow from
dr/dvar); dweight = sum_rows dy * xhat, dbias = sum_rows dy. The two row sums
are one reduction of a pair. dweight/dbias are reduced in two steps, as in
rmsnorm.

Warps: one per 512 columns of the row block (16 values a thread: two 16-byte
loads of bf16), at most 16; 8 at N = 4096, as Liger-Kernel's LayerNorm picks
(Hsu et al. 2024, arXiv:2410.10989). Fewer warps than rmsnorm's rule (one per
256) because each of the two reductions pays a cross-warp exchange (a choice
from review, not yet timed on a GPU).

The launchers are the custom ops ``abl::layernorm_fwd`` / ``abl::layernorm_bwd``
(abl.kernels.registration.kernel_op), the backward registered as the forward's autograd
formula: ``torch.compile`` keeps a call in one graph.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch.library import wrap_triton

from . import use_triton
from .registration import kernel_op, no_tensor
from .utils import as_rows, cdiv, check_launch, next_pow2, reduction_programs, tl, triton

# ---------------------------------------------------------------- kernels


@triton.jit
def _layernorm_fwd_kernel(X, Y, W, B, MEAN, RSTD, ISTD, stride_x, stride_y, N, eps,
                          HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                          EPS_OUTSIDE: tl.constexpr, BLOCK_N: tl.constexpr):
    eps = tl.cast(eps, tl.float32)  # fp64 when torch.compile launches it (a Python float)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    inv_n = 1.0 / N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) * inv_n
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) * inv_n
    if EPS_OUTSIDE:
        sigma = tl.sqrt(var)
        rstd = 1.0 / (sigma + eps)
        # k of the backward: 1/sigma, 0 for a constant row (where xhat = 0)
        tl.store(ISTD + row, tl.where(var > 0, tl.math.rsqrt(tl.maximum(var, 1e-38)), 0.0))
    else:
        rstd = tl.math.rsqrt(var + eps)
    y = xc * rstd
    if HAS_WEIGHT:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)


@triton.jit
def _add_pair(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _layernorm_bwd_kernel(DY, X, W, MEAN, RSTD, ISTD, DX, DW, DB, stride_dy, stride_x, stride_dx, M, N,
                          rows_per_program, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                          EPS_OUTSIDE: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    inv_n = 1.0 / N
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for row in range(row_start, row_end):
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(MEAN + row)
        rstd = tl.load(RSTD + row)
        xhat = tl.where(mask, x - mean, 0.0) * rstd
        if HAS_WEIGHT:
            g = dy * w
        else:
            g = dy
        # mean(g) and mean(g * xhat): one reduction of the pair
        sum_g, sum_gx = tl.reduce((g, g * xhat), 0, _add_pair)
        if EPS_OUTSIDE:
            k = tl.load(ISTD + row)
        else:
            k = rstd
        dx = rstd * (g - sum_g * inv_n) - k * xhat * (sum_gx * inv_n)
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
    if HAS_WEIGHT:
        tl.store(DW + pid * N + cols, dw, mask=mask)
    if HAS_BIAS:
        tl.store(DB + pid * N + cols, db, mask=mask)


# ---------------------------------------------------------------- launchers (custom ops)


def _num_warps(block_n: int) -> int:
    return min(16, max(1, block_n // 512))


def _layernorm_fwd_fake(x2, weight, bias, eps, eps_outside):
    m, n = x2.shape
    stat = x2.new_empty(m, dtype=torch.float32)
    return x2.new_empty((m, n)), stat, torch.empty_like(stat), torch.empty_like(stat) if eps_outside else no_tensor(x2)


@kernel_op("abl::layernorm_fwd", _layernorm_fwd_fake)
def layernorm_fwd(x2: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float,
                  eps_outside: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x2 [M, N] -> (y [M, N], mean [M] fp32, rstd [M] fp32, 1/sqrt(var) [M] fp32 for "outside"
    (an empty tensor for "inside"))."""
    check_launch(x2, weight, bias)
    x2 = as_rows(x2)
    m, n = x2.shape
    block_n = next_pow2(n)
    y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    mean = torch.empty(m, dtype=torch.float32, device=x2.device)
    rstd = torch.empty(m, dtype=torch.float32, device=x2.device)
    istd = torch.empty(m, dtype=torch.float32, device=x2.device) if eps_outside else no_tensor(x2)
    if m:
        wrap_triton(_layernorm_fwd_kernel)[(m,)](
            x2, y, weight if weight is not None else x2, bias if bias is not None else x2, mean, rstd,
            istd if eps_outside else rstd, x2.stride(0), y.stride(0), n, eps,
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, EPS_OUTSIDE=eps_outside,
            BLOCK_N=block_n, num_warps=_num_warps(block_n))
    return y, mean, rstd, istd


def _layernorm_bwd_fake(dy2, x2, weight, bias, mean, rstd, istd, eps_outside):
    n = x2.shape[1]
    return (x2.new_empty(x2.shape), x2.new_empty(n, dtype=torch.float32) if weight is not None else no_tensor(x2),
            x2.new_empty(n, dtype=torch.float32) if bias is not None else no_tensor(x2))


@kernel_op("abl::layernorm_bwd", _layernorm_bwd_fake)
def layernorm_bwd(dy2: torch.Tensor, x2: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                  mean: torch.Tensor, rstd: torch.Tensor, istd: torch.Tensor,
                  eps_outside: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
        wrap_triton(_layernorm_bwd_kernel)[(progs,)](
            dy2, x2, weight if weight is not None else x2, mean, rstd, istd if eps_outside else rstd, dx,
            dw if dw is not None else rstd, db if db is not None else rstd,
            dy2.stride(0), x2.stride(0), dx.stride(0), m, n, cdiv(m, progs),
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, EPS_OUTSIDE=eps_outside,
            BLOCK_N=block_n, num_warps=_num_warps(block_n))
    return (dx, dw.sum(0) if dw is not None else no_tensor(x2), db.sum(0) if db is not None else no_tensor(x2))


# ---------------------------------------------------------------- autograd


def _layernorm_setup(ctx, inputs, output):
    x2, weight, bias, _, eps_outside = inputs
    _, mean, rstd, istd = output
    ctx.save_for_backward(x2, weight, bias, mean, rstd, istd)
    ctx.eps_outside = eps_outside


def _layernorm_backward(ctx, dy, *_dstats):
    x2, weight, bias, mean, rstd, istd = ctx.saved_tensors
    dx, dw, db = layernorm_bwd(dy, x2, weight, bias, mean, rstd, istd, ctx.eps_outside)
    return (dx, dw.to(weight.dtype) if weight is not None else None,
            db.to(bias.dtype) if bias is not None else None, None, None)


layernorm_fwd.register_autograd(_layernorm_backward, setup_context=_layernorm_setup)


def layernorm_triton(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
              eps: float = 1e-5, eps_placement: str = "inside") -> torch.Tensor:
    """LayerNorm over the last dim with the Triton kernels.

    Args:
        x: ``[..., N]`` (any float dtype; arithmetic in fp32).
        weight: ``[N]`` gain gamma, or None.
        bias: ``[N]`` shift beta, or None.
        eps: numerical-safety term.
        eps_placement: "inside" (1/sqrt(var + eps)) or "outside" (1/(sqrt(var) + eps)).

    Returns:
        ``[..., N]`` in x's dtype. Differentiable in x, weight and bias.
    """
    if eps_placement not in ("inside", "outside"):
        raise ValueError(f"eps_placement must be 'inside' or 'outside', got {eps_placement!r}")
    y, *_ = layernorm_fwd(as_rows(x), weight, bias, eps, eps_placement == "outside")
    return y.view(x.shape)


# ---------------------------------------------------------------- reference


def layernorm_reference(x: torch.Tensor, weight: torch.Tensor | None = None,
                        bias: torch.Tensor | None = None, eps: float = 1e-5,
                        eps_placement: str = "inside") -> torch.Tensor:
    """The torch definition (ground truth in tests): "inside" is torch's own ``F.layer_norm``;
    "outside", which torch does not offer, is spelled out in fp32."""
    if eps_placement == "inside":
        if any(t is not None and t.dtype != x.dtype for t in (weight, bias)):
            # mixed dtypes (bf16 activations, fp32 parameters): CUDA's layer_norm refuses them and
            # CPU's computes in fp32; this spells out the same fp32 computation on every device
            y = F.layer_norm(x.float(), (x.shape[-1],), None if weight is None else weight.float(),
                             None if bias is None else bias.float(), eps)
            return y.to(x.dtype)
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    if eps_placement != "outside":
        raise ValueError(f"eps_placement must be 'inside' or 'outside', got {eps_placement!r}")
    xf = x.float()
    mu = xf.mean(-1, keepdim=True)
    sigma = (xf - mu).pow(2).mean(-1, keepdim=True).sqrt()
    y = (xf - mu) / (sigma + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y.to(x.dtype)


# ---------------------------------------------------------------- the op


def layernorm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
              eps: float = 1e-5, eps_placement: str = "inside") -> torch.Tensor:
    """LayerNorm over the last dim on the active kernel backend (``abl.kernels.use_triton``):
    ``layernorm_triton`` under triton, ``layernorm_reference`` otherwise. Arguments as ``layernorm_triton``."""
    if use_triton("layernorm"):
        return layernorm_triton(x, weight, bias, eps, eps_placement)
    return layernorm_reference(x, weight, bias, eps, eps_placement)
