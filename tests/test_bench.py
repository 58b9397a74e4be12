"""abl bench kernels: rows for the torch providers on CPU, the bench table, the JSON output."""

import json

import duckdb
import pytest
from conftest import run_abl


def test_run_bench_rows_on_cpu(tmp_path):
    torch = pytest.importorskip("torch")
    from abl.bench.kernelbench import BENCH_COLUMNS, run_bench, store_rows

    rows = run_bench(torch.device("cpu"), ops=["rmsnorm", "flash_attention"], providers=["torch", "triton"],
                     passes=["fwd", "fwd+bwd"])
    assert {(r["op"], r["pass"]) for r in rows} == {
        ("rmsnorm", "fwd"), ("rmsnorm", "fwd+bwd"), ("flash_attention", "fwd"), ("flash_attention", "fwd+bwd")}
    for r in rows:
        assert r["provider"] == "torch"  # triton is not timed on CPU
        assert 0 < r["p20"] <= r["p50"] <= r["p80"]
        assert r["device"].startswith("cpu") and json.loads(r["versions"])["torch"]
        assert "measured" in r["peak_basis"]
        if r["peak_fraction"] is None:  # a peak that does not hold, or none measured on a busy machine
            assert "faster than the measured peak" in r["notes"] or "too busy to measure" in r["notes"]
        else:
            assert 0 < r["peak_fraction"] <= 1
        if r["op"] == "flash_attention":
            assert r["tflops"] > 0 and r["gbps"] is None
        else:
            assert r["gbps"] > 0 and r["tflops"] is None
    p50 = {(r["op"], r["pass"]): r["p50"] for r in rows}
    for op in ("rmsnorm", "flash_attention"):  # a forward never takes longer than forward+backward
        assert p50[(op, "fwd")] < p50[(op, "fwd+bwd")], p50
    db = tmp_path / "b.duckdb"
    store_rows(db, rows)
    con = duckdb.connect(str(db), read_only=True)
    try:
        cols = [d[0] for d in con.execute("SELECT * FROM bench LIMIT 0").description]
        assert set(BENCH_COLUMNS) <= set(cols)
        assert con.execute("SELECT count(*) FROM bench").fetchone()[0] == len(rows)
    finally:
        con.close()


def test_bench_kernels_cli_json(tmp_path):
    db = tmp_path / "cli.duckdb"
    r = run_abl(["bench", "kernels", "--op", "swiglu", "--op", "cross_entropy", "--provider", "torch",
                 "--pass", "fwd", "--json", "--db", str(db)], timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {(x["op"], x["provider"], x["pass"]) for x in rows} == {
        ("swiglu", "torch", "fwd"), ("cross_entropy", "torch", "fwd")}
    assert all(set(x) >= {"op", "provider", "shape", "dtype", "pass", "p20", "p50", "p80", "gbps", "tflops",
                          "device", "versions"} for x in rows)
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM bench").fetchone()[0] == 2
    finally:
        con.close()


def test_gpu_peak_table_matches_the_most_specific_name():
    pytest.importorskip("torch")
    from abl.store.provenance import gpu_peak

    cases = {"NVIDIA H100 80GB HBM3": "h100", "NVIDIA H100 PCIe": "h100 pcie", "NVIDIA GH200 480GB": "gh200",
             "NVIDIA A100-SXM4-40GB": "a100", "NVIDIA A10G": "a10g", "NVIDIA L40S": "l40s", "NVIDIA L4": "l4",
             "Tesla T4": "t4", "NVIDIA H200": "h200"}
    for name, key in cases.items():
        assert gpu_peak(name).basis == f"datasheet ({key})", name
    unknown = gpu_peak("Some Future GPU")
    assert unknown.gbps is None and unknown.tflops == {}


def test_cpu_timing_is_calibrated_on_warmed_calls_not_a_cold_one():
    import time

    from abl.bench.kernelbench import time_cpu

    calls = []

    def op():  # the first call pays 50 ms of one-off work, later ones 1 ms
        calls.append(1)
        time.sleep(0.05 if len(calls) == 1 else 0.001)

    p20, p50, p80 = time_cpu(op, None)
    assert 0.9 < p50 < 5, p50  # ms: the warmed call's time, not the cold one's
    assert p20 <= p50 <= p80
    assert len(calls) >= 10


def test_a_fraction_of_peak_is_never_above_one():
    from abl.bench.kernelbench import bandwidth_peak, peak_fraction
    from abl.store.provenance import Peak

    assert peak_fraction(50.0, 100.0) == (0.5, "")
    frac, why = peak_fraction(610.0, 100.0)
    assert frac is None and "6.10x" in why
    cpu = Peak("cpu", 10.0, {}, "measured", cache_gbps=60.0)
    assert bandwidth_peak(cpu, 1 << 20, 32 << 20)[0] == 60.0  # fits in the cache
    assert bandwidth_peak(cpu, 1 << 30, 32 << 20)[0] == 10.0  # does not
    assert bandwidth_peak(Peak("h100", 3350.0, {}, "datasheet"), 1 << 20, None)[0] == 3350.0


def test_a_flops_bound_op_is_a_fraction_of_its_flops_peak(monkeypatch):
    """Found on the first GPU run: attention's TFLOP/s was divided by the peak in FLOP/s (0.0% of peak)."""
    torch = pytest.importorskip("torch")
    from abl.bench import kernelbench
    from abl.store.provenance import Peak

    # a peak far above what the CPU reaches, so the fraction is given and must be tflops / peak
    monkeypatch.setattr(kernelbench, "device_peak", lambda device: Peak("cpu", 1e4, {"fp32": 1e3}, "test"))
    rows = kernelbench.run_bench(torch.device("cpu"), ops=["flash_attention"], providers=["torch"], passes=["fwd"])
    assert rows
    for r in rows:
        assert r["tflops"] > 0
        assert r["peak_fraction"] == pytest.approx(r["tflops"] / 1e3)


def test_the_fused_lm_head_loss_is_timed_forward_and_backward_only():
    # abl's and liger's fused kernels form the gradients in their forward: a forward-only torch
    # figure beside them compared a forward+backward with a forward (docs/gpu.md's first figures)
    torch = pytest.importorskip("torch")
    from abl.bench.kernelbench import run_bench

    rows = run_bench(torch.device("cpu"), ops=["linear_cross_entropy"], providers=["torch"], passes=["fwd"],
                     size="small")
    assert [(r["op"], r["pass"]) for r in rows] == [("linear_cross_entropy", "fwd+bwd")]
    assert "timed fwd+bwd for every provider" in rows[0]["notes"]


def _naive_simple_gla(q, k, v, g, scale):
    """fla's chunk_simple_gla by its definition: S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = scale q_t^T S_t."""
    import torch

    b, t, h, kd = q.shape
    s = torch.zeros(b, h, kd, v.shape[-1], dtype=torch.float64)
    out = torch.zeros(b, t, h, v.shape[-1], dtype=torch.float64)
    for i in range(t):
        s = g[:, i].double().exp()[..., None, None] * s + k[:, i].double()[..., :, None] * v[:, i].double()[..., None, :]
        out[:, i] = scale * (q[:, i].double()[..., :, None] * s).sum(-2)
    return out, s


def test_fla_provider_maps_the_ssd_scan_onto_simple_gla():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from abl.bench.peers import fla_ssd
    from abl.kernels.ssd_scan import ssd_chunked

    torch.manual_seed(0)
    b, t, h, p, n = 2, 40, 4, 8, 6
    x, dt = torch.randn(b, t, h, p), F.softplus(torch.randn(b, t, h) - 1)
    a, bm, cm = -torch.rand(h) - 0.5, torch.randn(b, t, 1, n), torch.randn(b, t, 1, n)
    got = fla_ssd(_naive_simple_gla, x, dt, a, bm, cm).float()
    want = ssd_chunked(x, dt, a, bm, cm, 16)[0]
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_fla_is_a_peer_that_needs_cuda():
    torch = pytest.importorskip("torch")
    from abl.bench.kernelbench import PROVIDERS, available_providers

    assert "fla" in PROVIDERS and available_providers(torch.device("cpu"))["fla"] == "peer kernels need CUDA"
