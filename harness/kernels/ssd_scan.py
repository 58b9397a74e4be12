"""Mamba-2 state-space duality (SSD) scan: torch reference.

The recurrence, per head with a scalar decay (Dao & Gu 2024, "Transformers are
SSMs", arXiv:2405.21060, sec. 3, scalar-times-identity A), for t = 0 .. T-1:

    h_t = exp(dt_t * A) h_{t-1} + dt_t * x_t B_t^T      h: [P, N] per head
    y_t = h_t C_t                                       y: [P]

Shapes (batch B, length T, heads H, head dim P, groups G, state N; G divides H
and head h reads group h // (H / G)):

    x  [B, T, H, P]    dt [B, T, H] (after softplus, > 0)    A [H] (< 0)
    Bm [B, T, G, N]    Cm [B, T, G, N]    state [B, H, P, N]

Three forms, all equal up to rounding:

- ``ssd_chunked``: the chunked SSD algorithm of the Mamba-2 paper, sec. 6 (its
  ``ssd_minimal_discrete`` listing, Listing 1): intra-chunk
  quadratic (attention-like) form through segment sums, plus inter-chunk
  state passing. No Python loop over time; the training path.
- ``ssd_sequential``: the recurrence above, one step at a time. The ground
  truth in tests.
- ``ssd_step``: one step of the recurrence with O(1) state: decoding.

D (skip) and the gate are not part of the scan; the Mamba-2 block adds them.
Everything is computed in the dtype of the inputs; callers pass fp32.
"""

from __future__ import annotations

from typing import Any

import math

import torch
import torch.nn.functional as F

from . import use_triton


def _heads(m: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[B, T, G, N] -> [B, T, H, N]: head h reads group h // (H / G)."""
    return m.repeat_interleave(n_heads // m.size(2), dim=2)


def segsum(a: torch.Tensor) -> torch.Tensor:
    """Segment sums of the last dim: out[..., l, s] = sum_{k=s+1}^{l} a[..., k] for l >= s, else -inf.

    The stable form of the Mamba-2 reference code (Dao & Gu 2024, arXiv:2405.21060,
    Listing 1's ``segsum``, as in mamba_ssm's ssd_minimal.py): a masked cumulative sum
    that adds only the terms it needs instead of subtracting two cumulative sums
    (no cancellation). exp(segsum(a)) is the lower-triangular decay mask L of sec. 6.1.
    """
    t = a.size(-1)
    z = torch.ones(t, t, dtype=torch.bool, device=a.device).tril(-1)  # Z: 1 where l > s
    x = a[..., :, None].expand(*a.shape, t).masked_fill(~z, 0)       # x[l, s] = a[l] for l > s
    out = torch.cumsum(x, dim=-2)
    m = torch.ones(t, t, dtype=torch.bool, device=a.device).tril()   # M: -inf where l < s
    return out.masked_fill(~m, float("-inf"))


def ssd_chunked(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, Bm: torch.Tensor,
                Cm: torch.Tensor, chunk_size: int, initial_state: torch.Tensor | None = None):
    """Chunked SSD scan (Dao & Gu 2024, arXiv:2405.21060, sec. 6: diagonal and low-rank blocks).

    Returns (y [B, T, H, P], final_state [B, H, P, N]); shapes in the module docstring.

    The sequence is padded with zeros to a multiple of the chunk length; a
    padded step has dt = 0 (decay 1, no input), so it changes neither the
    outputs kept nor the final state.
    """
    b, t, h, p = x.shape
    chunk = max(1, min(chunk_size, t))
    pad = (-t) % chunk
    if pad:
        x, Bm, Cm = (F.pad(v, (0, 0, 0, 0, 0, pad)) for v in (x, Bm, Cm))
        dt = F.pad(dt, (0, 0, 0, pad))
    c = (t + pad) // chunk
    g, n = Bm.shape[2:]
    # chunk the time index s into (c, l); the discretised input is dt x (the
    # zero-order-hold input dt B x without B itself) and the log-decay A_s = dt_s A
    X = (x * dt[..., None]).reshape(b, c, chunk, h, p)
    Bc, Cc = _heads(Bm, h).reshape(b, c, chunk, h, n), _heads(Cm, h).reshape(b, c, chunk, h, n)
    a = (dt * A).reshape(b, c, chunk, h).permute(0, 3, 1, 2)      # [B, H, c, l]
    a_cum = torch.cumsum(a, dim=-1)

    # 1. c = c' (sec. 6.1, diagonal blocks): within a chunk y = (C B^T o exp(segsum)) X, the
    #    quadratic "attention" form over the chunk's L x L lower triangle
    decay = torch.exp(segsum(a))                               # [B, H, c, l, s]
    cb = torch.einsum("bclgn,bcsgn->bgcls", Cm.reshape(b, c, chunk, g, n), Bm.reshape(b, c, chunk, g, n))
    scores = cb.repeat_interleave(h // g, dim=1) * decay      # C B^T is shared by a group's heads
    y_diag = torch.einsum("bhcls,bcshp->bclhp", scores, X)

    # 2. each chunk's own end state: inputs carried to the chunk end by the
    #    right factor T = exp(sum_l A - cumsum_l A) (sec. 6.2, the B-block factors)
    to_end = torch.exp(a_cum[..., -1:] - a_cum)                # [B, H, c, l]
    states = torch.einsum("bclhn,bclhp->bchpn", Bc * to_end.permute(0, 2, 3, 1)[..., None], X)

    # 3. c > c' (sec. 6.2, low-rank blocks): pass states between chunks with the centre
    #    factor exp(segsum over chunk totals); the initial state is chunk -1
    if initial_state is None:
        initial_state = torch.zeros(b, h, p, n, dtype=x.dtype, device=x.device)
    states = torch.cat([initial_state[:, None], states], dim=1)          # [B, c+1, H, P, N]
    chunk_decay = torch.exp(segsum(F.pad(a_cum[..., -1], (1, 0))))       # [B, H, c+1, c+1]
    states = torch.einsum("bhzc,bchq->bzhq", chunk_decay, states.flatten(3)).reshape(b, c + 1, h, p, n)
    states, final_state = states[:, :-1], states[:, -1]

    # 4. state -> output within each chunk with the left factor U = exp(cumsum_l A)
    y_off = torch.einsum("bclhn,bchpn->bclhp", Cc, states) * torch.exp(a_cum).permute(0, 2, 3, 1)[..., None]
    y = (y_diag + y_off).reshape(b, c * chunk, h, p)[:, :t]
    return y, final_state


def ssd_step(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, Bm: torch.Tensor, Cm: torch.Tensor,
             state: torch.Tensor):
    """One step of the recurrence: x [B, H, P], dt [B, H], Bm/Cm [B, G, N], state [B, H, P, N].

    Returns (y [B, H, P], new state). O(1) in the sequence length (decoding).
    """
    h = x.size(1)
    Bh = Bm.repeat_interleave(h // Bm.size(1), dim=1)
    Ch = Cm.repeat_interleave(h // Cm.size(1), dim=1)
    decay = torch.exp(dt * A)[..., None, None]
    state = decay * state + (dt[..., None] * x)[..., None] * Bh[:, :, None, :]
    y = torch.einsum("bhpn,bhn->bhp", state, Ch)
    return y, state


def ssd_sequential(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, Bm: torch.Tensor,
                   Cm: torch.Tensor, initial_state: torch.Tensor | None = None):
    """The recurrence one step at a time (the ground truth). Same signature and result as ``ssd_chunked``."""
    b, t, h, p = x.shape
    state = initial_state
    if state is None:
        state = torch.zeros(b, h, p, Bm.size(-1), dtype=x.dtype, device=x.device)
    ys = []
    for i in range(t):
        y, state = ssd_step(x[:, i], dt[:, i], A, Bm[:, i], Cm[:, i], state)
        ys.append(y)
    return torch.stack(ys, dim=1), state


def ssd_chunked_flops(seq_len: int, chunk_size: int, n_heads: int, head_dim: int, d_state: int,
                      n_groups: int = 1) -> tuple[float, float]:
    """Forward FLOPs per token of ``ssd_chunked`` at length ``seq_len``: (as executed, useful).

    Counts its five contractions as torch.utils.flop_counter does (2 per
    multiply-add), on the padded length. "Useful" keeps only the lower
    triangle of each intra-chunk L x L product (causality: the mask L of sec. 6.1) and the
    unpadded tokens.
    """
    chunk = max(1, min(chunk_size, seq_len))
    c = math.ceil(seq_len / chunk)
    t_pad = c * chunk
    h, p, n = n_heads, head_dim, d_state
    intra = 2 * chunk * n * n_groups + 2 * chunk * p * h   # C B^T per group, scores @ X per head
    states = 2 * n * p * h                             # chunk end states
    out = 2 * n * p * h                                # C @ passed states
    passing = 2 * (c + 1) ** 2 * h * p * n / t_pad     # inter-chunk recurrence, spread over tokens
    executed = (intra + states + out + passing) * t_pad / seq_len
    tri = (chunk + 1) / 2
    useful = 2 * tri * n * n_groups + 2 * tri * p * h + states + out + passing * t_pad / seq_len
    return executed, useful


# ==================================================================== Triton kernels
#
# The forward of ``ssd_chunked`` as four Triton kernels, following the same
# decomposition (Dao & Gu 2024, arXiv:2405.21060, sec. 6, steps 1-4; the paper's
# ssd_minimal listing), with the chunk length L a power of two >= 16 and the
# sequence tail masked instead of padded:
#   1. _ssd_chunk_cumsum_kernel:  a_cum[c, l] = cumsum_l (dt A)          per (batch, head, chunk)
#   2. _ssd_chunk_state_kernel:   S_c = sum_l exp(a_cum[L-1] - a_cum[l]) dt_l x_l B_l^T   (sec. 6.2, T)
#   3. _ssd_state_passing_kernel: h_c = exp(sum_l A_{c-1,l}) h_{c-1} + S_{c-1}, h_0 = initial state
#   4. _ssd_chunk_scan_kernel:    y_l = sum_{s<=l} (C_l . B_s) exp(a_cum[l] - a_cum[s]) dt_s x_s
#                                       + exp(a_cum[l]) C_l h_c                    (secs. 6.1, 6.2)
# Positions past the end load dt = 0 (decay 1, no input), so the final state is
# exact. Arithmetic is fp32 whatever the input dtype. The backward recomputes
# through ``ssd_chunked`` with autograd (the issue allows it).


from .utils import check_launch as _check_launch  # noqa: E402
from .utils import next_pow2 as _next_pow2  # noqa: E402
from .utils import tl, triton  # noqa: E402


@triton.jit
def _ssd_chunk_cumsum_kernel(DT, A, ACUM, stride_dtb, stride_dtt, stride_dth, T, H, NCHUNK,
                             L: tl.constexpr):
    pid_bh = tl.program_id(0)
    c = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    offs_l = tl.arange(0, L)
    t = c * L + offs_l
    dt = tl.load(DT + b * stride_dtb + t * stride_dtt + h * stride_dth, mask=t < T, other=0.0).to(tl.float32)
    a = dt * tl.load(A + h).to(tl.float32)
    tl.store(ACUM + (pid_bh.to(tl.int64) * NCHUNK + c) * L + offs_l, tl.cumsum(a, axis=0))


@triton.jit
def _ssd_chunk_state_kernel(X, DT, ACUM, BM, STATES,
                            stride_xb, stride_xt, stride_xh, stride_dtb, stride_dtt, stride_dth,
                            stride_bb, stride_bt, stride_bg, T, H, HEADS_PER_GROUP, NCHUNK, P, N,
                            L: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_p = tl.program_id(0)
    pid_bc = tl.program_id(1)
    h = tl.program_id(2)
    b = (pid_bc // NCHUNK).to(tl.int64)
    c = pid_bc % NCHUNK
    g = h // HEADS_PER_GROUP
    offs_l = tl.arange(0, L)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    t = c * L + offs_l
    t_mask = t < T
    x = tl.load(X + b * stride_xb + t[:, None] * stride_xt + h * stride_xh + offs_p[None, :],
                mask=t_mask[:, None] & (offs_p[None, :] < P), other=0.0).to(tl.float32)
    dt = tl.load(DT + b * stride_dtb + t * stride_dtt + h * stride_dth, mask=t_mask, other=0.0).to(tl.float32)
    acum_base = ACUM + ((b * H + h) * NCHUNK + c) * L
    acum = tl.load(acum_base + offs_l)
    a_last = tl.load(acum_base + L - 1)
    w = tl.exp(a_last - acum) * dt  # the right factor T (sec. 6.2), times the discretisation dt
    bm = tl.load(BM + b * stride_bb + t[:, None] * stride_bt + g * stride_bg + offs_n[None, :],
                 mask=t_mask[:, None] & (offs_n[None, :] < N), other=0.0).to(tl.float32)
    state = tl.dot(tl.trans(x * w[:, None]), bm, input_precision="ieee")  # [P, N]
    s_base = STATES + (((b * NCHUNK + c) * H + h) * P) * N
    tl.store(s_base + offs_p[:, None] * N + offs_n[None, :], state,
             mask=(offs_p[:, None] < P) & (offs_n[None, :] < N))


@triton.jit
def _ssd_state_passing_kernel(STATES, ACUM, INIT, PREV, FINAL, H, NCHUNK, PN,
                              L: tl.constexpr, HAS_INIT: tl.constexpr, BLOCK: tl.constexpr):
    pid_bh = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < PN
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    if HAS_INIT:
        s = tl.load(INIT + pid_bh.to(tl.int64) * PN + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        s = tl.zeros([BLOCK], dtype=tl.float32)
    for c in range(0, NCHUNK):
        idx = ((b * NCHUNK + c) * H + h) * PN + offs
        tl.store(PREV + idx, s, mask=mask)  # the state entering chunk c
        total = tl.load(ACUM + (pid_bh.to(tl.int64) * NCHUNK + c) * L + L - 1)
        s = tl.exp(total) * s + tl.load(STATES + idx, mask=mask, other=0.0)
    tl.store(FINAL + pid_bh.to(tl.int64) * PN + offs, s, mask=mask)


@triton.jit
def _ssd_chunk_scan_kernel(X, DT, ACUM, BM, CM, PREV, Y,
                           stride_xb, stride_xt, stride_xh, stride_dtb, stride_dtt, stride_dth,
                           stride_bb, stride_bt, stride_bg, stride_cb, stride_ct, stride_cg,
                           stride_yb, stride_yt, stride_yh, T, H, HEADS_PER_GROUP, NCHUNK, P, N,
                           L: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_p = tl.program_id(0)
    pid_bc = tl.program_id(1)
    h = tl.program_id(2)
    b = (pid_bc // NCHUNK).to(tl.int64)
    c = pid_bc % NCHUNK
    g = h // HEADS_PER_GROUP
    offs_l = tl.arange(0, L)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    t = c * L + offs_l
    t_mask = t < T
    n_mask = offs_n < N
    cm = tl.load(CM + b * stride_cb + t[:, None] * stride_ct + g * stride_cg + offs_n[None, :],
                 mask=t_mask[:, None] & n_mask[None, :], other=0.0).to(tl.float32)
    bm = tl.load(BM + b * stride_bb + t[:, None] * stride_bt + g * stride_bg + offs_n[None, :],
                 mask=t_mask[:, None] & n_mask[None, :], other=0.0).to(tl.float32)
    acum = tl.load(ACUM + ((b * H + h) * NCHUNK + c) * L + offs_l)
    dt = tl.load(DT + b * stride_dtb + t * stride_dtt + h * stride_dth, mask=t_mask, other=0.0).to(tl.float32)
    # intra-chunk (c = c'): (C B^T o exp(segsum(a))) (dt x), lower triangle only (sec. 6.1)
    causal = offs_l[:, None] >= offs_l[None, :]
    seg = tl.where(causal, acum[:, None] - acum[None, :], float("-inf"))
    scores = tl.dot(cm, tl.trans(bm), input_precision="ieee") * tl.exp(seg) * dt[None, :]
    x = tl.load(X + b * stride_xb + t[:, None] * stride_xt + h * stride_xh + offs_p[None, :],
                mask=t_mask[:, None] & (offs_p[None, :] < P), other=0.0).to(tl.float32)
    y = tl.dot(scores, x, input_precision="ieee")
    # inter-chunk (c > c'): the passed state, carried to each row by U = exp(cumsum a) (sec. 6.2, the C-block factors)
    prev = tl.load(PREV + (((b * NCHUNK + c) * H + h) * P + offs_p[:, None]) * N + offs_n[None, :],
                   mask=(offs_p[:, None] < P) & n_mask[None, :], other=0.0)
    y += tl.exp(acum)[:, None] * tl.dot(cm, tl.trans(prev), input_precision="ieee")
    tl.store(Y + b * stride_yb + t[:, None] * stride_yt + h * stride_yh + offs_p[None, :],
             y.to(Y.dtype.element_ty), mask=t_mask[:, None] & (offs_p[None, :] < P))


def _unit_last(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def ssd_scan_fwd(x, dt, A, Bm, Cm, chunk_size, initial_state=None):
    """The Triton forward. Returns (y [B, T, H, P] in x's dtype, final_state [B, H, P, N] fp32)."""
    b, t, h, p = x.shape
    g, n = Bm.shape[2], Bm.shape[3]
    L = chunk_size
    nchunk = max(1, triton.cdiv(t, L))
    x, Bm, Cm = _unit_last(x), _unit_last(Bm), _unit_last(Cm)
    dt, A = dt.contiguous(), A.contiguous()
    dev = x.device
    acum = torch.empty((b, h, nchunk, L), dtype=torch.float32, device=dev)
    states = torch.empty((b, nchunk, h, p, n), dtype=torch.float32, device=dev)
    prev = torch.empty_like(states)
    final = torch.empty((b, h, p, n), dtype=torch.float32, device=dev)
    y = torch.empty((b, t, h, p), dtype=x.dtype, device=dev)
    block_p = max(16, min(64, _next_pow2(p)))
    block_n = max(16, _next_pow2(n))
    _ssd_chunk_cumsum_kernel[(b * h, nchunk)](dt, A, acum, dt.stride(0), dt.stride(1), dt.stride(2),
                                              t, h, nchunk, L=L)
    grid = (triton.cdiv(p, block_p), b * nchunk, h)
    _ssd_chunk_state_kernel[grid](
        x, dt, acum, Bm, states, x.stride(0), x.stride(1), x.stride(2), dt.stride(0), dt.stride(1),
        dt.stride(2), Bm.stride(0), Bm.stride(1), Bm.stride(2), t, h, h // g, nchunk, p, n,
        L=L, BLOCK_P=block_p, BLOCK_N=block_n)
    init = initial_state.float().contiguous() if initial_state is not None else final
    block = min(1024, _next_pow2(p * n))
    _ssd_state_passing_kernel[(b * h, triton.cdiv(p * n, block))](
        states, acum, init, prev, final, h, nchunk, p * n,
        L=L, HAS_INIT=initial_state is not None, BLOCK=block)
    _ssd_chunk_scan_kernel[grid](
        x, dt, acum, Bm, Cm, prev, y, x.stride(0), x.stride(1), x.stride(2), dt.stride(0), dt.stride(1),
        dt.stride(2), Bm.stride(0), Bm.stride(1), Bm.stride(2), Cm.stride(0), Cm.stride(1), Cm.stride(2),
        y.stride(0), y.stride(1), y.stride(2), t, h, h // g, nchunk, p, n,
        L=L, BLOCK_P=block_p, BLOCK_N=block_n)
    return y, final


class SSDScanFunction(torch.autograd.Function):
    """Triton forward; the backward differentiates ``ssd_chunked`` (recomputed in fp32)."""

    @staticmethod
    def forward(ctx, x, dt, A, Bm, Cm, initial_state, chunk_size):
        _check_launch(x, dt, A, Bm, Cm, initial_state)
        y, final = ssd_scan_fwd(x, dt, A, Bm, Cm, chunk_size, initial_state)
        ctx.save_for_backward(x, dt, A, Bm, Cm, initial_state)
        ctx.chunk_size = chunk_size
        return y, final.to(x.dtype)

    @staticmethod
    def backward(ctx, dy, dfinal):
        x, dt, A, Bm, Cm, initial_state = ctx.saved_tensors
        inputs: list[Any] = [t.detach().float().requires_grad_(t.requires_grad) if t is not None else None
                             for t in (x, dt, A, Bm, Cm, initial_state)]
        with torch.enable_grad():
            x_, dt_, a_, b_, c_, s_ = inputs
            y, final = ssd_chunked(x_, dt_, a_, b_, c_, ctx.chunk_size, initial_state=s_)
            outs, grads_out = [y], [dy.float()]
            if dfinal is not None:
                outs.append(final)
                grads_out.append(dfinal.float())
            wanted = [i for i, t in enumerate(inputs) if t is not None and t.requires_grad]
            got = torch.autograd.grad(outs, [inputs[i] for i in wanted], grads_out, allow_unused=True)
        grads: list[torch.Tensor | None] = [None] * 6
        for i, gr in zip(wanted, got):
            src = (x, dt, A, Bm, Cm, initial_state)[i]
            grads[i] = gr.to(src.dtype) if gr is not None else None
        return (*grads, None)


def ssd_scan_triton(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, Bm: torch.Tensor, Cm: torch.Tensor,
             chunk_size: int = 64, initial_state: torch.Tensor | None = None):
    """The chunked SSD scan with the Triton forward kernels (same contract as ``ssd_chunked``).

    Args:
        x: ``[B, T, H, P]``; dt: ``[B, T, H]`` (after softplus, > 0); A: ``[H]`` (< 0);
        Bm, Cm: ``[B, T, G, N]`` with G dividing H (head h reads group h // (H / G));
        chunk_size: L, a power of two >= 16 (the kernels' tile along time);
        initial_state: ``[B, H, P, N]`` or None (zeros).

    Returns:
        (y ``[B, T, H, P]`` in x's dtype, final_state ``[B, H, P, N]`` in x's dtype).
        Differentiable in every input (the backward goes through ``ssd_chunked``).
    """
    if chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two >= 16 for the kernels, got {chunk_size}")
    b, t, h, p = x.shape
    if dt.shape != (b, t, h) or A.shape != (h,) or Bm.shape != Cm.shape or Bm.shape[:2] != (b, t) \
            or h % Bm.shape[2]:
        raise ValueError(f"ssd_scan shapes: x {tuple(x.shape)}, dt {tuple(dt.shape)}, A {tuple(A.shape)}, "
                         f"B {tuple(Bm.shape)}, C {tuple(Cm.shape)}")
    return SSDScanFunction.apply(x, dt, A, Bm, Cm, initial_state, int(chunk_size))


# ---------------------------------------------------------------- the op


def fits_the_kernels(chunk_size: int) -> bool:
    """Whether the Triton kernels tile this chunk length: a power of two >= 16."""
    return chunk_size >= 16 and not chunk_size & (chunk_size - 1)


def ssd_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, Bm: torch.Tensor, Cm: torch.Tensor,
             chunk_size: int = 64, initial_state: torch.Tensor | None = None):
    """The chunked SSD scan on the active kernel backend (``abl.kernels.use_triton``):
    ``ssd_scan_triton`` under triton when its tile fits the chunk length
    (``fits_the_kernels``), else ``ssd_chunked``; both are the same chunked
    algorithm. Arguments and result as ``ssd_chunked``."""
    if use_triton("ssd_scan") and fits_the_kernels(chunk_size):
        return ssd_scan_triton(x, dt, A, Bm, Cm, chunk_size, initial_state)
    return ssd_chunked(x, dt, A, Bm, Cm, chunk_size, initial_state=initial_state)
