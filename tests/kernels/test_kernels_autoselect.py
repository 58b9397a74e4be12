"""train.kernels = "auto"'s measurement (abl.kernels.autoselect.measure_op) in the interpreter, with a
fake timer for do_bench: the kernel is verified under both bounds before it is timed, a wrong kernel
is never timed, and abl selftest's auto section shows the choices."""

import pytest
import torch

from abl import kernels
from abl.kernels.autoselect import Measurement, Workload, decide, measure_op


def fake_timer(ms):
    calls = []

    def timer(fn, leaves):
        fn()  # the forward+backward closure runs
        calls.append(len(leaves))
        return ms[len(calls) - 1]

    timer.calls = calls
    return timer


@pytest.mark.parametrize("op, shape", [("rmsnorm", (16, 64)), ("flash_attention", (1, 2, 37, 32))])
def test_a_verified_kernel_is_timed_against_its_torch_path(op, shape, device):
    timer = fake_timer([1.0, 3.0])
    m = measure_op(op, shape, torch.bfloat16, torch.device(device), timer=timer)
    assert m.verified and "verified: fwd" in m.why and (m.triton_ms, m.torch_ms) == (1.0, 3.0)
    assert timer.calls == [3, 3]  # every differentiable input's gradient cleared between repetitions
    assert decide(m)[0] == "triton"


def test_a_wrong_kernel_is_never_timed(monkeypatch, device):
    real = kernels.load

    def load(op):
        kernel, ref = real(op)
        # 1.5% off: inside bf16's fixed bound (2.5e-2), not within 2x torch's own rounding
        return (lambda *a, **k: kernel(*a, **k) * 1.015), ref

    monkeypatch.setattr(kernels, "load", load)
    timer = fake_timer([0.1, 9.0])
    m = measure_op("rmsnorm", (16, 64), torch.bfloat16, torch.device(device), timer=timer)
    assert not m.verified and timer.calls == [] and "bound" in m.why
    assert decide(m)[0] == "torch"


def test_the_selftest_shows_the_choices(tmp_path):
    from abl.bench.selftest import AUTO_WORKLOAD, auto_checks
    from abl.kernels import KernelBackend

    seen = {}

    def choose(device, workload, cache_dir, log):
        seen.update(device=device, workload=workload, cache_dir=cache_dir)
        return KernelBackend("triton", torch_ops=frozenset({"ssd_scan"}), choices=(
            {"op": "rmsnorm", "shape": "rmsnorm 16384x1024 bfloat16", "choice": "triton", "why": "faster",
             "triton_ms": 0.1, "torch_ms": 0.5, "cached": True},
            {"op": "ssd_scan", "shape": "ssd_scan 16x1024x64x32x64x64 bfloat16", "choice": "torch",
             "why": "slower", "triton_ms": 9.0, "torch_ms": 2.0, "cached": False}))

    checks = auto_checks(torch.device("cuda", 0), tmp_path, lambda m: None, choose=choose)
    assert seen["workload"] == Workload(**AUTO_WORKLOAD) and seen["cache_dir"] == tmp_path
    assert [c.status for c in checks] == ["info", "info"]
    assert checks[0].value == pytest.approx(5.0) and "triton: faster (cached)" in checks[0].detail
    assert checks[1].value == pytest.approx(2 / 9) and checks[1].detail.startswith("torch: slower")
    (cpu,) = auto_checks(torch.device("cpu"), tmp_path, lambda m: None)
    assert "torch on a CPU" in cpu.detail
    assert Measurement(True, 1.0, 2.0).verified
