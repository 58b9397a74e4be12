"""ssd_scan: the Triton forward vs the step-by-step recurrence; backward through the reference."""

import pytest
import torch
import torch.nn.functional as F

from abl.kernels.ssd_scan import ssd_scan_triton, ssd_sequential

from .helpers import DTYPE_NAMES, assert_close

# (B, T, H, P, G, N, chunk, initial state, dtype): T not a multiple of the chunk (masked
# tail), P and N not powers of two, grouped B/C (G < H).
CASES = [
    (1, 40, 2, 16, 1, 16, 16, False, torch.float32),
    (2, 37, 4, 24, 2, 20, 16, True, torch.float32),
    (1, 50, 2, 32, 1, 32, 32, False, torch.bfloat16),
]


def _id(c):
    b, t, h, p, g, n, chunk, init, dt = c
    return f"B{b}-T{t}-H{h}-P{p}-G{g}-N{n}-chunk{chunk}{'-init' if init else ''}-{DTYPE_NAMES[dt]}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_ssd_scan(case, device):
    b, t, h, p, g, n, chunk, init, dtype = case
    torch.manual_seed(0)
    x = torch.randn(b, t, h, p, device=device).to(dtype).requires_grad_()
    dt = F.softplus(torch.randn(b, t, h, device=device) - 1).requires_grad_()
    A = (-torch.rand(h, device=device) - 0.5).requires_grad_()
    Bm = torch.randn(b, t, g, n, device=device).to(dtype).requires_grad_()
    Cm = torch.randn(b, t, g, n, device=device).to(dtype).requires_grad_()
    s0 = torch.randn(b, h, p, n, device=device).requires_grad_() if init else None
    y, final = ssd_scan_triton(x, dt, A, Bm, Cm, chunk, s0)
    y_ref, final_ref = ssd_sequential(x.float(), dt, A, Bm.float(), Cm.float(), s0)
    assert y.dtype == dtype and final.shape == (b, h, p, n)
    assert_close("y", y_ref, y, dtype)
    assert_close("final_state", final_ref, final, dtype)
    dy, dfinal = torch.randn_like(y_ref), torch.randn_like(final_ref)
    leaves = [v for v in (x, dt, A, Bm, Cm, s0) if v is not None]
    got = torch.autograd.grad((y.float() * dy).sum() + (final.float() * dfinal).sum(), leaves)
    want = torch.autograd.grad((y_ref * dy).sum() + (final_ref * dfinal).sum(), leaves)
    for name, g_, r in zip(("dx", "ddt", "dA", "dB", "dC", "dinitial"), got, want):
        assert_close(name, r, g_, dtype)


def test_ssd_scan_rejects_bad_chunk(device):
    x = torch.randn(1, 8, 2, 16, device=device)
    with pytest.raises(ValueError, match="power of two"):
        ssd_scan_triton(x, torch.rand(1, 8, 2, device=device), -torch.rand(2, device=device),
                 torch.randn(1, 8, 1, 16, device=device), torch.randn(1, 8, 1, 16, device=device), 24)
