"""FlashAttention forward and backward: exact softmax attention without the [T, T] score matrix.

The algorithm is FlashAttention-2's (Dao 2023, arXiv:2307.08691, sec. 3.1,
Algorithm 1 forward, Algorithm 2 backward), after FlashAttention (Dao et al.
2022, arXiv:2205.14135, sec. 3.1, Algorithm 1), whose sec. 2.1 gives the
memory-hierarchy reason (scores stay in SRAM). Per query block (rows r) the forward streams key/value
blocks (columns c) and keeps a running max M, denominator L and numerator Z:
    S = q k^T * scale + bias            (masked entries are -inf)
    M_new = max(M_old, rowmax S)
    Z <- exp(M_old - M_new) Z + exp(S - M_new) v
    L <- exp(M_old - M_new) L + rowsum exp(S - M_new)
    out = Z / L,   lse = M + ln L       (lse is kept for the backward)
Exponentials are base 2 on the hardware path (exp(x) = 2^(x log2 e)), so the
kernels carry scores and lse in log2 units.

Backward (FlashAttention-2's Algorithm 2: delta = rowsum(dO * O) is computed
first, and dq has its own loop):
    P = exp(S - lse),  dV = P^T dO,  dP = dO V^T,  dS = P (dP - delta),
    dK = dS^T Q * scale,  dQ = dS K * scale.

Features, all inside the kernels:
- causal masking, aligned bottom-right: query row r sits at absolute position
  r + Tk - Tq, so a query block appended to a KV cache is masked correctly;
- sliding window (Mistral 7B, Jiang et al. 2023, arXiv:2310.06825, sec. 2): a query at position i sees keys j with
  i - j < window (and j - i < window when not causal);
- ALiBi (Press, Smith & Lewis 2021, arXiv:2108.12409, sec. 3): bias -m_h |i - j| added to the
  scaled scores, m_h = ``alibi_slopes[h]`` (the ALiBi position, abl.plugins.positions, holds the
  paper's slopes);
- GQA / MQA: query head h reads key/value head h // (Hq / Hkv) in place; the
  dK/dV kernel sums the group's query heads itself, so K/V are never repeated;
- head dims up to 256 (``FLASH_ATTENTION_MAX_HEAD_DIM``; 12-128 tested), non-power-of-two dims and sequence
  lengths by masking; fp32, fp16 and bf16 inputs, fp32 accumulation.
Key blocks that the causal mask or the window hide entirely are skipped.
"""

import json
import math
import os

import torch

from . import FLASH_ATTENTION_MAX_HEAD_DIM, use_triton
from .utils import TRITON_VERSION, check_launch, checking_compiles, interpreting, next_pow2, on_gpu, tl, triton

_LOG2E = 1.4426950408889634

# ---------------------------------------------------------------- kernels


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, lo, hi, q_pos, offs_n, offs_d,
                    N_K, WINDOW, qk_scale, slope,
                    MASKED: tl.constexpr, EVEN_D: tl.constexpr, HEAD_DIM: tl.constexpr,
                    IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_ALIBI: tl.constexpr,
                    BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # One pass over key blocks [lo, hi). MASKED=False is for blocks every row of the query block
    # sees whole (in bounds, inside the causal limit and the window): no mask arithmetic there.
    qk_scale = tl.cast(qk_scale, tl.float32)  # the caller's is fp32 already; kept fp32 whoever calls
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k_ptrs = k_base + cols[:, None] * stride_kn + offs_d[None, :]
        v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :]
        if MASKED:
            kv_mask = (cols[:, None] < N_K) & (offs_d[None, :] < HEAD_DIM)
            k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
            v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
        elif EVEN_D:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        else:
            k = tl.load(k_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
            v = tl.load(v_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if HAS_ALIBI:
            s = s - slope * tl.abs(q_pos[:, None] - cols[None, :]).to(tl.float32)
        if MASKED:
            rel = q_pos[:, None] - cols[None, :]
            valid = cols[None, :] < N_K
            if IS_CAUSAL:
                valid = valid & (rel >= 0)
            if HAS_WINDOW:
                valid = valid & (rel < WINDOW) & (rel > -WINDOW)
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that sees nothing yet
        else:
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = m_new
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        pv = p.to(v_base.dtype.element_ty)
        if UPCAST:
            pv = pv.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(Q, K, V, O, LSE, SLOPES,
                     stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                     stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
                     H, GROUP, M_Q, N_K, OFFSET, WINDOW, qk_scale,
                     HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                     HAS_ALIBI: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
                     UPCAST: tl.constexpr):
    # a float argument can arrive as fp64 when torch.compile launches the kernel (inductor types a
    # Python float as fp64): the loop-carried row maxima must stay fp32
    qk_scale = tl.cast(qk_scale, tl.float32)
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    b = (off_bh // H).to(tl.int64)
    h = off_bh % H
    hk = (h // GROUP).to(tl.int64)
    h = h.to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=(offs_m[:, None] < M_Q) & d_mask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(SLOPES + h).to(tl.float32) * 1.4426950408889634
    q_pos = offs_m + OFFSET
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # the key blocks that some row of this query block can see: [lo, hi)
    row0 = OFFSET + start_m * BLOCK_M  # the first row's position
    lo = 0
    hi = N_K
    if IS_CAUSAL:
        hi = tl.minimum(N_K, row0 + BLOCK_M)
    if HAS_WINDOW:
        lo = tl.maximum(0, row0 - WINDOW + 1)
        lo = (lo // BLOCK_N) * BLOCK_N
        if not IS_CAUSAL:
            hi = tl.minimum(N_K, row0 + BLOCK_M - 1 + WINDOW)
    # the key blocks that every row sees whole, [full_lo, full_hi): the loop without masks
    # (Triton's fused-attention tutorial splits its loop the same way)
    full_hi = (N_K // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        full_hi = tl.minimum(full_hi, (tl.maximum(row0 + 1, 0) // BLOCK_N) * BLOCK_N)
    full_lo = lo
    if HAS_WINDOW:
        first = tl.maximum(row0 + BLOCK_M - WINDOW, 0)  # rel < WINDOW for the last row
        full_lo = tl.maximum(lo, ((first + BLOCK_N - 1) // BLOCK_N) * BLOCK_N)
        if not IS_CAUSAL:
            full_hi = tl.minimum(full_hi, (tl.maximum(row0 + WINDOW, 0) // BLOCK_N) * BLOCK_N)
    full_lo = tl.minimum(full_lo, hi)
    full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, lo, full_lo, q_pos,
                                    offs_n, offs_d, N_K, WINDOW, qk_scale, slope, True, EVEN_D, HEAD_DIM,
                                    IS_CAUSAL, HAS_WINDOW, HAS_ALIBI, BLOCK_N, DOT_PRECISION, UPCAST)
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, full_lo, full_hi,
                                    q_pos, offs_n, offs_d, N_K, WINDOW, qk_scale, slope, False, EVEN_D, HEAD_DIM,
                                    IS_CAUSAL, HAS_WINDOW, HAS_ALIBI, BLOCK_N, DOT_PRECISION, UPCAST)
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, full_hi, hi, q_pos,
                                    offs_n, offs_d, N_K, WINDOW, qk_scale, slope, True, EVEN_D, HEAD_DIM,
                                    IS_CAUSAL, HAS_WINDOW, HAS_ALIBI, BLOCK_N, DOT_PRECISION, UPCAST)
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(seen, m_i + tl.math.log2(l_safe), float("inf"))  # +inf: P = 0 in the backward
    m_mask = offs_m < M_Q
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])
    tl.store(LSE + off_bh.to(tl.int64) * M_Q + offs_m, lse, mask=m_mask)


@triton.jit
def _attn_bwd_preprocess_kernel(O, DO, DELTA, stride_ob, stride_oh, stride_om,
                                stride_dob, stride_doh, stride_dom, H, M_Q,
                                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    b = (off_bh // H).to(tl.int64)
    h = (off_bh % H).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < M_Q) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
                mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :],
                 mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + off_bh.to(tl.int64) * M_Q + offs_m, tl.sum(o * do, axis=1), mask=offs_m < M_Q)


@triton.jit
def _attn_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, SLOPES,
                          stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                          stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                          stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                          H, HK, GROUP, M_Q, N_K, OFFSET, WINDOW, qk_scale, sm_scale,
                          HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                          HAS_ALIBI: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
                     UPCAST: tl.constexpr):
    # a float argument can arrive as fp64 when torch.compile launches the kernel (inductor types a
    # Python float as fp64): the loop-carried accumulators must stay fp32
    qk_scale = tl.cast(qk_scale, tl.float32)
    sm_scale = tl.cast(sm_scale, tl.float32)
    # One program per (key block, batch, KV head): it loops over the GROUP query heads
    # that share this KV head, so GQA/MQA gradients are summed without repeating K/V.
    start_n = tl.program_id(0)
    off_bhk = tl.program_id(1)
    b = (off_bhk // HK).to(tl.int64)
    hk = (off_bhk % HK).to(tl.int64)
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    n_mask = offs_n < N_K
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(K + b * stride_kb + hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                mask=kv_mask, other=0.0)
    v = tl.load(V + b * stride_vb + hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
                mask=kv_mask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    # the query blocks that can see some key of this block
    lo = 0
    hi = M_Q
    if IS_CAUSAL:
        lo = tl.maximum(0, start_n * BLOCK_N - OFFSET)
        lo = (lo // BLOCK_M) * BLOCK_M
    if HAS_WINDOW:
        hi = tl.minimum(M_Q, (start_n + 1) * BLOCK_N - 1 + WINDOW - OFFSET)
        if not IS_CAUSAL:
            lo = tl.maximum(0, start_n * BLOCK_N - WINDOW + 1 - OFFSET)
            lo = (lo // BLOCK_M) * BLOCK_M
    for g in range(0, GROUP):
        h = hk * GROUP + g
        off_bh = b * H + h
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DO + b * stride_dob + h * stride_doh
        if HAS_ALIBI:
            slope = tl.load(SLOPES + h).to(tl.float32) * 1.4426950408889634
        for start_m in range(lo, hi, BLOCK_M):
            offs_m = start_m + offs_m0
            m_mask = offs_m < M_Q
            qo_mask = m_mask[:, None] & d_mask[None, :]
            q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], mask=qo_mask, other=0.0)
            do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :], mask=qo_mask, other=0.0)
            if UPCAST:
                q = q.to(tl.float32)
                do = do.to(tl.float32)
            lse = tl.load(LSE + off_bh * M_Q + offs_m, mask=m_mask, other=float("inf"))
            delta = tl.load(DELTA + off_bh * M_Q + offs_m, mask=m_mask, other=0.0)
            # transposed form (the key block is the M dimension of every product, as in Triton's
            # fused-attention tutorial): S^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T,
            # dS^T = P^T (dP^T - delta), dK += dS^T Q; no tile is transposed through shared memory
            st = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale
            rel = (offs_m + OFFSET)[None, :] - offs_n[:, None]
            if HAS_ALIBI:
                st = st - slope * tl.abs(rel).to(tl.float32)
            valid = n_mask[:, None] & m_mask[None, :]
            if IS_CAUSAL:
                valid = valid & (rel >= 0)
            if HAS_WINDOW:
                valid = valid & (rel < WINDOW) & (rel > -WINDOW)
            pt = tl.where(valid, tl.math.exp2(st - lse[None, :]), 0.0)
            ptv = pt.to(DO.dtype.element_ty)
            if UPCAST:
                ptv = ptv.to(tl.float32)
            dv += tl.dot(ptv, do, input_precision=DOT_PRECISION)
            dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
            dst = (pt * (dpt - delta[None, :])).to(Q.dtype.element_ty)
            if UPCAST:
                dst = dst.to(tl.float32)
            dk += tl.dot(dst, q, input_precision=DOT_PRECISION)
    dk = dk * sm_scale
    tl.store(DK + b * stride_dkb + hk * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + b * stride_dvb + hk * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _attn_bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, SLOPES,
                        stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                        stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                        stride_dqb, stride_dqh, stride_dqm,
                        H, GROUP, M_Q, N_K, OFFSET, WINDOW, qk_scale, sm_scale,
                        HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                        HAS_ALIBI: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
                     UPCAST: tl.constexpr):
    # a float argument can arrive as fp64 when torch.compile launches the kernel (inductor types a
    # Python float as fp64): the loop-carried accumulators must stay fp32
    qk_scale = tl.cast(qk_scale, tl.float32)
    sm_scale = tl.cast(sm_scale, tl.float32)
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    b = (off_bh // H).to(tl.int64)
    h = off_bh % H
    hk = (h // GROUP).to(tl.int64)
    h = h.to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    m_mask = offs_m < M_Q
    qo_mask = m_mask[:, None] & d_mask[None, :]
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=qo_mask, other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :],
                 mask=qo_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse = tl.load(LSE + off_bh.to(tl.int64) * M_Q + offs_m, mask=m_mask, other=float("inf"))
    delta = tl.load(DELTA + off_bh.to(tl.int64) * M_Q + offs_m, mask=m_mask, other=0.0)
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh
    if HAS_ALIBI:
        slope = tl.load(SLOPES + h).to(tl.float32) * 1.4426950408889634
    q_pos = offs_m + OFFSET
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo = 0
    hi = N_K
    if IS_CAUSAL:
        hi = tl.minimum(N_K, OFFSET + (start_m + 1) * BLOCK_M)
    if HAS_WINDOW:
        lo = tl.maximum(0, OFFSET + start_m * BLOCK_M - WINDOW + 1)
        lo = (lo // BLOCK_N) * BLOCK_N
        if not IS_CAUSAL:
            hi = tl.minimum(N_K, OFFSET + (start_m + 1) * BLOCK_M - 1 + WINDOW)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n0
        kv_mask = (cols[:, None] < N_K) & d_mask[None, :]
        k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        rel = q_pos[:, None] - cols[None, :]
        if HAS_ALIBI:
            s = s - slope * tl.abs(rel).to(tl.float32)
        valid = (cols[None, :] < N_K) & m_mask[:, None]
        if IS_CAUSAL:
            valid = valid & (rel >= 0)
        if HAS_WINDOW:
            valid = valid & (rel < WINDOW) & (rel > -WINDOW)
        p = tl.where(valid, tl.math.exp2(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = (p * (dp - delta[:, None])).to(Q.dtype.element_ty)
        if UPCAST:
            ds = ds.to(tl.float32)
        dq += tl.dot(ds, k, input_precision=DOT_PRECISION)
    dq = dq * sm_scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=qo_mask)


# ---------------------------------------------------------------- launchers

# Tile configurations: (BLOCK_M, BLOCK_N, num_warps, num_stages). For the dK/dV kernel BLOCK_N is the
# key block a program holds and BLOCK_M the query block it streams; for the forward and dQ kernels
# BLOCK_M is the query block held and BLOCK_N the key block streamed. On CUDA a launch picks the
# fastest configuration of its class by timing each once (``_launch``); every configuration listed
# here compiles for sm_90 with no register spills and no asynchronous-MMA buffer hazard
# (``abl.kernels.compilecheck``, run by tests/kernels/test_compilecheck.py). The dK/dV tile
# (32, 64, 4 warps, 2 stages) at head_dim 128 is not here: Triton 3.6-3.9 give its q and dO tiles
# a single shared buffer that the next iteration's cp.async overwrites while the asynchronous
# wgmma products still read it, and gradients varied from run to run on an H100 (docs/gpu.md).
# The interpreter runs one program at a time: small tiles keep the tests' loops over several
# blocks (and their masked tails) cheap.
_INTERPRETER_TILE = (16, 16, 1, 1)
_TILES: dict[str, dict[str, tuple[tuple[int, int, int, int], ...]]] = {
    "fwd": {
        "d64": ((128, 64, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 3)),
        "d64+alibi": ((128, 64, 8, 3), (64, 64, 4, 3)),
        "d128": ((128, 64, 8, 3), (128, 32, 8, 3), (64, 64, 4, 3)),
        "d128+alibi": ((128, 64, 8, 2), (128, 32, 8, 3), (64, 64, 4, 3)),  # the bias tile needs registers
        "d256": ((64, 32, 4, 2), (64, 64, 8, 2), (32, 32, 4, 2)),
        # fp32 (IEEE or TF32 products): operands stay 32-bit in registers, so small tiles
        "fp32_d64": ((32, 32, 4, 1), (16, 32, 4, 1), (32, 16, 4, 1)),
        "fp32_d128": ((16, 16, 4, 1),),
        "fp32_d256": ((16, 16, 4, 1),),
    },
    "bwd_dkdv": {
        "d64": ((32, 128, 8, 3), (64, 128, 8, 2), (32, 64, 4, 3)),
        "d128": ((32, 128, 8, 3), (32, 64, 8, 3), (16, 128, 8, 2)),
        "d256": ((32, 32, 8, 2), (16, 32, 4, 2), (16, 32, 4, 1)),
        "fp32_d64": ((16, 16, 4, 1),),
        "fp32_d128": ((16, 16, 4, 1), (32, 16, 4, 1), (16, 32, 4, 1)),
        "fp32_d256": ((16, 16, 4, 1),),
    },
    "bwd_dq": {
        "d64": ((128, 32, 8, 3), (64, 64, 4, 3), (128, 64, 8, 3), (64, 32, 4, 3)),
        "d128": ((128, 32, 8, 3), (64, 32, 4, 3), (64, 64, 8, 3), (128, 64, 8, 2)),
        "d256": ((64, 32, 4, 2), (64, 16, 4, 2), (32, 32, 4, 2)),
        "fp32_d64": ((32, 32, 4, 1), (32, 16, 4, 1), (16, 16, 4, 1)),
        "fp32_d128": ((16, 16, 4, 1), (32, 16, 4, 1), (16, 32, 4, 1)),
        "fp32_d256": ((16, 16, 4, 1),),
    },
}
_chosen: dict = {}
# Where the timed choices are kept between processes (``use_tile_cache``): a run's cells, its
# resumed cells and later runs on this device then launch the same tiles, so their numerics do
# not change with a timing race between two near-equal tiles.
_tile_cache: list = [None]


def use_tile_cache(path) -> None:
    """Keep (and read) the attention tiles timed on CUDA in the JSON file ``path`` (None: this
    process only). Keyed by the device's name, torch and triton versions and the launch key."""
    _tile_cache[0] = None if path is None else os.fspath(path)


def _cache_key(kind, q, shape_key) -> str:
    name = torch.cuda.get_device_name(q.device) if q.device.type == "cuda" else q.device.type
    return "|".join(map(str, (name, torch.__version__, TRITON_VERSION, kind, q.dtype, _tile_class(q),
                              *shape_key)))


def _read_tiles() -> dict:
    path = _tile_cache[0]
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):  # none yet, or unreadable: time again
        return {}


def _write_tile(key: str, cfg) -> None:
    path = _tile_cache[0]
    if not path:
        return
    try:
        data = _read_tiles()
        data[key] = list(cfg)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:  # a read-only folder: this process keeps its choice, the next one times again
        pass


def _tile_class(q) -> str:
    d = next_pow2(q.shape[-1])
    cls = "d64" if d <= 64 else ("d128" if d <= 128 else "d256")
    return f"fp32_{cls}" if q.dtype == torch.float32 else cls


def _candidates(kind, q, alibi=False):
    if not on_gpu(q):
        return (_INTERPRETER_TILE,)
    table = _TILES[kind]
    cls = _tile_class(q)
    return table.get(f"{cls}+alibi", table[cls]) if alibi else table[cls]


def _length_bucket(n: int) -> int:
    return max(128, min(16384, next_pow2(n)))


def _launch(kind, q, launch, shape_key=()):
    """Run ``launch(block_m, block_n, num_warps, num_stages)`` with this class's tile.

    On CUDA the first launch per (kernel, device, dtype, head-dim class, masks, length bucket)
    times every configuration of the class once (``triton.testing.do_bench``; each launch
    rewrites its outputs whole, so repeating it is harmless) and keeps the fastest for the
    process, and in the tile cache where one is set (``use_tile_cache``), which later processes
    read instead of timing; a configuration that does not fit the device (out of shared memory)
    is skipped."""
    key = (kind, q.device.index, q.dtype, _tile_class(q), shape_key)
    alibi = bool(shape_key[2]) if len(shape_key) > 2 else False
    if checking_compiles():  # every tile this launch could pick is compiled and checked
        for cfg in _candidates(kind, q, alibi):
            launch(*cfg)
        return None
    if key in _chosen:
        return launch(*_chosen[key])
    candidates = _candidates(kind, q, alibi)
    if len(candidates) == 1 or not on_gpu(q):
        _chosen[key] = candidates[0]
        return launch(*candidates[0])
    stored = _read_tiles().get(_cache_key(kind, q, shape_key))
    if stored is not None and tuple(stored) in candidates:
        _chosen[key] = tuple(stored)
        return launch(*_chosen[key])
    from triton.testing import do_bench

    timed = []
    last: Exception | None = None
    for cfg in candidates:
        try:
            ms = do_bench(lambda cfg=cfg: launch(*cfg), warmup=3, rep=12)
        except Exception as exc:  # triton's OutOfResources, or a compile failure for this tile
            if type(exc).__name__ not in ("OutOfResources", "CompilationError"):
                raise
            last = exc
            continue
        timed.append((ms, cfg))
    if not timed:
        raise last or RuntimeError(f"no tile configuration to try for {kind}")  # pragma: no cover
    best = min(timed)[1]
    _chosen[key] = best
    _write_tile(_cache_key(kind, q, shape_key), best)
    return launch(*best)


def _dot_precision(dtype) -> str | None:
    # fp32 inputs: exact fp32 dots unless the run opted into TF32 (the tf32 precision
    # policy); 16-bit inputs: Triton's default (the tensor cores' native MMA)
    if dtype == torch.float32:
        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
    return None


def _upcast(dtype) -> bool:
    # The Triton interpreter (3.x) multiplies bf16 tiles as their raw uint16 bits in
    # tl.dot; there the kernels widen bf16 tiles to fp32 before each dot (exact: bf16
    # products are exact in fp32, as in the GPU's MMA). Roundings of P and dS to the
    # input dtype are kept, so the numerics match the GPU path's.
    return dtype == torch.bfloat16 and interpreting()


def _mask_args(tq, tk, window):
    """(offset of query row 0 in key positions, window or 0 for none)."""
    return tk - tq, (int(window) if window else 0)


def attention_fwd(q, k, v, slopes, causal, window, scale):
    b, h, tq, d = q.shape
    hk, tk = k.shape[1], k.shape[2]
    o = torch.empty((b, h, tq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h, tq), dtype=torch.float32, device=q.device)
    offset, win = _mask_args(tq, tk, window)
    block_d = max(16, next_pow2(d))

    def launch(bm, bn, warps, stages):
        _attn_fwd_kernel[(triton.cdiv(tq, bm), b * h)](
            q, k, v, o, lse, slopes if slopes is not None else lse,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
            h, h // hk, tq, tk, offset, win, scale * _LOG2E,
            HEAD_DIM=d, IS_CAUSAL=causal, HAS_WINDOW=win > 0, HAS_ALIBI=slopes is not None,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d, DOT_PRECISION=_dot_precision(q.dtype),
            UPCAST=_upcast(q.dtype), num_warps=warps, num_stages=stages)

    if o.numel():
        _launch("fwd", q, launch, (causal, win > 0, slopes is not None, _length_bucket(max(tq, tk))))
    return o, lse


def attention_bwd(do, q, k, v, o, lse, slopes, causal, window, scale):
    b, h, tq, d = q.shape
    hk, tk = k.shape[1], k.shape[2]
    offset, win = _mask_args(tq, tk, window)
    block_d = max(16, next_pow2(d))
    dq = torch.empty((b, h, tq, d), dtype=q.dtype, device=q.device)
    dk = torch.empty((b, hk, tk, d), dtype=k.dtype, device=k.device)
    dv = torch.empty((b, hk, tk, d), dtype=v.dtype, device=v.device)
    if not q.numel() or not k.numel():
        return dq.zero_(), dk.zero_(), dv.zero_()
    delta = torch.empty_like(lse)
    bm_pre = 64 if on_gpu(q) else 16
    _attn_bwd_preprocess_kernel[(triton.cdiv(tq, bm_pre), b * h)](
        o, do, delta, o.stride(0), o.stride(1), o.stride(2), do.stride(0), do.stride(1), do.stride(2),
        h, tq, HEAD_DIM=d, BLOCK_M=bm_pre, BLOCK_D=block_d)
    common = dict(HEAD_DIM=d, IS_CAUSAL=causal, HAS_WINDOW=win > 0, HAS_ALIBI=slopes is not None,
                  BLOCK_D=block_d, DOT_PRECISION=_dot_precision(q.dtype), UPCAST=_upcast(q.dtype))
    slopes_arg = slopes if slopes is not None else lse

    def launch_dkdv(bm, bn, warps, stages):
        _attn_bwd_dkdv_kernel[(triton.cdiv(tk, bn), b * hk)](
            q, k, v, do, lse, delta, dk, dv, slopes_arg,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
            dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
            h, hk, h // hk, tq, tk, offset, win, scale * _LOG2E, scale,
            BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **common)

    def launch_dq(bm, bn, warps, stages):
        _attn_bwd_dq_kernel[(triton.cdiv(tq, bm), b * h)](
            q, k, v, do, lse, delta, dq, slopes_arg,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
            dq.stride(0), dq.stride(1), dq.stride(2),
            h, h // hk, tq, tk, offset, win, scale * _LOG2E, scale,
            BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **common)

    shape_key = (causal, win > 0, slopes is not None, _length_bucket(max(tq, tk)))
    _launch("bwd_dkdv", q, launch_dkdv, shape_key)
    _launch("bwd_dq", q, launch_dq, shape_key)
    return dq, dk, dv


# ---------------------------------------------------------------- autograd


def _unit_last(x):
    return x if x.stride(-1) == 1 else x.contiguous()


# The forward and backward are registered as custom ops: torch.compile (dynamo) keeps each one as a
# single node of its graph instead of tracing the launchers' Python (tile timing, caches), so a
# compiled model has no graph break around attention. They are opaque to Inductor (the tile is
# chosen at run time), which launches them as they are.
@torch.library.custom_op("abl::flash_attention_fwd", mutates_args=())
def _flash_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor | None, causal: bool,
               window: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    check_launch(q, k, v, slopes)
    o, lse = attention_fwd(_unit_last(q), _unit_last(k), _unit_last(v), slopes, causal, window or None, scale)
    return o, lse


@_flash_fwd.register_fake
def _(q, k, v, slopes, causal, window, scale):
    b, h, tq, d = q.shape
    return q.new_empty((b, h, tq, d)), q.new_empty((b, h, tq), dtype=torch.float32)


@torch.library.custom_op("abl::flash_attention_bwd", mutates_args=())
def _flash_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
               lse: torch.Tensor, slopes: torch.Tensor | None, causal: bool, window: int,
               scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return attention_bwd(_unit_last(do), _unit_last(q), _unit_last(k), _unit_last(v), o, lse, slopes, causal,
                         window or None, scale)


@_flash_bwd.register_fake
def _(do, q, k, v, o, lse, slopes, causal, window, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _flash_setup(ctx, inputs, output):
    q, k, v, slopes, causal, window, scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, slopes)
    ctx.args = (causal, window, scale)
    ctx.mark_non_differentiable(lse)


def _flash_backward(ctx, do, _dlse):
    q, k, v, o, lse, slopes = ctx.saved_tensors
    dq, dk, dv = _flash_bwd(do, q, k, v, o, lse, slopes, *ctx.args)
    return dq, dk, dv, None, None, None, None


torch.library.register_autograd("abl::flash_attention_fwd", _flash_backward, setup_context=_flash_setup)


def _check_shapes(q, k, v, window, alibi_slopes):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be [B, H, T, D]")
    b, h, _, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be [B, Hkv, Tk, D] "
                         f"with B={b}, D={d}")
    if h % k.shape[1]:
        raise ValueError(f"query heads {h} not divisible by key/value heads {k.shape[1]}")
    if not 1 <= d <= FLASH_ATTENTION_MAX_HEAD_DIM:
        raise ValueError(f"head dim must be in 1..{FLASH_ATTENTION_MAX_HEAD_DIM}, got {d}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1 (or None), got {window}")
    if alibi_slopes is not None and tuple(alibi_slopes.shape) != (h,):
        raise ValueError(f"alibi_slopes must be [H] = [{h}], got {tuple(alibi_slopes.shape)}")


def flash_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                    window: int | None = None, alibi_slopes: torch.Tensor | None = None,
                    scale: float | None = None, return_lse: bool = False):
    """Softmax attention with the FlashAttention Triton kernels (no [T, T] matrix in memory).

    Args:
        q: ``[B, H, Tq, D]``.
        k, v: ``[B, Hkv, Tk, D]`` with H % Hkv == 0 (Hkv = H: MHA, 1: MQA, else GQA;
            query head h reads KV head h // (H / Hkv), nothing is repeated).
            Only the last dim needs unit stride: ``x.view(B, T, H, D).transpose(1, 2)``
            is read in place. fp32, fp16 or bf16; D up to 256.
        causal: mask keys after the query; with Tq < Tk the queries are the last
            Tq positions (a KV cache's new tokens).
        window: sliding window W: a query at position i sees keys j with
            i - j < W (and j - i < W when not causal). None = unlimited.
        alibi_slopes: ``[H]`` fp32 slopes m_h; adds -m_h |i - j| to the scaled scores.
        scale: score scale (default 1/sqrt(D)).
        return_lse: also return the row log-sum-exp ``[B, H, Tq]`` (fp32, natural log).

    Returns:
        ``[B, H, Tq, D]`` in q's dtype (and lse). Differentiable in q, k and v.
    """
    _check_shapes(q, k, v, window, alibi_slopes)
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    slopes = None if alibi_slopes is None else alibi_slopes.to(device=q.device, dtype=torch.float32).contiguous()
    o, lse2 = _flash_fwd(q, k, v, slopes, bool(causal), int(window) if window else 0, scale)
    if return_lse:
        return o, lse2 * math.log(2.0)
    return o


# ---------------------------------------------------------------- reference


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                        window: int | None = None, alibi_slopes: torch.Tensor | None = None,
                        scale: float | None = None) -> torch.Tensor:
    """The plain definition in fp32 (materialises the scores; repeats K/V for GQA)."""
    _check_shapes(q, k, v, window, alibi_slopes)
    tq, tk, d = q.shape[2], k.shape[2], q.shape[3]
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    group = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    s = (q.float() @ kf.transpose(-1, -2)) * scale
    rel = (torch.arange(tq, device=q.device)[:, None] + (tk - tq)) - torch.arange(tk, device=q.device)[None, :]
    if alibi_slopes is not None:
        s = s - alibi_slopes.float().to(q.device)[:, None, None] * rel.abs().float()
    keep = torch.ones_like(rel, dtype=torch.bool)
    if causal:
        keep &= rel >= 0
    if window:
        keep &= (rel < window) & (rel > -window)
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row that sees no key gives 0
    return (p @ vf).to(q.dtype)


# ---------------------------------------------------------------- the op


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                    window: int | None = None, alibi_slopes: torch.Tensor | None = None,
                    scale: float | None = None) -> torch.Tensor:
    """Softmax attention on the active kernel backend (``abl.kernels.use_triton``):
    ``flash_attention_triton`` under triton, ``attention_reference`` otherwise.
    Arguments as ``flash_attention_triton`` (its ``return_lse`` is the kernel's own)."""
    if use_triton("flash_attention"):
        return flash_attention_triton(q, k, v, causal, window, alibi_slopes, scale)
    return attention_reference(q, k, v, causal, window, alibi_slopes, scale)
