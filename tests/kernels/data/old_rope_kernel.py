"""The RoPE kernel as it was when the GPU probe of 2026-11-28 profiled the 126M cell (abl at d5f91a8):
``_rope_kernel`` took about 54% of the step's CUDA time there. Its interleaved path loads and stores
the pairs (2k, 2k+1) at stride 2, 2 bytes at a time; tests/kernels/test_rope_compile.py holds
``abl.kernels.compilecheck``'s vector check to finding that. Kept verbatim; not used by abl."""

import triton
import triton.language as tl


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
