import math

import pytest
import torch

from harness.config import ModelConfig
from plugins.positions import LearnedPosition, RotaryPosition


def ref_rope(x, start, theta, scale, layout):
    """RoPE via complex multiplication, one pair at a time (seeds 002 sec. 1.5.4)."""
    *lead, t, d = x.shape
    out = torch.empty_like(x)
    for p in range(t):
        pos = (start + p) / scale
        for k in range(d // 2):
            ang = pos * theta ** (-2 * k / d)
            rot = complex(math.cos(ang), math.sin(ang))
            i, j = (2 * k, 2 * k + 1) if layout == "interleaved" else (k, k + d // 2)
            z = torch.complex(x[..., p, i].double(), x[..., p, j].double()) * rot
            out[..., p, i] = z.real.to(x.dtype)
            out[..., p, j] = z.imag.to(x.dtype)
    return out


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_rope_matches_complex_reference(layout, scale):
    cfg = ModelConfig(d_model=16, n_heads=2)
    rope = RotaryPosition(cfg, theta=500.0, interpolation_factor=scale, layout=layout)
    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    rq, rk = rope.rotate(q, k, 3, 3)
    torch.testing.assert_close(rq, ref_rope(q, 3, 500.0, scale, layout), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rk, ref_rope(k, 3, 500.0, scale, layout), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rope_scores_depend_only_on_relative_position(layout):
    cfg = ModelConfig(d_model=16, n_heads=2)
    rope = RotaryPosition(cfg, layout=layout)
    torch.manual_seed(1)
    q, k = torch.randn(8), torch.randn(8)

    def score(pq, pk):
        rq, _ = rope.rotate(q.view(1, 1, 1, 8), q.view(1, 1, 1, 8), pq, pq)
        _, rk = rope.rotate(k.view(1, 1, 1, 8), k.view(1, 1, 1, 8), pk, pk)
        return float((rq * rk).sum())

    assert score(7, 3) == pytest.approx(score(104, 100), abs=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 5), abs=1e-3)


def test_rope_preserves_norms():
    cfg = ModelConfig(d_model=32, n_heads=4)
    q = torch.randn(1, 4, 9, 8)
    rq, _ = RotaryPosition(cfg).rotate(q, q, 0, 0)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))


def test_learned_position_adds_a_row_per_position():
    cfg = ModelConfig(d_model=8, n_heads=2, context=6)
    pos = LearnedPosition(cfg)
    x = torch.zeros(1, 3, 8)
    torch.testing.assert_close(pos.embed(x, 2), pos.table.weight[2:5].unsqueeze(0))
    with pytest.raises(ValueError, match="cover 6"):
        pos.embed(torch.zeros(1, 5, 8), 3)
