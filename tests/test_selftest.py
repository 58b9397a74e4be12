"""``abl selftest``: the whole command on CPU (what CI runs), its checks failing when they should,
and its GPU-only branches driven on CPU with the device queries faked (as tests/test_gpu_paths.py)."""

from __future__ import annotations

import json

import duckdb
import pytest
import torch
from conftest import run_abl

from abl.bench import selftest as st
from abl.bench import selftest_kernels as sk
from abl.bench import selftest_training as tr

CUDA = torch.device("cuda", 0)


@pytest.fixture
def fake_gpu(monkeypatch):
    """A pretend CUDA device: set ``fake_gpu.name`` / ``.capability`` in the test."""

    class Fake:
        name = "NVIDIA H100 80GB HBM3"
        capability = (9, 0)

    class Props:
        total_memory = 80 * 2**30

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: Fake.name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: Fake.capability)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Props)
    return Fake


# ---------------------------------------------------------------- the command, on CPU


@pytest.mark.slow
def test_selftest_quick_json_passes_on_cpu_and_lists_every_kernel_op(tmp_path):
    from abl.kernels import OPS

    db = tmp_path / "abl.duckdb"
    r = run_abl(["selftest", "--quick", "--json", "--db", str(db)])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["passed"] and out["failed"] == 0 and out["quick"]
    # how long each section took here (the environment's probe first, then the sections in order)
    assert list(out["timings_s"]) == ["environment", "kernels", "determinism", "auto", "peaks", "bench", "training"]
    assert all(v >= 0 for v in out["timings_s"].values()) and out["timings_s"]["training"] > 0
    assert "sections took" in r.stderr
    kernels = out["sections"]["kernels"]
    for op in OPS:  # every op, forward and backward, each with its error and bound
        for pass_ in ("fwd", "bwd"):
            rows = [k for k in kernels if k["data"].get("op") == op and k["data"].get("pass") == pass_]
            assert rows, f"no {pass_} check of {op}"
            assert all(k["status"] == "pass" and k["value"] <= k["reference"] for k in rows)
    assert {k["data"]["dtype"] for k in kernels} == {"fp32", "bf16"}
    peaks = {c["name"]: c for c in out["sections"]["peaks"]}
    assert peaks["matmul fp32"]["status"] == "pass" and peaks["matmul fp8"]["status"] == "skip"
    training = out["sections"]["training"]
    cells = [c for c in training if c["name"].startswith("cell ")]
    assert {c["name"] for c in cells} >= {"cell fp32 torch eager", "cell bf16 torch eager", "cell fp32 triton eager"}
    assert all(c["value"] > 0 for c in cells)  # tokens/s
    assert any(c["name"] == "bf16 torch eager: loss vs fp32 torch eager" and c["status"] == "pass"
               for c in training)
    assert any(c["status"] == "skip" and c["name"].startswith("tf32") for c in training)
    # the store and the JSON file hold the same report
    con = duckdb.connect(str(db), read_only=True)
    n, ids = con.execute("SELECT count(*), count(DISTINCT selftest_id) FROM selftest").fetchone()
    con.close()
    assert ids == 1 and n == sum(len(v) for v in out["sections"].values())
    (saved,) = (db.parent / "selftest").glob("*.json")
    assert json.loads(saved.read_text())["selftest_id"] == out["selftest_id"]


def test_bad_device_is_a_clear_error_and_the_store_untouched(tmp_path):
    db = tmp_path / "abl.duckdb"
    r = run_abl(["selftest", "--quick", "--device", "tpu", "--db", str(db)])
    assert r.returncode == 2 and "error: --device" in r.stderr and "Traceback" not in r.stderr
    assert not db.exists()


# ---------------------------------------------------------------- checks fail when they should


def test_a_wrong_kernel_fails_its_check(monkeypatch):
    from abl import kernels

    real = kernels.load

    def broken(op):
        _, ref = real(op)
        return (lambda *a, **k: ref(*a, **k) * 1.01), ref  # 1% off: far outside fp32's bound

    monkeypatch.setattr(kernels, "load", broken)
    rows = sk.check_op("rmsnorm", (7, 100), torch.float32, torch.device("cpu"))
    fwd = next(r for r in rows if r["pass"] == "fwd")
    assert not fwd["ok"] and fwd["error"] == pytest.approx(0.01, rel=1e-3)


def test_a_kernel_that_raises_fails_both_passes_and_the_others_still_run(monkeypatch):
    from abl import kernels

    def raising(op):
        raise RuntimeError("boom")

    monkeypatch.setattr(kernels, "load", raising)
    rows = sk.check_op("swiglu", (7, 50), torch.float32, torch.device("cpu"))
    assert [r["ok"] for r in rows] == [False, False] and "boom" in rows[0]["detail"]


def test_every_op_has_shapes_for_both_devices_and_quick_covers_each_dtype():
    from abl.kernels import OPS

    assert set(sk.SHAPES) == set(OPS)
    plan = sk.kernel_plan(torch.device("cpu"), quick=True)
    assert {(op, sk.DTYPE_NAMES[dt]) for op, _, dt in plan} == {(op, d) for op in OPS for d in ("fp32", "bf16")}
    full = sk.kernel_plan(torch.device("cpu"), quick=False)
    assert len(full) == sum(len(SHAPE["cpu"]) for SHAPE in sk.SHAPES.values()) * 3


FORMATS = {"fp32": ("fp32", "fp32"), "tf32": ("tf32", "fp32"), "bf16": ("bf16", "bf16"), "fp8": ("fp8", "bf16")}


def _cell(p, k, c, loss, status="completed", ratio=1.0):
    fmt, compute = FORMATS[p]
    return {"precision": p, "format": fmt, "compute": compute, "kernels": k, "compile": c, "status": status,
            "error": None, "val_loss": loss, "memory_ratio": ratio,
            "memory_verdict": "agrees" if 0.9 <= ratio <= 1.25 else "DISAGREES",
            "measured_peak_tensor_bytes": ratio * 2**20, "predicted_peak_bytes": 2**20}


def test_training_checks_hold_losses_to_their_tolerance_and_memory_to_the_band():
    rows = [_cell("fp32", "torch", False, 3.00), _cell("bf16", "torch", False, 3.05),  # 1.7%: within 3%
            _cell("fp8", "torch", False, 3.30),  # 8% from bf16 (its compute format): outside 5%
            _cell("fp32", "triton", False, 3.00, ratio=0.7),  # the fused kernels save more: not held
            _cell("fp32", "torch", True, 3.10),  # compiled 3.3% off eager fp32: outside 0.5%
            _cell("tf32", "torch", False, 3.0, status="failed")]
    checks = {c["name"]: c for c in tr.training_checks(rows)}
    assert checks["bf16 torch eager: loss vs fp32 torch eager"]["ok"]
    assert not checks["fp8 torch eager: loss vs bf16 torch eager"]["ok"]
    assert not checks["fp32 torch compiled: loss vs fp32 torch eager"]["ok"]
    assert checks["fp32 triton eager: loss vs fp32 torch eager"]["ok"]
    assert checks["fp32 triton eager: memory predicted vs measured"]["ok"] is None
    assert checks["fp32 torch eager: memory predicted vs measured"]["ok"]
    assert not checks["tf32 torch eager: completes"]["ok"]
    assert "fp32 torch compiled: memory predicted vs measured" not in checks  # inductor's memory, not the model's


def test_precision_policies_say_themselves_what_is_real_on_a_cpu(registry):
    got = {p.name: p for p in tr.policies(torch.device("cpu"), registry)}
    assert set(got) == set(registry.names("precision"))
    assert got["fp32"].real and got["bf16"].real and got["bf16"].format == "bf16"
    assert not got["tf32"].real and "TF32" in got["tf32"].why  # the policy's own note: identical to fp32
    assert not got["fp8"].real and "emulated" in got["fp8"].why
    assert torch.get_float32_matmul_precision() == "highest"  # nothing left switched on


# ---------------------------------------------------------------- GPU-only branches, device faked


def _policies(*real):
    return [tr.Policy(n, n in real, "" if n in real else "not here", FORMATS[n][0], FORMATS[n][1])
            for n in ("fp32", "tf32", "bf16", "fp8")]


def test_training_plan_on_gpus_keeps_only_what_is_real(fake_gpu, monkeypatch):
    monkeypatch.setattr(tr, "policies", lambda device, registry: _policies("fp32", "tf32", "bf16", "fp8"))
    cells, skipped = tr.plan(CUDA, quick=False, registry=object())
    assert {c[0] for c in cells if not c[2]} == {"fp32", "tf32", "bf16", "fp8"}  # eager: every one, both ways
    assert {(c[0], c[1]) for c in cells if c[2]} == {(p, k) for p in ("fp32", "bf16") for k in ("torch", "triton")}
    cells, skipped = tr.plan(CUDA, quick=True, registry=object())
    assert {c for c in cells if c[2]} == {("bf16", "torch", True), ("bf16", "triton", True)}
    monkeypatch.setattr(tr, "policies", lambda device, registry: _policies("fp32", "bf16"))
    cells, skipped = tr.plan(CUDA, quick=False, registry=object())
    assert {c[0] for c in cells} == {"fp32", "bf16"}
    assert ("fp8 (every backend)", "not here") in skipped


def test_precision_policies_on_an_old_gpu(fake_gpu, registry):
    fake_gpu.capability = (7, 0)  # V100: no TF32, no fp8 (the policies' own device checks)
    got = {p.name: p for p in tr.policies(CUDA, registry)}
    assert not got["tf32"].real and "8.0" in got["tf32"].why
    assert not got["fp8"].real and got["fp32"].real
    assert tr.format_unreal("bf16", CUDA).startswith("needs compute capability 8.0")
    fake_gpu.capability = (9, 0)
    assert tr.format_unreal("fp8", CUDA) is None and tr.format_unreal("tf32", CUDA) is None


def test_training_grid_excludes_what_the_plan_leaves_out(registry):
    from abl.grid.gridfile import expand

    cells = [("fp32", "torch", False), ("bf16", "torch", False), ("bf16", "triton", True)]
    raw = tr.grid_raw(CUDA, True, cells)
    grid = expand(raw, registry, source="test")
    got = {(c.train.precision, c.train.kernels, c.train.compile) for c in grid.cells}
    assert got == set(cells)
    assert all(c.train.device == "cuda:0" for c in grid.cells)


def test_environment_on_a_gpu_reports_capability_precisions_and_providers(fake_gpu, monkeypatch):
    monkeypatch.setattr(st, "driver_version", lambda: "580.1")
    env, _ = st.environment(CUDA)
    assert env["capability"] == "9.0" and env["driver"] == "580.1" and env["memory_gib"] == 80.0
    assert env["precisions"]["bf16"] == "real" and env["precisions"]["tf32"] == "real"
    assert set(env["providers"]) == {"liger-kernel", "flash-attn", "fla", "mamba-ssm"}
    fake_gpu.capability = (7, 5)
    env, _ = st.environment(CUDA)
    assert env["precisions"]["tf32"] != "real" and env["precisions"]["fp32"] == "real"


def test_gpu_matmul_and_copy_figures_from_the_timer():
    cpu = torch.device("cpu")

    def one_ms(fn):  # a timer that says every call took 1 ms
        fn()
        return 1.0

    for fmt in ("fp32", "tf32", "bf16", "fp16", "fp8"):  # fp8: torch._scaled_mm on E4M3 operands
        assert st.gpu_matmul_tflops(cpu, fmt, 64, one_ms) == pytest.approx(2 * 64**3 / 1e-3 / 1e12)
    assert torch.backends.cuda.matmul.allow_tf32 is False  # put back after the tf32 figure
    assert st.gpu_copy_gbps(cpu, 4 * 2**20, one_ms) == pytest.approx(2 * 4 * 2**20 / 1e-3 / 1e9)


def test_a_gpu_peak_above_the_datasheet_fails(fake_gpu):
    measured = {"tflops": {"bf16": 700.0, "fp8": 2500.0}, "skipped": {}, "gbps": 3000.0, "cache_gbps": None}
    checks = {c.name: c for c in st.peak_checks(CUDA, measured)}
    assert checks["matmul bf16"].status == "pass" and checks["matmul bf16"].reference == 989.0
    assert checks["matmul fp8"].status == "fail"  # 2500 > 1.1 x 1979: the measurement is wrong
    assert checks["copy (DRAM/HBM)"].status == "pass" and "90%" in checks["copy (DRAM/HBM)"].detail


def test_a_failed_check_exits_1_and_is_still_stored(tmp_path, monkeypatch):
    from datetime import datetime

    from click.testing import CliRunner

    from abl.cli import cli

    checks = [st.Check("kernels", "rmsnorm fwd", "fail", 0.5, "rel. error", 2e-5, "output vs reference: 0.5"),
              st.Check("peaks", "matmul fp32", "pass", 1.0, "TFLOP/s", None, "measured")]
    report = st.Report("0123456789abcdef", datetime(2026, 1, 1), "cpu (test)", True, {"versions": {}}, checks)
    monkeypatch.setattr(st, "run_selftest", lambda device, quick, log, cache_dir=None: report)
    db = tmp_path / "abl.duckdb"
    r = CliRunner().invoke(cli, ["selftest", "--quick", "--device", "cpu", "--db", str(db)])
    assert r.exit_code == 1, r.output
    assert "1 check(s) FAILED" in r.output
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT section, name, status, reference FROM selftest ORDER BY section").fetchall()
    con.close()
    assert rows == [("kernels", "rmsnorm fwd", "fail", 2e-5), ("peaks", "matmul fp32", "pass", None)]
    saved = json.loads(next((tmp_path / "selftest").glob("*.json")).read_text())
    assert saved["passed"] is False and saved["failed"] == 1
