"""Comparison helpers shared by the kernel tests."""

import torch

from abl.kernels.utils import TOLERANCE as _TOLERANCE
from abl.kernels.utils import check_error

# Largest error allowed, relative to the largest magnitude of the reference
# (outputs and gradients are rounded to the input dtype at the end): abl.kernels.utils,
# which abl selftest checks too.
TOLERANCE = {getattr(torch, name): tol for name, tol in _TOLERANCE.items()}
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def assert_close(name, ref, out, dtype=None):
    """max |out - ref| <= tol(dtype) * max |ref| (and the same shape, no nan where ref has none)."""
    assert out is not None and ref is not None, name
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    tol = TOLERANCE[dtype or ref.dtype]
    r, o = ref.detach().float().cpu(), out.detach().float().cpu()
    assert torch.isfinite(o).all() or not torch.isfinite(r).all(), f"{name}: non-finite values"
    err = (o - r).abs().max().item()
    scale = max(r.abs().max().item(), 1e-6)
    assert err <= tol * scale, f"{name}: max abs err {err:.3g} > {tol:g} x max|ref| {scale:.3g}"


def assert_bounded(name, out, truth, torch_out, dtype):
    """``out`` against the fp32 ``truth`` under both bounds abl selftest holds the kernels to
    (abl.kernels.utils.check_error): the dtype's fixed TOLERANCE, and at most twice the error of
    ``torch_out`` (torch's own path on the same low-precision inputs) plus a floor."""
    assert out is not None and truth is not None, name
    c = check_error(out, truth, torch_out, dtype)
    assert c.ok, f"{name}: {c.detail()}"
    return c


def triton_device():
    """Where the Triton kernels can run in this process: "cuda", "cpu" (interpreter) or None."""
    from abl.kernels.utils import HAS_TRITON, interpreting

    if not HAS_TRITON:
        return None
    if interpreting():
        return "cpu"
    return "cuda" if torch.cuda.is_available() else None
