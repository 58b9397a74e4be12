"""cross_entropy (chunked over the vocabulary) and the fused LM-head variant vs torch."""

import pytest
import torch

from abl.kernels.cross_entropy import (cross_entropy_triton, cross_entropy_reference, linear_cross_entropy_triton,
                                           linear_cross_entropy_reference)

from .helpers import DTYPE_NAMES, assert_close

# V = 300 and 1000: several BLOCK_V chunks with a masked tail; some targets ignored.
CE_CASES = [
    ((2, 9), 300, torch.float32, "mean", 0.0, 0.0),
    ((13,), 1000, torch.bfloat16, "sum", 0.1, 1e-3),
    ((3, 4), 300, torch.float16, "none", 0.0, 1e-4),
]


def _ce_id(c):
    lead, v, dt, red, ls, z = c
    return f"N{'x'.join(map(str, lead))}-V{v}-{DTYPE_NAMES[dt]}-{red}{f'-ls{ls}' if ls else ''}{f'-z{z}' if z else ''}"


def _targets(lead, v, device):
    t = torch.randint(0, v, lead, device=device)
    t.view(-1)[1] = -100
    return t


@pytest.mark.parametrize("case", CE_CASES, ids=_ce_id)
def test_cross_entropy(case, device):
    lead, v, dt, red, ls, z = case
    torch.manual_seed(0)
    x = (3 * torch.randn(*lead, v, device=device)).to(dt).requires_grad_()
    t = _targets(lead, v, device)
    out = cross_entropy_triton(x, t, reduction=red, label_smoothing=ls, z_loss=z)
    ref = cross_entropy_reference(x, t, reduction=red, label_smoothing=ls, z_loss=z)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert_close("loss", ref, out, torch.float32 if dt == torch.float32 else torch.float16)
    dy = torch.randn_like(ref)
    gx, rx = torch.autograd.grad(out, x, dy)[0], torch.autograd.grad(ref, x, dy)[0]
    assert gx.dtype == dt
    assert_close("dlogits", rx, gx, dt)
    assert (gx.view(-1, v)[1] == 0).all()  # the ignored row


LCE_CASES = [
    (17, 32, 300, torch.float32, "mean", 5, True),
    (12, 48, 1000, torch.bfloat16, "sum", None, False),
]


@pytest.mark.parametrize("case", LCE_CASES,
                         ids=lambda c: f"N{c[0]}-D{c[1]}-V{c[2]}-{DTYPE_NAMES[c[3]]}-{c[4]}-chunk{c[5]}"
                         f"{'-bias' if c[6] else ''}")
def test_linear_cross_entropy(case, device):
    n, d, v, dt, red, chunk, has_bias = case
    torch.manual_seed(0)
    h = torch.randn(n, d, device=device).to(dt).requires_grad_()
    w = (torch.randn(v, d, device=device) / d ** 0.5).to(dt).requires_grad_()
    b = (0.1 * torch.randn(v, device=device)).to(dt).requires_grad_() if has_bias else None
    t = _targets((n,), v, device)
    out = linear_cross_entropy_triton(h, w, t, b, reduction=red, label_smoothing=0.05, z_loss=1e-4, chunk_size=chunk)
    ref = linear_cross_entropy_reference(h, w, t, b, reduction=red, label_smoothing=0.05, z_loss=1e-4)
    assert_close("loss", ref, out, dt)
    leaves = [x for x in (h, w, b) if x is not None]
    for name, g, r in zip(("dhidden", "dweight", "dbias"), torch.autograd.grad(3 * out, leaves),
                          torch.autograd.grad(3 * ref, leaves)):
        assert g.dtype == r.dtype
        assert_close(name, r, g, dt)


def test_cross_entropy_rejects_out_of_range_targets(device):
    x = torch.randn(4, 10, device=device)
    with pytest.raises(IndexError):
        cross_entropy_triton(x, torch.tensor([0, 1, 10, 2], device=device))
