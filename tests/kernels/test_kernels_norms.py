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


# Compiles the norm kernels for an H100 (sm_90) without a GPU and counts the barriers (bar.sync) in
# their PTX: each cross-warp reduction costs one here, and a second reduction one more (its scratch
# reuse). Runs in a child process: the Triton compiler needs TRITON_INTERPRET unset.
_BARRIERS = r'''
import json, re, sys
import triton
import triton.compiler.errors
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from abl.kernels import layernorm, rmsnorm

DATA = {"X", "Y", "DY", "DX"}  # the bf16 rows; every other pointer is fp32
SIZES = {"M", "N"}  # the integer arguments in capitals


def barriers(fn, warps, **constexprs):
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.isupper() and name not in SIZES:
            sig[name] = "*bf16" if name in DATA else "*fp32"
        else:
            sig[name] = "fp32" if name == "eps" else "i32"
    ptx = triton.compile(ASTSource(fn, sig, constexprs), target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": warps}).asm["ptx"]
    return len(re.findall(r"\bbar\.sync\b|\bbarrier\.sync\b", ptx))


n = 4096
try:
    out = {}
    for outside in (False, True):
        kw = dict(HAS_WEIGHT=True, HAS_BIAS=True, BLOCK_N=n)
        out[f"layernorm_fwd_{outside}"] = barriers(layernorm._layernorm_fwd_kernel, layernorm._num_warps(n),
                                                   EPS_OUTSIDE=outside, **kw)
        out[f"layernorm_bwd_{outside}"] = barriers(layernorm._layernorm_bwd_kernel, layernorm._num_warps(n),
                                                   EPS_OUTSIDE=outside, **kw)
    out["rmsnorm_fwd"] = barriers(rmsnorm._rmsnorm_fwd_kernel, rmsnorm._num_warps(n), **kw)
    out["rmsnorm_bwd"] = barriers(rmsnorm._rmsnorm_bwd_kernel, rmsnorm._num_warps(n), **kw)
except triton.compiler.errors.CompilationError:
    raise  # the kernel's own error: a failure
except Exception as exc:  # this triton cannot target sm_90 here (no CUDA backend, no ptxas)
    print(json.dumps({"skip": repr(exc)[:300]}))
    sys.exit(0)
print(json.dumps(out))
'''


def test_layernorm_needs_no_more_barriers_than_two_rmsnorm_reductions():
    """LayerNorm at N = 4096 (bf16), compiled for sm_90: the forward's two reductions (mean, then
    the centred sum of squares) cost at most two of rmsnorm's one plus the one between them; the
    backward's pair of row sums is one reduction, at most one barrier above rmsnorm's backward
    (for "outside" too: 1/sqrt(var) is saved by the forward, not recomputed)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _BARRIERS], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    counts = json.loads(r.stdout.strip().splitlines()[-1])
    if "skip" in counts:
        pytest.skip(f"triton {triton_version()} cannot compile for sm_90 here: {counts['skip']}")
    for outside in (False, True):
        assert counts[f"layernorm_fwd_{outside}"] <= 2 * counts["rmsnorm_fwd"] + 1, counts
        assert counts[f"layernorm_bwd_{outside}"] <= counts["rmsnorm_bwd"] + 1, counts


def triton_version() -> str:
    import triton

    return triton.__version__


def test_layernorm_warps_hold_16_values_a_thread():
    from abl.kernels.layernorm import _num_warps

    assert [_num_warps(n) for n in (64, 512, 1024, 4096, 8192, 65536)] == [1, 1, 2, 8, 16, 16]
