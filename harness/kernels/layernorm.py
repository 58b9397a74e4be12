"""LayerNorm: y = (x - mean) * r * weight + bias  (Ba et al. 2016, arXiv:1607.06450, sec. 3, eq. 4).

``eps_placement`` follows plugins/norms.py: "inside" r = 1/sqrt(var + eps)
(torch's ``F.layer_norm``), "outside" r = 1/(sqrt(var) + eps) (the other
placement found in implementations). var is the biased (1/N) estimate;
arithmetic is fp32.

Backward (xhat = (x - mean) * r, g = dy * weight, means over the row):
    dx = r * (g - mean(g)) - k * xhat * mean(g * xhat)
with k = r for "inside" and k = 1/sqrt(var) for "outside" (both follow from
dr/dvar); dweight = sum_rows dy * xhat, dbias = sum_rows dy.
"""

import torch
import torch.nn.functional as F

from . import use_triton
from .utils import as_rows, cdiv, check_launch, next_pow2, reduction_programs, tl, triton

# ---------------------------------------------------------------- kernels


@triton.jit
def _layernorm_fwd_kernel(X, Y, W, B, MEAN, RSTD, stride_x, stride_y, N, eps,
                          HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                          EPS_OUTSIDE: tl.constexpr, BLOCK_N: tl.constexpr):
    eps = tl.cast(eps, tl.float32)  # fp64 when torch.compile launches it (a Python float)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / N
    if EPS_OUTSIDE:
        rstd = 1.0 / (tl.sqrt(var) + eps)
    else:
        rstd = 1.0 / tl.sqrt(var + eps)
    y = xc * rstd
    if HAS_WEIGHT:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)


@triton.jit
def _layernorm_bwd_kernel(DY, X, W, MEAN, RSTD, DX, DW, DB, stride_dy, stride_x, stride_dx, M, N,
                          rows_per_program, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                          EPS_OUTSIDE: tl.constexpr, BLOCK_N: tl.constexpr):
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
        mean = tl.load(MEAN + row)
        rstd = tl.load(RSTD + row)
        xc = tl.where(mask, x - mean, 0.0)
        xhat = xc * rstd
        if HAS_WEIGHT:
            g = dy * w
        else:
            g = dy
        mean_g = tl.sum(g, axis=0) / N
        mean_gx = tl.sum(g * xhat, axis=0) / N
        if EPS_OUTSIDE:
            # k = 1/sigma, sigma recomputed from x (0 for a constant row, where xhat = 0)
            sigma = tl.sqrt(tl.sum(xc * xc, axis=0) / N)
            k = tl.where(sigma > 0, 1.0 / tl.maximum(sigma, 1e-30), 0.0)
        else:
            k = rstd
        dx = rstd * (g - mean_g) - k * xhat * mean_gx
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


def layernorm_fwd(x2, weight, bias, eps, eps_outside):
    """x2 [M, N] -> (y [M, N], mean [M] fp32, rstd [M] fp32)."""
    m, n = x2.shape
    block_n = next_pow2(n)
    y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    mean = torch.empty(m, dtype=torch.float32, device=x2.device)
    rstd = torch.empty(m, dtype=torch.float32, device=x2.device)
    if m:
        _layernorm_fwd_kernel[(m,)](
            x2, y, weight if weight is not None else x2, bias if bias is not None else x2, mean, rstd,
            x2.stride(0), y.stride(0), n, eps,
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, EPS_OUTSIDE=eps_outside,
            BLOCK_N=block_n, num_warps=_num_warps(block_n))
    return y, mean, rstd


def layernorm_bwd(dy2, x2, weight, bias, mean, rstd, eps_outside):
    m, n = x2.shape
    block_n = next_pow2(n)
    dx = torch.empty_like(x2)
    progs = reduction_programs(x2, m)
    dw = torch.empty((progs, n), dtype=torch.float32, device=x2.device) if weight is not None else None
    db = torch.empty((progs, n), dtype=torch.float32, device=x2.device) if bias is not None else None
    if m:
        _layernorm_bwd_kernel[(progs,)](
            dy2, x2, weight if weight is not None else x2, mean, rstd, dx,
            dw if dw is not None else rstd, db if db is not None else rstd,
            dy2.stride(0), x2.stride(0), dx.stride(0), m, n, cdiv(m, progs),
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, EPS_OUTSIDE=eps_outside,
            BLOCK_N=block_n, num_warps=_num_warps(block_n))
        dweight = dw.sum(0) if dw is not None else None
        dbias = db.sum(0) if db is not None else None
    else:
        dweight = torch.zeros(n, device=x2.device) if weight is not None else None
        dbias = torch.zeros(n, device=x2.device) if bias is not None else None
    return dx, dweight, dbias


# ---------------------------------------------------------------- autograd


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, eps_outside):
        check_launch(x, weight, bias)
        shape = x.shape
        x2 = as_rows(x)
        y, mean, rstd = layernorm_fwd(x2, weight, bias, eps, eps_outside)
        ctx.save_for_backward(x2, weight, bias, mean, rstd)
        ctx.shape, ctx.eps_outside = shape, eps_outside
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, bias, mean, rstd = ctx.saved_tensors
        dx, dw, db = layernorm_bwd(as_rows(dy), x2, weight, bias, mean, rstd, ctx.eps_outside)
        return (dx.view(ctx.shape),
                dw.to(weight.dtype) if dw is not None else None,
                db.to(bias.dtype) if db is not None else None,
                None, None)


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
    return LayerNormFunction.apply(x, weight, bias, eps, eps_placement == "outside")


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
