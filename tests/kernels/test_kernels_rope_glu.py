"""rope (both layouts) and the swiglu / geglu activations vs their references, forward and backward."""

import pytest
import torch

from abl.kernels.rope import rope_triton, rope_reference
from abl.kernels.swiglu import geglu_triton, geglu_reference, swiglu_triton, swiglu_reference

from .helpers import DTYPE_NAMES, assert_close

# (B, H, T, D, dtype, layout, per-sequence angles): T and D/2 not powers of two; q read in
# place from a [B, T, H, D] projection (non-contiguous), as the attention mixers hold it.
ROPE_CASES = [
    (2, 3, 17, 48, torch.float32, "interleaved", False),
    (1, 2, 9, 64, torch.bfloat16, "half", False),
    (2, 2, 70, 32, torch.float16, "interleaved", True),
    (1, 4, 5, 24, torch.float32, "half", True),
]


def _rope_id(c):
    b, h, t, d, dt, layout, per_seq = c
    return f"B{b}-H{h}-T{t}-D{d}-{DTYPE_NAMES[dt]}-{layout}{'-perseq' if per_seq else ''}"


@pytest.mark.parametrize("case", ROPE_CASES, ids=_rope_id)
def test_rope(case, device):
    b, h, t, d, dt, layout, per_seq = case
    torch.manual_seed(0)
    x = torch.randn(b, t, h, d, device=device).to(dt).transpose(1, 2).requires_grad_()
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, device=device).float() / d)
    pos = torch.arange(t, device=device).float()
    if per_seq:
        pos = pos + torch.arange(b, device=device)[:, None] * 3.0  # [B, T]: each sequence its own offset
    ang = pos[..., None] * inv_freq
    cos, sin = ang.cos(), ang.sin()
    out, ref = rope_triton(x, cos, sin, layout), rope_reference(x, cos, sin, layout)
    assert out.dtype == x.dtype
    assert_close("y", ref, out, dt)
    dy = torch.randn_like(ref)
    assert_close("dx", torch.autograd.grad(ref, x, dy)[0], torch.autograd.grad(out, x, dy)[0], dt)


def test_rope_matches_the_position_plugin(device):
    from abl.contracts.config import ModelConfig
    from abl.plugins.positions import RotaryPosition

    cfg = ModelConfig(d_model=64, n_layers=1, n_heads=2, context=32, vocab_size=16)
    for layout in ("interleaved", "half"):
        pos = RotaryPosition(cfg, layout=layout).to(device)
        q = torch.randn(2, 2, 11, 32, device=device)
        cos, sin = pos.angles(5, 11, q.device)
        want, _ = pos.rotate(q, q, 5, 5)
        assert_close(layout, want, rope_triton(q, cos, sin, layout), torch.float32)


# (leading shape, H, dtype, op, views of one gate/up projection)
GLU_CASES = [
    ((3, 7), 50, torch.float32, "swiglu", True),
    ((2, 5), 96, torch.bfloat16, "swiglu", False),
    ((4,), 130, torch.float16, "geglu", True),
    ((2, 3), 40, torch.float32, "geglu_tanh", False),
]


def _glu_id(c):
    lead, h, dt, op, views = c
    return f"M{'x'.join(map(str, lead))}-H{h}-{DTYPE_NAMES[dt]}-{op}{'-views' if views else ''}"


@pytest.mark.parametrize("case", GLU_CASES, ids=_glu_id)
def test_glu(case, device):
    lead, h, dt, op, views = case
    torch.manual_seed(0)
    if views:
        gu = (2 * torch.randn(*lead, 2 * h, device=device)).to(dt).requires_grad_()
        gate, up = gu.chunk(2, dim=-1)
        leaves = (gu,)
    else:
        gate = (2 * torch.randn(*lead, h, device=device)).to(dt).requires_grad_()
        up = torch.randn(*lead, h, device=device).to(dt).requires_grad_()
        leaves = (gate, up)
    fn, ref_fn = {
        "swiglu": (swiglu_triton, swiglu_reference),
        "geglu": (geglu_triton, geglu_reference),
        "geglu_tanh": (lambda g, u: geglu_triton(g, u, "tanh"), lambda g, u: geglu_reference(g, u, "tanh")),
    }[op]
    out, ref = fn(gate, up), ref_fn(gate, up)
    assert out.dtype == dt
    assert_close("y", ref, out, dt)
    dy = torch.randn_like(ref)
    for name, g, r in zip(("dgate/up", "dup"), torch.autograd.grad(out, leaves, dy),
                          torch.autograd.grad(ref, leaves, dy)):
        assert_close(name, r, g, dt)
