"""RoPE on the q/k views the attention mixers pass (read in place, not copied), tiled over heads.

The 126M cell (scripts/gpu_big.toml) rotates q, a transposed view of its [B, T, H, D] projection,
and k, a permuted view of its [B, T, 2, H, D] key/value projection, in the default interleaved
layout, with one [T, D/2] angle table. The kernel tiles (a sequence, a block of positions, a
block of heads); these cases cover views, head and position counts that do not fill a tile, head
dims that are no power of two, per-sequence angles, and the compiled graph around the op.
"""

import re

import pytest
import torch

from abl.kernels.rope import rope_reference, rope_tiles, rope_triton

from .helpers import DTYPE_NAMES, assert_close


def _angles(b, t, d, per_seq, device):
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, device=device).float() / d)
    pos = torch.arange(t, device=device).float()
    if per_seq:
        pos = pos + torch.arange(b, device=device)[:, None] * 5.0
    ang = pos[..., None] * inv_freq
    return ang.cos(), ang.sin()


def _views(kind, b, t, h, d, dt, device):
    """(q, k) as the mixers hold them, and the leaf their gradients reach."""
    if kind == "mha":  # q from [B, T, H, D], k from [B, T, 2, H, D] (plugins/attention.py)
        qp = torch.randn(b, t, h, d, device=device).to(dt).requires_grad_()
        kvp = torch.randn(b, t, 2, h, d, device=device).to(dt).requires_grad_()
        return qp.transpose(1, 2), kvp.permute(2, 0, 3, 1, 4)[0], (qp, kvp)
    qkv = torch.randn(b, t, 3, h, d, device=device).to(dt).requires_grad_()  # one fused projection
    q, k, _ = qkv.permute(2, 0, 3, 1, 4)
    return q, k, (qkv,)


# (view kind, B, T, H, D, dtype, layout, per-sequence angles)
CASES = [
    ("mha", 2, 7, 3, 16, torch.bfloat16, "interleaved", False),
    ("qkv", 1, 9, 5, 24, torch.float32, "interleaved", True),
    ("mha", 2, 6, 2, 20, torch.float16, "half", False),
    ("qkv", 2, 5, 3, 32, torch.bfloat16, "half", True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-B{c[1]}-T{c[2]}-H{c[3]}-D{c[4]}-"
                                                      f"{DTYPE_NAMES[c[5]]}-{c[6]}{'-perseq' if c[7] else ''}")
def test_rope_on_the_mixers_views(case, device, monkeypatch):
    kind, b, t, h, d, dt, layout, per_seq = case
    import abl.kernels.rope as rope_mod

    monkeypatch.setattr(rope_mod, "_TILE_ELEMENTS", 2 * d * 2)  # tiles of 2 heads x 1 position, or 1 x 2
    torch.manual_seed(0)
    q, k, leaves = _views(kind, b, t, h, d, dt, device)
    assert q.stride(-1) == 1 and not q.is_contiguous()
    cos, sin = _angles(b, t, d, per_seq, device)
    outs = [rope_triton(x, cos, sin, layout) for x in (q, k)]
    refs = [rope_reference(x, cos, sin, layout) for x in (q, k)]
    dys = [torch.randn_like(r) for r in refs]
    for name, o, r in zip("qk", outs, refs):
        assert o.dtype == dt and o.shape == r.shape
        assert_close(name, r, o, dt)
    got = torch.autograd.grad(outs, leaves, dys)
    want = torch.autograd.grad(refs, leaves, dys)
    for g, w in zip(got, want):
        assert_close("d" + kind, w, g, dt)


def test_the_cells_tile_covers_all_its_heads():
    # scripts/gpu_big.toml: 16 heads of 64: one program rotates 4 positions of all 16 heads (8 KiB of
    # bf16), loading the angles once for the 16
    assert rope_tiles(16, 1024, 64) == (16, 4, 32)
    for h, t, d in ((32, 2048, 128), (3, 5, 24), (64, 7, 256), (1, 1, 2)):
        bh, bt, bk = rope_tiles(h, t, d)
        assert 2 * bk >= d and bh * bt * 2 * bk <= max(4096, 2 * bk) and bh <= max(h, 1) * 2 and bt <= max(t, 1) * 2


def test_compiled_graph_passes_the_views_to_the_op_without_a_copy(device):
    """torch.compile (inductor) hands abl::rope the projection's buffer as a strided view: no
    clone or contiguous copy of q/k is made in front of the op."""
    from torch._inductor.utils import run_and_get_code

    b, t, h, d = 1, 4, 2, 8
    torch.manual_seed(0)
    w = torch.randn(16, 3 * h * d, device=device, requires_grad=True)
    x = torch.randn(b, t, 16, device=device)
    cos, sin = _angles(b, t, d, False, device)

    def f(x, w):
        q, k, v = (x @ w).view(b, t, 3, h, d).permute(2, 0, 3, 1, 4)
        q, k = rope_triton(q, cos, sin), rope_triton(k, cos, sin)
        return ((q * k).sum(-1, keepdim=True) * v).sum()

    torch._dynamo.reset()
    try:
        out, codes = run_and_get_code(torch.compile(f), x, w)
    finally:
        torch._dynamo.reset()
    assert torch.allclose(out, f(x, w), rtol=1e-5, atol=1e-5)
    forward = codes[0]
    # the op itself (the interpreter keeps it one node), or its kernel's launch (on a GPU inductor
    # launches the kernel the op decomposes into)
    calls = re.findall(r"= torch\.ops\.abl\.rope\.default\((.*)|_rope_qk_kernel\w*\.run\((.*)", forward)
    calls = [a or b for a, b in calls]
    assert len(calls) == 2, forward
    # each call takes the mm's output buffer reinterpreted as the strided q or k view, in place
    assert all(line.startswith("reinterpret_tensor(buf") for line in calls), calls
    assert "clone" not in forward.split("def call", 1)[1].split("return", 1)[0], forward
