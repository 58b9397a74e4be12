"""flash_attention vs the materialised-scores reference: causal, GQA/MQA, window, ALiBi, tails."""

import math

import pytest
import torch

from abl.kernels.flash_attention import attention_reference, flash_attention_triton
from abl.plugins.positions import alibi_slopes

from .helpers import DTYPE_NAMES, assert_close

# (B, H, Hkv, Tq, Tk, D, dtype, causal, window, alibi). The interpreter's tiles are
# 16 x 16, so T = 33..45 means several query and key blocks with masked tails.
CASES = [
    (1, 2, 2, 40, 40, 32, torch.float32, True, None, False),     # MHA, causal
    (2, 4, 2, 37, 37, 48, torch.bfloat16, True, 9, False),       # GQA, sliding window, D not 2^k
    (1, 4, 1, 20, 45, 64, torch.float16, True, None, True),      # MQA, ALiBi, queries after a cache
    (1, 2, 1, 33, 33, 128, torch.float32, False, 7, True),       # bidirectional window + ALiBi, D=128
    (1, 2, 2, 5, 29, 32, torch.bfloat16, False, None, False),    # non-causal, Tq < Tk
    (1, 2, 1, 24, 12, 32, torch.float32, True, None, False),     # Tq > Tk: early rows see no key
    (1, 4, 2, 30, 30, 12, torch.float32, True, None, True),      # D = 12: model.head_dim set apart from d_model
    # windows wider than a tile: key blocks seen whole inside the window (the loop without masks)
    # beside masked ones at both of its ends
    (1, 2, 1, 90, 90, 32, torch.float32, True, 40, True),        # causal window, ALiBi
    (1, 2, 2, 70, 90, 32, torch.bfloat16, False, 35, False),     # bidirectional window, Tq < Tk
]


def _id(c):
    b, h, hk, tq, tk, d, dt, causal, window, alibi = c
    return (f"B{b}-H{h}-KV{hk}-Tq{tq}-Tk{tk}-D{d}-{DTYPE_NAMES[dt]}-{'causal' if causal else 'full'}"
            f"{f'-win{window}' if window else ''}{'-alibi' if alibi else ''}")


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_flash_attention(case, device):
    b, h, hk, tq, tk, d, dt, causal, window, alibi = case
    torch.manual_seed(0)
    q = torch.randn(b, tq, h, d, device=device).to(dt).transpose(1, 2).requires_grad_()  # a strided view
    k = torch.randn(b, hk, tk, d, device=device).to(dt).requires_grad_()
    v = torch.randn(b, hk, tk, d, device=device).to(dt).requires_grad_()
    slopes = torch.tensor(alibi_slopes(h), device=device) if alibi else None
    out, lse = flash_attention_triton(q, k, v, causal=causal, window=window, alibi_slopes=slopes, return_lse=True)
    ref = attention_reference(q, k, v, causal=causal, window=window, alibi_slopes=slopes)
    assert out.dtype == dt and lse.shape == (b, h, tq)
    assert_close("out", ref, out, dt)
    do = torch.randn_like(ref)
    got = torch.autograd.grad(out, (q, k, v), do)
    want = torch.autograd.grad(ref, (q, k, v), do)
    for name, g, r in zip(("dq", "dk", "dv"), got, want):
        assert g.shape == r.shape  # dk/dv have the KV heads' shape: nothing was repeated
        assert_close(name, r, g, dt)


def test_lse_is_the_row_logsumexp(device):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 19, 32, device=device) for _ in range(3))
    _, lse = flash_attention_triton(q, k, v, causal=True, return_lse=True)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(32)
    s = s.masked_fill(torch.ones(19, 19, dtype=torch.bool, device=device).triu(1), float("-inf"))
    assert_close("lse", torch.logsumexp(s, -1), lse, torch.float32)




def test_rejects_bad_shapes(device):
    q = torch.randn(1, 3, 8, 32, device=device)
    kv = torch.randn(1, 2, 8, 32, device=device)
    with pytest.raises(ValueError, match="divisible"):
        flash_attention_triton(q, kv, kv)
    with pytest.raises(ValueError, match="window"):
        flash_attention_triton(q, q, q, window=0)
