"""Rotary position embedding (RoPE): rotate pairs of dims of q/k by position-dependent angles.

Su et al. 2021, arXiv:2104.09864, sec. 3.4.2, eq. 34. For each pair (x1, x2) and angle a:
    y1 = x1 cos a - x2 sin a,    y2 = x1 sin a + x2 cos a.
Two layouts of the pairs, as in plugins/positions.py:
- "interleaved": dims (2k, 2k+1), the paper's form;
- "half": dims (k, k + D/2), the GPT-NeoX (Black et al. 2022, arXiv:2204.06745) / LLaMA code form.
The rotation is orthogonal, so the backward is the same kernel rotating by -a
(sin negated). cos/sin are inputs (the position plugin owns theta, position
interpolation and the cache) and get no gradient. Arithmetic is fp32.

The launchers are the custom ops ``abl::rope_qk`` (q and k of a layer in one launch: ``rope_qk``)
and ``abl::rope`` (one tensor: ``rope``), both the one kernel (abl.kernels.registration.kernel_op),
each with its own autograd formula (the inverse rotation, one launch), so ``torch.compile`` keeps a
call in one graph.
"""

import torch
from torch.library import wrap_triton

from . import use_triton
from .registration import kernel_op
from .utils import check_launch, next_pow2, tl, triton

# ---------------------------------------------------------------- kernel


@triton.jit
def _rotate_tile(X, Y, COS, SIN, b, t0, h0,
                 stride_xb, stride_xh, stride_xt, stride_yb, stride_yh, stride_yt, stride_cb, stride_ct,
                 H, T, HALF, INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
                 BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
    # BLOCK_T positions (from t0) of sequence b, BLOCK_H heads (from h0) of x [B, H, T, D]. The angles
    # are loaded once for all the heads; each row (one head at one position, D elements) is read and
    # written whole, at unit stride, so the accesses are vectors; "interleaved" pairs are split and
    # joined in registers (not loaded at stride 2). 64-bit arithmetic on the tile's base pointers only.
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


@triton.jit
def _rope_qk_kernel(Q, QO, K, KO, COS_Q, SIN_Q, COS_K, SIN_K,
                 stride_qb, stride_qh, stride_qt, stride_qob, stride_qoh, stride_qot,
                 stride_kb, stride_kh, stride_kt, stride_kob, stride_koh, stride_kot,
                 stride_cqb, stride_cqt, stride_ckb, stride_ckt, HQ, HK, TQ, TK, HALF,
                 INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
                 BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
    # One launch rotates q [B, HQ, TQ, D] and k [B, HK, TK, D] (HK = 0: q alone). Grid: (B x the
    # position blocks of the longer, the head blocks of q then those of k). A program is q's or k's
    # as a whole (a uniform branch); each branch is the one tile code, specialised on its own strides.
    pid = tl.program_id(0)
    n_t = tl.cdiv(tl.maximum(TQ, TK), BLOCK_T)
    b = (pid // n_t).to(tl.int64)
    t0 = (pid % n_t) * BLOCK_T
    hb = tl.program_id(1)
    n_q = tl.cdiv(HQ, BLOCK_H)
    if hb < n_q:
        _rotate_tile(Q, QO, COS_Q, SIN_Q, b, t0, hb * BLOCK_H,
                     stride_qb, stride_qh, stride_qt, stride_qob, stride_qoh, stride_qot, stride_cqb, stride_cqt,
                     HQ, TQ, HALF, INTERLEAVED, BACKWARD, BLOCK_H, BLOCK_T, BLOCK_K)
    else:
        _rotate_tile(K, KO, COS_K, SIN_K, b, t0, (hb - n_q) * BLOCK_H,
                     stride_kb, stride_kh, stride_kt, stride_kob, stride_koh, stride_kot, stride_ckb, stride_ckt,
                     HK, TK, HALF, INTERLEAVED, BACKWARD, BLOCK_H, BLOCK_T, BLOCK_K)


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


def _launch(q, k, cos_q, sin_q, cos_k, sin_k, interleaved, inverse):
    """q [B, Hq, Tq, D] (and k [B, Hk, Tk, D], or None) rotated in one launch: new contiguous tensors."""
    qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    # without k the k side is never run: q's strides, and an output of its own (an empty one: under
    # torch.compile an output passed twice would be one the kernel mutates through two arguments,
    # which inductor could not write in place)
    ko = torch.empty(0 if k is None else k.shape, dtype=q.dtype if k is None else k.dtype, device=q.device)
    kk, ck, sk = (q, cos_q, sin_q) if k is None else (k, cos_k, sin_k)
    ko_strides = qo.stride() if k is None else ko.stride()
    b, hq, tq, d = q.shape
    hk, tk = (0, tq) if k is None else (k.shape[1], k.shape[2])
    if b * d and (hq * tq or hk * tk):
        block_h, block_t, block_k = rope_tiles(max(hq, hk), max(tq, tk), d)
        grid = (b * triton.cdiv(max(tq, tk), block_t), triton.cdiv(hq, block_h) + triton.cdiv(hk, block_h))
        wrap_triton(_rope_qk_kernel)[grid](
            q, qo, kk, ko, cos_q, sin_q, ck, sk,
            q.stride(0), q.stride(1), q.stride(2), qo.stride(0), qo.stride(1), qo.stride(2),
            kk.stride(0), kk.stride(1), kk.stride(2), ko_strides[0], ko_strides[1], ko_strides[2],
            cos_q.stride(0) if cos_q.shape[0] > 1 else 0, cos_q.stride(1),
            ck.stride(0) if ck.shape[0] > 1 else 0, ck.stride(1), hq, hk, tq, tk, d // 2,
            INTERLEAVED=interleaved, BACKWARD=inverse, BLOCK_H=block_h, BLOCK_T=block_t, BLOCK_K=block_k,
            num_warps=4)
    return qo, ko


@kernel_op("abl::rope", _rope_fake)
def rope_launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                inverse: bool) -> torch.Tensor:
    """x: [..., T, D] with up to 4 dims. Returns a new tensor of x's shape and dtype: x rotated
    by the angles, or by their negatives (``inverse``: the backward)."""
    check_launch(x, cos, sin)
    cos, sin = _as_angles(cos), _as_angles(sin)
    return _launch(_as4d(x), None, cos, sin, None, None, interleaved, inverse)[0].view(x.shape)


def _rope_qk_fake(q, k, cos_q, sin_q, cos_k, sin_k, interleaved, inverse):
    return q.new_empty(q.shape), k.new_empty(k.shape)


@kernel_op("abl::rope_qk", _rope_qk_fake)
def rope_qk_launch(q: torch.Tensor, k: torch.Tensor, cos_q: torch.Tensor, sin_q: torch.Tensor,
                   cos_k: torch.Tensor, sin_k: torch.Tensor, interleaved: bool,
                   inverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, Hq, Tq, D] and k [B, Hk, Tk, D] rotated by their own angles in one launch (``inverse``:
    by their negatives, the backward). Returns new tensors of q's and k's shapes and dtypes."""
    check_launch(q, k, cos_q, sin_q, cos_k, sin_k)
    qo, ko = _launch(q if q.stride(-1) == 1 else q.contiguous(), k if k.stride(-1) == 1 else k.contiguous(),
                     _as_angles(cos_q), _as_angles(sin_q), _as_angles(cos_k), _as_angles(sin_k),
                     interleaved, inverse)
    return qo, ko


# ---------------------------------------------------------------- autograd


def _rope_setup(ctx, inputs, output):
    _, cos, sin, interleaved, inverse = inputs
    ctx.save_for_backward(cos, sin)
    ctx.interleaved, ctx.inverse = interleaved, inverse


def _rope_backward(ctx, dy):
    cos, sin = ctx.saved_tensors
    return rope_launch(dy, cos, sin, ctx.interleaved, not ctx.inverse), None, None, None, None


rope_launch.register_autograd(_rope_backward, setup_context=_rope_setup)


def _rope_qk_setup(ctx, inputs, output):
    _, _, cos_q, sin_q, cos_k, sin_k, interleaved, inverse = inputs
    ctx.save_for_backward(cos_q, sin_q, cos_k, sin_k)
    ctx.interleaved, ctx.inverse = interleaved, inverse


def _rope_qk_backward(ctx, dq, dk):
    # the inverse rotation of dq and dk, in one launch
    cos_q, sin_q, cos_k, sin_k = ctx.saved_tensors
    dq, dk = rope_qk_launch(dq, dk, cos_q, sin_q, cos_k, sin_k, ctx.interleaved, not ctx.inverse)
    return dq, dk, None, None, None, None, None, None


rope_qk_launch.register_autograd(_rope_qk_backward, setup_context=_rope_qk_setup)


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


def _as4d_qk(q, k, cos_q, sin_q, cos_k, sin_k):
    _check_shapes(q, cos_q, sin_q)
    _check_shapes(k, cos_k, sin_k)
    q4, k4 = _as4d(q), _as4d(k)
    if q4.shape[0] != k4.shape[0]:
        raise ValueError(f"rope_qk needs q and k of the same batch size, got {tuple(q.shape)} and {tuple(k.shape)}")
    if q4.shape[-1] != k4.shape[-1]:
        raise ValueError(f"rope_qk needs q and k of the same head dim, got {q.shape[-1]} and {k.shape[-1]}")
    return q4, k4


def rope_qk_triton(q: torch.Tensor, k: torch.Tensor, cos_q: torch.Tensor, sin_q: torch.Tensor,
                   cos_k: torch.Tensor | None = None, sin_k: torch.Tensor | None = None,
                   layout: str = "interleaved") -> tuple[torch.Tensor, torch.Tensor]:
    """``rope_triton`` on queries ``[B, Hq, Tq, D]`` and keys ``[B, Hk, Tk, D]`` in one kernel launch
    (its backward, dq and dk, one launch too). The keys may have fewer heads (GQA) and their own
    angles ``cos_k``/``sin_k`` ``[Tk, D/2]`` or ``[B, Tk, D/2]`` (None: q's); q and k may be strided
    views of one projection (only D needs unit stride). Differentiable in q and k."""
    interleaved = _layout(layout)
    if cos_k is None or sin_k is None:
        cos_k, sin_k = cos_q, sin_q
    q4, k4 = _as4d_qk(q, k, cos_q, sin_q, cos_k, sin_k)
    qo, ko = rope_qk_launch(q4, k4, cos_q, sin_q, cos_k, sin_k, interleaved, False)
    return qo.view(q.shape), ko.view(k.shape)


def rope_qk_reference(q: torch.Tensor, k: torch.Tensor, cos_q: torch.Tensor, sin_q: torch.Tensor,
                      cos_k: torch.Tensor | None = None, sin_k: torch.Tensor | None = None,
                      layout: str = "interleaved") -> tuple[torch.Tensor, torch.Tensor]:
    """``rope_reference`` on q and on k (k by q's angles when cos_k/sin_k are None)."""
    if cos_k is None or sin_k is None:
        cos_k, sin_k = cos_q, sin_q
    return rope_reference(q, cos_q, sin_q, layout), rope_reference(k, cos_k, sin_k, layout)


def compile_check_cases():
    """The launches ``abl.kernels.compilecheck`` compiles for sm_90: yields (label, function that makes
    them), the forward and the backward (the inverse rotation, of contiguous dq and dk) as cases of
    their own, so that their labels differ. First the 126M cell's own (scripts/gpu_big.toml: B16 T1024,
    16 heads of 64, bf16, q a transposed view of its [B, T, H, D] projection, k one of the [B, T, 2, H, D]
    key/value projection, one [T, D/2] angle table) in both layouts, q and k in one launch
    (``abl::rope_qk``; ``abl::rope`` on q alone specialises to the same launch, k empty); then the
    bench's contiguous D128 with GQA keys, fp32, a head dim that is no power of two and per-sequence
    angles. Tensors are allocated, never filled: nothing runs."""
    def run(layout, backward, dtype=torch.bfloat16, b=16, h=16, hk=16, t=1024, d=64, view="cell",
            per_seq=False):
        def go():
            if view == "cell":
                q = torch.empty(b, t, h, d, dtype=dtype).transpose(1, 2)
                k = torch.empty(b, t, 2, hk, d, dtype=dtype).permute(2, 0, 3, 1, 4)[0]
            else:
                q, k = torch.empty(b, h, t, d, dtype=dtype), torch.empty(b, hk, t, d, dtype=dtype)
            if backward:  # the gradients reaching the op: contiguous, as its outputs are
                q, k = torch.empty(q.shape, dtype=dtype), torch.empty(k.shape, dtype=dtype)
            ang = torch.empty((b, t, d // 2) if per_seq else (t, d // 2))
            rope_qk_launch(q, k, ang, ang, ang, ang, layout == "interleaved", backward)
        return go

    for backward in (False, True):
        way = "backward" if backward else "forward"
        for layout in ("interleaved", "half"):
            yield f"rope {layout} bf16 D64, the 126M cell's q and k views in one launch, {way}", run(layout, backward)
            yield f"rope {layout} bf16 D128 contiguous, 8 key heads, {way}", run(
                layout, backward, b=4, h=32, hk=8, t=2048, d=128, view="contiguous")
        yield f"rope interleaved fp32 D64, the cell's views, {way}", run("interleaved", backward, torch.float32,
                                                                         b=2, t=256)
        yield f"rope interleaved fp16 D96, per-sequence angles, {way}", run(
            "interleaved", backward, torch.float16, b=2, h=12, hk=4, t=200, d=96, per_seq=True)


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


def rope_qk(q: torch.Tensor, k: torch.Tensor, cos_q: torch.Tensor, sin_q: torch.Tensor,
            cos_k: torch.Tensor | None = None, sin_k: torch.Tensor | None = None,
            layout: str = "interleaved") -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on queries and keys on the active kernel backend: ``rope_qk_triton`` (one launch) under
    triton, ``rope_qk_reference`` otherwise. Arguments as ``rope_qk_triton``."""
    if use_triton("rope"):
        return rope_qk_triton(q, k, cos_q, sin_q, cos_k, sin_k, layout)
    return rope_qk_reference(q, k, cos_q, sin_q, cos_k, sin_k, layout)
