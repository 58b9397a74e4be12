"""GLU activations, the elementwise part only: swiglu(g, u) = silu(g) * u, geglu(g, u) = gelu(g) * u.

Shazeer 2020, "GLU Variants Improve Transformer", arXiv:2002.05202, sec. 2,
with SiLU (Elfwing et al. 2017, arXiv:1702.03118) and GELU with its tanh
approximation (Hendrycks & Gimpel 2016, arXiv:1606.08415, sec. 2). The
projections around them stay ordinary matmuls; this fuses the activation, the
product and their backward into one pass each.

Derivatives (s = sigmoid(g)):
    silu'(g) = s * (1 + g * (1 - s))
    gelu'(g) = Phi(g) + g * phi(g)                      exact: Phi = 0.5 (1 + erf(g / sqrt 2))
    gelu_tanh'(g) = 0.5 (1 + t) + 0.5 g (1 - t^2) c (1 + 3 a g^2),  t = tanh(c (g + a g^3))
so du = dy * act(g) and dg = dy * u * act'(g). Arithmetic is fp32.

The launchers are the custom ops ``abl::glu_fwd`` / ``abl::glu_bwd`` (one pair for
swiglu and both GEGLUs; abl.kernels.registration.kernel_op), the backward registered as the
forward's autograd formula, so ``torch.compile`` keeps a call in one graph.
"""

import torch
import torch.nn.functional as F
from torch.library import wrap_triton

from . import use_triton
from .registration import kernel_op
from .utils import check_launch, next_pow2, tl, triton

# ACT codes (constexpr): 0 silu, 1 gelu (erf), 2 gelu (tanh approximation). The literals in the
# kernels: 0.7071... = 1/sqrt(2), 0.3989... = 1/sqrt(2 pi), 0.7978... = sqrt(2/pi).

# ---------------------------------------------------------------- kernels


@triton.jit
def _glu_fwd_kernel(G, U, Y, stride_g, stride_u, stride_y, N,
                    ACT: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    g = tl.load(G + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    if ACT == 0:
        a = g * tl.sigmoid(g)
    elif ACT == 1:
        a = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))
    else:
        inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        a = 0.5 * g * (1.0 + (2.0 * tl.sigmoid(2.0 * inner) - 1.0))  # tanh(z) = 2 sigmoid(2z) - 1
    tl.store(Y + row * stride_y + cols, (a * u).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _glu_bwd_kernel(DY, G, U, DG, DU, stride_dy, stride_g, stride_u, stride_dg, stride_du, N,
                    ACT: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    if ACT == 0:
        s = tl.sigmoid(g)
        a = g * s
        da = s * (1.0 + g * (1.0 - s))
    elif ACT == 1:
        cdf = 0.5 * (1.0 + tl.math.erf(g * 0.7071067811865476))
        a = g * cdf
        da = cdf + g * 0.3989422804014327 * tl.exp(-0.5 * g * g)
    else:
        inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        t = 2.0 * tl.sigmoid(2.0 * inner) - 1.0
        a = 0.5 * g * (1.0 + t)
        da = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * g * g)
    tl.store(DG + row * stride_dg + cols, (dy * u * da).to(DG.dtype.element_ty), mask=mask)
    tl.store(DU + row * stride_du + cols, (dy * a).to(DU.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------- launchers


def _rows(x, n):
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2


def _block(n):
    return min(4096, next_pow2(n))


def _glu_fwd_fake(gate, up, act):
    return gate.new_empty(gate.shape)


@kernel_op("abl::glu_fwd", _glu_fwd_fake)
def glu_fwd(gate: torch.Tensor, up: torch.Tensor, act: int) -> torch.Tensor:
    """act(gate) * up, ``act`` 0 silu, 1 gelu, 2 gelu (tanh); gate and up of one shape."""
    check_launch(gate, up)
    n = gate.shape[-1]
    g2, u2 = _rows(gate, n), _rows(up, n)
    y = torch.empty(g2.shape, dtype=gate.dtype, device=gate.device)
    if y.numel():
        block = _block(n)
        wrap_triton(_glu_fwd_kernel)[(g2.shape[0], triton.cdiv(n, block))](
            g2, u2, y, g2.stride(0), u2.stride(0), y.stride(0), n,
            ACT=act, BLOCK_N=block, num_warps=max(1, min(8, block // 256)))
    return y.view(gate.shape)


def _glu_bwd_fake(dy, gate, up, act):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


@kernel_op("abl::glu_bwd", _glu_bwd_fake)
def glu_bwd(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, act: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgate, dup) of ``glu_fwd``."""
    check_launch(dy, gate, up)
    n = gate.shape[-1]
    dy2, g2, u2 = _rows(dy, n), _rows(gate, n), _rows(up, n)
    dg = torch.empty(g2.shape, dtype=gate.dtype, device=gate.device)
    du = torch.empty(u2.shape, dtype=up.dtype, device=up.device)
    if dg.numel():
        block = _block(n)
        wrap_triton(_glu_bwd_kernel)[(g2.shape[0], triton.cdiv(n, block))](
            dy2, g2, u2, dg, du, dy2.stride(0), g2.stride(0), u2.stride(0), dg.stride(0), du.stride(0), n,
            ACT=act, BLOCK_N=block, num_warps=max(1, min(8, block // 256)))
    return dg.view(gate.shape), du.view(up.shape)


# ---------------------------------------------------------------- autograd


def _glu_setup(ctx, inputs, output):
    gate, up, act = inputs
    ctx.save_for_backward(gate, up)
    ctx.act = act


def _glu_backward(ctx, dy):
    gate, up = ctx.saved_tensors
    dg, du = glu_bwd(dy, gate, up, ctx.act)
    return dg, du, None


glu_fwd.register_autograd(_glu_backward, setup_context=_glu_setup)


def _glu(gate, up, act):
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have one shape, got {tuple(gate.shape)} and {tuple(up.shape)}")
    return glu_fwd(gate, up, act)


def swiglu_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up with the Triton kernels.

    Args:
        gate, up: ``[..., H]``, one shape and dtype (e.g. the two halves of a
            fused gate/up projection: ``gate, up = proj(x).chunk(2, -1)``;
            such strided views are read in place).

    Returns:
        ``[..., H]`` in the inputs' dtype. Differentiable in gate and up.
    """
    return _glu(gate, up, 0)


def geglu_triton(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(gate) * up with the Triton kernels.

    Args:
        gate, up: ``[..., H]``, one shape and dtype.
        approximate: "none" (exact erf GELU, torch's default) or "tanh".

    Returns:
        ``[..., H]`` in the inputs' dtype. Differentiable in gate and up.
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return _glu(gate, up, 1 if approximate == "none" else 2)


# ---------------------------------------------------------------- references


# torch's own elementwise ops in the inputs' dtype, as a gated FFN always computed
# act(gate) * up on this path (under bf16 autocast: two bf16 roundings where the
# kernel, in fp32, has one; the kernel tests' bf16 tolerance covers that).


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def geglu_reference(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return F.gelu(gate, approximate=approximate) * up


# ---------------------------------------------------------------- the ops


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up on the active kernel backend (``abl.kernels.use_triton``):
    ``swiglu_triton`` under triton, ``swiglu_reference`` otherwise."""
    if use_triton("swiglu"):
        return swiglu_triton(gate, up)
    return swiglu_reference(gate, up)


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(gate) * up on the active kernel backend (``abl.kernels.use_triton``):
    ``geglu_triton`` under triton, ``geglu_reference`` otherwise."""
    if use_triton("geglu"):
        return geglu_triton(gate, up, approximate)
    return geglu_reference(gate, up, approximate)
