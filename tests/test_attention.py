"""mha / gqa / mqa against an explicit T x T attention with per-head loops."""

import math

import pytest
import torch

from harness.config import ModelConfig
from harness.model import ForwardContext, PositionEncoding
from plugins.attention import MultiHeadAttention
from plugins.positions import RotaryPosition


def reference(attn, x, rope=None):
    b, t, d = x.shape
    hq, hk, dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    wq = attn.q_proj.weight
    wk, wv = attn.kv_proj.weight[: hk * dh], attn.kv_proj.weight[hk * dh:]
    out = torch.zeros(b, t, hq * dh, dtype=x.dtype)
    for bi in range(b):
        for h in range(hq):
            g = h // (hq // hk)  # the KV group query head h reads
            q = x[bi] @ wq[h * dh:(h + 1) * dh].T
            k = x[bi] @ wk[g * dh:(g + 1) * dh].T
            v = x[bi] @ wv[g * dh:(g + 1) * dh].T
            if rope is not None:
                q = rope._rotate(q[None, None], 0)[0, 0]
                k = rope._rotate(k[None, None], 0)[0, 0]
            scores = torch.full((t, t), float("-inf"), dtype=x.dtype)
            for i in range(t):
                for j in range(i + 1):
                    scores[i, j] = (q[i] @ k[j]) / math.sqrt(dh)
            out[bi, :, h * dh:(h + 1) * dh] = torch.softmax(scores, dim=-1) @ v
    return out @ attn.out_proj.weight.T


@pytest.mark.parametrize("n_kv", [4, 2, 1], ids=["mha", "gqa2", "mqa"])
@pytest.mark.parametrize("use_rope", [False, True], ids=["nope", "rope"])
def test_attention_matches_reference(n_kv, use_rope):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=4, context=7)
    pos = RotaryPosition(cfg) if use_rope else PositionEncoding()
    attn = MultiHeadAttention(cfg, pos, n_kv_heads=n_kv).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    y = attn(x, ForwardContext(position=pos))
    torch.testing.assert_close(y, reference(attn, x, pos if use_rope else None))


def test_attention_is_causal():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=2)
    pos = PositionEncoding()
    attn = MultiHeadAttention(cfg, pos)
    x = torch.randn(1, 6, 16)
    x2 = x.clone()
    x2[:, 4:] = torch.randn(1, 2, 16)
    y, y2 = attn(x, ForwardContext(position=pos)), attn(x2, ForwardContext(position=pos))
    torch.testing.assert_close(y[:, :4], y2[:, :4])
    assert not torch.allclose(y[:, 4:], y2[:, 4:])


class TinyBias(PositionEncoding):
    def score_bias(self, n_heads, q_len, k_len, q_start, k_start, device):
        i = torch.arange(q_len)[:, None]
        j = torch.arange(k_len)[None, :]
        return (-(i - j).abs().float() * torch.arange(1, n_heads + 1).float()[:, None, None])


def test_score_bias_interface_reaches_the_scores():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=2)
    attn = MultiHeadAttention(cfg, PositionEncoding())
    x = torch.randn(1, 5, 16)
    plain = attn(x, ForwardContext(position=PositionEncoding()))
    biased = attn(x, ForwardContext(position=TinyBias()))
    assert not torch.allclose(plain, biased)
    assert torch.allclose(plain[:, 0], biased[:, 0], atol=1e-6)  # first token sees only itself
