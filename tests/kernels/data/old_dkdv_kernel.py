"""The dK/dV attention kernel as shipped before the compile check (main d4fc99e), kept as a fixture.

At (BLOCK_M 32, BLOCK_N 64, 4 warps, 2 stages) and head_dim 128 in bf16 this kernel raced on an
H100 (docs/gpu.md): Triton gave its q and dO tiles one shared buffer that the next iteration's
cp.async overwrote while asynchronous wgmma products still read it. tests/kernels/test_compilecheck.py
holds ``abl.kernels.compilecheck`` to finding that. Not imported by the package.
"""

from abl.kernels.utils import tl, triton


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
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
            rel = (offs_m + OFFSET)[:, None] - offs_n[None, :]
            if HAS_ALIBI:
                s = s - slope * tl.abs(rel).to(tl.float32)
            valid = n_mask[None, :] & m_mask[:, None]
            if IS_CAUSAL:
                valid = valid & (rel >= 0)
            if HAS_WINDOW:
                valid = valid & (rel < WINDOW) & (rel > -WINDOW)
            p = tl.where(valid, tl.math.exp2(s - lse[:, None]), 0.0)
            pv = p.to(DO.dtype.element_ty)
            if UPCAST:
                pv = pv.to(tl.float32)
            dv += tl.dot(tl.trans(pv), do, input_precision=DOT_PRECISION)
            dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
            ds = (p * (dp - delta[:, None])).to(Q.dtype.element_ty)
            if UPCAST:
                ds = ds.to(tl.float32)
            dk += tl.dot(tl.trans(ds), q, input_precision=DOT_PRECISION)
    dk = dk * sm_scale
    tl.store(DK + b * stride_dkb + hk * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + b * stride_dvb + hk * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=kv_mask)
