"""H3 and Hyena (plugins/gated_conv.py): against step-by-step references written here, causality,
cached decoding against the full forward, and their cost."""

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from abl.contracts.config import ConfigError, ModelConfig
from abl.grid.gridfile import expand
from abl.model.decoder import DecoderLM, ForwardContext, PositionEncoding
from abl.plugins.gated_conv import H3, Hyena, hyena_filter_flops
from abl.plugins.s4 import s4d_recurrence

CFG = ModelConfig(d_model=8, n_heads=2, context=24)


def _ctx(cache=None, start=0, layer=0):
    return ForwardContext(position=PositionEncoding(), cache=cache, start=start, layer=layer)


@pytest.mark.parametrize("head_dim", [1, 2])
def test_h3_equals_its_algorithm_written_as_loops(head_dim):
    """Algorithm 1 of the H3 paper, token by token: the shift SSM as a sum over the last m keys, the
    diagonal SSM as its recurrence, the heads' outer products as explicit sums."""
    torch.manual_seed(0)
    layer = H3(CFG, d_state=4, shift_state=3, head_dim=head_dim, dt_min=0.05, dt_max=0.5).double()
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    with torch.no_grad():
        got = layer(x, _ctx())
        q, k, v = layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)
        ks = torch.zeros_like(k)
        for t in range(9):
            for i in range(min(3, t + 1)):
                ks[:, t] += layer.shift_C[:, i] * k[:, t - i]
        ks += layer.shift_D * k
        p, h = head_dim, 8 // head_dim
        kv = torch.einsum("bthi,bthj->bhijt", ks.view(2, 9, h, p), v.view(2, 9, h, p)).reshape(2, 8 * p, 9)
        log_dt, a, b, c = layer.diag.ssm(torch.float64)
        s, _ = s4d_recurrence(kv, log_dt, a, b, c)
        s = s.double() + kv * layer.diag.D[:, None]
        o = torch.einsum("bthi,bhijt->bthj", q.view(2, 9, h, p), s.view(2, h, p, p, 9)).reshape(2, 9, 8)
        want = layer.out_proj(o)
    assert want.abs().max() > 0.1
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_hyena_equals_definition_3_1_with_direct_convolutions():
    """z^(n+1) = x^n * (h^n conv z^n + b z^n), with the long convolutions as explicit causal sums."""
    torch.manual_seed(0)
    layer = Hyena(CFG, order=2, filter_width=8, emb_dim=3).double()
    x = torch.randn(2, 10, 8, dtype=torch.float64)
    with torch.no_grad():
        got = layer(x, _ctx())
        u = layer.in_proj(x).transpose(1, 2)
        uc = torch.zeros_like(u)
        for t in range(10):
            for i in range(3):  # causal depthwise conv of width 3: tap i reads t - (2 - i)
                if t - (2 - i) >= 0:
                    uc[..., t] += layer.short_w[:, i] * u[..., t - (2 - i)]
        uc += layer.short_b[:, None]
        x1, x2, z = uc.split(8, dim=1)
        h = layer.filter(10, x.device).view(2, 8, 10).double()
        bias = layer.filter_bias.view(2, 8)
        for n, gate in enumerate((x1, x2)):
            conv = torch.zeros_like(z)
            for t in range(10):
                for s in range(t + 1):
                    conv[..., t] += h[n][:, t - s] * z[..., s]
            z = gate * (conv + bias[n][:, None] * z)
        want = layer.out_proj(z.transpose(1, 2))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_hyena_window_decays_and_filters_do_not_depend_on_the_sequence_length():
    torch.manual_seed(0)
    layer = Hyena(CFG, order=2)
    with torch.no_grad():
        short, long = layer.filter(10, torch.device("cpu")), layer.filter(30, torch.device("cpu"))
    torch.testing.assert_close(long[:, :10], short)
    window = torch.exp(-layer.filter.positional(24, torch.device("cpu"))[1][:, None] * layer.filter.deltas)
    assert window[0].eq(1).all() and (window[-1] < window[0]).all()
    # the fastest channel's window reaches the target (1e-2) at fast_decay = 0.3 of the context
    assert window[:, -1].min() == pytest.approx(math.exp(-math.log(100) / 0.3), rel=1e-3)


def _mixers():
    torch.manual_seed(0)
    return [H3(CFG, d_state=4, shift_state=3).double(), H3(CFG, d_state=4, shift_state=5, head_dim=2).double(),
            Hyena(CFG, order=2, filter_width=8).double(), Hyena(CFG, order=3, filter_width=8).double()]


IDS = ["h3", "h3-heads", "hyena", "hyena-order3"]


@pytest.mark.parametrize("layer", _mixers(), ids=IDS)
def test_mixers_are_causal(layer):
    x = torch.randn(1, 12, 8, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 7:] = torch.randn(1, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x, _ctx())[:, :7], layer(x2, _ctx())[:, :7])


@pytest.mark.parametrize("layer", _mixers(), ids=IDS)
def test_cached_steps_and_chunks_equal_the_full_sequence(layer):
    x = torch.randn(2, 11, 8, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x, _ctx())
        cache: dict = {}
        outs = [layer(x[:, :4], _ctx(cache, 0, 2))]
        for i in range(4, 7):
            outs.append(layer(x[:, i:i + 1], _ctx(cache, i, 2)))
        outs.append(layer(x[:, 7:], _ctx(cache, 7, 2)))
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-4, atol=1e-5)


def test_h3_decoding_keeps_constant_state():
    layer = H3(CFG, d_state=4, shift_state=3)
    cache: dict = {}
    x = torch.randn(1, 6, 8)
    with torch.no_grad():
        layer(x[:, :2], _ctx(cache, 0))
        shapes = {k: v.shape for k, v in cache[0].items()}
        for i in range(2, 6):
            layer(x[:, i:i + 1], _ctx(cache, i))
            assert {k: v.shape for k, v in cache[0].items()} == shapes


@pytest.mark.parametrize("name,params", [("h3", {}), ("h3", {"head_dim": 2, "shift_state": 4, "bias": False}),
                                         ("hyena", {}), ("hyena", {"order": 3, "inner_mlps": 1})])
def test_cost_matches_parameters_flop_counter_and_cache(registry, name, params):
    comp = registry.get("mixer", name)
    cfg = ModelConfig(d_model=16, n_heads=4, context=20)
    p = {k: v.default for k, v in comp.params.items()} | params
    m = comp.factory(cfg, None, **p)
    cost = comp.cost(cfg, **p)
    assert cost.params == sum(q.numel() for q in m.parameters())
    x = torch.randn(2, 20, 16)
    with FlopCounterMode(display=False) as fc:
        m(x)
    per_forward = hyena_filter_flops(cfg, **p) if name == "hyena" else 0.0
    assert cost.flops_per_token == pytest.approx((fc.get_total_flops() - per_forward) / 40)
    cache: dict = {}
    m(x[:1], ForwardContext(position=PositionEncoding(), cache=cache))
    kept = [v for v in cache[0].values() if isinstance(v, torch.Tensor)]
    assert cost.state_elements_per_sequence + 20 * cost.state_elements_per_token == sum(v.numel() for v in kept)


def _components(registry, mixer):
    def spec(axis, name):
        return {"name": name, "params": {k: p.default for k, p in registry.get(axis, name).params.items()}}

    return {axis: spec(axis, name) for axis, name in (("norm", "rmsnorm"), ("block", "pre"), ("position", "nope"),
                                                      ("mixer", mixer), ("ffn", "gelu"))}


@pytest.mark.parametrize("mixer", ["h3", "hyena"])
def test_cached_greedy_decoding_equals_full_recomputation(registry, mixer):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_layers=2, n_heads=2, context=32, vocab_size=40, mixer=mixer, position="nope")
    model = DecoderLM(cfg, _components(registry, mixer), registry).double().eval()
    prompt = torch.randint(0, 40, (2, 5))
    with torch.no_grad():
        full = prompt
        for _ in range(5):
            full = torch.cat([full, model(full)[0][:, -1].argmax(-1, keepdim=True)], 1)
        cache: dict = {}
        logits, _, _ = model(prompt, ctx=ForwardContext(position=model.position, cache=cache, start=0))
        cached = prompt
        for _ in range(5):
            cached = torch.cat([cached, logits[:, -1].argmax(-1, keepdim=True)], 1)
            logits, _, _ = model(cached[:, -1:], ctx=ForwardContext(position=model.position, cache=cache,
                                                                     start=cached.size(1) - 1))
    assert torch.equal(cached, full)


def test_h3_head_dim_must_divide_d_model(registry):
    raw = {"model": {"d_model": 30, "n_heads": 2, "context": 16, "mixer": "h3"}, "mixer": {"h3": {"head_dim": 4}}}
    with pytest.raises(ConfigError, match="not divisible by head_dim=4"):
        expand(raw, registry)


@pytest.mark.parametrize("mixer", ["h3", "hyena"])
def test_trains_in_a_model(registry, mixer):
    raw = {"model": {"d_model": 16, "n_layers": 2, "n_heads": 2, "context": 16, "vocab_size": 40, "mixer": mixer,
                     "position": "nope"}}
    cell = expand(raw, registry).cells[0]
    model = DecoderLM(cell.model, cell.components, registry)
    idx = torch.randint(0, 40, (2, 16))
    _, loss, _ = model(idx, idx)
    assert math.isfinite(float(loss.detach()))
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_hyena_filter_keeps_its_own_init_in_a_model(registry):
    """The skeleton's normal init must not overwrite the implicit filter's (torch's default, as the reference)."""
    raw = {"model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16, "vocab_size": 40, "mixer": "hyena",
                     "position": "nope", "init_std": 1e-3}}
    cell = expand(raw, registry).cells[0]
    model = DecoderLM(cell.model, cell.components, registry)
    first = model.blocks[0].mixer.filter.mlp[0].weight
    assert first.std() > 0.1  # torch's default for fan-in 3 is uniform(+-1/sqrt(3)), not std 1e-3
    assert model.blocks[0].mixer.in_proj.weight.std() < 0.01  # the projections do take the skeleton's init
