"""S4D (plugins/s4.py): the FFT-convolution kernel against the recurrence, the LegS init against the
HiPPO-LegS matrix, training forward against cached step-by-step decoding, and its cost."""

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from abl.contracts.config import ConfigError, ModelConfig
from abl.grid.gridfile import expand
from abl.model.decoder import DecoderLM, ForwardContext, PositionEncoding
from abl.plugins.s4 import S4D, fft_conv, legs_diagonal, s4d_init, s4d_kernel, s4d_recurrence

CFG = ModelConfig(d_model=16, n_heads=2, context=64)


@pytest.mark.parametrize("init", ["lin", "inv", "legs"])
def test_convolution_kernel_equals_the_recurrence_in_fp32(init):
    """S4D sec. 3.1: the FFT convolution with K_l = 2 Re(C dA^l dB) is the recurrence unrolled."""
    torch.manual_seed(0)
    layer = S4D(CFG, d_state=16, init=init, dt_min=0.01, dt_max=0.5)
    u = torch.randn(3, 16, 50)
    with torch.no_grad():
        log_dt, a, b, c = layer.ssm.ssm()
        y_conv = fft_conv(u, s4d_kernel(log_dt, a, b, c, 50))
        y_rec, _ = s4d_recurrence(u, log_dt, a, b, c)
    assert y_conv.dtype == torch.float32
    assert y_rec.abs().max() > 0.1  # not a comparison of zeros
    torch.testing.assert_close(y_conv, y_rec, rtol=1e-4, atol=1e-4)


def test_legs_init_is_the_spectrum_of_the_normal_part_of_hippo_legs():
    n = 8
    a, b = legs_diagonal(n)
    q = torch.arange(n, dtype=torch.float64)
    r = torch.sqrt(2 * q + 1)
    legs = torch.where(q[:, None] > q[None, :], -r[:, None] * r[None, :], torch.zeros(n, n, dtype=torch.float64))
    legs = legs - torch.diag(q + 1)
    normal = legs + torch.sqrt(q + 0.5)[:, None] * torch.sqrt(q + 0.5)[None, :]
    eig = torch.linalg.eigvals(normal)
    torch.testing.assert_close(a.real, torch.full((n // 2,), -0.5, dtype=torch.float64))
    neg = eig[eig.imag < 0]
    torch.testing.assert_close(torch.sort(a.imag).values, torch.sort(neg.imag).values)
    # with the conjugate modes, V diag(w) V^* B is A^(N) B: B was projected onto the eigenvectors
    assert b.abs().sum() > 0 and len(b) == n // 2


def test_lin_init_is_s4d_lin():
    a, b = s4d_init(6, "lin")
    torch.testing.assert_close(a, torch.complex(torch.full((3,), -0.5, dtype=torch.float64),
                                                math.pi * torch.arange(3, dtype=torch.float64)))
    assert torch.equal(b, torch.ones(3, dtype=torch.complex128))


def test_layer_is_causal():
    torch.manual_seed(0)
    layer = S4D(CFG, d_state=8)
    x = torch.randn(1, 12, 16)
    x2 = x.clone()
    x2[:, 7:] = torch.randn(1, 5, 16)
    c = ForwardContext(position=PositionEncoding())
    torch.testing.assert_close(layer(x, c)[:, :7], layer(x2, c)[:, :7])


@pytest.mark.parametrize("init", ["lin", "legs"])
def test_training_forward_equals_step_by_step_decoding(init):
    torch.manual_seed(0)
    layer = S4D(CFG, d_state=8, init=init, dt_min=0.01, dt_max=0.5)
    x = torch.randn(2, 13, 16)
    with torch.no_grad():
        full = layer(x, ForwardContext(position=PositionEncoding()))
        cache: dict = {}

        def at(start):
            return ForwardContext(position=PositionEncoding(), cache=cache, start=start, layer=1)

        outs = [layer(x[:, :4], at(0))]  # prefill: the convolution plus the state it leaves
        shape = cache[1]["ssm"].shape
        for i in range(4, 9):  # one token at a time: the recurrence
            outs.append(layer(x[:, i:i + 1], at(i)))
            assert cache[1]["ssm"].shape == shape  # O(1) state
        outs.append(layer(x[:, 9:], at(9)))  # a chunk continues from the state
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-4, atol=1e-5)


def _components(registry, mixer):
    def spec(axis, name):
        return {"name": name, "params": {k: p.default for k, p in registry.get(axis, name).params.items()}}

    return {axis: spec(axis, name) for axis, name in (("norm", "rmsnorm"), ("block", "pre"), ("position", "nope"),
                                                      ("mixer", mixer), ("ffn", "gelu"))}


def test_cached_greedy_decoding_equals_full_recomputation(registry):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, context=32, vocab_size=48, mixer="s4", position="nope")
    model = DecoderLM(cfg, _components(registry, "s4"), registry).double().eval()
    prompt = torch.randint(0, 48, (2, 5))
    with torch.no_grad():
        full = prompt
        for _ in range(6):
            full = torch.cat([full, model(full)[0][:, -1].argmax(-1, keepdim=True)], 1)
        cache: dict = {}
        logits, _, _ = model(prompt, ctx=ForwardContext(position=model.position, cache=cache, start=0))
        cached = prompt
        for _ in range(6):
            torch.testing.assert_close(logits[:, -1].float(), model(cached)[0][:, -1].float(), rtol=1e-4, atol=1e-4)
            cached = torch.cat([cached, logits[:, -1].argmax(-1, keepdim=True)], 1)
            logits, _, _ = model(cached[:, -1:], ctx=ForwardContext(position=model.position, cache=cache,
                                                                     start=cached.size(1) - 1))
    assert torch.equal(cached, full)


@pytest.mark.parametrize("params", [{}, {"d_state": 4, "init": "legs"}])
def test_cost_matches_module_parameters_flop_counter_and_cache(registry, params):
    comp = registry.get("mixer", "s4")
    cfg = ModelConfig(d_model=32, n_heads=4, context=20)
    p = {k: v.default for k, v in comp.params.items()} | params
    m = comp.factory(cfg, None, **p)
    cost = comp.cost(cfg, **p)
    assert cost.params == sum(q.numel() for q in m.parameters())
    x = torch.randn(2, 20, 32)
    with FlopCounterMode(display=False) as fc:
        m(x)
    assert cost.flops_per_token == pytest.approx(fc.get_total_flops() / 40)
    cache: dict = {}
    m(x[:1], ForwardContext(position=PositionEncoding(), cache=cache))
    state = cache[0].values()
    assert cost.state_elements_per_sequence == sum(v.numel() for v in state)
    assert sum(v.untyped_storage().nbytes() for v in state) == 4 * cost.state_elements_per_sequence


def test_odd_state_size_is_refused_before_training(registry):
    raw = {"model": {"d_model": 32, "n_heads": 2, "context": 16, "mixer": "s4"}, "mixer": {"s4": {"d_state": 7}}}
    with pytest.raises(ConfigError, match="d_state=7 must be even"):
        expand(raw, registry)


def test_s4_trains_in_a_model(registry):
    raw = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "context": 16, "vocab_size": 40, "mixer": "s4",
                     "position": "nope"}, "mixer": {"s4": {"d_state": 8, "init": "legs"}}}
    cell = expand(raw, registry).cells[0]
    model = DecoderLM(cell.model, cell.components, registry)
    idx = torch.randint(0, 40, (2, 16))
    _, loss, _ = model(idx, idx)
    assert abs(float(loss.detach()) - math.log(40)) < 1.0
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
