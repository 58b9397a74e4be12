"""The backward of the Triton SSD scan (``abl.kernels.ssd_scan``) as Triton kernels.

The chunked SSD algorithm of the Mamba-2 paper (Dao & Gu 2024, "Transformers are SSMs",
arXiv:2405.21060, sec. 6) differentiated block by block, in the kernel split of its reference
implementation's backward (mamba_ssm's ``_mamba_chunk_scan_combined_bwd``), written anew here.
Per batch b, chunk c, head h (group g), chunk positions l, s in [0, L), with a_cum the in-chunk
cumulative log-decay, X_s = dt_s x_s and h_c the state entering chunk c (notation of ssd_scan.py):

    y_l   = sum_{s<=l} CB[l, s] exp(a_cum[l] - a_cum[s]) X_s + exp(a_cum[l]) h_c C_l   (sec. 6.1; 6.2 left)
    S_c   = sum_s exp(a_cum[L-1] - a_cum[s]) X_s B_s^T                                  (sec. 6.2, right)
    h_c+1 = exp(a_cum[L-1]) h_c + S_c                                                   (sec. 6.2, centre)

The forward's cheap intermediates (a_cum, dt by chunk, CB, the passed states h_c in fp32) are
recomputed with the forward's own kernels 1-4 (``abl.kernels.ssd_scan``, whose op
``abl::ssd_scan_bwd`` calls ``ssd_scan_backward`` here), then seven kernels:

  1. _ssd_bwd_dstates_kernel:  dH_c = sum_l exp(a_cum[l]) dy_l C_l^T, what the outputs send to h_c
  2. _ssd_bwd_passing_kernel:  the state passing run backwards, c = NCHUNK-1 .. 0:
                               dS_c = g_c+1 (g_NCHUNK = d final), g_c = exp(a_cum_c[L-1]) g_c+1 + dH_c,
                               d initial = g_0; and exp(a_cum[L-1]) <h_c, g_c+1> for d a_cum[L-1]
  3. _ssd_bwd_dx_kernel:       dX_s = sum_{l>=s} CB[l, s] exp(a_cum[l] - a_cum[s]) dy_l
                                      + exp(a_cum[L-1] - a_cum[s]) dS_c B_s;  dx = dt dX, x . dX
  4. _ssd_bwd_dcb_kernel:      dCB[l, s] = sum_{h in g} exp(a_cum[l] - a_cum[s]) dt_s dy_l . x_s  (l >= s),
                               and per head the row and column sums of CB o dCB_h (for d a_cum)
  5. _ssd_bwd_dc_kernel:       dC_l = sum_{s<=l} dCB[l, s] B_s + sum_{h in g} exp(a_cum[l]) dy_l h_c,
                               and per head dy_l . (exp(a_cum[l]) h_c C_l) (for d a_cum[l])
  6. _ssd_bwd_db_kernel:       dB_s = sum_{l>=s} dCB[l, s] C_l + sum_{h in g} exp(a_cum[L-1] - a_cum[s]) dt_s dS_c^T x_s

and 7. _ssd_bwd_ddt_kernel, the gradient of a_cum from the kernels' per-row partial sums (O(B H T)
work), the in-chunk reverse cumulative sum, and the dt gradient (d A: per-chunk sums added in torch):

    d a_cum[l] = (rows of W)[l] - (columns of W)[l] + (dy . y_off)[l] - dt_l x_l . dX_l^state
                 + [l = L-1] (sum_s dt_s x_s . dX_s^state + exp(a_cum[L-1]) <h_c, dS_c>)

with W = CB o dCB_h per head (fp32: the row and column sums, which cancel on the diagonal, come
from the same fp32 tile, not from the rounded products of dX), and

    d a_s = sum_{l>=s} d a_cum[l];  d dt = x . dX + A d a;  d A = sum dt d a.

Precision as the forward: every product a ``tl.dot`` with fp32 accumulation on operands in the
inputs' dtype (decay-weighted tiles rounded to it first; TF32 for fp32 only where the run allows
it), decays, cumulative sums and all gradients of the decays in fp32.

Deterministic: no atomics. Sums over heads of a group (dB, dC, dCB) run in a loop inside a
program (four heads a program on CUDA, so a single group still fills the GPU), the programs'
shares added in torch; partial sums over tiles (of P or N, of the chunk's rows or columns) are
written to their own slots and added in a fixed order (kernel 7; d A's per-chunk sums by torch).
"""

from __future__ import annotations

import torch

from .ssd_scan_common import dot_precision as _dot_precision
from .ssd_scan_common import mma as _mma
from .ssd_scan_common import narrow as _narrow
from .ssd_scan_common import tile as _tile
from .ssd_scan_common import unit_last as _unit_last
from .ssd_scan_common import upcast as _upcast
from .ssd_scan_common import wrap_triton as _wrap_triton
from .utils import next_pow2 as _next_pow2
from .utils import on_gpu as _on_gpu
from .utils import tl, triton


@triton.jit
def _ssd_bwd_dstates_kernel(DY, CM, ACUM, DSY, stride_yb, stride_yt, stride_yh, stride_cb, stride_ct, stride_cg,
                            T, H, HEADS_PER_GROUP, NCHUNK, P, N, L: tl.constexpr, BLOCK_P: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
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
    dy_ptr = DY + b * stride_yb + c0 * stride_yt + h * stride_yh + offs_p[:, None]  # dy^T: [P, L]
    c_ptr = CM + b * stride_cb + c0 * stride_ct + g * stride_cg + offs_n[None, :]
    vec = ((b * H + h) * NCHUNK + c) * L
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for k in range(0, chunk_len, BLOCK_K):
        kk = k + offs_k
        k_mask = kk < chunk_len
        dyt = tl.load(dy_ptr + kk[None, :] * stride_yt, mask=(offs_p[:, None] < P) & k_mask[None, :], other=0.0)
        cm = tl.load(c_ptr + kk[:, None] * stride_ct, mask=k_mask[:, None] & (offs_n[None, :] < N), other=0.0)
        # the left factor U = exp(a_cum) (sec. 6.2) on C's rows
        w = tl.exp(tl.load(ACUM + vec + kk, mask=k_mask, other=0.0))
        acc = _mma(dyt, _narrow(cm.to(tl.float32) * w[:, None], DY.dtype.element_ty, UPCAST), acc, PRECISION, UPCAST)
    out = DSY + ((b * NCHUNK + c) * H + h) * P * N  # [B, NCHUNK, H, P, N] fp32
    tl.store(out + offs_p[:, None] * N + offs_n[None, :], acc, mask=(offs_p[:, None] < P) & (offs_n[None, :] < N))


@triton.jit
def _ssd_bwd_passing_kernel(DSY, ACUM, PREV, DFINAL, DSTATES, DINIT, DTOTAL, H, NCHUNK, PN,
                            L: tl.constexpr, BLOCK: tl.constexpr):
    pid_bh = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs = pid_k * BLOCK + tl.arange(0, BLOCK)
    mask = offs < PN
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    n_blocks = tl.num_programs(1)
    gs = tl.load(DFINAL + pid_bh.to(tl.int64) * PN + offs, mask=mask, other=0.0).to(tl.float32)
    for i in range(0, NCHUNK):
        c = NCHUNK - 1 - i
        idx = ((b * NCHUNK + c) * H + h) * PN + offs
        tl.store(DSTATES + idx, gs, mask=mask)  # the gradient of S_c: that of the state leaving chunk c
        decay = tl.exp(tl.load(ACUM + (pid_bh.to(tl.int64) * NCHUNK + c) * L + L - 1))
        hc = tl.load(PREV + idx, mask=mask, other=0.0)
        # this block's share of d a_cum[L-1] through the centre factor (sec. 6.2)
        tl.store(DTOTAL + (pid_bh.to(tl.int64) * NCHUNK + c) * n_blocks + pid_k, decay * tl.sum(hc * gs, axis=0))
        gs = decay * gs + tl.load(DSY + idx, mask=mask, other=0.0)
    tl.store(DINIT + pid_bh.to(tl.int64) * PN + offs, gs, mask=mask)


@triton.jit
def _ssd_bwd_dx_kernel(X, DY, BM, CB, ACUM, DTC, DSTATES, DX, RALL, RSTATE,
                       stride_xb, stride_xt, stride_xh, stride_yb, stride_yt, stride_yh,
                       stride_bb, stride_bt, stride_bg, stride_ob, stride_ot, stride_oh,
                       T, H, HEADS_PER_GROUP, G, NCHUNK, P, N,
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
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # the rows s
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < chunk_len
    p_mask = offs_p < P
    vec = ((b * H + h) * NCHUNK + c) * L
    acum_m = tl.load(ACUM + vec + offs_m)
    a_last = tl.load(ACUM + vec + L - 1)
    # through the chunk state: B_s dS_c^T over blocks of the state dim, then the right factor
    # exp(a_cum[L-1] - a_cum[s]) (sec. 6.2)
    b_ptr = BM + b * stride_bb + c0 * stride_bt + g * stride_bg + offs_m[:, None] * stride_bt
    ds_ptr = DSTATES + ((b * NCHUNK + c) * H + h) * P * N + offs_p[None, :] * N  # dS_c^T: [N, P]
    acc = tl.zeros([BLOCK_M, BLOCK_P], dtype=tl.float32)
    for k in range(0, N, BLOCK_N):
        kn = k + offs_n
        bm = tl.load(b_ptr + kn[None, :], mask=m_mask[:, None] & (kn[None, :] < N), other=0.0)
        dst = tl.load(ds_ptr + kn[:, None], mask=(kn[:, None] < N) & p_mask[None, :], other=0.0)
        acc = _mma(bm, _narrow(dst, X.dtype.element_ty, UPCAST), acc, PRECISION, UPCAST)
    acc *= tl.exp(a_last - acum_m)[:, None]
    x = tl.load(X + b * stride_xb + c0 * stride_xt + h * stride_xh + offs_m[:, None] * stride_xt + offs_p[None, :],
                mask=m_mask[:, None] & p_mask[None, :], other=0.0).to(tl.float32)
    r_state = tl.sum(acc * x, axis=1)
    # within the chunk (sec. 6.1): the transposed lower triangle, (CB o exp(segsum))^T dy, from this
    # row block's diagonal to the chunk's end
    cb_ptr = CB + ((b * NCHUNK + c) * G + g) * L * L + offs_m[:, None]  # CB^T: [s, l]
    dy_ptr = DY + b * stride_yb + c0 * stride_yt + h * stride_yh + offs_p[None, :]
    for k in range(pid_m * BLOCK_M, chunk_len, BLOCK_K):
        kk = k + offs_k
        k_mask = kk < chunk_len
        causal = kk[None, :] >= offs_m[:, None]
        cbt = tl.load(cb_ptr + kk[None, :] * L, mask=causal & k_mask[None, :], other=0.0)
        acum_k = tl.load(ACUM + vec + kk, mask=k_mask, other=0.0)
        seg = tl.where(causal, acum_k[None, :] - acum_m[:, None], float("-inf"))
        dyk = tl.load(dy_ptr + kk[:, None] * stride_yt, mask=k_mask[:, None] & p_mask[None, :], other=0.0)
        acc = _mma(_narrow(cbt * tl.exp(seg), X.dtype.element_ty, UPCAST), dyk, acc, PRECISION, UPCAST)
    part = (vec + offs_m) * n_blocks_p + pid_p  # [B, H, NCHUNK, L, P blocks] fp32
    tl.store(RALL + part, tl.sum(acc * x, axis=1))
    tl.store(RSTATE + part, r_state)
    dt_m = tl.load(DTC + vec + offs_m)
    dx_ptr = DX + b * stride_ob + c0 * stride_ot + h * stride_oh  # dx's own strides: x may be a strided view
    tl.store(dx_ptr + offs_m[:, None] * stride_ot + offs_p[None, :],
             _narrow(acc * dt_m[:, None], DX.dtype.element_ty, UPCAST), mask=m_mask[:, None] & p_mask[None, :])


@triton.jit
def _ssd_bwd_dcb_kernel(X, DY, CB, ACUM, DTC, DCB, RROW, RCOL,
                        stride_xb, stride_xt, stride_xh, stride_yb, stride_yt, stride_yh,
                        T, H, HEADS_PER_GROUP, G, NCHUNK, P, B, NSPLIT, HEADS_PER_PROGRAM,
                        L: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_P: tl.constexpr,
                        PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    n_blocks_s = L // BLOCK_S
    pid_m = tl.program_id(0) // n_blocks_s
    pid_s = tl.program_id(0) % n_blocks_s
    if pid_s * BLOCK_S >= (pid_m + 1) * BLOCK_M:  # above the diagonal: zero (causal)
        return
    pid_bc = tl.program_id(1)
    g = tl.program_id(2) // NSPLIT
    split = tl.program_id(2) % NSPLIT  # this program's share of the group's heads
    b = (pid_bc // NCHUNK).to(tl.int64)
    c = pid_bc % NCHUNK
    chunk_len = tl.minimum(T - c * L, L)
    c0 = c.to(tl.int64) * L
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # the rows l
    offs_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_p = tl.arange(0, BLOCK_P)
    m_mask = offs_m < chunk_len
    s_mask = offs_s < chunk_len
    causal = offs_m[:, None] >= offs_s[None, :]
    cb_tile = ((b * NCHUNK + c) * G + g) * L * L + offs_m[:, None] * L + offs_s[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_S], dtype=tl.float32)
    for hh in range(split * HEADS_PER_PROGRAM, tl.minimum((split + 1) * HEADS_PER_PROGRAM, HEADS_PER_GROUP)):
        h = g * HEADS_PER_GROUP + hh
        dy_ptr = DY + b * stride_yb + c0 * stride_yt + h * stride_yh + offs_m[:, None] * stride_yt
        x_ptr = X + b * stride_xb + c0 * stride_xt + h * stride_xh + offs_s[None, :] * stride_xt  # x^T: [P, S]
        dots = tl.zeros([BLOCK_M, BLOCK_S], dtype=tl.float32)
        for k in range(0, P, BLOCK_P):
            kp = k + offs_p
            dy = tl.load(dy_ptr + kp[None, :], mask=m_mask[:, None] & (kp[None, :] < P), other=0.0)
            xt = tl.load(x_ptr + kp[:, None], mask=(kp[:, None] < P) & s_mask[None, :], other=0.0)
            dots = _mma(dy, xt, dots, PRECISION, UPCAST)
        vec = ((b * H + h) * NCHUNK + c) * L
        acum_m = tl.load(ACUM + vec + offs_m)
        acum_s = tl.load(ACUM + vec + offs_s)
        dt_s = tl.load(DTC + vec + offs_s)
        seg = tl.where(causal, acum_m[:, None] - acum_s[None, :], float("-inf"))
        dcb = dots * tl.exp(seg) * dt_s[None, :]  # this head's share of dCB
        acc += dcb
        # d a_cum through exp(a_cum[l] - a_cum[s]) (sec. 6.1): + the row sums, - the column sums
        # of CB o dCB_h, both in fp32 from the same tile (this tile's shares)
        w = tl.load(CB + cb_tile) * dcb  # CB reloaded per head (from L2): fewer live registers
        tl.store(RROW + (vec + offs_m) * n_blocks_s + pid_s, tl.sum(w, axis=1))
        tl.store(RCOL + (vec + offs_s) * (L // BLOCK_M) + pid_m, tl.sum(w, axis=0))
    # [NSPLIT, B, NCHUNK, G, L, L] fp32, lower-triangle tiles: this share of the heads' sum
    tl.store(DCB + split.to(tl.int64) * B * NCHUNK * G * L * L + cb_tile, acc)


@triton.jit
def _ssd_bwd_dc_kernel(DY, BM, CM, DCB, ACUM, PREV, DC, RYOFF,
                       stride_yb, stride_yt, stride_yh, stride_bb, stride_bt, stride_bg,
                       T, H, HEADS_PER_GROUP, G, NCHUNK, P, N, B, NSPLIT, HEADS_PER_PROGRAM,
                       L: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr,
                       BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    n_blocks_n = tl.cdiv(N, BLOCK_N)
    pid_m = tl.program_id(0) // n_blocks_n
    pid_n = tl.program_id(0) % n_blocks_n
    pid_bc = tl.program_id(1)
    g = tl.program_id(2) // NSPLIT
    split = tl.program_id(2) % NSPLIT  # this program's share of the group's heads
    b = (pid_bc // NCHUNK).to(tl.int64)
    c = pid_bc % NCHUNK
    chunk_len = tl.minimum(T - c * L, L)
    c0 = c.to(tl.int64) * L
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # the rows l
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_p = tl.arange(0, BLOCK_P)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < chunk_len
    n_mask = offs_n < N
    cm = tl.load(CM + b * stride_bb + c0 * stride_bt + g * stride_bg + offs_m[:, None] * stride_bt + offs_n[None, :],
                 mask=m_mask[:, None] & n_mask[None, :], other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # through the passed state (sec. 6.2, left factor): exp(a_cum[l]) dy_l h_c, per head of the group
    for hh in range(split * HEADS_PER_PROGRAM, tl.minimum((split + 1) * HEADS_PER_PROGRAM, HEADS_PER_GROUP)):
        h = g * HEADS_PER_GROUP + hh
        dy_ptr = DY + b * stride_yb + c0 * stride_yt + h * stride_yh + offs_m[:, None] * stride_yt
        prev_ptr = PREV + ((b * NCHUNK + c) * H + h) * P * N + offs_n[None, :]  # h_c: [P, N]
        t = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, P, BLOCK_P):
            kp = k + offs_p
            dy = tl.load(dy_ptr + kp[None, :], mask=m_mask[:, None] & (kp[None, :] < P), other=0.0)
            hc = tl.load(prev_ptr + kp[:, None] * N, mask=(kp[:, None] < P) & n_mask[None, :], other=0.0)
            t = _mma(dy, _narrow(hc, DY.dtype.element_ty, UPCAST), t, PRECISION, UPCAST)
        vec = ((b * H + h) * NCHUNK + c) * L
        t *= tl.exp(tl.load(ACUM + vec + offs_m))[:, None]
        # dy_l . y_off_l: this N block's share of d a_cum[l] (the left factor's side)
        tl.store(RYOFF + (vec + offs_m) * n_blocks_n + pid_n, tl.sum(t * cm, axis=1))
        acc += t
    # within the chunk (sec. 6.1): dCB B over the lower triangle, to this row block's diagonal (once:
    # by the first share of the heads)
    dcb_ptr = DCB + ((b * NCHUNK + c) * G + g) * L * L + offs_m[:, None] * L
    b_ptr = BM + b * stride_bb + c0 * stride_bt + g * stride_bg + offs_n[None, :]
    hi = tl.where(split == 0, tl.minimum((pid_m + 1) * BLOCK_M, chunk_len), 0)
    for k in range(0, hi, BLOCK_K):
        kk = k + offs_k
        k_mask = kk < chunk_len
        causal = offs_m[:, None] >= kk[None, :]
        dcb = tl.load(dcb_ptr + kk[None, :], mask=causal & k_mask[None, :], other=0.0)
        bk = tl.load(b_ptr + kk[:, None] * stride_bt, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc = _mma(_narrow(dcb, BM.dtype.element_ty, UPCAST), bk, acc, PRECISION, UPCAST)
    out = DC + (((split.to(tl.int64) * B + b) * T + c0 + offs_m[:, None]) * G + g) * N  # [NSPLIT, B, T, G, N] fp32
    tl.store(out + offs_n[None, :], acc, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _ssd_bwd_db_kernel(X, CM, DCB, ACUM, DTC, DSTATES, DB,
                       stride_xb, stride_xt, stride_xh, stride_cb, stride_ct, stride_cg,
                       T, H, HEADS_PER_GROUP, G, NCHUNK, P, N, B, NSPLIT, HEADS_PER_PROGRAM,
                       L: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr,
                       BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    n_blocks_n = tl.cdiv(N, BLOCK_N)
    pid_m = tl.program_id(0) // n_blocks_n
    pid_n = tl.program_id(0) % n_blocks_n
    pid_bc = tl.program_id(1)
    g = tl.program_id(2) // NSPLIT
    split = tl.program_id(2) % NSPLIT  # this program's share of the group's heads
    b = (pid_bc // NCHUNK).to(tl.int64)
    c = pid_bc % NCHUNK
    chunk_len = tl.minimum(T - c * L, L)
    c0 = c.to(tl.int64) * L
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # the rows s
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_p = tl.arange(0, BLOCK_P)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < chunk_len
    n_mask = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # through the chunk state (sec. 6.2, right factor): exp(a_cum[L-1] - a_cum[s]) dt_s x_s dS_c, per head
    for hh in range(split * HEADS_PER_PROGRAM, tl.minimum((split + 1) * HEADS_PER_PROGRAM, HEADS_PER_GROUP)):
        h = g * HEADS_PER_GROUP + hh
        x_ptr = X + b * stride_xb + c0 * stride_xt + h * stride_xh + offs_m[:, None] * stride_xt
        ds_ptr = DSTATES + ((b * NCHUNK + c) * H + h) * P * N + offs_n[None, :]  # dS_c: [P, N]
        t = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, P, BLOCK_P):
            kp = k + offs_p
            x = tl.load(x_ptr + kp[None, :], mask=m_mask[:, None] & (kp[None, :] < P), other=0.0)
            ds = tl.load(ds_ptr + kp[:, None] * N, mask=(kp[:, None] < P) & n_mask[None, :], other=0.0)
            t = _mma(x, _narrow(ds, X.dtype.element_ty, UPCAST), t, PRECISION, UPCAST)
        vec = ((b * H + h) * NCHUNK + c) * L
        a_last = tl.load(ACUM + vec + L - 1)
        w = tl.exp(a_last - tl.load(ACUM + vec + offs_m)) * tl.load(DTC + vec + offs_m)
        acc += t * w[:, None]
    # within the chunk (sec. 6.1): dCB^T C over the lower triangle, from this row block's diagonal
    # (once: by the first share of the heads)
    dcb_ptr = DCB + ((b * NCHUNK + c) * G + g) * L * L + offs_m[:, None]  # dCB^T: [s, l]
    c_ptr = CM + b * stride_cb + c0 * stride_ct + g * stride_cg + offs_n[None, :]
    for k in range(pid_m * BLOCK_M, tl.where(split == 0, chunk_len, 0), BLOCK_K):
        kk = k + offs_k
        k_mask = kk < chunk_len
        causal = kk[None, :] >= offs_m[:, None]
        dcbt = tl.load(dcb_ptr + kk[None, :] * L, mask=causal & k_mask[None, :], other=0.0)
        ck = tl.load(c_ptr + kk[:, None] * stride_ct, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc = _mma(_narrow(dcbt, CM.dtype.element_ty, UPCAST), ck, acc, PRECISION, UPCAST)
    out = DB + (((split.to(tl.int64) * B + b) * T + c0 + offs_m[:, None]) * G + g) * N  # [NSPLIT, B, T, G, N] fp32
    tl.store(out + offs_n[None, :], acc, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _partial_rows(PTR, rows, NB, BLOCK_B: tl.constexpr):
    """sum over the last dim of the [.., NB] partial sums of ``rows``, in a fixed order."""
    offs = tl.arange(0, BLOCK_B)
    return tl.sum(tl.load(PTR + rows[:, None] * NB + offs[None, :], mask=offs[None, :] < NB, other=0.0), axis=1)


@triton.jit
def _ssd_bwd_ddt_kernel(RROW, RCOL, RYOFF, RALL, RSTATE, DTOTAL, DTC, A, DDT, DA_SUM,
                        stride_db, stride_dt, stride_dh, T, H, NCHUNK, NS, NM, NN, NP, NPASS,
                        L: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_PASS: tl.constexpr):
    pid = tl.program_id(0)  # (b, h, c)
    b = (pid // (H * NCHUNK)).to(tl.int64)
    h = (pid // NCHUNK) % H
    c = pid % NCHUNK
    offs_l = tl.arange(0, L)
    rows = pid.to(tl.int64) * L + offs_l
    dt = tl.load(DTC + rows)
    r_state = _partial_rows(RSTATE, rows, NP, BLOCK_B)
    dacum = _partial_rows(RROW, rows, NS, BLOCK_B) - _partial_rows(RCOL, rows, NM, BLOCK_B) \
        + _partial_rows(RYOFF, rows, NN, BLOCK_B) - dt * r_state
    offs_pass = tl.arange(0, BLOCK_PASS)
    last = tl.sum(dt * r_state, axis=0) + tl.sum(tl.load(DTOTAL + pid.to(tl.int64) * NPASS + offs_pass,
                                                         mask=offs_pass < NPASS, other=0.0), axis=0)
    dacum += tl.where(offs_l == L - 1, last, 0.0)
    da = tl.cumsum(dacum, axis=0, reverse=True)  # a_cum[l] = sum_{s<=l} a_s, so d a_s = sum_{l>=s} d a_cum[l]
    ddt = _partial_rows(RALL, rows, NP, BLOCK_B) + tl.load(A + h).to(tl.float32) * da
    ptr = DDT + b * stride_db + (c.to(tl.int64) * L + offs_l) * stride_dt + h * stride_dh
    tl.store(ptr, ddt.to(DDT.dtype.element_ty), mask=offs_l < T - c * L)
    tl.store(DA_SUM + pid, tl.sum(da * dt, axis=0))  # this chunk's share of d A = sum dt d a


# ---------------------------------------------------------------- launcher


def ssd_scan_bwd_configs(x, p: int, n: int, chunk: int) -> dict:
    """The tiles, warps and stages of each backward kernel for a launch on ``x`` (the forward's
    classes: 64-row blocks of the chunk, 64-wide blocks of P and N, 32 for fp32 operands; tiles of
    16 in the interpreter, so the tests go round every loop and masked tail)."""
    if not _on_gpu(x):
        t = dict(num_warps=1, num_stages=1)
        return {"dstates": dict(BLOCK_P=16, BLOCK_N=16, BLOCK_K=16, **t), "passing": dict(BLOCK=256, **t),
                "dx": dict(BLOCK_M=16, BLOCK_P=16, BLOCK_N=16, BLOCK_K=16, **t),
                "dcb": dict(BLOCK_M=16, BLOCK_S=16, BLOCK_P=16, **t),
                "dc": dict(BLOCK_M=16, BLOCK_N=16, BLOCK_P=16, BLOCK_K=16, **t),
                "db": dict(BLOCK_M=16, BLOCK_N=16, BLOCK_P=16, BLOCK_K=16, **t), "ddt": t,
                "heads_per_program": 1}
    wide = x.dtype == torch.float32  # fp32 operands: twice the registers per tile
    bm = min(chunk, 64)
    bp, bn = _tile(p, 32 if wide else 64), _tile(n, 32 if wide else 64)
    bk = min(chunk, 32)
    mma = dict(num_warps=4, num_stages=2)
    return {"dstates": dict(BLOCK_P=bp, BLOCK_N=bn, BLOCK_K=bk, **mma),
            "passing": dict(BLOCK=min(1024, _next_pow2(p * n)), num_warps=4, num_stages=1),
            "dx": dict(BLOCK_M=bm, BLOCK_P=bp, BLOCK_N=bn, BLOCK_K=bk, **mma),
            # dCB and dC hold three (two) fp32 [M, 64] tiles across their loop over the group's heads: 8
            # warps (4 spill at 64-wide tiles); fp32 operands: 32-row tiles, a 16-wide loop over P
            "dcb": dict(BLOCK_M=min(bm, 32), BLOCK_S=min(bm, 32), BLOCK_P=16, **mma) if wide
            else dict(BLOCK_M=bm, BLOCK_S=bm, BLOCK_P=bp, num_warps=8, num_stages=2),
            "dc": dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_P=bp, BLOCK_K=bk, num_warps=8, num_stages=2),
            "db": dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_P=bp, BLOCK_K=bk, **mma),
            "ddt": dict(num_warps=4, num_stages=1),
            # dCB, dC and dB loop over a group's heads: 4 a program (8 programs a group at 32 heads)
            "heads_per_program": 4}


def ssd_scan_backward(dy, dfinal, x, dt, A, Bm, Cm, initial_state, acum, dtc, cb, prev):
    """Gradients of (x, dt, A, Bm, Cm, initial_state) of the Triton SSD scan, each in its input's
    dtype (the last None without an initial state), from the forward's recomputed intermediates
    (``abl.kernels.ssd_scan.forward_intermediates`` on x, Bm, Cm in x's dtype with unit last
    strides: a_cum and dt by chunk, CB, the passed states in fp32): the seven kernels above
    (module docstring)."""
    b, t, h, p = x.shape
    L = acum.shape[3]
    xd = _unit_last(x)
    bm, cm = _unit_last(Bm.to(x.dtype)), _unit_last(Cm.to(x.dtype))
    g, n = bm.shape[2], bm.shape[3]
    dy = _unit_last(dy.to(x.dtype))
    dev = x.device
    ops = dict(PRECISION=_dot_precision(x.dtype), UPCAST=_upcast(x.dtype))
    nchunk = acum.shape[2]
    cfg = ssd_scan_bwd_configs(xd, p, n, L)
    f32 = dict(dtype=torch.float32, device=dev)
    dx = torch.empty((b, t, h, p), dtype=x.dtype, device=dev)
    dsy = torch.empty((b, nchunk, h, p, n), **f32)
    dstates = torch.empty_like(dsy)
    dinit = torch.empty((b, h, p, n), **f32)
    k = cfg["dstates"]
    n_p, n_n = triton.cdiv(p, k["BLOCK_P"]), triton.cdiv(n, k["BLOCK_N"])
    _wrap_triton(_ssd_bwd_dstates_kernel)[(n_p * n_n, b * nchunk, h)](
        dy, cm, acum, dsy, dy.stride(0), dy.stride(1), dy.stride(2), cm.stride(0), cm.stride(1), cm.stride(2),
        t, h, h // g, nchunk, p, n, L=L, **ops, **k)
    k = cfg["passing"]
    n_pass = triton.cdiv(p * n, k["BLOCK"])
    dtotal = torch.empty((b, h, nchunk, n_pass), **f32)
    _wrap_triton(_ssd_bwd_passing_kernel)[(b * h, n_pass)](
        dsy, acum, prev, dfinal.contiguous(), dstates, dinit, dtotal, h, nchunk, p * n, L=L, **k)
    k = cfg["dx"]
    n_p = triton.cdiv(p, k["BLOCK_P"])
    r_all, r_state = torch.empty((b, h, nchunk, L, n_p), **f32), torch.empty((b, h, nchunk, L, n_p), **f32)
    _wrap_triton(_ssd_bwd_dx_kernel)[((L // k["BLOCK_M"]) * n_p, b * nchunk, h)](
        xd, dy, bm, cb, acum, dtc, dstates, dx, r_all, r_state, xd.stride(0), xd.stride(1), xd.stride(2),
        dy.stride(0), dy.stride(1), dy.stride(2), bm.stride(0), bm.stride(1), bm.stride(2),
        dx.stride(0), dx.stride(1), dx.stride(2), t, h, h // g, g, nchunk, p, n, L=L, **ops, **k)
    # the group's heads shared out over NSPLIT programs (parallelism where G is small); their sums added in torch
    hpg = h // g
    hpp = min(hpg, cfg["heads_per_program"])
    nsplit = triton.cdiv(hpg, hpp)
    split = dict(B=b, NSPLIT=nsplit, HEADS_PER_PROGRAM=hpp)
    k = cfg["dcb"]
    n_s = L // k["BLOCK_S"]
    dcb_part = torch.empty((nsplit, b, nchunk, g, L, L), **f32)
    r_row = torch.zeros((b, h, nchunk, L, n_s), **f32)  # the tiles above the diagonal stay 0
    r_col = torch.zeros((b, h, nchunk, L, L // k["BLOCK_M"]), **f32)
    _wrap_triton(_ssd_bwd_dcb_kernel)[((L // k["BLOCK_M"]) * n_s, b * nchunk, g * nsplit)](
        xd, dy, cb, acum, dtc, dcb_part, r_row, r_col, xd.stride(0), xd.stride(1), xd.stride(2),
        dy.stride(0), dy.stride(1), dy.stride(2), t, h, hpg, g, nchunk, p, **split, L=L, **ops, **k)
    dcb = dcb_part[0] if nsplit == 1 else dcb_part.sum(0)
    k = cfg["dc"]
    n_n = triton.cdiv(n, k["BLOCK_N"])
    r_yoff = torch.empty((b, h, nchunk, L, n_n), **f32)
    dc_part = torch.empty((nsplit, b, t, g, n), **f32)
    _wrap_triton(_ssd_bwd_dc_kernel)[((L // k["BLOCK_M"]) * n_n, b * nchunk, g * nsplit)](
        dy, bm, cm, dcb, acum, prev, dc_part, r_yoff, dy.stride(0), dy.stride(1), dy.stride(2),
        cm.stride(0), cm.stride(1), cm.stride(2), t, h, hpg, g, nchunk, p, n, **split, L=L, **ops, **k)
    k = cfg["db"]
    db_part = torch.empty((nsplit, b, t, g, n), **f32)
    _wrap_triton(_ssd_bwd_db_kernel)[((L // k["BLOCK_M"]) * triton.cdiv(n, k["BLOCK_N"]), b * nchunk, g * nsplit)](
        xd, cm, dcb, acum, dtc, dstates, db_part, xd.stride(0), xd.stride(1), xd.stride(2),
        cm.stride(0), cm.stride(1), cm.stride(2), t, h, hpg, g, nchunk, p, n, **split, L=L, **ops, **k)
    dB, dC = db_part.sum(0).to(Bm.dtype), dc_part.sum(0).to(Cm.dtype)
    # the decay's gradient (module docstring), fp32, the partial sums added in a fixed order
    ddt = torch.empty_like(dt)
    da_sum = torch.empty((b, h, nchunk), **f32)
    k = cfg["ddt"]
    block_b = max(2, _next_pow2(max(n_p, n_s, L // cfg["dcb"]["BLOCK_M"], n_n)))
    _wrap_triton(_ssd_bwd_ddt_kernel)[(b * h * nchunk,)](
        r_row, r_col, r_yoff, r_all, r_state, dtotal, dtc, A.contiguous(), ddt, da_sum,
        ddt.stride(0), ddt.stride(1), ddt.stride(2),
        t, h, nchunk, n_s, L // cfg["dcb"]["BLOCK_M"], n_n, n_p, n_pass, L=L, BLOCK_B=block_b,
        BLOCK_PASS=max(2, _next_pow2(n_pass)), **k)
    dA = da_sum.sum((0, 2))
    ds0 = dinit.to(initial_state.dtype) if initial_state is not None else None
    return dx, ddt, dA.to(A.dtype), dB, dC, ds0

