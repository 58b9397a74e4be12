"""The CUDA-only branches, run on CPU with the device queries monkeypatched.

No GPU exists in CI, so every branch that only a GPU would take is driven here
with ``torch.cuda.*`` faked: the device-peak lookup and MFU's use of it, the
precision policies' device checks (TF32 on sm_80+, real fp8 on sm_90+), and
the local executor's one-GPU-per-cell placement. A wrong-arity or wrong-type
call in such a branch fails one of these tests (and the type checker,
tests/test_typecheck.py).
"""

from __future__ import annotations

import subprocess

import pytest
import torch
import torch.nn as nn

from abl.store import provenance

CUDA = torch.device("cuda", 0)
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def fake_gpu(monkeypatch):
    """A pretend CUDA device: set ``fake_gpu.name`` / ``.capability`` in the test."""

    class Fake:
        name = H100
        capability = (9, 0)
        count = 1

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: Fake.count)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: Fake.name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: Fake.capability)
    return Fake


# ---------------------------------------------------------------- device peak


def test_peak_flops_on_a_gpu_is_the_datasheet_number_for_the_format(fake_gpu):
    assert provenance.peak_flops(CUDA, "bf16") == pytest.approx(989e12)
    assert provenance.peak_flops(CUDA, "fp8") == pytest.approx(1979e12)
    assert provenance.peak_flops(CUDA, "tf32") == pytest.approx(494e12)
    assert provenance.peak_flops(CUDA, "fp32") == pytest.approx(67e12)
    assert provenance.peak_basis(CUDA) == "datasheet (h100)"
    fake_gpu.name = "NVIDIA H100 PCIe"
    assert provenance.peak_flops(CUDA, "bf16") == pytest.approx(756e12)


def test_peak_flops_is_none_for_an_unknown_gpu_or_a_format_it_lacks(fake_gpu):
    fake_gpu.name = "NVIDIA A100-SXM4-80GB"
    assert provenance.peak_flops(CUDA, "fp8") is None  # Ampere has no fp8 tensor cores
    fake_gpu.name = "Some Future Accelerator"
    assert provenance.peak_flops(CUDA, "bf16") is None
    assert provenance.peak_basis(CUDA).startswith("unknown GPU")


def test_peak_flops_refuses_a_format_it_does_not_know():
    with pytest.raises(ValueError, match="unknown number format"):
        provenance.peak_flops(torch.device("cpu"), "bf17")


def test_peak_flops_returns_a_number_not_a_record(fake_gpu, monkeypatch):
    # the crash that reached a GPU cell: a Peak record (or a tuple) where a float belongs
    value = provenance.peak_flops(CUDA, "bf16")
    assert isinstance(value, float)
    monkeypatch.setattr(provenance, "cpu_peak_flops", lambda fmt="fp32": 1.5e11)
    assert provenance.peak_flops(torch.device("cpu"), "fp32") == 1.5e11


def test_device_peak_on_a_gpu_reports_bandwidth_and_every_known_format(fake_gpu):
    peak = provenance.device_peak(CUDA)
    assert peak.device == H100 and peak.gbps == 3350.0
    assert set(peak.tflops) == set(provenance.FORMATS)


# ---------------------------------------------------------------- precision policies


def test_tf32_turns_on_on_ampere_and_reports_the_tf32_peak_format(fake_gpu):
    from abl.plugins.precision import TF32

    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        fake_gpu.capability = (8, 0)
        policy = TF32()
        policy.setup(nn.Linear(2, 2), CUDA)
        assert policy.active and policy.peak_format() == "tf32"
        assert policy.info()["effective_precision"] == "tf32"
        fake_gpu.capability = (7, 5)
        old = TF32()
        old.setup(nn.Linear(2, 2), CUDA)
        assert not old.active and old.peak_format() == "fp32"
        assert H100 in old.note
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]


def test_fp8_is_real_only_on_sm90_and_then_looks_up_the_fp8_peak(fake_gpu, monkeypatch):
    from abl.plugins import precision as prec

    fake_gpu.capability = (8, 9)
    ok, why = prec.real_fp8_available(CUDA)
    assert not ok and "sm_89" in why
    fake_gpu.capability = (9, 0)
    assert prec.real_fp8_available(CUDA) == (True, "")
    # the on-device probe runs a real GEMM; here it is taken as passed
    monkeypatch.setattr(prec, "_probe_real", lambda device, per_channel: (True, ""))
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    policy = prec.FP8()
    policy.setup(model, CUDA)
    assert policy.emulated is False and policy.n_layers == 2
    assert all(isinstance(m, prec.FP8Linear) and m.real for m in model)
    assert policy.peak_format() == "fp8"
    assert provenance.peak_flops(CUDA, policy.peak_format()) == pytest.approx(1979e12)


def test_fp8_on_cpu_is_emulated_and_not_measured_against_an_fp8_peak():
    from abl.plugins.precision import FP8

    policy = FP8()
    policy.setup(nn.Sequential(nn.Linear(8, 8)), torch.device("cpu"))
    assert policy.emulated and policy.peak_format() == "fp32"
    assert policy.info()["emulated"] is True


# ---------------------------------------------------------------- executors


class _FakePopen:
    launched: list[dict] = []

    def __init__(self, argv, env=None, **kw):
        type(self).launched.append(env or {})
        self.pid = 0

    def poll(self):
        return 0


def _jobs(tmp_path, n, devices=1):
    from types import SimpleNamespace

    from abl.run.executors import Job

    jobs = []
    for i in range(n):
        d = tmp_path / f"run{i}"
        d.mkdir()
        cell = SimpleNamespace(train=SimpleNamespace(devices=devices), run_id=f"run{i}")
        jobs.append(Job(cell=cell, run_dir=d, index=i))  # type: ignore[arg-type]
    return jobs


def test_local_executor_places_one_cell_per_visible_gpu(tmp_path, monkeypatch, fake_gpu):
    from abl.run import executors

    fake_gpu.count = 2
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("ABL_ZYGOTE", "0")  # each worker its own (faked) process, to see its environment
    monkeypatch.setattr(subprocess, "Popen", _FakePopen)
    _FakePopen.launched = []
    ex = executors.LocalExecutor()
    assert ex.use_gpus and ex.slots == 2
    a, b, c = _jobs(tmp_path, 3)
    for job in (a, b):
        assert ex.can_launch(job)
        ex.launch(job)
        ex.running.append(job)
    assert not ex.can_launch(c)  # both GPUs are taken
    assert [e["CUDA_VISIBLE_DEVICES"] for e in _FakePopen.launched] == ["0", "1"]
    ex.running.remove(a)
    ex.release(a)
    assert ex.can_launch(c)
    ex.launch(c)
    assert _FakePopen.launched[-1]["CUDA_VISIBLE_DEVICES"] == "0"


def test_local_executor_gives_a_multi_gpu_cell_that_many_devices(tmp_path, monkeypatch):
    from abl.run import executors

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setattr(subprocess, "Popen", _FakePopen)
    _FakePopen.launched = []
    ex = executors.LocalExecutor()
    (job,) = _jobs(tmp_path, 1, devices=3)
    assert ex.can_launch(job)
    ex.launch(job)
    assert _FakePopen.launched[-1]["CUDA_VISIBLE_DEVICES"] == "0,1,2"
    assert ex.free_gpus == [3]


# ---------------------------------------------------------------- MFU


def test_mfu_on_a_gpu_divides_by_the_policy_formats_datasheet_peak(fake_gpu, monkeypatch):
    from abl.plugins import precision as prec
    from abl.train.measure import mfu, mfu_peak

    bf16 = prec.BF16()
    bf16.setup(nn.Linear(2, 2), CUDA)
    peak = mfu_peak(CUDA, bf16, world=2)
    assert peak == pytest.approx(2 * 989e12)  # two processes, two GPUs' worth of peak
    costs = {"useful_flops_per_step": 1e12, "device_peak_flops": peak}
    assert mfu(costs, [0.02, 0.01, 0.5]) == pytest.approx(1e12 / 0.02 / peak)  # the median step
    monkeypatch.setattr(prec, "_probe_real", lambda device, per_channel: (True, ""))
    fp8 = prec.FP8()
    fp8.setup(nn.Sequential(nn.Linear(4, 4)), CUDA)
    assert mfu_peak(CUDA, fp8, world=1) == pytest.approx(1979e12)
    fake_gpu.name = "Unknown Accelerator 9000"
    assert mfu_peak(CUDA, bf16, world=1) is None
    assert mfu({"useful_flops_per_step": 1e12}, [0.01]) is None  # no peak: no MFU, never a guess
