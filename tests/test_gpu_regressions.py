"""Defects the first GPU run (an H100, docs/gpu.md) found, each held on the CPU.

- torch.compile launches a user Triton kernel with a Python float typed fp64, and
  a loop-carried fp32 value mixed with it fails to compile ("m_i ... re-assigned
  to fp64"): every float argument of every kernel is cast to fp32 first.
- CUDA's ``layer_norm`` refuses bf16 input with fp32 weights (CPU accepts them),
  so the layernorm reference spells out the fp32 computation when dtypes differ.
"""

import ast
import importlib
import inspect
import pkgutil

import pytest

torch = pytest.importorskip("torch")

# kernel parameters that receive a Python float from their launcher
FLOAT_PARAMS = {"eps", "qk_scale", "sm_scale", "scale", "label_smoothing", "z_loss", "softcap"}


def _jit_kernels():
    import abl.kernels as kernels_pkg

    for info in pkgutil.iter_modules(kernels_pkg.__path__):
        mod = importlib.import_module(f"abl.kernels.{info.name}")
        tree = ast.parse(inspect.getsource(mod))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(
                    ast.unparse(d).endswith("jit") for d in node.decorator_list):
                yield info.name, node


def test_every_float_argument_of_a_kernel_is_cast_to_fp32():
    found = 0
    for module, fn in _jit_kernels():
        params = [a.arg for a in fn.args.args if a.annotation is None and a.arg in FLOAT_PARAMS]
        body = ast.unparse(fn)
        for p in params:
            found += 1
            assert f"{p} = tl.cast({p}, tl.float32)" in body, (
                f"abl.kernels.{module}.{fn.name}: float argument {p!r} is not cast to fp32 "
                "(torch.compile passes it as fp64)")
    assert found >= 8  # flash attention's scales, the norms' eps, the loss's two floats


def test_layernorm_reference_never_hands_layer_norm_mixed_dtypes(monkeypatch):
    from abl.kernels import layernorm as ln

    real = torch.nn.functional.layer_norm

    def cuda_like(x, shape, weight=None, bias=None, eps=1e-5):
        for t in (weight, bias):
            if t is not None and t.dtype != x.dtype:
                raise RuntimeError(f"expected scalar type {x.dtype} but found {t.dtype}")
        return real(x, shape, weight, bias, eps)

    monkeypatch.setattr(ln.F, "layer_norm", cuda_like)
    torch.manual_seed(0)
    x = torch.randn(6, 64).to(torch.bfloat16)
    w, b = 1 + 0.1 * torch.randn(64), 0.1 * torch.randn(64)
    y = ln.layernorm_reference(x, w, b, 1e-5)
    assert y.dtype == torch.bfloat16
    want = real(x.float(), (64,), w, b, 1e-5).to(torch.bfloat16)
    assert torch.equal(y, want)
    # same dtypes: torch's own layer_norm, unchanged
    xf = x.float()
    assert torch.equal(ln.layernorm_reference(xf, w, b, 1e-5), real(xf, (64,), w, b, 1e-5))
