"""Rotary position embedding (RoPE): rotate pairs of dims of q/k by position-dependent angles.

Su et al. 2021, arXiv:2104.09864, sec. 3.4.2, eq. 34. For each pair (x1, x2) and angle a:
    y1 = x1 cos a - x2 sin a,    y2 = x1 sin a + x2 cos a.
Two layouts of the pairs, as in plugins/positions.py:
- "interleaved": dims (2k, 2k+1), the paper's form;
- "half": dims (k, k + D/2), the GPT-NeoX (Black et al. 2022, arXiv:2204.06745) / LLaMA code form.
The rotation is orthogonal, so the backward is the same kernel rotating by -a
(sin negated). cos/sin are inputs (the position plugin owns theta, position
interpolation and the cache) and get no gradient. Arithmetic is fp32.

The launcher is the custom op ``abl::rope`` (abl.kernels.registration.kernel_op), its own
autograd formula (the inverse rotation), so ``torch.compile`` keeps a call in one graph.
"""

import torch
from torch.library import wrap_triton

from . import use_triton
from .registration import kernel_op
from .utils import check_launch, next_pow2, tl, triton

# ---------------------------------------------------------------- kernel


@triton.jit
def _rope_kernel(X, Y, COS, SIN,
                 stride_xb, stride_xh, stride_xt, stride_yb, stride_yh, stride_yt,
                 stride_cb, stride_ct, H, T, HALF,
                 INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_bh = tl.program_id(0)
    pid_t = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    k = tl.arange(0, BLOCK_K)
    mask = (t[:, None] < T) & (k[None, :] < HALF)
    c_off = b * stride_cb + t[:, None] * stride_ct + k[None, :]
    cos = tl.load(COS + c_off, mask=mask, other=1.0).to(tl.float32)
    sin = tl.load(SIN + c_off, mask=mask, other=0.0).to(tl.float32)
    if BACKWARD:
        sin = -sin
    if INTERLEAVED:
        d1 = 2 * k
        d2 = 2 * k + 1
    else:
        d1 = k
        d2 = k + HALF
    x_row = X + b * stride_xb + h * stride_xh + t[:, None] * stride_xt
    y_row = Y + b * stride_yb + h * stride_yh + t[:, None] * stride_yt
    x1 = tl.load(x_row + d1[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + d2[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(y_row + d1[None, :], (x1 * cos - x2 * sin).to(Y.dtype.element_ty), mask=mask)
    tl.store(y_row + d2[None, :], (x1 * sin + x2 * cos).to(Y.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------- launcher


def _as4d(x):
    while x.dim() < 4:
        x = x.unsqueeze(0)
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x


def _check_shapes(x, cos, sin):
    if x.dim() < 2 or x.dim() > 4:
        raise ValueError(f"rope expects [T, D], [H, T, D] or [B, H, T, D], got {tuple(x.shape)}")
    if x.shape[-1] % 2:
        raise ValueError(f"rope needs an even last dim, got {x.shape[-1]}")
    t, half = x.shape[-2], x.shape[-1] // 2
    batch = x.shape[0] if x.dim() == 4 else 1
    for c in (cos, sin):
        if c.shape[-2:] != (t, half):
            raise ValueError(f"cos/sin must be [T, D/2] = [{t}, {half}] (or [B, T, D/2]), got {tuple(c.shape)}")
        if c.dim() not in (2, 3) or (c.dim() == 3 and c.shape[0] not in (1, batch)):
            raise ValueError(f"cos/sin batch dim must be 1 or {batch}, got {tuple(c.shape)}")


def _as_angles(c, t, half, batch):
    if c.dim() == 2:
        c = c.unsqueeze(0).expand(batch, t, half)
    if c.stride(-1) != 1:
        c = c.contiguous()
    return c


def _rope_fake(x, cos, sin, interleaved, inverse):
    return x.new_empty(x.shape)


@kernel_op("abl::rope", _rope_fake)
def rope_launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                inverse: bool) -> torch.Tensor:
    """x: [..., T, D] with up to 4 dims. Returns a new tensor of x's shape and dtype: x rotated
    by the angles, or by their negatives (``inverse``: the backward)."""
    check_launch(x, cos, sin)
    shape = x.shape
    x4 = _as4d(x)
    b, h, t, d = x4.shape
    half = d // 2
    cos = _as_angles(cos, t, half, b)
    sin = _as_angles(sin, t, half, b)
    y4 = torch.empty((b, h, t, d), dtype=x.dtype, device=x.device)
    if x4.numel():
        block_k = next_pow2(half)
        block_t = max(1, min(next_pow2(t), 4096 // block_k, 64))
        grid = (b * h, triton.cdiv(t, block_t))
        wrap_triton(_rope_kernel)[grid](
            x4, y4, cos, sin,
            x4.stride(0), x4.stride(1), x4.stride(2), y4.stride(0), y4.stride(1), y4.stride(2),
            cos.stride(0) if cos.shape[0] > 1 else 0, cos.stride(1), h, t, half,
            INTERLEAVED=interleaved, BACKWARD=inverse, BLOCK_T=block_t, BLOCK_K=block_k,
            num_warps=4)
    return y4.view(shape)


# ---------------------------------------------------------------- autograd


def _rope_setup(ctx, inputs, output):
    _, cos, sin, interleaved, inverse = inputs
    ctx.save_for_backward(cos, sin)
    ctx.interleaved, ctx.inverse = interleaved, inverse


def _rope_backward(ctx, dy):
    cos, sin = ctx.saved_tensors
    return rope_launch(dy, cos, sin, ctx.interleaved, not ctx.inverse), None, None, None, None


rope_launch.register_autograd(_rope_backward, setup_context=_rope_setup)


def _layout(layout: str) -> bool:
    if layout not in ("interleaved", "half"):
        raise ValueError(f"layout must be 'interleaved' or 'half', got {layout!r}")
    return layout == "interleaved"


def rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "interleaved") -> torch.Tensor:
    """Rotate x by the angles whose cos/sin are given, with the Triton kernel.

    Args:
        x: ``[B, H, T, D]`` (or ``[H, T, D]``, ``[T, D]``); D even; any float dtype.
            Only the last dim needs unit stride (the transposed q/k views of an
            attention layer are read in place).
        cos, sin: ``[T, D/2]`` (or ``[B, T, D/2]``) angles p * theta_k for the T
            positions, as ``RotaryPosition.angles`` returns them.
        layout: "interleaved" (pairs 2k, 2k+1) or "half" (pairs k, k + D/2).

    Returns:
        the rotated tensor, shape and dtype of x. Differentiable in x.
    """
    interleaved = _layout(layout)
    _check_shapes(x, cos, sin)
    return rope_launch(x, cos, sin, interleaved, False)


def rope_qk(q: torch.Tensor, k: torch.Tensor, cos_q: torch.Tensor, sin_q: torch.Tensor,
            cos_k: torch.Tensor | None = None, sin_k: torch.Tensor | None = None,
            layout: str = "interleaved") -> tuple[torch.Tensor, torch.Tensor]:
    """``rope`` on queries ``[B, Hq, Tq, D]`` and keys ``[B, Hk, Tk, D]`` (keys reuse q's angles
    when cos_k/sin_k are None)."""
    if cos_k is None or sin_k is None:
        cos_k, sin_k = cos_q, sin_q
    return rope_triton(q, cos_q, sin_q, layout), rope_triton(k, cos_k, sin_k, layout)


# ---------------------------------------------------------------- reference


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   layout: str = "interleaved") -> torch.Tensor:
    """The plain torch definition (as plugins/positions.py's RotaryPosition computes it)."""
    xf = x.float()
    if cos.dim() == 3 and x.dim() == 4:  # per-sequence angles [B, T, D/2]
        cos, sin = cos[:, None], sin[:, None]
    cos, sin = cos.float(), sin.float()
    if _layout(layout):
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    else:
        half = x.shape[-1] // 2
        x1, x2 = xf[..., :half], xf[..., half:]
        out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.to(x.dtype)


# ---------------------------------------------------------------- the op


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "interleaved") -> torch.Tensor:
    """RoPE on the active kernel backend (``abl.kernels.use_triton``): ``rope_triton`` under
    triton, ``rope_reference`` otherwise. Arguments as ``rope_triton``."""
    if use_triton("rope"):
        return rope_triton(x, cos, sin, layout)
    return rope_reference(x, cos, sin, layout)
