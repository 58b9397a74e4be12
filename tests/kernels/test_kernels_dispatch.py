"""Each op picks its path itself: the torch reference outside a triton backend, the Triton function inside.

A component calls ``abl.kernels.<module>.<op>`` and keeps no copy of the math; these check
that the op is the reference, bit for bit, on the torch backend and hands the same arguments
to its ``_triton`` function on the triton backend.
"""

import pytest
import torch

from abl import kernels


def _inputs(op):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    if op in ("rmsnorm", "layernorm"):
        return (r(2, 3, 16), r(16), r(16), 1e-5)
    if op == "rope":
        ang = torch.arange(5.0)[:, None] * torch.rand(4, generator=g)
        return (r(2, 2, 5, 8), ang.cos(), ang.sin(), "half")
    if op in ("swiglu", "geglu"):
        return (r(3, 10), r(3, 10))
    if op == "cross_entropy":
        return (r(6, 11), torch.randint(0, 11, (6,), generator=g))
    if op == "linear_cross_entropy":
        return (r(6, 8), r(11, 8), torch.randint(0, 11, (6,), generator=g))
    if op == "flash_attention":
        return (r(1, 4, 6, 8), r(1, 2, 6, 8), r(1, 2, 6, 8), True, 3)
    if op == "ssd_scan":
        return (r(1, 32, 2, 4), torch.rand(1, 32, 2, generator=g), -torch.rand(2, generator=g),
                r(1, 32, 1, 3), r(1, 32, 1, 3), 16)
    raise AssertionError(f"no inputs for {op}: a new op needs a case here")


@pytest.mark.parametrize("op", sorted(kernels.OPS))
def test_op_is_its_reference_on_the_torch_backend(op):
    args = _inputs(op)
    _, reference = kernels.load(op)
    got, want = kernels.op(op)(*args), reference(*args)
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(a, b), op


@pytest.mark.parametrize("op", sorted(kernels.OPS))
def test_op_calls_its_triton_function_on_the_triton_backend(op, monkeypatch):
    import importlib

    module, triton_name, _ = kernels.OPS[op]
    mod = importlib.import_module(f"abl.kernels.{module}")
    seen = []
    monkeypatch.setattr(mod, triton_name, lambda *a, **k: seen.append(a) or "from the kernel")
    args = _inputs(op)
    with kernels.KernelBackend("triton").activate():
        assert kernels.op(op)(*args) == "from the kernel"
    assert len(seen) == 1 and all(x is y for x, y in zip(seen[0], args))
    assert kernels.op(op)(*args) != "from the kernel"  # outside the activation: the reference again


def test_ssd_scan_keeps_the_reference_where_the_kernel_tile_does_not_fit(monkeypatch):
    from abl.kernels import ssd_scan

    monkeypatch.setattr(ssd_scan, "ssd_scan_triton", lambda *a, **k: pytest.fail("a 12-token chunk has no tile"))
    args = list(_inputs("ssd_scan"))
    args[5] = 12
    with kernels.KernelBackend("triton").activate():
        y, final = ssd_scan.ssd_scan(*args)
    want_y, want_final = ssd_scan.ssd_chunked(*args)
    assert torch.equal(y, want_y) and torch.equal(final, want_final)
