"""Mixture of experts against per-token loops written here: routing, capacity, losses, metrics, cost."""

import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from abl.contracts.config import ConfigError, ModelConfig
from abl.grid.gridfile import expand
from abl.model.decoder import DecoderLM, ForwardContext, PositionEncoding
from abl.plugins.moe import MixtureOfExperts

D = 16


def ctx():
    return ForwardContext(position=PositionEncoding())


def moe(**kw):
    torch.manual_seed(0)
    m = MixtureOfExperts(ModelConfig(d_model=D), **kw).double()
    torch.nn.init.normal_(m.router.weight, std=0.5)  # a router with clear preferences
    return m


def probs(m, x):
    return torch.softmax(x @ m.router.weight.T, dim=-1)


def test_top_k_equal_n_experts_dropless_is_the_dense_weighted_mixture():
    m = moe(n_experts=4, top_k=4, capacity_factor=0.0)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    p = probs(m, x)
    dense = sum(p[..., e:e + 1] * m.experts[e](x) for e in range(4))
    torch.testing.assert_close(m(x), dense)


@pytest.mark.parametrize("expert", ["swiglu", "relu", "bilinear"])
def test_token_choice_matches_a_per_token_loop(expert):
    m = moe(n_experts=4, top_k=2, expert=expert)
    x = torch.randn(3, 4, D, dtype=torch.float64)
    out = m(x).reshape(-1, D)
    flat, p = x.reshape(-1, D), probs(m, x).reshape(-1, 4)
    for n in range(flat.size(0)):
        top = torch.topk(p[n], 2).indices
        w = p[n, top] / p[n, top].sum()  # softmax -> top-k -> renormalise (Lepikhin et al. 2020, GShard, arXiv:2006.16668)
        ref = sum(w[i] * m.experts[int(e)](flat[n]) for i, e in enumerate(top))
        torch.testing.assert_close(out[n], ref)


def test_capacity_serves_first_choices_first_then_by_position():
    m = moe(n_experts=4, top_k=2, capacity_factor=0.5)  # capacity floor(0.5 * 2 * 12 / 4) = 3
    assert m.capacity(12) == 3
    x = torch.randn(1, 12, D, dtype=torch.float64)
    c = ctx()
    out = m(x, c)[0]
    flat, p = x[0], probs(m, x)[0]
    top = torch.topk(p, 2, dim=-1)
    load, ref, dropped = [0] * 4, torch.zeros_like(flat), 0
    for rank in range(2):  # GShard priority: all first choices, then all second choices
        for n in range(12):
            e = int(top.indices[n, rank])
            if load[e] < 3:
                load[e] += 1
                ref[n] += top.values[n, rank] / top.values[n].sum() * m.experts[e](flat[n])
            else:
                dropped += 1
    torch.testing.assert_close(out, ref)
    assert float(c.metrics["moe_dropped_frac"]) == pytest.approx(dropped / 24)


def test_dropped_tokens_pass_through_the_residual_unchanged():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=D)
    m = MixtureOfExperts(cfg, n_experts=4, top_k=1, capacity_factor=1.0, router_bias=True)
    with torch.no_grad():  # every token's first choice is expert 0, which takes floor(8 / 4) = 2
        m.router.weight.zero_()
        m.router.bias.copy_(torch.tensor([5.0, 0.0, 0.0, 0.0]))
    x = torch.randn(1, 8, D)
    c = ctx()
    y = m(x, c)
    torch.testing.assert_close(y[0, :2], m.experts[0](x[0, :2]))  # gate renormalised to 1
    assert torch.equal(y[0, 2:], torch.zeros_like(y[0, 2:]))   # the MoE adds nothing ...
    residual = x + y
    assert torch.equal(residual[0, 2:], x[0, 2:])                # ... so the stream is unchanged
    assert float(c.metrics["moe_dropped_frac"]) == pytest.approx(6 / 8)


def test_expert_choice_each_expert_takes_its_top_tokens():
    m = moe(n_experts=4, top_k=2, routing="expert_choice", capacity_factor=1.0)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    cap = m.capacity(12)
    assert cap == 6  # top_k * tokens / E
    out = m(x).reshape(-1, D)
    flat, p = x.reshape(-1, D), probs(m, x).reshape(-1, 4)
    ref = torch.zeros_like(flat)
    for e in range(4):
        for n in torch.topk(p[:, e], cap).indices:  # weighted by the token's probability (Zhou et al. 2022)
            ref[n] += p[n, e] * m.experts[e](flat[n])
    torch.testing.assert_close(out, ref)


def test_shared_experts_see_every_token():
    m = moe(n_experts=4, top_k=1, n_shared_experts=2)
    x = torch.randn(1, 5, D, dtype=torch.float64)
    with_shared = m(x)
    shared = m.shared[0](x) + m.shared[1](x)
    m.shared = torch.nn.ModuleList()
    torch.testing.assert_close(with_shared, m(x) + shared)


def test_balanced_router_aux_loss_equals_top_k():
    """Switch / GShard L_aux = E * sum_e f_e m_e (Fedus et al. 2021, arXiv:2101.03961, eq. 4) with f_e = tokens routed to
    e / tokens, counting all top_k assignments, and m_e = mean router probability of e. A perfectly
    balanced router has f_e = top_k / E and m_e = 1 / E, so L_aux = top_k (1 for top-1 Switch)."""
    for top_k in (1, 2):
        E = 4
        m = MixtureOfExperts(ModelConfig(d_model=E), n_experts=E, top_k=top_k, aux_loss_coef=0.5,
                             router_z_loss_coef=0.0)
        with torch.no_grad():  # token i prefers expert i, then i + 1: cyclic, so perfectly balanced
            m.router.weight.copy_(2 * torch.eye(E) + torch.roll(torch.eye(E), 1, dims=0))
        x = torch.eye(E).repeat(3, 1)[None]
        c = ctx()
        m(x, c)
        assert float(c.metrics["moe_aux_loss"]) == pytest.approx(top_k)
        assert float(c.aux_losses["moe_aux_loss"].detach()) == pytest.approx(0.5 * top_k)
        assert float(c.metrics["moe_load_entropy"]) == pytest.approx(1.0)
        assert "moe_z_loss" not in c.aux_losses  # coefficient 0: not added
    # a collapsed router (everything on expert 0, probability ~1) costs E times more
    m = MixtureOfExperts(ModelConfig(d_model=4), n_experts=4, top_k=1, router_bias=True)
    with torch.no_grad():
        m.router.weight.zero_()
        m.router.bias.copy_(torch.tensor([50.0, 0, 0, 0]))
    c = ctx()
    m(torch.randn(1, 8, 4), c)
    assert float(c.metrics["moe_aux_loss"]) == pytest.approx(4.0)
    assert float(c.metrics["moe_load_entropy"]) == pytest.approx(0.0, abs=1e-6)


def test_z_loss_is_mean_squared_logsumexp():
    m = moe(n_experts=4, top_k=2, router_z_loss_coef=0.1)
    x = torch.randn(2, 3, D, dtype=torch.float64)
    c = ctx()
    m(x, c)
    z = torch.logsumexp(x @ m.router.weight.detach().T, dim=-1).pow(2).mean()
    assert float(c.metrics["moe_z_loss"]) == pytest.approx(float(z))
    assert float(c.aux_losses["moe_z_loss"].detach()) == pytest.approx(0.1 * float(z))


def test_router_noise_only_in_training():
    m = moe(n_experts=8, top_k=2, router_noise=0.5)
    x = torch.randn(2, 16, D, dtype=torch.float64)
    clean = moe(n_experts=8, top_k=2)
    m.eval()
    torch.testing.assert_close(m(x), clean(x))
    m.train()
    assert not torch.allclose(m(x), clean(x))


def test_metrics_every_step_and_aux_losses_join_the_loss(registry):
    cfg = ModelConfig(d_model=D, n_layers=2, n_heads=2, context=8, vocab_size=32)
    comps = {}
    for axis, name in (("norm", "rmsnorm"), ("block", "pre"), ("position", "rope"), ("mixer", "mha"),
                       ("ffn", "moe")):
        defaults = {k: p.default for k, p in registry.get(axis, name).params.items()}
        comps[axis] = {"name": name, "params": defaults}
    model = DecoderLM(cfg, comps, registry)
    idx = torch.randint(0, 32, (2, 8))
    _, loss, c = model(idx, idx)
    assert {"moe_aux_loss", "moe_z_loss", "moe_dropped_frac", "moe_load_entropy"} <= set(c.metrics)
    assert 0.0 <= float(c.metrics["moe_load_entropy"]) <= 1.0
    aux = sum(float(v.detach()) for v in c.aux_losses.values())
    assert float(loss.detach()) == pytest.approx(float(c.metrics["ce_loss"]) + aux)
    loss.backward()
    assert model.blocks[0].ffn.router.weight.grad is not None


def test_top_k_above_n_experts_is_rejected_before_training(registry):
    comp = registry.get("ffn", "moe")
    params = {k: p.default for k, p in comp.params.items()} | {"top_k": 3, "n_experts": 2}
    assert any("top_k=3" in m and "n_experts=2" in m for m in comp.check(ModelConfig(), params))
    raw = {"model": {"ffn": "moe"}, "ffn": {"moe": {"top_k": 3, "n_experts": 2}}}
    with pytest.raises(ConfigError, match="top_k=3 is larger than n_experts=2"):
        expand(raw, registry)


@pytest.mark.parametrize("routing", ["token_choice", "expert_choice"])
@pytest.mark.parametrize("expert,shared", [("swiglu", 0), ("gelu", 1)])
def test_cost_matches_module_and_flop_counter(registry, routing, expert, shared):
    comp = registry.get("ffn", "moe")
    cfg = ModelConfig(d_model=D)
    params = {k: p.default for k, p in comp.params.items()} | {
        "routing": routing, "expert": expert, "n_shared_experts": shared, "bias": True, "router_bias": True}
    m = comp.factory(cfg, **params)
    cost = comp.cost(cfg, **params)
    assert cost.params == sum(p.numel() for p in m.parameters())  # all experts, not just the active
    x = torch.randn(2, 8, D)
    with FlopCounterMode(display=False) as fc:
        m(x)
    assert cost.flops_per_token == fc.get_total_flops() / 16  # router + active experts only


def test_moe_grid_matches_active_parameters(registry):
    from conftest import ROOT

    from abl.grid.gridfile import load_grid

    grid = load_grid(ROOT / "ablations" / "moe.toml", registry)
    ffn = {c.components["ffn"]["name"] for c in grid.cells}
    assert ffn == {"swiglu", "moe"}
    dense = next(c for c in grid.cells if c.components["ffn"]["name"] == "swiglu")
    sparse = next(c for c in grid.cells if c.components["ffn"]["name"] == "moe")
    cfg = dataclasses.replace(dense.model, vocab_size=256)
    d = DecoderLM(cfg, dense.components, registry).blocks[0].ffn
    m = DecoderLM(cfg, sparse.components, registry).blocks[0].ffn
    per_expert = sum(p.numel() for p in m.experts[0].parameters())
    assert m.top_k * per_expert == sum(p.numel() for p in d.parameters())
