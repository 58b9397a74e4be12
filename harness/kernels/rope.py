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
                 BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
    # One program: BLOCK_T positions of one sequence, BLOCK_H heads of it. The angles are loaded
    # once for all its heads; each row (one head at one position, D elements) is read and written
    # whole, at unit stride, so the accesses are vectors; "interleaved" pairs are split and joined
    # in registers (not loaded at stride 2). 64-bit arithmetic on the tile's base pointers only.
    pid = tl.program_id(0)
    n_t = tl.cdiv(T, BLOCK_T)
    b = (pid // n_t).to(tl.int64)
    t0 = (pid % n_t) * BLOCK_T
    h0 = tl.program_id(1) * BLOCK_H
    x_base = X + b * stride_xb + h0.to(tl.int64) * stride_xh + t0.to(tl.int64) * stride_xt
    y_base = Y + b * stride_yb + h0.to(tl.int64) * stride_yh + t0.to(tl.int64) * stride_yt
    c_base = b * stride_cb + t0.to(tl.int64) * stride_ct
    hh = tl.arange(0, BLOCK_H)[:, None, None]
    tt = tl.arange(0, BLOCK_T)[None, :, None]
    k = tl.arange(0, BLOCK_K)[None, None, :]
    rows = (h0 + hh < H) & (t0 + tt < T)
    c_off = tt * stride_ct + k
    c_mask = (t0 + tt < T) & (k < HALF)
    cos = tl.load(COS + c_base + c_off, mask=c_mask, other=1.0).to(tl.float32)  # [1, BLOCK_T, BLOCK_K]
    sin = tl.load(SIN + c_base + c_off, mask=c_mask, other=0.0).to(tl.float32)
    if BACKWARD:
        sin = -sin
    x_off = hh * stride_xh + tt * stride_xt
    y_off = hh * stride_yh + tt * stride_yt
    if INTERLEAVED:
        # pairs (2k, 2k+1): the whole row in one load, viewed as [..., BLOCK_K, 2] and split
        d = tl.arange(0, 2 * BLOCK_K)[None, None, :]
        mask = rows & (d < 2 * HALF)
        x = tl.load(x_base + x_off + d, mask=mask, other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(x, (BLOCK_H, BLOCK_T, BLOCK_K, 2)))
        y = tl.reshape(tl.join(x1 * cos - x2 * sin, x1 * sin + x2 * cos), (BLOCK_H, BLOCK_T, 2 * BLOCK_K))
        tl.store(y_base + y_off + d, y.to(Y.dtype.element_ty), mask=mask)
    else:
        # pairs (k, k + D/2): two contiguous half rows
        mask = rows & (k < HALF)
        x1 = tl.load(x_base + x_off + k, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_base + x_off + HALF + k, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_base + y_off + k, (x1 * cos - x2 * sin).to(Y.dtype.element_ty), mask=mask)
        tl.store(y_base + y_off + HALF + k, (x1 * sin + x2 * cos).to(Y.dtype.element_ty), mask=mask)


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


def _as_angles(c):
    """cos/sin as [B or 1, T, D/2] with unit stride along D/2 (a [T, D/2] table gets a leading 1:
    one table for every sequence, read with batch stride 0)."""
    if c.dim() == 2:
        c = c.unsqueeze(0)
    if c.stride(-1) != 1:
        c = c.contiguous()
    return c


# Elements of x one program rotates (its heads x positions x D): 8 KiB of bf16 on 4 warps.
_TILE_ELEMENTS = 4096


def rope_tiles(h: int, t: int, d: int) -> tuple[int, int, int]:
    """(BLOCK_H, BLOCK_T, BLOCK_K) of a launch on x [B, h, t, d]: whole rows (BLOCK_K = next_pow2(d/2)
    pairs), as many heads as fit the tile (the angles are loaded once for all of them), then
    positions."""
    block_k = next_pow2(d // 2)
    rows = max(1, _TILE_ELEMENTS // (2 * block_k))
    rows = 1 << (rows.bit_length() - 1)  # a power of two (tl.arange's sizes must be)
    block_h = min(next_pow2(h), rows)
    block_t = max(1, min(next_pow2(t), rows // block_h))
    return block_h, block_t, block_k


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
    cos, sin = _as_angles(cos), _as_angles(sin)
    y4 = torch.empty((b, h, t, d), dtype=x.dtype, device=x.device)
    if x4.numel():
        block_h, block_t, block_k = rope_tiles(h, t, d)
        grid = (b * triton.cdiv(t, block_t), triton.cdiv(h, block_h))
        wrap_triton(_rope_kernel)[grid](
            x4, y4, cos, sin,
            x4.stride(0), x4.stride(1), x4.stride(2), y4.stride(0), y4.stride(1), y4.stride(2),
            cos.stride(0) if cos.shape[0] > 1 else 0, cos.stride(1), h, t, d // 2,
            INTERLEAVED=interleaved, BACKWARD=inverse, BLOCK_H=block_h, BLOCK_T=block_t, BLOCK_K=block_k,
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


def compile_check_cases():
    """The launches ``abl.kernels.compilecheck`` compiles for sm_90: yields (label, function that runs
    the forward and backward). First the 126M cell's own (scripts/gpu_big.toml: B16 T1024, 16 heads of
    64, bf16, q a transposed view of its [B, T, H, D] projection, k one of the [B, T, 2, H, D] key/value
    projection, one [T, D/2] angle table) in both layouts; then the bench's contiguous D128, fp32,
    a head dim that is no power of two and per-sequence angles. Tensors are allocated, never filled:
    nothing runs."""
    def run(layout, dtype=torch.bfloat16, b=16, h=16, t=1024, d=64, view="cell", per_seq=False):
        def go():
            if view == "cell":
                q = torch.empty(b, t, h, d, dtype=dtype).transpose(1, 2)
                k = torch.empty(b, t, 2, h, d, dtype=dtype).permute(2, 0, 3, 1, 4)[0]
            else:
                q = k = torch.empty(b, h, t, d, dtype=dtype)
            ang = torch.empty((b, t, d // 2) if per_seq else (t, d // 2))
            for x in (q, k):
                y = rope_launch(x, ang, ang, layout == "interleaved", False)
                rope_launch(torch.empty_like(y), ang, ang, layout == "interleaved", True)  # the backward
        return go

    for layout in ("interleaved", "half"):
        yield f"rope {layout} bf16 D64, the 126M cell's q and k views", run(layout)
        yield f"rope {layout} bf16 D128 contiguous", run(layout, b=4, h=32, t=2048, d=128, view="contiguous")
    yield "rope interleaved fp32 D64, the cell's views", run("interleaved", torch.float32, b=2, t=256)
    yield "rope interleaved fp16 D96, per-sequence angles", run("interleaved", torch.float16, b=2, h=12, t=200,
                                                                 d=96, per_seq=True)


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
