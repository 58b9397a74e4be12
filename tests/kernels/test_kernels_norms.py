"""rmsnorm and layernorm kernels vs their references: forward, dx, dweight, dbias."""

import pytest
import torch

from abl.kernels.layernorm import layernorm_triton, layernorm_reference
from abl.kernels.rmsnorm import rmsnorm_triton, rmsnorm_reference

from .helpers import DTYPE_NAMES, assert_close

# (leading shape, N, dtype, weight, bias): non-power-of-two N (masked tail of the row
# block), rows not a multiple of the reduction programs, every dtype.
NORM_CASES = [
    ((2, 13), 100, torch.float32, True, False),
    ((3, 5), 64, torch.bfloat16, True, True),
    ((7,), 33, torch.float16, False, False),
]


def _id(case):
    lead, n, dt, w, b = case
    return f"M{'x'.join(map(str, lead))}-N{n}-{DTYPE_NAMES[dt]}-{'w' if w else 'now'}{'b' if b else ''}"


def _inputs(lead, n, dt, w, b, device):
    torch.manual_seed(0)
    x = torch.randn(*lead, n, device=device).to(dt).requires_grad_()
    weight = (1 + 0.1 * torch.randn(n, device=device)).requires_grad_() if w else None
    bias = (0.1 * torch.randn(n, device=device)).requires_grad_() if b else None
    return x, weight, bias


def _check(out, ref, leaves, dt):
    assert out.dtype == ref.dtype
    assert_close("y", ref, out, dt)
    dy = torch.randn_like(ref)
    live = [t for t in leaves if t is not None]
    got = torch.autograd.grad(out, live, dy)
    want = torch.autograd.grad(ref, live, dy)
    for name, g, r in zip(("dx", "dweight", "dbias"), got, want):
        # dweight/dbias are sums over rows in fp32; compare at the input dtype's tolerance
        assert_close(name, r, g, dt)


@pytest.mark.parametrize("case", NORM_CASES, ids=_id)
def test_rmsnorm(case, device):
    lead, n, dt, w, b = case
    x, weight, bias = _inputs(lead, n, dt, w, b, device)
    _check(rmsnorm_triton(x, weight, bias, 1e-6), rmsnorm_reference(x, weight, bias, 1e-6), (x, weight, bias), dt)


@pytest.mark.parametrize("placement", ["inside", "outside"])
@pytest.mark.parametrize("case", NORM_CASES[:2], ids=_id)
def test_layernorm(case, placement, device):
    lead, n, dt, w, b = case
    x, weight, bias = _inputs(lead, n, dt, w, b, device)
    _check(layernorm_triton(x, weight, bias, 1e-5, placement),
           layernorm_reference(x, weight, bias, 1e-5, placement), (x, weight, bias), dt)


def test_layernorm_constant_row_outside_eps(device):
    # sigma = 0: the "outside" backward must not divide by it
    x = torch.full((3, 40), 2.0, device=device, requires_grad=True)
    y = layernorm_triton(x, None, None, 1e-5, "outside")
    (dx,) = torch.autograd.grad(y, x, torch.randn_like(y))
    assert torch.isfinite(dx).all()
    assert y.abs().max() == 0


def test_norm_plugins_dispatch_to_the_kernels(device):
    from abl.kernels import KernelBackend
    from abl.plugins.norms import LayerNorm, RMSNorm

    x = torch.randn(2, 5, 48, device=device)
    for module in (RMSNorm(48, bias=True), LayerNorm(48), LayerNorm(48, eps_placement="outside")):
        module = module.to(device)
        with torch.no_grad():
            module.weight.normal_()
        want = module(x)  # no backend active: the torch path
        with KernelBackend("triton").activate():
            got = module(x)
        assert_close(type(module).__name__, want, got, torch.float32)


def test_cpu_without_the_interpreter_is_a_clear_error(monkeypatch):
    from abl.kernels.utils import KernelUnavailable

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelUnavailable, match="CUDA"):
        rmsnorm_triton(torch.randn(2, 8), torch.ones(8))
