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

import math
from typing import Optional

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
# The forward of ``ssd_chunked`` as five Triton kernels, the decomposition of the
# Mamba-2 paper's chunked SSD algorithm (Dao & Gu 2024, arXiv:2405.21060, sec. 6,
# steps 1-4 of Listing 1; the kernel split of its reference implementation,
# mamba_ssm's ops/triton/ssd_*.py), with the chunk length L a power of two >= 16 and
# the sequence tail masked instead of padded:
#   1. _ssd_chunk_cumsum_kernel:  a_cum[c, l] = cumsum_l (dt A), and dt in the same layout
#   2. _ssd_bmm_chunk_kernel:     CB[c, l, s] = C_l . B_s, once per group (B and C are shared by
#                                 the group's heads), lower-triangle tiles only
#   3. _ssd_chunk_state_kernel:   S_c = sum_l exp(a_cum[L-1] - a_cum[l]) dt_l x_l B_l^T  (sec. 6.2, right factor)
#   4. _ssd_state_passing_kernel: h_c = exp(sum_l A_{c-1,l}) h_{c-1} + S_{c-1}, h_0 = initial state (sec. 6.2, centre)
#   5. _ssd_chunk_scan_kernel:    y_l = sum_{s<=l} CB[l, s] exp(a_cum[l] - a_cum[s]) dt_s x_s     (sec. 6.1, diagonal
#                                       + exp(a_cum[l]) C_l h_c                       blocks; sec. 6.2, left factor)
# Positions past the end load dt = 0 (decay 1, no input), so the final state is exact.
#
# Precision (as mamba_ssm's kernels): every product is a ``tl.dot`` with fp32 accumulation
# whose operands are in the inputs' dtype: fp16/bf16 inputs run on the tensor cores (the
# decay-weighted operands, CB exp(segsum) dt and B exp(..) dt, and the passed states are
# rounded to that dtype first); fp32 inputs use TF32 only where
# ``torch.backends.cuda.matmul.allow_tf32`` allows it, else exact fp32 ("ieee"). Decays,
# cumulative sums, CB and the chunk states are fp32.
#
# The backward (``abl.kernels.ssd_scan_bwd``) recomputes kernels 1-4 (``forward_intermediates``,
# with the passed states in fp32) and differentiates the same blocks with seven more kernels, in
# mamba_ssm's backward split (sec. 6 of the paper, block by block), at the same precision.
#
# Both directions are custom ops (``abl::ssd_scan_fwd``, ``abl::ssd_scan_bwd``), so
# ``torch.compile`` traces ``ssd_scan_triton`` without graph breaks; each is a
# ``torch.library.triton_op`` whose kernels launch through ``wrap_triton`` (Inductor sees
# the kernels), or an opaque custom op under the Triton interpreter.


from .ssd_scan_bwd import ssd_scan_backward  # noqa: E402
from .ssd_scan_common import dot_precision as _dot_precision  # noqa: E402
from .ssd_scan_common import mma as _mma  # noqa: E402
from .ssd_scan_common import narrow as _narrow  # noqa: E402
from .ssd_scan_common import op_decorator as _op_decorator  # noqa: E402
from .ssd_scan_common import tile as _tile  # noqa: E402
from .ssd_scan_common import unit_last as _unit_last  # noqa: E402
from .ssd_scan_common import upcast as _upcast  # noqa: E402
from .ssd_scan_common import wrap_triton as _wrap_triton  # noqa: E402
from .utils import check_launch as _check_launch  # noqa: E402
from .utils import next_pow2 as _next_pow2  # noqa: E402
from .utils import on_gpu as _on_gpu  # noqa: E402
from .utils import tl, triton  # noqa: E402


@triton.jit
def _ssd_chunk_cumsum_kernel(DT, A, ACUM, DTC, stride_dtb, stride_dtt, stride_dth, T, H, NCHUNK,
                             L: tl.constexpr, BLOCK_H: tl.constexpr):
    pid_bc = tl.program_id(0)
    b = (pid_bc // NCHUNK).to(tl.int64)
    c = pid_bc % NCHUNK
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_l = tl.arange(0, L)
    h_mask = offs_h < H
    dt_ptr = DT + b * stride_dtb + c.to(tl.int64) * L * stride_dtt
    dt = tl.load(dt_ptr + offs_l[:, None] * stride_dtt + offs_h[None, :] * stride_dth,
                 mask=(offs_l[:, None] < T - c * L) & h_mask[None, :], other=0.0).to(tl.float32)
    a = dt * tl.load(A + offs_h, mask=h_mask, other=0.0).to(tl.float32)[None, :]
    out = ((b * H + offs_h[None, :]) * NCHUNK + c) * L + offs_l[:, None]  # [B, H, NCHUNK, L]
    tl.store(ACUM + out, tl.cumsum(a, axis=0), mask=h_mask[None, :])
    tl.store(DTC + out, dt, mask=h_mask[None, :])


@triton.jit
def _ssd_bmm_chunk_kernel(CM, BM, CB, stride_cb, stride_ct, stride_cg, stride_bb, stride_bt, stride_bg,
                          T, G, NCHUNK, N, L: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr,
                          BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    pid_m = tl.program_id(0) // (L // BLOCK_S)
    pid_s = tl.program_id(0) % (L // BLOCK_S)
    if pid_s * BLOCK_S >= (pid_m + 1) * BLOCK_M:  # a tile above the diagonal: never read
        return
    pid_bc = tl.program_id(1)
    g = tl.program_id(2)
    b = (pid_bc // NCHUNK).to(tl.int64)
    c = pid_bc % NCHUNK
    chunk_len = T - c * L
    c0 = c.to(tl.int64) * L
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_n = tl.arange(0, BLOCK_N)
    c_ptr = CM + b * stride_cb + c0 * stride_ct + g * stride_cg + offs_m[:, None] * stride_ct
    b_ptr = BM + b * stride_bb + c0 * stride_bt + g * stride_bg + offs_s[None, :] * stride_bt
    acc = tl.zeros([BLOCK_M, BLOCK_S], dtype=tl.float32)
    for k in range(0, N, BLOCK_N):
        kn = k + offs_n
        cm = tl.load(c_ptr + kn[None, :], mask=(offs_m[:, None] < chunk_len) & (kn[None, :] < N), other=0.0)
        bt = tl.load(b_ptr + kn[:, None], mask=(kn[:, None] < N) & (offs_s[None, :] < chunk_len), other=0.0)
        acc = _mma(cm, bt, acc, PRECISION, UPCAST)
    out = CB + ((b * NCHUNK + c) * G + g) * L * L  # [B, NCHUNK, G, L, L] fp32
    tl.store(out + offs_m[:, None] * L + offs_s[None, :], acc)


@triton.jit
def _ssd_chunk_state_kernel(X, BM, ACUM, DTC, STATES,
                            stride_xb, stride_xt, stride_xh, stride_bb, stride_bt, stride_bg,
                            T, H, HEADS_PER_GROUP, NCHUNK, P, N, L: tl.constexpr,
                            BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    n_blocks_n = tl.cdiv(N, BLOCK_N)
    pid_p = tl.program_id(0) // n_blocks_n
    pid_n = tl.program_id(0) % n_blocks_n
    pid_bc = tl.program_id(1)
    h = tl.program_id(2)
    b = (pid_bc // NCHUNK).to(tl.int64)
    c = pid_bc % NCHUNK
    g = h // HEADS_PER_GROUP
    chunk_len = tl.minimum(T - c * L, L)
    c0 = c.to(tl.int64) * L
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptr = X + b * stride_xb + c0 * stride_xt + h * stride_xh + offs_p[:, None]  # x^T: [P, L]
    b_ptr = BM + b * stride_bb + c0 * stride_bt + g * stride_bg + offs_n[None, :]
    vec = ((b * H + h) * NCHUNK + c) * L
    a_last = tl.load(ACUM + vec + L - 1)
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for k in range(0, chunk_len, BLOCK_K):
        kk = k + offs_k
        k_mask = kk < chunk_len
        xt = tl.load(x_ptr + kk[None, :] * stride_xt, mask=(offs_p[:, None] < P) & k_mask[None, :], other=0.0)
        bm = tl.load(b_ptr + kk[:, None] * stride_bt, mask=k_mask[:, None] & (offs_n[None, :] < N), other=0.0)
        # the right factor T (sec. 6.2) times the discretisation dt, on B's rows
        w = tl.exp(a_last - tl.load(ACUM + vec + kk, mask=k_mask, other=0.0)) \
            * tl.load(DTC + vec + kk, mask=k_mask, other=0.0)
        acc = _mma(xt, _narrow(bm.to(tl.float32) * w[:, None], X.dtype.element_ty, UPCAST), acc, PRECISION, UPCAST)
    out = STATES + ((b * NCHUNK + c) * H + h) * P * N  # [B, NCHUNK, H, P, N] fp32
    tl.store(out + offs_p[:, None] * N + offs_n[None, :], acc, mask=(offs_p[:, None] < P) & (offs_n[None, :] < N))


@triton.jit
def _ssd_state_passing_kernel(STATES, ACUM, INIT, PREV, FINAL, H, NCHUNK, PN,
                              L: tl.constexpr, HAS_INIT: tl.constexpr, BLOCK: tl.constexpr, UPCAST: tl.constexpr):
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
        tl.store(PREV + idx, _narrow(s, PREV.dtype.element_ty, UPCAST), mask=mask)  # the state entering chunk c
        total = tl.load(ACUM + (pid_bh.to(tl.int64) * NCHUNK + c) * L + L - 1)
        s = tl.exp(total) * s + tl.load(STATES + idx, mask=mask, other=0.0)
    tl.store(FINAL + pid_bh.to(tl.int64) * PN + offs, s, mask=mask)


@triton.jit
def _ssd_chunk_scan_kernel(X, CM, CB, ACUM, DTC, PREV, Y,
                           stride_xb, stride_xt, stride_xh, stride_cb, stride_ct, stride_cg,
                           stride_yb, stride_yt, stride_yh, T, H, HEADS_PER_GROUP, G, NCHUNK, P, N,
                           L: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    n_blocks_p = tl.cdiv(P, BLOCK_P)
    pid_m = tl.program_id(0) // n_blocks_p
    pid_p = tl.program_id(0) % n_blocks_p
    pid_bc = tl.program_id(1)
    h = tl.program_id(2)
    b = (pid_bc // NCHUNK).to(tl.int64)
    c = pid_bc % NCHUNK
    g = h // HEADS_PER_GROUP
    chunk_len = tl.minimum(T - c * L, L)
    c0 = c.to(tl.int64) * L
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < chunk_len
    p_mask = offs_p < P
    vec = ((b * H + h) * NCHUNK + c) * L
    acum_m = tl.load(ACUM + vec + offs_m)
    # inter-chunk (c > c'): C_l h_c over blocks of the state dim, then the left factor
    # U = exp(cumsum a) (sec. 6.2, the C-block factors)
    c_ptr = CM + b * stride_cb + c0 * stride_ct + g * stride_cg + offs_m[:, None] * stride_ct
    prev_ptr = PREV + ((b * NCHUNK + c) * H + h) * P * N + offs_p[None, :] * N  # h_c^T: [N, P]
    acc = tl.zeros([BLOCK_M, BLOCK_P], dtype=tl.float32)
    for k in range(0, N, BLOCK_N):
        kn = k + offs_n
        cm = tl.load(c_ptr + kn[None, :], mask=m_mask[:, None] & (kn[None, :] < N), other=0.0)
        ht = tl.load(prev_ptr + kn[:, None], mask=(kn[:, None] < N) & p_mask[None, :], other=0.0)
        acc = _mma(cm, ht, acc, PRECISION, UPCAST)
    acc *= tl.exp(acum_m)[:, None]
    # intra-chunk (c = c'): (CB o exp(segsum(a)) dt) (x), the lower triangle only (sec. 6.1): the
    # loop stops at this row block's diagonal
    cb_ptr = CB + ((b * NCHUNK + c) * G + g) * L * L + offs_m[:, None] * L
    x_ptr = X + b * stride_xb + c0 * stride_xt + h * stride_xh + offs_p[None, :]
    hi = tl.minimum((pid_m + 1) * BLOCK_M, chunk_len)
    for k in range(0, hi, BLOCK_K):
        kk = k + offs_k
        k_mask = kk < chunk_len
        causal = offs_m[:, None] >= kk[None, :]
        cb = tl.load(cb_ptr + kk[None, :], mask=causal & k_mask[None, :], other=0.0)
        acum_k = tl.load(ACUM + vec + kk, mask=k_mask, other=0.0)
        dt_k = tl.load(DTC + vec + kk, mask=k_mask, other=0.0)
        seg = tl.where(causal, acum_m[:, None] - acum_k[None, :], float("-inf"))
        xk = tl.load(x_ptr + kk[:, None] * stride_xt, mask=k_mask[:, None] & p_mask[None, :], other=0.0)
        scores = cb * tl.exp(seg) * dt_k[None, :]
        acc = _mma(_narrow(scores, X.dtype.element_ty, UPCAST), xk, acc, PRECISION, UPCAST)
    y_ptr = Y + b * stride_yb + c0 * stride_yt + h * stride_yh
    tl.store(y_ptr + offs_m[:, None] * stride_yt + offs_p[None, :], _narrow(acc, Y.dtype.element_ty, UPCAST),
             mask=m_mask[:, None] & p_mask[None, :])


# ---------------------------------------------------------------- launchers


def ssd_scan_configs(x, p: int, n: int, chunk: int) -> dict:
    """The tiles, warps and stages of each kernel for a launch on ``x`` (one configuration
    per kernel; ``abl.kernels.compilecheck`` compiles them for sm_90 and checks for spills).

    On CUDA: 64-row blocks of the chunk, 64-wide blocks of P and of the state dim (a loop over
    N; 32-wide for fp32 operands where the tile would spill), 4 warps, 2 stages on the loops
    (0 bytes of spill stores for sm_90 at every tile class: tests/kernels/test_kernels_ssd_scan.py).
    The interpreter runs programs one at a time: tiles of 16 there, so the tests go round every
    loop and through every masked tail.
    """
    if not _on_gpu(x):
        t = dict(num_warps=1, num_stages=1)
        return {"cumsum": dict(BLOCK_H=4, **t),
                "bmm": dict(BLOCK_M=16, BLOCK_S=16, BLOCK_N=16, **t),
                "state": dict(BLOCK_P=16, BLOCK_N=16, BLOCK_K=16, **t),
                "passing": dict(BLOCK=256, **t),
                "scan": dict(BLOCK_M=16, BLOCK_P=16, BLOCK_N=16, BLOCK_K=16, **t)}
    wide = x.dtype == torch.float32  # fp32 operands: twice the registers per tile
    exact = _dot_precision(x.dtype) == "ieee"  # fp32 products without TF32: FMAs, operands in registers
    bm = min(chunk, 64)
    return {"cumsum": dict(BLOCK_H=max(1, min(_next_pow2(x.shape[2]), 2048 // chunk)), num_warps=4, num_stages=1),
            "bmm": dict(BLOCK_M=bm, BLOCK_S=bm, BLOCK_N=_tile(n, 32 if wide else 64), num_warps=4, num_stages=2),
            "state": dict(BLOCK_P=_tile(p, 64), BLOCK_N=_tile(n, 32 if exact else 64),
                          BLOCK_K=min(chunk, 16 if exact else 32 if wide else 64), num_warps=4, num_stages=2),
            "passing": dict(BLOCK=min(1024, _next_pow2(p * n)), num_warps=4, num_stages=1),
            "scan": dict(BLOCK_M=bm, BLOCK_P=_tile(p, 64), BLOCK_N=_tile(n, 32 if wide else 64),
                         BLOCK_K=min(chunk, 32), num_warps=4, num_stages=2)}


def forward_intermediates(x, dt, A, Bm, Cm, L: int, initial_state, prev_dtype, cfg: dict, ops: dict):
    """Kernels 1-4 of the forward on x, Bm, Cm already in one dtype with unit last strides:
    (a_cum and dt [B, H, NCHUNK, L] fp32, CB [B, NCHUNK, G, L, L] fp32, the state entering each
    chunk [B, NCHUNK, H, P, N] in ``prev_dtype``, final state [B, H, P, N] fp32). The backward
    (``abl.kernels.ssd_scan_bwd``) recomputes them with ``prev_dtype`` fp32."""
    b, t, h, p = x.shape
    g, n = Bm.shape[2], Bm.shape[3]
    nchunk = max(1, triton.cdiv(t, L))
    dt, A = dt.contiguous(), A.contiguous()
    dev = x.device
    acum = torch.empty((b, h, nchunk, L), dtype=torch.float32, device=dev)
    dtc = torch.empty_like(acum)
    cb = torch.empty((b, nchunk, g, L, L), dtype=torch.float32, device=dev)
    states = torch.empty((b, nchunk, h, p, n), dtype=torch.float32, device=dev)
    prev = torch.empty((b, nchunk, h, p, n), dtype=prev_dtype, device=dev)
    final = torch.empty((b, h, p, n), dtype=torch.float32, device=dev)
    if not final.numel() and not x.numel():
        return acum, dtc, cb, prev, final
    k = cfg["cumsum"]
    _wrap_triton(_ssd_chunk_cumsum_kernel)[(b * nchunk, triton.cdiv(h, k["BLOCK_H"]))](
        dt, A, acum, dtc, dt.stride(0), dt.stride(1), dt.stride(2), t, h, nchunk, L=L, **k)
    k = cfg["bmm"]
    _wrap_triton(_ssd_bmm_chunk_kernel)[((L // k["BLOCK_M"]) * (L // k["BLOCK_S"]), b * nchunk, g)](
        Cm, Bm, cb, Cm.stride(0), Cm.stride(1), Cm.stride(2), Bm.stride(0), Bm.stride(1), Bm.stride(2),
        t, g, nchunk, n, L=L, **ops, **k)
    k = cfg["state"]
    _wrap_triton(_ssd_chunk_state_kernel)[
        (triton.cdiv(p, k["BLOCK_P"]) * triton.cdiv(n, k["BLOCK_N"]), b * nchunk, h)](
        x, Bm, acum, dtc, states, x.stride(0), x.stride(1), x.stride(2), Bm.stride(0), Bm.stride(1), Bm.stride(2),
        t, h, h // g, nchunk, p, n, L=L, **ops, **k)
    k = cfg["passing"]
    init = initial_state.float().contiguous() if initial_state is not None else final
    _wrap_triton(_ssd_state_passing_kernel)[(b * h, triton.cdiv(p * n, k["BLOCK"]))](
        states, acum, init, prev, final, h, nchunk, p * n, L=L, HAS_INIT=initial_state is not None,
        UPCAST=ops["UPCAST"] and prev_dtype != torch.float32, **k)
    return acum, dtc, cb, prev, final


@_op_decorator("abl::ssd_scan_fwd", mutates_args=())
def ssd_scan_fwd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, Bm: torch.Tensor, Cm: torch.Tensor,
                 chunk_size: int, initial_state: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton forward (``torch.ops.abl.ssd_scan_fwd``): the chunked SSD algorithm (Dao & Gu
    2024, arXiv:2405.21060, sec. 6; Listing 1) as the five kernels above. Returns (y [B, T, H, P]
    in x's dtype, final_state [B, H, P, N] fp32)."""
    _check_launch(x, dt, A, Bm, Cm, initial_state)
    b, t, h, p = x.shape
    L = chunk_size
    # one operand dtype for every product: x's (B and C are cast to it where they differ)
    x, Bm, Cm = _unit_last(x), _unit_last(Bm.to(x.dtype)), _unit_last(Cm.to(x.dtype))
    g, n = Bm.shape[2], Bm.shape[3]
    y = torch.empty((b, t, h, p), dtype=x.dtype, device=x.device)
    cfg = ssd_scan_configs(x, p, n, L)
    ops = dict(PRECISION=_dot_precision(x.dtype), UPCAST=_upcast(x.dtype))
    # the passed states are an MMA operand beside C: stored in its dtype
    acum, dtc, cb, prev, final = forward_intermediates(x, dt, A, Bm, Cm, L, initial_state, x.dtype, cfg, ops)
    if not y.numel():
        return y, final
    nchunk = acum.shape[2]
    k = cfg["scan"]
    _wrap_triton(_ssd_chunk_scan_kernel)[((L // k["BLOCK_M"]) * triton.cdiv(p, k["BLOCK_P"]), b * nchunk, h)](
        x, Cm, cb, acum, dtc, prev, y, x.stride(0), x.stride(1), x.stride(2), Cm.stride(0), Cm.stride(1),
        Cm.stride(2), y.stride(0), y.stride(1), y.stride(2), t, h, h // g, g, nchunk, p, n,
        L=L, **ops, **k)
    return y, final


@ssd_scan_fwd.register_fake
def _(x, dt, A, Bm, Cm, chunk_size, initial_state=None):
    b, t, h, p = x.shape
    return x.new_empty((b, t, h, p)), x.new_empty((b, h, p, Bm.shape[3]), dtype=torch.float32)


@_op_decorator("abl::ssd_scan_bwd", mutates_args=())
def ssd_scan_bwd(dy: torch.Tensor, dfinal: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                 Bm: torch.Tensor, Cm: torch.Tensor, chunk_size: int, initial_state: Optional[torch.Tensor] = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Triton backward (``torch.ops.abl.ssd_scan_bwd``): the chunked SSD algorithm (Dao & Gu
    2024, arXiv:2405.21060, sec. 6) differentiated block by block, ``abl.kernels.ssd_scan_bwd``:
    the forward's kernels 1-4 recomputed, then seven backward kernels. Returns the gradients of
    (x, dt, A, Bm, Cm, initial_state), each in its input's dtype; the last is empty without an
    initial state."""
    _check_launch(dy, dfinal, x, dt, A, Bm, Cm, initial_state)
    p, n = x.shape[3], Bm.shape[3]
    xd, bm, cm = _unit_last(x), _unit_last(Bm.to(x.dtype)), _unit_last(Cm.to(x.dtype))
    ops = dict(PRECISION=_dot_precision(x.dtype), UPCAST=_upcast(x.dtype))
    acum, dtc, cb, prev, _ = forward_intermediates(xd, dt, A, bm, cm, chunk_size, initial_state, torch.float32,
                                                   ssd_scan_configs(xd, p, n, chunk_size), ops)
    grads = ssd_scan_backward(dy, dfinal, x, dt, A, Bm, Cm, initial_state, acum, dtc, cb, prev)
    return (*grads[:5], grads[5] if grads[5] is not None else x.new_empty(0))


def ssd_scan_bwd_vjp(dy, dfinal, x, dt, A, Bm, Cm, chunk_size: int, initial_state=None):
    """The former backward, kept as a baseline for the GPU probe: the vector-Jacobian product of
    ``ssd_chunked`` recomputed in fp32 (``torch.func.vjp``); same arguments and result as
    ``ssd_scan_bwd``."""
    def chunked(x_, dt_, a_, b_, c_, *s0):
        return ssd_chunked(x_, dt_, a_, b_, c_, chunk_size, initial_state=s0[0] if s0 else None)

    sources = [v for v in (x, dt, A, Bm, Cm, initial_state) if v is not None]
    vjp = torch.func.vjp(chunked, *[v.detach().float() for v in sources])[1]
    grads = [gr.to(src.dtype) for gr, src in zip(vjp((dy.float(), dfinal.float())), sources)]
    if initial_state is None:
        grads.append(x.new_empty(0))
    return tuple(grads)


@ssd_scan_bwd.register_fake
def _(dy, dfinal, x, dt, A, Bm, Cm, chunk_size, initial_state=None):
    s0 = torch.empty_like(initial_state) if initial_state is not None else x.new_empty(0)
    return (torch.empty_like(x), torch.empty_like(dt), torch.empty_like(A), torch.empty_like(Bm),
            torch.empty_like(Cm), s0)


def compile_check_cases():
    """The launches ``abl.kernels.compilecheck`` compiles for sm_90 (``register_cases("ssd_scan",
    compile_check_cases)``): yields (label, function that runs the op) for the forward and the
    backward (``abl::ssd_scan_bwd``: the recomputed forward kernels with fp32 passed states, and the
    kernels of ``abl.kernels.ssd_scan_bwd``) for each dtype class (bf16, fp16, fp32 exact, fp32
    TF32) and tile class (the largest, 64-wide tiles; 32; 16), with and without an initial state;
    two heads share one group (the backward: eight, so two programs share a group's heads). Under
    ``compile_check()`` nothing runs (zeros suffice)."""
    for dtype, tf32 in ((torch.bfloat16, False), (torch.float16, False), (torch.float32, False),
                        (torch.float32, True)):
        for p, n, chunk, init in ((64, 128, 64, False), (64, 128, 256, True), (32, 32, 32, False),
                                  (16, 16, 16, True)):
            for backward in (False, True):
                def run(dtype=dtype, tf32=tf32, p=p, n=n, chunk=chunk, init=init, backward=backward):
                    allowed = torch.backends.cuda.matmul.allow_tf32
                    torch.backends.cuda.matmul.allow_tf32 = tf32
                    try:
                        h = 8 if backward else 2
                        x = torch.zeros(1, 2 * chunk, h, p, dtype=dtype)
                        dt, a = torch.zeros(1, 2 * chunk, h), -torch.ones(h)
                        bm = torch.zeros(1, 2 * chunk, 1, n, dtype=dtype)
                        s0 = torch.zeros(1, h, p, n, dtype=dtype if backward else torch.float32) if init else None
                        if backward:
                            torch.ops.abl.ssd_scan_bwd(x, torch.zeros(1, h, p, n, dtype=dtype), x, dt, a, bm, bm,
                                                       chunk, s0)
                        else:
                            ssd_scan_triton(x, dt, a, bm, bm, chunk, s0)
                    finally:
                        torch.backends.cuda.matmul.allow_tf32 = allowed
                name = f"{str(dtype)[6:]}{'-tf32' if tf32 else ''}"
                yield (f"ssd_scan{' backward' if backward else ''} {name} P{p} N{n} chunk{chunk}"
                       f"{' init' if init else ''}"), run


class SSDScanFunction(torch.autograd.Function):
    """Triton forward (``abl::ssd_scan_fwd``) and backward (``abl::ssd_scan_bwd``, the Triton kernels
    of ``abl.kernels.ssd_scan_bwd``)."""

    @staticmethod
    def forward(ctx, x, dt, A, Bm, Cm, initial_state, chunk_size):
        y, final = torch.ops.abl.ssd_scan_fwd(x, dt, A, Bm, Cm, chunk_size, initial_state)
        ctx.save_for_backward(x, dt, A, Bm, Cm, initial_state)
        ctx.chunk_size = chunk_size
        return y, final.to(x.dtype)

    @staticmethod
    def backward(ctx, dy, dfinal):
        x, dt, A, Bm, Cm, initial_state = ctx.saved_tensors
        dx, ddt, dA, dB, dC, ds0 = torch.ops.abl.ssd_scan_bwd(dy, dfinal, x, dt, A, Bm, Cm, ctx.chunk_size,
                                                              initial_state)
        return dx, ddt, dA, dB, dC, (ds0 if initial_state is not None else None), None


def ssd_scan_triton(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, Bm: torch.Tensor, Cm: torch.Tensor,
             chunk_size: int = 64, initial_state: torch.Tensor | None = None):
    """The chunked SSD scan with the Triton forward kernels (same contract as ``ssd_chunked``): the
    chunked SSD algorithm of Dao & Gu 2024 (arXiv:2405.21060, sec. 6; Listing 1), as five kernels.

    Args:
        x: ``[B, T, H, P]``; dt: ``[B, T, H]`` (after softplus, > 0); A: ``[H]`` (< 0);
        Bm, Cm: ``[B, T, G, N]`` with G dividing H (head h reads group h // (H / G));
        chunk_size: L, a power of two >= 16 (the kernels' tile along time);
        initial_state: ``[B, H, P, N]`` or None (zeros).

    Returns:
        (y ``[B, T, H, P]`` in x's dtype, final_state ``[B, H, P, N]`` in x's dtype).
        Differentiable in every input (the backward is Triton kernels too:
        ``abl.kernels.ssd_scan_bwd``).
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
