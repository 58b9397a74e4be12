"""Attention mixers (axis ``mixer``).

Seeds 003 sec. 1.3 (causal attention), 000 sec. 3 (MHA / MQA / GQA). Every
factory is ``factory(config, position, **params)`` and returns a module with
``forward(x, ctx)``; positions act only through ``ctx.position``.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from harness.hookspecs import hookimpl
from harness.model import residual_out
from harness.registry import Param


class MultiHeadAttention(nn.Module):
    """Causal softmax attention with ``n_kv_heads`` key/value heads.

    n_kv_heads = n_heads is MHA, 1 is MQA, anything between is GQA: query head
    h reads KV group h // (n_heads / n_kv_heads). The fast path is torch's
    scaled_dot_product_attention with ``enable_gqa``, so K/V are not repeated.
    """

    def __init__(self, cfg, position, n_kv_heads: int = 0, bias: bool = False):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = n_kv_heads or cfg.n_heads
        self.head_dim = cfg.head_dim
        d = cfg.d_model
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=bias)
        self.kv_proj = nn.Linear(d, 2 * self.n_kv_heads * self.head_dim, bias=bias)
        self.out_proj = residual_out(nn.Linear(self.n_heads * self.head_dim, d, bias=bias))

    def forward(self, x, ctx):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k, v = self.kv_proj(x).view(b, t, 2, self.n_kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = ctx.position.rotate(q, k, ctx.start, ctx.start)
        bias = ctx.position.score_bias(self.n_heads, t, t, ctx.start, ctx.start, x.device)
        gqa = self.n_kv_heads != self.n_heads
        if bias is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            mask = bias.to(q.dtype).masked_fill(~causal, float("-inf"))
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, -1))


def _kv_check(cfg, params):
    kv = params["n_kv_heads"] or cfg.n_heads
    if cfg.n_heads % kv:
        return [f"n_heads={cfg.n_heads} is not divisible by n_kv_heads={kv}"]
    return []


@hookimpl
def register_components(register):
    register("mixer", "mha", MultiHeadAttention, params={
        "n_kv_heads": Param(0, doc="key/value heads; 0 = n_heads (MHA), 1 = MQA", min=0),
        "bias": Param(False, doc="biases on the q/k/v/out projections"),
    }, check=_kv_check)
