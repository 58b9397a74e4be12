"""linear_cross_entropy's GEMM plumbing, without the Triton kernels: the chunk-size rule, the
probe for fp32-output GEMMs and the fp32 accumulation of the weight gradient on every path."""

import pytest
import torch

from abl.kernels import cross_entropy as ce


@pytest.mark.parametrize("n,d,v,dtype", [
    (8192, 4096, 65536, torch.bfloat16),  # the H100 benchmark shape: one chunk
    (8192, 4096, 65536, torch.float32),
    (100_000, 768, 50257, torch.bfloat16),
    (70_000, 2048, 32000, torch.float16),
    (4096, 128, 256, torch.float32),
    (300, 1024, 50257, torch.bfloat16),  # fewer rows than the cap: one chunk of N
    (1 << 20, 16384, 256000, torch.bfloat16),  # the maximum caps it
])
def test_chunk_rows_keeps_the_logits_within_the_fp32_weight_gradient(n, d, v, dtype):
    es = dtype.itemsize
    rows = ce.chunk_rows(n, d, es)
    assert 1 <= rows <= min(n, ce.MAX_CHUNK_ROWS)
    assert rows * v * es <= v * d * 4  # the transient logits vs d(weight) in fp32
    assert rows >= min(n, ce.MIN_CHUNK_ROWS)
    cap = min(ce.MAX_CHUNK_ROWS, 4 * d // es // 64 * 64)
    assert -(-n // rows) == -(-n // cap)  # as few chunks as the bound allows


def test_chunk_rows_minimum_and_balance():
    assert ce.chunk_rows(5000, 8, 4) == ce.MIN_CHUNK_ROWS  # tiny D: the minimum wins over the bound
    assert ce.chunk_rows(0, 64, 2) == 1
    rows = ce.chunk_rows(8200, 4096, 2)  # just over one cap: two equal chunks, not 8192 + 8
    assert rows == 4160 and -(-8200 // rows) == 2


def _fp64_product_works(kind, device, dtype):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(8, 5, generator=g).to(device, dtype)
    b = (torch.randn(5, 3, generator=g) * 2 ** -10).to(device, dtype)
    want = a.double() @ b.double()
    try:
        if kind == "addmm":
            acc = torch.ones(8, 3, device=device)
            torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
            return torch.allclose(acc.double(), want + 1, rtol=0, atol=1e-6)
        out = torch.empty(8, 3, device=device)
        torch.mm(a, b, out_dtype=torch.float32, out=out)
        return torch.allclose(out.double(), want, rtol=0, atol=1e-6)
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return False


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_out_gemm_probe_agrees_with_the_gemms(device, dtype):
    dev = torch.device(device)
    got = ce.fp32_out_gemms(dev, dtype)
    assert got == (_fp64_product_works("addmm", dev, dtype), _fp64_product_works("mm", dev, dtype))
    assert ce.fp32_out_gemms(dev, dtype) is got  # probed once


def _emulated_gemms(monkeypatch):
    """CPU stand-ins for torch's out_dtype GEMMs, which check what the code hands them."""
    calls = {"mm": 0, "addmm": 0}

    def mm(a, b, out):
        assert a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16), (a.dtype, b.dtype)
        assert out.dtype == torch.float32 and out.is_contiguous()
        calls["mm"] += 1
        return torch.mm(a.float(), b.float(), out=out)

    def addmm(acc, a, b):
        assert a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16), (a.dtype, b.dtype)
        assert acc.dtype == torch.float32
        calls["addmm"] += 1
        return acc.addmm_(a.float(), b.float())

    monkeypatch.setattr(ce, "_mm_fp32", mm)
    monkeypatch.setattr(ce, "_addmm_fp32", addmm)
    return calls


# (addmm, mm) as the probe would answer; the last: whatever this device answers (CPU: neither)
PATHS = [(True, True), (True, False), (False, True), (False, False), None]


@pytest.mark.parametrize("gemms", PATHS, ids=["addmm", "addmm-only", "mm-sliced", "fp32-operands", "native"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_weight_gradient_accumulates_in_fp32_on_every_path(device, monkeypatch, gemms, dtype):
    """Five chunks of bf16 d(logits) and hidden rows: d(weight) equals the fp64 sum of the
    products of those very bf16 values to fp32 precision (bf16 rounding anywhere would show at
    ~4e-3), and the slices of the fallbacks cover V exactly."""
    calls = None
    if gemms is None:
        gemms = ce.fp32_out_gemms(torch.device(device), dtype) if dtype != torch.float32 else (False, False)
    else:
        calls = _emulated_gemms(monkeypatch)
    monkeypatch.setattr(ce, "FALLBACK_SLICE_ELEMS", 7 * 24)  # slices of 7 rows of V
    v, d, c = 50, 24, 16
    g = torch.Generator().manual_seed(0)
    chunks = [(torch.randn(c, v, generator=g).to(device, dtype), torch.randn(c, d, generator=g).to(device, dtype))
              for _ in range(5)]
    grad_w = torch.full((v, d), float("nan"), device=device)  # the first chunk must overwrite it
    for i, (dl, hc) in enumerate(chunks):
        ce._accumulate_weight_grad(grad_w, dl, hc, i == 0, gemms)
    truth = sum(dl.double().t() @ hc.double() for dl, hc in chunks)
    err = ((grad_w.double() - truth).abs().max() / truth.abs().max()).item()
    assert grad_w.dtype == torch.float32 and err < 2e-6, err
    if calls is not None and dtype != torch.float32:
        if gemms[0]:
            assert calls["addmm"] >= 4  # the later chunks accumulate in the GEMM's epilogue
        elif gemms[1]:
            assert calls["mm"] == 1 + 4 * -(-v // 7)  # the first chunk whole, the others by slices
        else:
            assert calls == {"mm": 0, "addmm": 0}
