import math

import pytest
import torch

from abl.contracts.config import ModelConfig
from abl.plugins.positions import (
    ALiBiPosition,
    LearnedPosition,
    NoPosition,
    RotaryPosition,
    SinusoidalPosition,
    T5RelativeBias,
    alibi_slopes,
    t5_bucket,
)


def ref_rope(x, start, theta, scale, layout):
    """RoPE via complex multiplication, one pair at a time (Su et al. 2021, RoFormer, arXiv:2104.09864, sec. 3.2)."""
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


# ------------------------------------------------------------ RoPE on other widths (MLA's decoupled dims)


def test_rope_rotates_any_even_width_with_its_own_frequencies():
    cfg = ModelConfig(d_model=32, n_heads=2)  # head_dim 16; MLA rotates e.g. 4 dims
    rope = RotaryPosition(cfg, theta=300.0)
    torch.manual_seed(2)
    q = torch.randn(1, 2, 5, 4)
    rq, _ = rope.rotate(q, q, 2, 2)
    torch.testing.assert_close(rq, ref_rope(q, 2, 300.0, 1.0, "interleaved"), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------ sinusoidal


def test_sinusoidal_matches_the_formula_element_by_element():
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...) (Vaswani et al. 2017, arXiv:1706.03762, sec. 3.5)."""
    cfg = ModelConfig(d_model=10, n_heads=2)
    pos = SinusoidalPosition(cfg)
    x = torch.zeros(1, 6, 10)
    got = pos.embed(x, 5)[0]
    for p in range(6):
        for dim in range(10):
            i = dim // 2
            ang = (5 + p) / 10000 ** (2 * i / 10)
            want = math.sin(ang) if dim % 2 == 0 else math.cos(ang)
            assert float(got[p, dim]) == pytest.approx(want, abs=1e-5)
    scaled = SinusoidalPosition(cfg, embed_scale=True).embed(torch.ones(1, 1, 10), 0)
    torch.testing.assert_close(scaled - math.sqrt(10), pos.embed(torch.zeros(1, 1, 10), 0))


def test_sinusoidal_has_no_length_limit():
    pos = SinusoidalPosition(ModelConfig(d_model=8, n_heads=2, context=4))
    assert getattr(pos, "max_positions", None) is None
    assert pos.embed(torch.zeros(1, 3, 8), 1000).abs().max() <= 1.0


# ------------------------------------------------------------ ALiBi


def test_alibi_slopes_as_in_the_paper():
    # Press et al. 2022 sec. 3: 8 heads -> 1/2, 1/4, ..., 1/256
    assert alibi_slopes(8) == pytest.approx([2.0 ** -k for k in range(1, 9)])
    # 16 heads -> 2^(-h/2): the geometric slopes of Press et al. 2021, ALiBi, arXiv:2108.12409, sec. 3
    assert alibi_slopes(16) == pytest.approx([2.0 ** (-h / 2) for h in range(1, 17)])
    # not a power of two (the paper's get_slopes): the 4-head slopes, then every
    # other slope of the 8-head sequence
    assert alibi_slopes(6) == pytest.approx([2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3])
    assert alibi_slopes(12) == pytest.approx(
        [2.0 ** -k for k in range(1, 9)] + [2.0 ** (-k / 2) for k in (1, 3, 5, 7)])
    assert len(alibi_slopes(3)) == 3 and alibi_slopes(3) == pytest.approx([2.0 ** -4, 2.0 ** -8, 2.0 ** -2])


def test_alibi_bias_is_minus_slope_times_distance():
    pos = ALiBiPosition(ModelConfig(d_model=12, n_heads=6))
    bias = pos.score_bias(6, 3, 7, 4, 0, torch.device("cpu"))
    assert bias.shape == (6, 3, 7)
    slopes = alibi_slopes(6)
    for h in range(6):
        for i in range(3):
            for j in range(7):
                if j <= 4 + i:
                    assert float(bias[h, i, j]) == pytest.approx(-slopes[h] * (4 + i - j))


# ------------------------------------------------------------ T5


def ref_t5_bucket(query, key, num_buckets=32, max_distance=128):
    """T5's _relative_position_bucket(bidirectional=False), one pair at a time."""
    n = max(0, query - key)
    exact = num_buckets // 2
    if n < exact:
        return n
    b = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact))
    return min(b, num_buckets - 1)


def test_t5_buckets_match_the_reference():
    i = torch.arange(300)[:, None]
    j = torch.arange(300)[None, :]
    got = t5_bucket(j - i, 32, 128)
    for q in range(0, 300, 7):
        for k in range(0, q + 1):
            assert int(got[q, k]) == ref_t5_bucket(q, k), (q, k)
    assert int(got[299, 0]) == 31 and int(got[20, 20]) == 0 and int(got[20, 5]) == 15


def test_t5_bias_looks_up_one_scalar_per_bucket_and_head():
    cfg = ModelConfig(d_model=8, n_heads=2)
    pos = T5RelativeBias(cfg, num_buckets=8, max_distance=20)
    torch.nn.init.normal_(pos.bias.weight)
    bias = pos.score_bias(2, 2, 30, 28, 0, torch.device("cpu")).detach()
    for h in range(2):
        for i in range(2):
            for j in range(29 + i):
                b = ref_t5_bucket(28 + i, j, 8, 20)
                assert float(bias[h, i, j]) == pytest.approx(float(pos.bias.weight[b, h].detach()))


# ------------------------------------------------------------ NoPE, learned, the registry


def test_nope_changes_nothing():
    pos = NoPosition(ModelConfig(d_model=8, n_heads=2))
    x, q = torch.randn(1, 3, 8), torch.randn(1, 2, 3, 4)
    assert pos.embed(x, 5) is x
    assert pos.rotate(q, q, 0, 0) == (q, q)
    assert pos.score_bias(2, 3, 3, 0, 0, x.device) is None


def test_learned_says_how_far_it_reaches():
    assert LearnedPosition(ModelConfig(d_model=8, n_heads=2, context=6)).max_positions == 6


def test_every_position_and_mixer_is_registered(registry):
    assert {"learned", "sinusoidal", "rope", "alibi", "t5", "nope"} <= set(registry.names("position"))
    assert {"mha", "mqa", "gqa", "sliding_window", "linear", "mla"} <= set(registry.names("mixer"))
    assert "parallel" in registry.names("block")


def test_position_costs_count_their_parameters(registry):
    cfg = ModelConfig(d_model=16, n_heads=4, context=12)
    for name in ("learned", "sinusoidal", "rope", "alibi", "t5", "nope"):
        comp = registry.get("position", name)
        params, _ = comp.resolve_params({}, name)
        module = comp.factory(cfg, **params)
        assert comp.cost(cfg, **params).params == sum(p.numel() for p in module.parameters()), name
