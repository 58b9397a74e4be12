"""``abl selftest``'s kernel section: every op of abl.kernels against its torch reference.

For each op in ``abl.kernels.OPS``, at several shapes and dtypes, the Triton
function and the op's reference (the ground truth the kernel tests use) get
the same inputs; the forward outputs are compared, then the gradients of
every differentiable input under the same random output gradient. An error
is measured as max |kernel - reference| relative to max |reference| and must
stay within ``TOLERANCE`` of the input dtype (outputs and gradients are
rounded to that dtype at the end, so the bound is the dtype's, not fp32's).

Shapes: on CPU the kernels run in the Triton interpreter (a correctness path,
numpy per program), so the shapes are small, with masked tails (sizes not
powers of two); ``quick`` keeps one shape per op and two dtypes. On CUDA the
shapes are training-sized. The checks here are the same comparisons as
tests/kernels/, run where the user's device is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..kernels.utils import TOLERANCE as _TOLERANCE

# Largest error allowed, relative to the largest magnitude of the reference (abl.kernels.utils).
TOLERANCE = {getattr(torch, name): tol for name, tol in _TOLERANCE.items()}
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
DTYPES = {v: k for k, v in DTYPE_NAMES.items()}


@dataclass
class Inputs:
    """One op's call at one shape: the kernel and the reference on the same arguments."""

    shape: str
    kernel: Callable[[], Any]
    reference: Callable[[], Any]
    leaves: list[torch.Tensor]  # the inputs the backward is checked for
    out_dtype: torch.dtype | None = None  # tolerance of the forward output, when not the input dtype


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _rand(shape, dtype, device, scale=1.0, grad=True):
    t = (scale * torch.randn(shape, device=device)).to(dtype)
    return t.requires_grad_(grad)


# op -> shapes: CPU (interpreter, small, with masked tails) and CUDA (training-sized)
SHAPES: dict[str, dict[str, list[tuple]]] = {
    "rmsnorm": {"cpu": [(7, 100), (16, 64)], "cuda": [(4096, 1024), (8192, 4096)]},
    "layernorm": {"cpu": [(7, 100), (16, 64)], "cuda": [(4096, 1024), (8192, 4096)]},
    "rope": {"cpu": [(1, 2, 9, 48), (2, 2, 17, 64)], "cuda": [(4, 16, 1024, 64), (2, 32, 2048, 128)]},
    "swiglu": {"cpu": [(7, 50), (16, 96)], "cuda": [(8192, 4096), (4096, 11008)]},
    "geglu": {"cpu": [(7, 50), (16, 96)], "cuda": [(8192, 4096), (4096, 11008)]},
    "cross_entropy": {"cpu": [(9, 300), (13, 1000)], "cuda": [(4096, 32000), (8192, 50304)]},
    "linear_cross_entropy": {"cpu": [(17, 32, 300), (12, 48, 1000)],
                             "cuda": [(4096, 1024, 32000), (8192, 768, 50304)]},
    "flash_attention": {"cpu": [(1, 2, 37, 32), (1, 2, 40, 64)],
                        "cuda": [(2, 16, 2048, 64), (2, 16, 2048, 128)]},
    "ssd_scan": {"cpu": [(1, 40, 2, 16, 16), (1, 37, 2, 24, 20)],
                 "cuda": [(2, 1024, 16, 64, 64), (2, 2048, 8, 64, 128)]},
}


def make_inputs(op: str, shape: tuple, dtype: torch.dtype, device: torch.device) -> Inputs:
    """The kernel and reference calls of ``op`` at ``shape`` (see SHAPES) on fresh random inputs."""
    from ..kernels import load

    kernel, ref = load(op)
    if op in ("rmsnorm", "layernorm"):
        m, n = shape
        x = _rand((m, n), dtype, device)
        w = (1 + 0.1 * torch.randn(n, device=device)).requires_grad_()
        b = (0.1 * torch.randn(n, device=device)).requires_grad_()
        eps = 1e-6 if op == "rmsnorm" else 1e-5
        return Inputs(f"M{m}-N{n}", lambda: kernel(x, w, b, eps), lambda: ref(x, w, b, eps), [x, w, b])
    if op == "rope":
        b_, h, t, d = shape
        x = _rand((b_, t, h, d), dtype, device).transpose(1, 2).detach().requires_grad_()
        inv_freq = 10000.0 ** (-torch.arange(0, d, 2, device=device).float() / d)
        ang = torch.arange(t, device=device).float()[:, None] * inv_freq
        cos, sin = ang.cos(), ang.sin()
        return Inputs(f"B{b_}-H{h}-T{t}-D{d}", lambda: kernel(x, cos, sin, "half"),
                      lambda: ref(x, cos, sin, "half"), [x])
    if op in ("swiglu", "geglu"):
        m, n = shape
        g, u = _rand((m, n), dtype, device, 2.0), _rand((m, n), dtype, device)
        return Inputs(f"M{m}-N{n}", lambda: kernel(g, u), lambda: ref(g, u), [g, u])
    if op == "cross_entropy":
        n, v = shape
        x = _rand((n, v), dtype, device, 3.0)
        y = torch.randint(0, v, (n,), device=device)
        y[1] = -100  # an ignored row
        # the loss is fp32; the bf16/fp16 logits bound it at fp16's tolerance (as tests/kernels)
        return Inputs(f"N{n}-V{v}", lambda: kernel(x, y), lambda: ref(x, y), [x],
                      out_dtype=torch.float32 if dtype == torch.float32 else torch.float16)
    if op == "linear_cross_entropy":
        n, d, v = shape
        hid, w = _rand((n, d), dtype, device), _rand((v, d), dtype, device, d ** -0.5)
        y = torch.randint(0, v, (n,), device=device)
        return Inputs(f"N{n}-D{d}-V{v}", lambda: kernel(hid, w, y), lambda: ref(hid, w, y), [hid, w])
    if op == "flash_attention":
        b_, h, t, d = shape
        q, k, v_ = (_rand((b_, h, t, d), dtype, device) for _ in range(3))
        return Inputs(f"B{b_}-H{h}-T{t}-D{d}-causal", lambda: kernel(q, k, v_, causal=True),
                      lambda: ref(q, k, v_, causal=True), [q, k, v_])
    if op == "ssd_scan":
        b_, t, h, p, n = shape
        chunk = 16 if device.type == "cpu" else 64
        x = _rand((b_, t, h, p), dtype, device)
        dt = F.softplus(torch.randn(b_, t, h, device=device) - 1).requires_grad_()
        a = (-torch.rand(h, device=device) - 0.5).requires_grad_()
        bm, cm = _rand((b_, t, 1, n), dtype, device), _rand((b_, t, 1, n), dtype, device)
        return Inputs(f"B{b_}-T{t}-H{h}-P{p}-N{n}-chunk{chunk}", lambda: kernel(x, dt, a, bm, cm, chunk)[0],
                      lambda: ref(x.float(), dt, a, bm.float(), cm.float(), chunk)[0], [x, dt, a, bm, cm])
    raise KeyError(f"no selftest inputs for kernel op {op!r}")


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref| (inf when the shapes differ or out has non-finite values ref lacks)."""
    o, r = out.detach().float(), ref.detach().float()
    if o.shape != r.shape or (not torch.isfinite(o).all() and torch.isfinite(r).all()):
        return float("inf")
    return float((o - r).abs().max()) / max(float(r.abs().max()), 1e-6)


def check_op(op: str, shape: tuple, dtype: torch.dtype, device: torch.device) -> list[dict[str, Any]]:
    """Forward and backward of one op at one shape and dtype: two result rows (pass "fwd", "bwd")."""
    torch.manual_seed(0)
    tol = TOLERANCE[dtype]
    base = {"op": op, "dtype": DTYPE_NAMES[dtype]}
    try:
        inp = make_inputs(op, shape, dtype, device)
        base["shape"] = inp.shape
        out, ref = _first(inp.kernel()), _first(inp.reference())
        fwd_tol = TOLERANCE[inp.out_dtype or dtype]
        fwd_err = relative_error(out, ref)
        rows = [{**base, "pass": "fwd", "error": fwd_err, "tolerance": fwd_tol, "ok": fwd_err <= fwd_tol,
                 "detail": f"output vs reference: {fwd_err:.3g} (max rel.), bound {fwd_tol:g}"}]
        grad = torch.randn_like(ref)
        got = torch.autograd.grad(out, inp.leaves, grad.to(out.dtype), allow_unused=True)
        want = torch.autograd.grad(ref, inp.leaves, grad, allow_unused=True)
        errs = [relative_error(g, w) for g, w in zip(got, want) if w is not None and g is not None]
        missing = sum(1 for g, w in zip(got, want) if (g is None) != (w is None))
        bwd_err = max(errs, default=float("inf")) if not missing else float("inf")
        rows.append({**base, "pass": "bwd", "error": bwd_err, "tolerance": tol, "ok": bwd_err <= tol,
                     "detail": f"worst of {len(errs)} input gradients: {bwd_err:.3g}, bound {tol:g}"
                     + (f"; {missing} gradient(s) missing" if missing else "")})
        return rows
    except Exception as exc:  # noqa: BLE001 - a kernel that raises fails its check, the others still run
        base.setdefault("shape", "x".join(str(s) for s in shape))
        return [{**base, "pass": p, "error": None, "tolerance": tol, "ok": False,
                 "detail": f"raised {type(exc).__name__}: {exc}"} for p in ("fwd", "bwd")]


def kernel_plan(device: torch.device, quick: bool) -> list[tuple[str, tuple, torch.dtype]]:
    """(op, shape, dtype) of every check: every op, its shapes for this device, the dtypes."""
    from ..kernels import OPS

    where = "cuda" if device.type == "cuda" else "cpu"
    dtypes = [torch.float32, torch.bfloat16] if quick else [torch.float32, torch.bfloat16, torch.float16]
    plan = []
    for op in OPS:
        shapes = SHAPES[op][where]
        for i, dtype in enumerate(dtypes):
            # quick: each dtype at one shape (alternating); full: every shape at every dtype
            for shape in ([shapes[i % len(shapes)]] if quick else shapes):
                plan.append((op, shape, dtype))
    return plan


def check_kernels(device: torch.device, quick: bool,
                  log: Callable[[str], None] = lambda m: None) -> tuple[list[dict[str, Any]], str | None]:
    """Every op's check rows, or ([], why) when the Triton kernels cannot run here."""
    from ..kernels.utils import HAS_TRITON, interpreting

    if not HAS_TRITON:
        return [], "triton is not installed: the kernels cannot run (the torch references still do)"
    if device.type == "cpu" and not interpreting():
        return [], ("the Triton interpreter is off (triton was imported before TRITON_INTERPRET=1 was set): "
                    "the kernels cannot run on CPU in this process")
    rows = []
    for op, shape, dtype in kernel_plan(device, quick):
        got = check_op(op, shape, dtype, device)
        for r in got:
            log(f"kernel {r['op']} {r['shape']} {r['dtype']} {r['pass']}: "
                + ("ok" if r["ok"] else f"FAILED ({r['detail']})"))
        rows += got
    return rows, None
