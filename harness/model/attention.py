"""The softmax attention core a mixer calls: masks, GQA, the position's score bias, kernel dispatch.

Scaled dot-product attention, softmax(q k^T * scale + bias) v (Vaswani et al.
2017, arXiv:1706.03762, sec. 3.2.1, eq. 1), with the causal mask of a decoder
(sec. 3.2.3), optionally a sliding window of the last W keys (Beltagy et al.
2020, arXiv:2004.05150, sec. 3.1; Mistral 7B, Jiang et al. 2023,
arXiv:2310.06825, sec. 2), grouped K/V heads (GQA, Ainslie et al. 2023,
arXiv:2305.13245, sec. 2.2; one K/V head is MQA, Shazeer 2019,
arXiv:1911.02150, sec. 3) and logit soft-capping (Gemma 2, Gemma Team 2024,
arXiv:2408.00118, sec. 2).

A new mixer projects q, k, v, lets the position rotate q/k, appends k/v to the
decode cache and calls ``softmax_attention``; positions are absolute, so the
same call serves training (q_start = k_start = 0) and cached decoding (the new
tokens' queries over every cached key). ``softmax_attention`` is the one place
that picks the path: the FlashAttention Triton kernel
(``abl.kernels.flash_attention.flash_attention_triton``) under ``train.kernels =
"triton"`` where it computes the same thing, else torch's
``scaled_dot_product_attention`` with the mask and the bias, else (soft-capped
logits) a plain torch computation. The kernel module's own ``flash_attention`` op
(Triton function or its materialised-scores reference, like every kernel op) serves
the kernel benches and checks; no model path goes through it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..kernels import FLASH_ATTENTION_MAX_HEAD_DIM, use_triton
from .decoder import PositionEncoding


def visible(q_len: int, k_len: int, q_start: int, k_start: int, window: int, device) -> torch.Tensor:
    """[Tq, Tk] bool: may the query at absolute position q_start+i read the key at k_start+j?

    Causal (j <= i); with a window W only the last W keys, i - W < j <= i
    (Mistral 7B, Jiang et al. 2023, arXiv:2310.06825, sec. 2).
    """
    qpos = torch.arange(q_start, q_start + q_len, device=device)[:, None]
    kpos = torch.arange(k_start, k_start + k_len, device=device)[None, :]
    ok = kpos <= qpos
    if window:
        ok = ok & (kpos > qpos - window)
    return ok


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, position: PositionEncoding,
                      q_start: int, k_start: int, window: int = 0, softcap: float = 0.0,
                      scale: float | None = None) -> torch.Tensor:
    """Causal softmax attention of q ``[B, Hq, Tq, E]`` over k ``[B, Hk, Tk, E]``, v ``[B, Hk, Tk, Ev]``.

    Args:
        q, k, v: heads-first; Hk divides Hq. Query head h reads KV head
            h // (Hq / Hk) (GQA, Ainslie et al. 2023, arXiv:2305.13245, sec. 2.2);
            K/V are never repeated: SDPA's ``enable_gqa`` on the fast path, a
            grouped view on the soft-capped path, in place in the kernel.
        position: the model's ``PositionEncoding``; its ``score_bias`` is added
            to the scaled scores (ALiBi's ``bias_slopes`` go to the kernel).
        q_start, k_start: absolute position of the first query and the first key.
        window: W > 0 lets each query read only the last W keys, itself included.
        softcap: c > 0 caps the scaled logits at c tanh(s / c) before the bias.
        scale: the score scale (default 1 / sqrt(E)).

    Returns:
        ``[B, Hq, Tq, Ev]`` in q's dtype.
    """
    hq, tq, tk = q.size(1), q.size(2), k.size(2)
    if use_triton("flash_attention"):
        out = _flash(q, k, v, position, q_start, k_start, window, softcap, scale)
        if out is not None:
            return out
    bias = position.score_bias(hq, tq, tk, q_start, k_start, q.device)
    if softcap:
        return _capped_attention(q, k, v, bias, q_start, k_start, window, softcap, scale)
    gqa = k.size(1) != hq
    whole_window = not window or window >= tk + (q_start - k_start)
    if bias is None and whole_window and tq == tk and q_start == k_start:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    # every key visible to every query: the last key is not after the first
    # query and (with a window) the first key is inside the last query's window
    all_visible = k_start + tk - 1 <= q_start and (not window or k_start > q_start + tq - 1 - window)
    if bias is None:
        mask = None if all_visible else visible(tq, tk, q_start, k_start, window, q.device)
    else:
        mask = bias.to(q.dtype)
        if not all_visible:
            mask = mask.masked_fill(~visible(tq, tk, q_start, k_start, window, q.device), float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)


def _flash(q, k, v, position, q_start, k_start, window, softcap, scale):
    """The FlashAttention Triton kernel (Dao 2023, arXiv:2307.08691, Algorithms 1-2) where it
    computes exactly what ``softmax_attention`` would, else None (the caller falls back).

    The kernel covers causal masking aligned at the last query/key (training,
    and decoding with a cache holding every key up to the new tokens), a
    sliding window, GQA/MQA in place, and a linear distance bias (ALiBi) that it
    forms itself from the position's ``bias_slopes``. Not covered: soft-capped
    logits, other score biases (T5 buckets), value heads of another width
    than the query/key heads (MLA), heads wider than ``FLASH_ATTENTION_MAX_HEAD_DIM``
    (256), and mixed q/k/v dtypes.
    """
    if softcap or q_start + q.size(2) != k_start + k.size(2) or v.size(-1) != q.size(-1):
        return None
    if not (q.dtype == k.dtype == v.dtype) or q.size(-1) > FLASH_ATTENTION_MAX_HEAD_DIM:
        return None
    slopes = None
    if type(position).overrides("score_bias"):
        slopes = position.bias_slopes(q.size(1), q.device)
        if slopes is None:
            return None
    # imported on first use: importing the kernel module imports triton, which must not happen
    # before a worker has decided whether triton interprets (see abl.kernels.enable_interpreter)
    from ..kernels.flash_attention import flash_attention_triton

    return flash_attention_triton(q, k, v, causal=True, window=window or None, alibi_slopes=slopes, scale=scale)


def _capped_attention(q, k, v, bias, q_start, k_start, window, softcap, scale):
    """Scores soft-capped as cap * tanh(s / cap) before the softmax (Gemma Team 2024,
    arXiv:2408.00118, sec. 2, "Logit soft-capping").

    The cap applies to q.k / sqrt(d) only; a position bias is added after it,
    so ALiBi's distance penalty is not squashed.
    """
    b, hq, tq, e = q.shape
    hk, tk = k.size(1), k.size(2)
    g = hq // hk
    scale = 1.0 / math.sqrt(e) if scale is None else scale
    qg = q.view(b, hk, g, tq, e)
    s = (qg @ k.unsqueeze(2).transpose(-1, -2)).float() * scale  # [B, Hk, G, Tq, Tk]
    s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.float().view(hk, g, tq, tk)
    s = s.masked_fill(~visible(tq, tk, q_start, k_start, window, q.device), float("-inf"))
    p = torch.softmax(s, dim=-1).to(v.dtype)
    return (p @ v.unsqueeze(2)).reshape(b, hq, tq, v.size(-1))
