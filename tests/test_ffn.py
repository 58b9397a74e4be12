"""Dense and gated FFNs against formulas written out here; sizing rule; ablations/ffn.toml parameter match."""

import dataclasses
import math

import pytest
import torch
from conftest import ROOT
from torch.utils.flop_counter import FlopCounterMode

from abl.contracts.config import ModelConfig
from abl.grid.gridfile import load_grid
from abl.model.decoder import DecoderLM
from tests.kernels.helpers import triton_device


def _relu(x):
    return torch.where(x > 0, x, torch.zeros_like(x))


def _sigmoid(x):
    return 1 / (1 + torch.exp(-x))


def _gelu(x):  # x Phi(x), the exact erf form
    return x * 0.5 * (1 + torch.erf(x / math.sqrt(2)))


# name -> (activation, gated), written independently of plugins/ffn.py (Shazeer 2020 eqs. 1-6)
REFERENCE = {
    "relu": (_relu, False),
    "gelu": (_gelu, False),
    "silu": (lambda x: x * _sigmoid(x), False),
    "relu2": (lambda x: _relu(x) ** 2, False),
    "glu": (_sigmoid, True),
    "reglu": (_relu, True),
    "geglu": (_gelu, True),
    "swiglu": (lambda x: x * _sigmoid(x), True),
    "bilinear": (lambda x: x, True),
}


def reference_ffn(ffn, x, act, gated):
    if gated:
        w, b = ffn.gate_up.weight, ffn.gate_up.bias
        h = w.shape[0] // 2
        g = x @ w[:h].T + (0 if b is None else b[:h])
        v = x @ w[h:].T + (0 if b is None else b[h:])
        hidden = act(g) * v
    else:
        hidden = act(x @ ffn.up.weight.T + (0 if ffn.up.bias is None else ffn.up.bias))
    return hidden @ ffn.down.weight.T + (0 if ffn.down.bias is None else ffn.down.bias)


def test_every_variant_is_registered(registry):
    assert set(REFERENCE) <= set(registry.names("ffn"))
    for name in ("gelu", "swiglu"):  # the names and parameters of the foundation keep working
        assert set(registry.get("ffn", name).params) == {"ratio", "bias", "multiple_of"}


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("name", list(REFERENCE))
def test_ffn_matches_reference(registry, name, bias):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16)
    ffn = registry.get("ffn", name).factory(cfg, bias=bias).double()
    if bias:  # nn.Linear biases start random enough, but make sure they are not zero
        for p in ffn.parameters():
            if p.dim() == 1:
                torch.nn.init.normal_(p)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    act, gated = REFERENCE[name]
    torch.testing.assert_close(ffn(x), reference_ffn(ffn, x, act, gated))


@pytest.mark.parametrize("name", ["swiglu", "geglu"])
def test_fused_glu_kernel_under_the_triton_backend(registry, name):
    """The wiring only (the kernel itself: tests/kernels/test_kernels_rope_glu.py)."""
    from abl import kernels

    device = triton_device()
    if device is None:
        pytest.skip("no CUDA device and the Triton interpreter is not active in this process")
    torch.manual_seed(0)
    ffn = registry.get("ffn", name).factory(ModelConfig(d_model=16)).to(device)
    x = torch.randn(2, 5, 16, device=device, requires_grad=True)
    outs = []
    for backend in ("torch", "triton"):
        with kernels.KernelBackend(backend).activate():
            y = ffn(x)
        outs.append((y, *torch.autograd.grad(y.square().sum(), x)))
    for ref, got in zip(*outs):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_gated_default_is_two_thirds_of_dense_and_matches_parameters(registry):
    # d_model = 96: dense d_ff = 4 * 96 = 384, gated d_ff = 8/3 * 96 = 256, no rounding
    cfg = ModelConfig(d_model=96)
    dense = registry.get("ffn", "relu").factory(cfg)
    gated = registry.get("ffn", "swiglu").factory(cfg)
    assert dense.up.out_features == 384 and gated.down.in_features == 256
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(dense) == count(gated) == 2 * 96 * 384


@pytest.mark.parametrize("name", list(REFERENCE))
def test_cost_matches_module_and_flop_counter(registry, name):
    comp = registry.get("ffn", name)
    cfg = ModelConfig(d_model=24)
    params = {"bias": True, "multiple_of": 1}
    ffn = comp.factory(cfg, **params)
    cost = comp.cost(cfg, **params)
    assert cost.params == sum(p.numel() for p in ffn.parameters())
    x = torch.randn(2, 3, 24)
    with FlopCounterMode(display=False) as fc:
        ffn(x)
    assert cost.flops_per_token == fc.get_total_flops() / 6


def test_ffn_grid_cells_match_parameters_within_two_percent(registry):
    grid = load_grid(ROOT / "ablations" / "ffn.toml", registry)
    names = {c.components["ffn"]["name"] for c in grid.cells}
    assert names == set(REFERENCE)  # every dense and gated variant
    assert {c.seed for c in grid.cells} == {0, 1, 2}  # three seeds: the fewest that can decide
    counts = {}
    for cell in grid.cells:
        if cell.seed:
            continue
        cfg = dataclasses.replace(cell.model, vocab_size=256)  # pystdlib is byte-level
        counts[cell.components["ffn"]["name"]] = DecoderLM(cfg, cell.components, registry).n_params()
    lo, hi = min(counts.values()), max(counts.values())
    assert (hi - lo) / lo < 0.02, counts
