"""ssd_scan's Triton backward (abl.kernels.ssd_scan_bwd, the op ``abl::ssd_scan_bwd``) alone: the
gradient of every input against the step-by-step recurrence in fp32, under the FlashAttention rule
(abl.kernels.utils.check_error: at most twice the error of torch's own low-precision path plus a
floor, and the dtype's fixed bound); bitwise repeatable."""

import pytest
import torch
import torch.nn.functional as F

from abl.kernels.ssd_scan import ssd_chunked, ssd_sequential
from abl.kernels.utils import check_error

from .helpers import DTYPE_NAMES

# (B, T, H, P, G, N, chunk, initial state): T not a multiple of the chunk (a masked tail) but one;
# grouped B/C with G < H (1 and 2 heads a group); P and N from 16 to 64, not all powers of two;
# chunks of 16, 32 and 64 (several 16-row blocks in the interpreter: the causal bounds skip tiles).
SHAPES = [
    (1, 45, 2, 16, 1, 16, 16, False),
    (2, 37, 4, 24, 2, 20, 16, True),
    (1, 96, 4, 32, 2, 32, 32, True),
    (1, 33, 6, 16, 3, 48, 32, False),
    (1, 70, 2, 64, 1, 64, 64, True),
]
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
CASES = [(*s, d) for s in SHAPES for d in DTYPES]
NAMES = ("dx", "ddt", "dA", "dB", "dC", "dinitial")


def _id(c):
    b, t, h, p, g, n, chunk, init, dt = c
    return f"B{b}-T{t}-H{h}-P{p}-G{g}-N{n}-chunk{chunk}{'-init' if init else ''}-{DTYPE_NAMES[dt]}"


def _inputs(case):
    """Inputs and output gradients exactly representable in the case's dtype (held in fp32), so
    the truth, torch's low-precision path and the kernel start from the very same values."""
    b, t, h, p, g, n, chunk, init, dtype = case
    torch.manual_seed(0)

    def rep(v):
        return v.to(dtype).float()

    x = rep(torch.randn(b, t, h, p))
    dt = rep(F.softplus(torch.randn(b, t, h) - 1))
    A = rep(-torch.rand(h) - 0.5)
    Bm, Cm = rep(torch.randn(b, t, g, n)), rep(torch.randn(b, t, g, n))
    s0 = rep(torch.randn(b, h, p, n)) if init else None
    dy, dfinal = rep(torch.randn(b, t, h, p)), rep(torch.randn(b, h, p, n))
    return (x, dt, A, Bm, Cm, s0), dy, dfinal


def _vjp(fn, inputs, dy, dfinal):
    leaves = [v.detach().requires_grad_() for v in inputs if v is not None]
    it = iter(leaves)
    y, final = fn(*[next(it) if v is not None else None for v in inputs])
    return torch.autograd.grad((y * dy.to(y.dtype)).sum() + (final * dfinal.to(final.dtype)).sum(), leaves)


def _kernel_grads(case, inputs, dy, dfinal):
    """The op on what the model hands it: x, B, C, dy and the initial state in the case's dtype;
    dt and A fp32 (as the Mamba-2 mixer passes them)."""
    dtype, chunk = case[-1], case[6]
    x, dt, A, Bm, Cm, s0 = inputs
    low = [x.to(dtype), dt, A, Bm.to(dtype), Cm.to(dtype), s0.to(dtype) if s0 is not None else None]
    out = torch.ops.abl.ssd_scan_bwd(dy.to(dtype), dfinal.to(dtype), *low[:5], chunk, low[5])
    assert [o.dtype for o in out[:5]] == [v.dtype for v in low[:5]]
    return [o for o, v in zip(out, low) if v is not None]


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_ssd_scan_backward_against_the_recurrence(case, device):
    """Each gradient within check_error's bounds of the fp32 recurrence's (ssd_sequential's); torch's
    low-precision path is ssd_chunked with every input in the case's dtype. Each true gradient is
    far from 0, so a dropped or zeroed gradient (of dt, say) fails."""
    dtype, chunk = case[-1], case[6]
    inputs, dy, dfinal = _inputs(case)
    got = _kernel_grads(case, inputs, dy, dfinal)
    truth = _vjp(ssd_sequential, inputs, dy, dfinal)
    torch_low = None
    if dtype != torch.float32:
        lowp = [v.to(dtype) if v is not None else None for v in inputs]
        torch_low = _vjp(lambda *a: ssd_chunked(*a[:5], chunk, initial_state=a[5]), lowp, dy, dfinal)
    names = [n for n, v in zip(NAMES, inputs) if v is not None]
    assert len(got) == len(truth) == len(names)
    for i, (name, out, want) in enumerate(zip(names, got, truth)):
        pt = torch_low[i] if torch_low is not None else None
        c = check_error(out, want, pt, dtype)
        assert c.ok, f"{name}: {c.detail()}"
        assert not check_error(torch.zeros_like(out), want, pt, dtype).ok, f"{name}: a zero gradient would pass"


def test_ssd_scan_backward_is_bitwise_repeatable(device):
    """No atomics: the same inputs give the same bits (the partial sums are added in a fixed order)."""
    case = (*SHAPES[1], torch.bfloat16)
    inputs, dy, dfinal = _inputs(case)
    first = _kernel_grads(case, inputs, dy, dfinal)
    again = _kernel_grads(case, inputs, dy, dfinal)
    for name, a, b in zip(NAMES, first, again):
        assert torch.equal(a, b), name


def test_ssd_scan_backward_matches_the_former_fp32_vjp(device):
    """In fp32 the kernels and the former backward (the vector-Jacobian product of ssd_chunked, kept
    as the probe's baseline) agree to fp32 rounding, the initial state's gradient included."""
    from abl.kernels.ssd_scan import ssd_scan_bwd_vjp

    case = (*SHAPES[2], torch.float32)
    (x, dt, A, Bm, Cm, s0), dy, dfinal = _inputs(case)
    got = torch.ops.abl.ssd_scan_bwd(dy, dfinal, x, dt, A, Bm, Cm, 32, s0)
    want = ssd_scan_bwd_vjp(dy, dfinal, x, dt, A, Bm, Cm, 32, s0)
    for name, g, w in zip(NAMES, got, want):
        c = check_error(g, w, dtype=torch.float32)
        assert c.ok, f"{name}: {c.detail()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: DTYPE_NAMES[d])
def test_ssd_scan_backward_on_strided_views_as_the_mixer_passes_them(dtype, device):
    """The Mamba-2 mixer hands the scan x, B, C and dt as views of one projection (strided along time).
    dx is a fresh tensor: written with x's strides it landed outside its storage (a crash in the
    interpreter, a corrupt heap). The op's gradients on the views equal those on contiguous copies."""
    b, t, h, p, g, n, chunk = 2, 37, 4, 8, 1, 16, 16
    torch.manual_seed(0)
    proj = torch.randn(b, t, h * p + 2 * g * n + h, device=device).to(dtype)
    u, bv, cv, dtv = proj.split([h * p, g * n, g * n, h], dim=-1)
    x, Bm, Cm = u.unflatten(-1, (h, p)), bv.unflatten(-1, (g, n)), cv.unflatten(-1, (g, n))
    dt = F.softplus(dtv.float())
    A = -torch.rand(h, device=device) - 0.5
    dy, dfinal = torch.randn(b, t, h, p, device=device).to(dtype), torch.randn(b, h, p, n, device=device).to(dtype)
    assert not x.is_contiguous() and x.stride(1) != h * p
    got = torch.ops.abl.ssd_scan_bwd(dy, dfinal, x, dt, A, Bm, Cm, chunk, None)
    want = torch.ops.abl.ssd_scan_bwd(dy, dfinal, x.contiguous(), dt, A, Bm.contiguous(), Cm.contiguous(),
                                      chunk, None)
    for name, a, w in zip(NAMES, got[:5], want[:5]):
        assert torch.equal(a, w), name


@pytest.mark.parametrize("case", [(1, 150, 4, 64, 2, 128, 64, True, torch.float32),
                                  (1, 120, 12, 64, 2, 128, 64, False, torch.bfloat16),
                                  (1, 300, 2, 64, 1, 64, 256, True, torch.float16)], ids=_id)
def test_ssd_scan_backward_at_the_cuda_tiles(case, device, monkeypatch):
    """The tiles the launchers pick on CUDA (64-row blocks of the chunk, 64-wide P and N, 32-row
    dCB tiles for fp32, a chunk of 256 in four row blocks, a group's 6 heads shared out 4 + 2 over
    two programs), run in the interpreter: the same bounds against the recurrence (the other tests
    take the interpreter's 16-wide tiles and one head a program)."""
    import abl.kernels.ssd_scan as fwd
    import abl.kernels.ssd_scan_bwd as bwd

    if device != "cpu":
        pytest.skip("on a GPU every test runs the CUDA tiles")
    monkeypatch.setattr(fwd, "_on_gpu", lambda x: True)
    monkeypatch.setattr(bwd, "_on_gpu", lambda x: True)
    test_ssd_scan_backward_against_the_recurrence(case, device)
