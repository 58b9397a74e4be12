"""Attention mixers (axis ``mixer``).

Causal multi-head attention (Vaswani et al. 2017, arXiv:1706.03762, sec.
3.2), MQA (Shazeer 2019, arXiv:1911.02150, sec. 3), GQA (Ainslie et al. 2023,
arXiv:2305.13245, sec. 2.2), sliding-window attention (Jiang et al. 2023,
arXiv:2310.06825, sec. 2), linear attention (Katharopoulos et al. 2020,
arXiv:2006.16236, sec. 3.2) and multi-head latent attention (DeepSeek-AI 2024,
arXiv:2405.04434, sec. 2.1). The softmax mixers call the harness's attention
core, ``abl.softmax_attention`` (masks, GQA, the position's score bias, kernel
dispatch). Every factory is ``factory(config, position, **params)`` and returns
a module with ``forward(x, ctx)``; positions act only through ``ctx.position``
(``rotate`` on q/k, ``score_bias`` on the scores; ``embed`` happened before).

Decoding follows the ForwardContext contract through ``abl.model.decoder.KVCache``:
the softmax mixers append K/V (MLA: its latent) with ``KVCache(ctx).append``,
linear attention keeps its recurrent state with ``state`` / ``set_state``;
``ctx.start`` is the absolute position of the first of the ``x`` tokens.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
import torch.nn as nn
import torch.nn.functional as F

from abl import (Arg, Cost, KVCache, PositionEncoding, hookimpl, linear_flops, linear_params, params_of,
                 residual_out, softmax_attention)

def _wide(x: torch.Tensor) -> torch.Tensor:
    """At least fp32 (norms of bf16 / fp16 activations are computed in fp32)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


# ------------------------------------------------------------ MHA / GQA / MQA / sliding window


class MultiHeadAttention(nn.Module):
    """Causal softmax attention with ``n_kv_heads`` key/value heads.

    n_kv_heads = n_heads is MHA, 1 is MQA (Shazeer 2019, arXiv:1911.02150, sec. 3),
    anything between is GQA (Ainslie et al. 2023, arXiv:2305.13245, sec. 2.2): query head h
    reads KV group h // (n_heads / n_kv_heads). K/V are not repeated in memory.
    ``window`` W > 0 makes it sliding-window attention (Mistral 7B, Jiang et
    al. 2023, arXiv:2310.06825, sec. 2): each query reads the last W keys, itself included,
    and the decode cache is a rolling buffer of W tokens.

    Optional extras: ``qk_norm`` RMS-normalises each head's q and k before
    the position rotation (Dehghani et al. 2023, arXiv:2302.05442, sec. 2; OLMo 2, Qwen 3);
    ``softcap`` > 0 caps the logits at cap * tanh(s / cap) (Gemma 2, Gemma Team 2024,
    arXiv:2408.00118, sec. 2).
    The KV cache stores K after the rotation and V: 2 n_kv_heads head_dim
    elements per token and layer (the incremental decoding of Shazeer 2019,
    arXiv:1911.02150, sec. 2.4).
    """

    def __init__(self, cfg, position,
                 n_kv_heads: Annotated[int, Arg("key/value heads; 0 = n_heads (MHA), 1 = MQA", min=0)] = 0,
                 bias: Annotated[bool, Arg("biases on the q/k/v/out projections")] = False,
                 qk_norm: Annotated[bool, Arg("RMS-normalise each head's q and k (Dehghani et al. 2023)")] = False,
                 softcap: Annotated[float, Arg("attention-logit soft cap c: s -> c tanh(s/c) (Gemma 2); 0 = off",
                                               min=0.0)] = 0.0,
                 window: int = 0):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = n_kv_heads or cfg.n_heads
        self.head_dim = cfg.head_dim
        self.window = window
        self.softcap = softcap
        d = cfg.d_model
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=bias)
        self.kv_proj = nn.Linear(d, 2 * self.n_kv_heads * self.head_dim, bias=bias)
        self.out_proj = residual_out(nn.Linear(self.n_heads * self.head_dim, d, bias=bias))
        self.q_norm = nn.RMSNorm(self.head_dim, eps=1e-6) if qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim, eps=1e-6) if qk_norm else None

    def forward(self, x, ctx):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k, v = self.kv_proj(x).view(b, t, 2, self.n_kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.q_norm is not None and self.k_norm is not None:
            # in fp32, back to the run dtype so the cache stays in it
            q, k = self.q_norm(_wide(q)).to(v.dtype), self.k_norm(_wide(k)).to(v.dtype)
        q, k = ctx.position.rotate(q, k, ctx.start, ctx.start)
        kv, k_start = KVCache(ctx).append(k=k, v=v, window=self.window)
        y = softmax_attention(q, kv["k"], kv["v"], ctx.position, ctx.start, k_start,
                              window=self.window, softcap=self.softcap)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, -1))


def multi_query_attention(cfg, position, **params):
    """Multi-query attention: every query head shares one K/V head (Shazeer 2019).

    Shazeer 2019, "Fast Transformer Decoding: One Write-Head is All You Need", arXiv:1911.02150, sec. 3.
    """
    return MultiHeadAttention(cfg, position, n_kv_heads=1, **params)


def grouped_query_attention(cfg, position,
                            n_kv_heads: Annotated[int, Arg("key/value groups; query head h reads group "
                                                           "h // (n_heads/n_kv_heads)", min=1)] = 2,
                            **params):
    """Grouped-query attention: n_kv_heads K/V groups (Ainslie et al. 2023).

    Ainslie et al. 2023, "GQA", arXiv:2305.13245, sec. 2.2.
    """
    return MultiHeadAttention(cfg, position, n_kv_heads=n_kv_heads, **params)


def sliding_window_attention(cfg, position,
                             window: Annotated[int, Arg("keys each query reads, itself included (Mistral's W)",
                                                        min=1)] = 64,
                             **params):
    """Sliding-window attention over the last `window` keys (Mistral 7B, Jiang et al. 2023).

    Jiang et al. 2023, "Mistral 7B", arXiv:2310.06825, sec. 2.
    """
    return MultiHeadAttention(cfg, position, window=window, **params)


# ------------------------------------------------------------ linear attention


class LinearAttention(nn.Module):
    """Causal linear attention (Katharopoulos et al. 2020).

    Katharopoulos et al. 2020, "Transformers are RNNs", arXiv:2006.16236, sec. 3.2 (eqs. 4-6)
    and sec. 3.3 (causal masking, eqs. 8-10).

        y_i = phi(q_i)^T S_i / (phi(q_i)^T z_i),  S_i = sum_{j<=i} phi(k_j) v_j^T,  z_i = sum_{j<=i} phi(k_j)

    with the feature map phi(x) = elu(x) + 1. Training uses the chunked form:
    inside a chunk of C tokens an explicit causal C x C product, across chunks
    the running state S (the chunkwise parallel form of Yang et al. 2023,
    arXiv:2312.06635, sec. 2.2), so only T/C states exist at once.
    Decoding is the recurrent form: S and z are the whole O(1) state.

    There is no score matrix, so an additive score bias (ALiBi, T5) cannot
    apply; the registered check rejects such positions. A rotation (RoPE)
    applies to the features of the numerator only and the denominator keeps
    the unrotated ones, so it stays positive (RoFormer, Su et al. 2021 sec. 3.3).
    """

    def __init__(self, cfg, position,
                 chunk_size: Annotated[int, Arg("tokens per chunk of the causal training form", min=1)] = 64,
                 bias: Annotated[bool, Arg("biases on the q/k/v/out projections")] = False,
                 eps: Annotated[float, Arg("added to the normaliser phi(q).z", min=0.0)] = 1e-6):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.head_dim
        self.chunk_size = chunk_size
        self.eps = eps
        d = cfg.d_model
        self.qkv_proj = nn.Linear(d, 3 * self.n_heads * self.head_dim, bias=bias)
        self.out_proj = residual_out(nn.Linear(self.n_heads * self.head_dim, d, bias=bias))

    def forward(self, x, ctx):
        b, t, _ = x.shape
        if ctx.position.score_bias(self.n_heads, 1, 1, ctx.start, ctx.start, x.device) is not None:
            raise ValueError(f"linear attention has no score matrix to add the bias of "
                             f"{type(ctx.position).__name__} to; use a position without score_bias")
        q, k, v = self.qkv_proj(x).view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        fq, fk = F.elu(q) + 1, F.elu(k) + 1
        rq, rk = ctx.position.rotate(fq, fk, ctx.start, ctx.start)
        state = KVCache(ctx).state()
        if state is None:
            state = {"S": v.new_zeros(b, self.n_heads, self.head_dim, self.head_dim),
                     "z": v.new_zeros(b, self.n_heads, self.head_dim)}
        if t == 1 and ctx.cache is not None:
            y, s, z = self.recurrent_step(rq, rk, fq, fk, v, state["S"], state["z"])
        else:
            y, s, z = self.chunked(rq, rk, fq, fk, v, state["S"], state["z"])
        KVCache(ctx).set_state(S=s, z=z)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, -1))

    def recurrent_step(self, rq, rk, fq, fk, v, s, z):
        """One token: S += phi(k) v^T, z += phi(k), y = phi(q) S / phi(q).z (Katharopoulos eq. 18-20)."""
        s = s + rk.transpose(-1, -2) @ v  # [B, H, d, dv]
        z = z + fk[:, :, 0]
        num = rq @ s  # [B, H, 1, dv]
        den = (fq[:, :, 0] * z).sum(-1)[..., None, None]
        return num / (den + self.eps), s, z

    def chunked(self, rq, rk, fq, fk, v, s0, z0):
        """The causal sum in chunks of C, from the initial state (s0, z0); returns (y, S_T, z_T)."""
        b, h, t, d = rq.shape
        c = min(self.chunk_size, t)
        n = -(-t // c)
        pad = n * c - t  # zero features past the end add nothing to any sum
        if pad:
            rq, rk, fq, fk, v = (F.pad(a, (0, 0, 0, pad)) for a in (rq, rk, fq, fk, v))
        rqc, rkc, vc = (a.reshape(b, h, n, c, a.size(-1)) for a in (rq, rk, v))
        kv = rkc.transpose(-1, -2) @ vc  # each chunk's sum of phi(k) v^T: [B, H, n, d, dv]
        s_before = torch.cat((s0[:, :, None], kv), dim=2).cumsum(dim=2)[:, :, :-1]  # state entering chunk
        causal = torch.ones(c, c, dtype=torch.bool, device=rq.device).tril()
        scores = (rqc @ rkc.transpose(-1, -2)).masked_fill(~causal, 0.0)  # within-chunk, j <= i
        num = scores @ vc + rqc @ s_before  # [B, H, n, C, dv]
        # the normaliser needs only the running sum of phi(k): [T, d], the size of k itself
        z = z0[:, :, None] + fk.cumsum(dim=2)
        den = (fq * z).sum(-1).view(b, h, n, c, 1)
        y = (num / (den + self.eps)).reshape(b, h, n * c, -1)[:, :, :t]
        return y, s_before[:, :, -1] + kv[:, :, -1], z[:, :, t - 1]


# ------------------------------------------------------------ multi-head latent attention


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2, 2024, sec. 2.1; DeepSeek-V3 sec. 2.1.1).

    DeepSeek-AI 2024, "DeepSeek-V2", arXiv:2405.04434, sec. 2.1; "DeepSeek-V3",
    arXiv:2412.19437, sec. 2.1.1.

        c_kv = W_DKV h                     the compressed KV latent (kv_rank dims)
        k_C, v = W_UK c_kv, W_UV c_kv      per-head keys and values, up-projected
        k_R = RoPE(W_KR h)                 one decoupled RoPE key shared by the heads
        q = [W_UQ c_q ; RoPE(W_QR c_q)]    c_q = W_DQ h (or h itself when q_rank = 0)
        o_h = softmax((q_C.k_C + q_R.k_R) / sqrt(d_h + d_R)) v;   u = W_O [o_1 .. o_H]

    The decode cache is only c_kv and k_R: kv_rank + rope_dim elements per
    token (sec. 2.1.3). While decoding, W_UK is absorbed into the query and
    W_UV into the output (sec. 2.1.2), so attention runs over the latent as
    one shared KV head and K/V are never re-expanded. The RoPE part goes
    through the position interface: with a non-rotating position the
    decoupled dims are plain extra q/k dims. ``latent_norm`` RMS-normalises
    c_kv and c_q as the released DeepSeek code does. Defaults follow
    DeepSeek-V2's ratios: kv_rank = 4 d_h, rope_dim = d_h / 2, no query
    compression (as V2-Lite).
    """

    def __init__(self, cfg, position,
                 kv_rank: Annotated[int, Arg("dims of the compressed KV latent c_kv; 0 = 4 * head_dim", min=0)] = 0,
                 q_rank: Annotated[int, Arg("dims of the compressed query latent; 0 = no query compression",
                                            min=0)] = 0,
                 rope_dim: Annotated[int, Arg("dims of the decoupled RoPE q/k; 0 = head_dim / 2", min=0)] = 0,
                 latent_norm: Annotated[bool, Arg("RMSNorm on the latents (DeepSeek's released code)")] = True):
        super().__init__()
        d, h, dh = cfg.d_model, cfg.n_heads, cfg.head_dim
        self.n_heads, self.nope_dim, self.v_dim = h, dh, dh
        self.kv_rank = kv_rank or 4 * dh
        self.rope_dim = rope_dim or mla_default_rope_dim(dh)
        self.scale = 1.0 / math.sqrt(dh + self.rope_dim)
        qk = self.nope_dim + self.rope_dim
        self.q_down: nn.Module
        self.q_norm: nn.Module
        if q_rank:
            self.q_down = nn.Linear(d, q_rank, bias=False)
            self.q_norm = nn.RMSNorm(q_rank, eps=1e-6) if latent_norm else nn.Identity()
            self.q_up = nn.Linear(q_rank, h * qk, bias=False)
        else:
            self.q_down, self.q_norm, self.q_up = nn.Identity(), nn.Identity(), nn.Linear(d, h * qk, bias=False)
        self.kv_down = nn.Linear(d, self.kv_rank + self.rope_dim, bias=False)  # W_DKV and W_KR together
        self.kv_norm = nn.RMSNorm(self.kv_rank, eps=1e-6) if latent_norm else nn.Identity()
        self.kv_up = nn.Linear(self.kv_rank, h * (self.nope_dim + self.v_dim), bias=False)  # W_UK, W_UV
        self.out_proj = residual_out(nn.Linear(h * self.v_dim, d, bias=False))

    def forward(self, x, ctx):
        b, t, _ = x.shape
        h, dn, dr, dv = self.n_heads, self.nope_dim, self.rope_dim, self.v_dim
        c_q = self.q_down(x)
        q = self.q_up(self.q_norm(_wide(c_q)).to(c_q.dtype)).view(b, t, h, dn + dr).transpose(1, 2)
        q_c, q_r = q.split((dn, dr), dim=-1)
        c_kv, k_r = self.kv_down(x).split((self.kv_rank, dr), dim=-1)
        # norm in fp32, then back to the run dtype: the latent is the cache
        c_kv = self.kv_norm(_wide(c_kv)).to(k_r.dtype).unsqueeze(1)  # [B, 1, T, kv_rank]
        q_r, k_r = ctx.position.rotate(q_r, k_r.unsqueeze(1), ctx.start, ctx.start)
        lat, k_start = KVCache(ctx).append(c_kv=c_kv, k_r=k_r)
        if ctx.cache is not None and t == 1:
            y = self._absorbed(q_c, q_r, lat["c_kv"], lat["k_r"], ctx, k_start)
        else:
            k_c, v = self.kv_up(lat["c_kv"][:, 0]).view(b, -1, h, dn + dv).transpose(1, 2).split((dn, dv), -1)
            k = torch.cat((k_c, lat["k_r"].expand(-1, h, -1, -1)), dim=-1)
            y = softmax_attention(torch.cat((q_c, q_r), dim=-1), k, v, ctx.position, ctx.start, k_start,
                                  scale=self.scale)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, h * dv))

    def _absorbed(self, q_c, q_r, c_kv, k_r, ctx, k_start):
        """Attention in latent space: q_C.(W_UK c) = (W_UK^T q_C).c, and W_UV applied after the sum."""
        h, dn, dv = self.n_heads, self.nope_dim, self.v_dim
        w = self.kv_up.weight.view(h, dn + dv, self.kv_rank)
        w_uk, w_uv = w[:, :dn], w[:, dn:]  # [H, dn, r], [H, dv, r]
        q_lat = q_c @ w_uk.to(q_c.dtype)  # [B, H, Tq, r]
        o_lat = softmax_attention(torch.cat((q_lat, q_r), dim=-1), torch.cat((c_kv, k_r), dim=-1), c_kv,
                                  ctx.position, ctx.start, k_start, scale=self.scale)
        return o_lat @ w_uv.transpose(-1, -2).to(o_lat.dtype)  # [B, H, Tq, dv]


def mla_default_rope_dim(head_dim: int) -> int:
    return max(2, head_dim // 2 // 2 * 2)  # d_h / 2 as DeepSeek-V2, kept even for the rotation


# ------------------------------------------------------------ checks


def _kv_check(cfg, params):
    kv = params.get("n_kv_heads", 1) or cfg.n_heads
    if cfg.n_heads % kv:
        return [f"n_heads={cfg.n_heads} is not divisible by n_kv_heads={kv}"]
    return []


def _gqa_check(cfg, params):
    errs = _kv_check(cfg, params)
    if params["n_kv_heads"] > cfg.n_heads:
        errs.append(f"n_kv_heads={params['n_kv_heads']} exceeds n_heads={cfg.n_heads}")
    return errs


# Cost and check functions name a ``position`` parameter, so the host hands them the
# configured position's class (``Registry.call_with_position``); None: unknown.


def _overrides(position, hook: str) -> bool:
    """Does the position class override ``PositionEncoding.<hook>``?"""
    return isinstance(position, type) and issubclass(position, PositionEncoding) and position.overrides(hook)


def _linear_check(cfg, params, position=None):
    if _overrides(position, "score_bias"):
        return [f"position {cfg.position!r} adds a bias to attention scores, which linear attention "
                "does not form; use rope, learned, sinusoidal or nope"]
    return []


def _mla_check(cfg, params):
    dr = params["rope_dim"] or mla_default_rope_dim(cfg.head_dim)
    return [f"rope_dim={dr} must be even (it is rotated in pairs)"] if dr % 2 else []


# ------------------------------------------------------------ costs (harness/contracts/cost.py conventions)


def _avg_keys(t: int, window: int = 0) -> float:
    """Mean number of keys a causal query reads over positions 0..t-1."""
    w = window if window and window < t else t
    return sum(min(i + 1, w) for i in range(t)) / t


def _softmax_cost(cfg, hq, hk, qk_dim, v_dim, proj_params, proj_flops, window=0, state_tok=0.0,
                  state_seq=0.0, extra_act=0.0, rotated_dim=None, materialised=False, position=None):
    """Cost of a causal softmax-attention layer with the given head shapes.

    Activations follow the torch reference path (the one ``train.kernels = "torch"``
    runs and FLOPs are counted on): saved for backward (the accounting of Korthikanti
    et al. 2022, arXiv:2205.05198, sec. 4.1) are the block input, q, k, v, the output and its per-row log-sum-exp (a
    fused attention kernel keeps no T x T probabilities); a rotating position
    adds the rotated q and k (``rotated_dim`` per head; the rotation runs in
    fp32 and keeps its input); and when the scores are ``materialised`` (soft
    capping, a float score bias, value heads narrower than q/k: torch cannot use
    a fused kernel there) the Tq x Tk probabilities are kept too.
    """
    t = cfg.context
    # SDPA as flop_counter counts it: a full Tq x Tk score matrix and its product with V
    attn = 2.0 * hq * t * (qk_dim + v_dim)
    useful = 2.0 * hq * _avg_keys(t, window) * (qk_dim + v_dim)
    act = cfg.d_model + hq * qk_dim + hk * (qk_dim + v_dim) + hq * v_dim + hq + extra_act
    if rotated_dim is None:
        rotated_dim = qk_dim
    if _overrides(position, "rotate"):
        act += (hq + hk) * rotated_dim
    if materialised or _overrides(position, "score_bias"):
        act += hq * t  # the probabilities of each query row
    return Cost(params=proj_params, flops_per_token=proj_flops + attn,
                useful_flops_per_token=proj_flops + useful, activation_elements_per_token=act,
                state_elements_per_token=state_tok, state_elements_per_sequence=state_seq)


def mha_cost(cfg, n_kv_heads=0, bias=False, qk_norm=False, softcap=0.0, window=0, position=None):
    d, h, dh = cfg.d_model, cfg.n_heads, cfg.head_dim
    hk = n_kv_heads or h
    params = (linear_params(d, h * dh, bias) + linear_params(d, 2 * hk * dh, bias)
              + linear_params(h * dh, d, bias) + (2 * dh if qk_norm else 0))
    flops = linear_flops(d, h * dh) + linear_flops(d, 2 * hk * dh) + linear_flops(h * dh, d)
    kv = 2 * hk * dh
    # the rolling buffer stops growing at W tokens: then it is a fixed per-sequence state
    bounded = bool(window) and window < cfg.context
    return _softmax_cost(cfg, h, hk, dh, dh, params, flops, window,
                         state_tok=0.0 if bounded else kv, state_seq=kv * window if bounded else 0.0,
                         materialised=bool(softcap), position=position)


def mqa_cost(cfg, position=None, **params):
    return mha_cost(cfg, n_kv_heads=1, position=position, **params)


def gqa_cost(cfg, n_kv_heads=2, position=None, **params):
    return mha_cost(cfg, n_kv_heads=n_kv_heads, position=position, **params)


def sliding_window_cost(cfg, window=64, position=None, **params):
    return mha_cost(cfg, window=window, position=position, **params)


def linear_cost(cfg, chunk_size=64, bias=False, eps=1e-6, position=None):
    d, h, dh, t = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.context
    c = min(chunk_size, t)
    padded = -(-t // c) * c / t
    params = linear_params(d, 3 * h * dh, bias) + linear_params(h * dh, d, bias)
    proj = linear_flops(d, 3 * h * dh) + linear_flops(h * dh, d)
    # per token and head: the C x C chunk scores and their product with V, the
    # read of the incoming state and the chunk's phi(k) v^T (padded chunks included)
    mixing = h * (2 * c * dh + 2 * c * dh + 2 * dh * dh + 2 * dh * dh) * padded
    useful = h * (2 * (c + 1) / 2 * dh * 2 + 4 * dh * dh)
    # saved on the chunked path, per token: the input; q, k, v (one projection); phi(q), phi(k)
    # and the chunk-shaped copy of v; the masked C x C chunk scores; the numerator, the
    # running z and the output; the denominator; the chunk-entry states (d x d per chunk);
    # a rotating position adds the rotated features
    act = (d + 3 * h * dh + 3 * h * dh + h * c + 3 * h * dh + h + h * dh * dh / c
           + (2 * h * dh if _overrides(position, "rotate") else 0))
    return Cost(params=params, flops_per_token=proj + mixing, useful_flops_per_token=proj + useful,
                activation_elements_per_token=act, state_elements_per_sequence=h * (dh * dh + dh))


def mla_cost(cfg, kv_rank=0, q_rank=0, rope_dim=0, latent_norm=True, position=None):
    d, h, dh = cfg.d_model, cfg.n_heads, cfg.head_dim
    r, dr = kv_rank or 4 * dh, rope_dim or mla_default_rope_dim(dh)
    qk = dh + dr
    if q_rank:
        q_params = d * q_rank + q_rank * h * qk + (q_rank if latent_norm else 0)
        q_flops = linear_flops(d, q_rank) + linear_flops(q_rank, h * qk)
    else:
        q_params, q_flops = d * h * qk, linear_flops(d, h * qk)
    params = (q_params + d * (r + dr) + (r if latent_norm else 0) + r * h * 2 * dh + h * dh * d)
    flops = q_flops + linear_flops(d, r + dr) + linear_flops(r, h * 2 * dh) + linear_flops(h * dh, d)
    # the value heads (d_h) are narrower than q/k (d_h + d_R): the probabilities are kept
    return _softmax_cost(cfg, h, h, qk, dh, params, flops, extra_act=r + dr,
                         state_tok=r + dr, rotated_dim=dr, materialised=True, position=position)


@hookimpl
def register_components(register):
    # the factories' signatures declare the parameters (type, default, doc, bounds); the wrappers that pass
    # **params on to MultiHeadAttention take its declarations (its ``window`` is sliding_window's own)
    softmax_extras = params_of(MultiHeadAttention, "bias", "qk_norm", "softcap")
    register("mixer", "mha", MultiHeadAttention, params=params_of(MultiHeadAttention, "n_kv_heads", *softmax_extras),
             check=_kv_check, cost=mha_cost)
    register("mixer", "mqa", multi_query_attention, params=softmax_extras, cost=mqa_cost)
    register("mixer", "gqa", grouped_query_attention,
             params={**params_of(grouped_query_attention, "n_kv_heads"), **softmax_extras},
             check=_gqa_check, cost=gqa_cost)
    register("mixer", "sliding_window", sliding_window_attention,
             params={**params_of(sliding_window_attention, "window"),
                     **params_of(MultiHeadAttention, "n_kv_heads", *softmax_extras)},
             check=_kv_check, cost=sliding_window_cost)
    register("mixer", "linear", LinearAttention, check=_linear_check, cost=linear_cost)
    register("mixer", "mla", MultiHeadLatentAttention, check=_mla_check, cost=mla_cost)
