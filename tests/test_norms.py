"""Each norm against its formula, written out element by element (no shared code)."""

import math

import pytest
import torch

from abl.plugins.norms import LayerNorm, NoNorm, RMSNorm, ScaleNorm


def ref_layernorm(x, gamma, beta, eps, inside):
    out = torch.empty_like(x)
    for idx in range(x.shape[0]):
        row = x[idx]
        mu = sum(row.tolist()) / len(row)
        var = sum((v - mu) ** 2 for v in row.tolist()) / len(row)
        denom = math.sqrt(var + eps) if inside else math.sqrt(var) + eps
        out[idx] = torch.tensor([(v - mu) / denom for v in row.tolist()], dtype=x.dtype) * gamma + beta
    return out


def ref_rmsnorm(x, gamma, eps):
    out = torch.empty_like(x)
    for idx in range(x.shape[0]):
        vals = x[idx].tolist()
        rms = math.sqrt(sum(v * v for v in vals) / len(vals) + eps)
        out[idx] = torch.tensor([v / rms for v in vals], dtype=x.dtype) * gamma
    return out


def ref_scalenorm(x, g, eps):
    out = torch.empty_like(x)
    for idx in range(x.shape[0]):
        vals = x[idx].tolist()
        n = max(math.sqrt(sum(v * v for v in vals)), eps)
        out[idx] = torch.tensor([g * v / n for v in vals], dtype=x.dtype)
    return out


@pytest.fixture
def x():
    torch.manual_seed(0)
    return torch.randn(6, 10, dtype=torch.float64) * 3 + 1


@pytest.mark.parametrize("placement", ["inside", "outside"])
def test_layernorm(x, placement):
    m = LayerNorm(10, eps=1e-2, eps_placement=placement).double()
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.uniform_(-0.5, 0.5)
    ref = ref_layernorm(x, m.weight.detach(), m.bias.detach(), 1e-2, placement == "inside")
    torch.testing.assert_close(m(x), ref)


def test_layernorm_placements_differ(x):
    a = LayerNorm(10, eps=0.5, eps_placement="inside").double()(x)
    b = LayerNorm(10, eps=0.5, eps_placement="outside").double()(x)
    assert not torch.allclose(a, b)


def test_layernorm_without_affine_has_no_parameters():
    assert list(LayerNorm(8, gain=False, bias=False).parameters()) == []


def test_rmsnorm(x):
    m = RMSNorm(10, eps=1e-3).double()
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
    torch.testing.assert_close(m(x), ref_rmsnorm(x, m.weight.detach(), 1e-3))
    assert m.bias is None
    assert RMSNorm(10, bias=True).bias is not None


def test_rmsnorm_keeps_low_precision_dtype(x):
    y = RMSNorm(10)(x.to(torch.bfloat16))
    assert y.dtype == torch.bfloat16


def test_scalenorm(x):
    m = ScaleNorm(10, eps=1e-5).double()
    assert float(m.g.detach()) == pytest.approx(math.sqrt(10))
    with torch.no_grad():
        m.g.fill_(2.5)
    torch.testing.assert_close(m(x), ref_scalenorm(x, 2.5, 1e-5))
    assert [n for n, _ in ScaleNorm(10, gain=False).named_parameters()] == []


def test_scalenorm_eps_guards_zero_vectors():
    y = ScaleNorm(4, eps=1e-5)(torch.zeros(2, 4))
    assert torch.isfinite(y).all()


def test_none_is_identity(x):
    assert torch.equal(NoNorm(10)(x), x)
