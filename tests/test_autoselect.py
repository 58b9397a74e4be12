"""train.kernels = "auto" (abl.kernels.autoselect): the choice per op from fake measurements, the cache
(hits skip measuring; keyed by device, versions and shape class; a corrupt file is ignored with a
warning), resolve() on a pretend CUDA device, and the workload of a model config. No GPU: the device
queries are faked and no kernel runs."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from abl import kernels
from abl.kernels import OPS, TORCH, KernelBackend, resolve
from abl.kernels import autoselect as auto
from abl.kernels.autoselect import Measurement, Workload, choose, decide

CUDA = torch.device("cuda", 0)
WORK = Workload(batch=4, context=256, d_model=512, n_heads=8, head_dim=64, vocab=4096, dtype="bfloat16")


@pytest.fixture
def gpu_name(monkeypatch):
    """A pretend CUDA device whose name the test may change."""

    class Dev:
        name = "NVIDIA H100 80GB HBM3"

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: Dev.name)
    return Dev


class FakeMeasure:
    """measure_op's stand-in: a table op -> Measurement; counts the calls."""

    def __init__(self, table: dict[str, Measurement] | None = None):
        self.table = table or {}
        self.calls: list[tuple[str, tuple]] = []

    def __call__(self, op, shape, dtype, device):
        self.calls.append((op, shape))
        return self.table.get(op, Measurement(True, 1.0, 2.0, "verified"))


# ---------------------------------------------------------------- the choice


def test_decide_takes_the_kernel_only_when_verified_and_faster():
    assert decide(Measurement(True, 1.0, 2.0))[0] == "triton"
    assert decide(Measurement(True, 2.0, 1.0))[0] == "torch"
    assert decide(Measurement(True, 1.0, 1.0))[0] == "torch"  # a tie is no reason to leave torch
    choice, why = decide(Measurement(False, 0.1, 9.0, "bwd: 0.03 vs fp32 truth, bound 0.01"))
    assert choice == "torch" and "not verified" in why and "bound 0.01" in why  # fast but wrong: never
    assert decide(Measurement(True, None, 2.0, "triton not timed: OutOfResources"))[0] == "torch"
    assert decide(Measurement(True, 1.0, None, "torch not timed: OutOfMemoryError"))[0] == "triton"


def test_choose_routes_the_losers_and_the_failures_to_torch(gpu_name, tmp_path):
    fake = FakeMeasure({"rmsnorm": Measurement(True, 0.5, 1.0), "layernorm": Measurement(True, 2.0, 1.0),
                        "flash_attention": Measurement(False, why="bwd: raised RuntimeError: race"),
                        "cross_entropy": Measurement(True, 0.3, 0.9)})
    fake.table["linear_cross_entropy"] = Measurement(True, None, 1.0, "triton not timed")
    backend = choose(CUDA, WORK, tmp_path, measure=fake)
    assert backend.triton and not backend.interpreted
    assert {"layernorm", "flash_attention", "linear_cross_entropy"} <= backend.torch_ops
    assert not {"rmsnorm", "cross_entropy"} & backend.torch_ops
    # no SSD mixer: the scan is neither measured nor trusted
    assert "ssd_scan" in backend.torch_ops and all(op != "ssd_scan" for op, _ in fake.calls)
    with backend.activate():
        assert kernels.use_triton("rmsnorm") and not kernels.use_triton("flash_attention")
    info = backend.info()
    assert info["kernel_torch_ops"] == sorted(backend.torch_ops)
    by_op = {c["op"]: c for c in info["kernel_choices"]}
    assert set(by_op) == set(OPS) and by_op["rmsnorm"]["choice"] == "triton"
    assert "not verified" in by_op["flash_attention"]["why"]
    json.dumps(info)  # what a run writes into its info.json


def test_ssd_scan_goes_to_triton_only_when_measured_faster(gpu_name, tmp_path):
    w = Workload(**{**WORK.__dict__, "ssd": (32, 32, 64, 64)})
    slow = choose(CUDA, w, tmp_path / "a", measure=FakeMeasure({"ssd_scan": Measurement(True, 15.0, 2.5)}))
    fast = choose(CUDA, w, tmp_path / "b", measure=FakeMeasure({"ssd_scan": Measurement(True, 1.0, 2.5)}))
    assert "ssd_scan" in slow.torch_ops and "ssd_scan" not in fast.torch_ops


def test_a_measurement_that_raises_sends_its_op_to_torch(gpu_name, tmp_path):
    def measure(op, shape, dtype, device):
        if op == "rope":
            raise torch.OutOfMemoryError("CUDA out of memory")
        return Measurement(True, 1.0, 2.0)

    backend = choose(CUDA, WORK, tmp_path, measure=measure)
    assert "rope" in backend.torch_ops and "rmsnorm" not in backend.torch_ops
    assert "out of memory" in next(c for c in backend.choices if c["op"] == "rope")["why"]


def test_measuring_leaves_the_runs_random_state_alone(gpu_name, tmp_path):
    def measure(op, shape, dtype, device):
        torch.manual_seed(123)
        torch.randn(10)
        return Measurement(True, 1.0, 2.0)

    torch.manual_seed(7)
    expected = torch.randn(3)
    torch.manual_seed(7)
    choose(CUDA, WORK, tmp_path, measure=measure)
    assert torch.equal(torch.randn(3), expected)


# ---------------------------------------------------------------- the cache


def test_a_cache_hit_measures_nothing(gpu_name, tmp_path):
    first = FakeMeasure({"layernorm": Measurement(True, 2.0, 1.0)})
    a = choose(CUDA, WORK, tmp_path, measure=first)
    assert len(first.calls) == len(WORK.measured_ops())
    again = FakeMeasure()  # would choose triton everywhere, were it asked
    b = choose(CUDA, WORK, tmp_path, measure=again)
    assert again.calls == [] and b.torch_ops == a.torch_ops and "layernorm" in b.torch_ops
    assert all(c.get("cached") for c in b.choices if c["op"] in WORK.measured_ops())
    data = json.loads((tmp_path / auto.CACHE_FILE).read_text())
    assert data["version"] == auto.CACHE_VERSION and len(data["entries"]) == len(WORK.measured_ops())


def test_the_cache_is_keyed_by_device_versions_and_shape_class(gpu_name, tmp_path, monkeypatch):
    choose(CUDA, WORK, tmp_path, measure=FakeMeasure())
    other_gpu = FakeMeasure()
    gpu_name.name = "NVIDIA H200"
    choose(CUDA, WORK, tmp_path, measure=other_gpu)
    assert len(other_gpu.calls) == len(WORK.measured_ops())  # another device measures again
    gpu_name.name = "NVIDIA H100 80GB HBM3"
    monkeypatch.setattr(auto, "device_key", lambda d: f"{torch.cuda.get_device_name(d)} | torch 9.9 | triton 9.9")
    other_versions = FakeMeasure()
    choose(CUDA, WORK, tmp_path, measure=other_versions)
    assert len(other_versions.calls) == len(WORK.measured_ops())  # so do other torch/triton versions
    monkeypatch.undo()
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    # another head dim: only the ops whose class holds it are measured again
    wider = FakeMeasure()
    choose(CUDA, Workload(**{**WORK.__dict__, "head_dim": 128}), tmp_path, measure=wider)
    assert sorted(op for op, _ in wider.calls) == ["flash_attention", "rope"]
    # a longer batch in the same power-of-two bucket is the same class
    same = FakeMeasure()
    choose(CUDA, Workload(**{**WORK.__dict__, "context": 200}), tmp_path, measure=same)
    assert same.calls == []
    # another dtype is another class
    fp32 = FakeMeasure()
    choose(CUDA, Workload(**{**WORK.__dict__, "dtype": "float32"}), tmp_path, measure=fp32)
    assert len(fp32.calls) == len(WORK.measured_ops())


@pytest.mark.parametrize("content", ["{not json", json.dumps([1, 2]), json.dumps({"version": 0, "entries": {}}),
                                     json.dumps({"version": auto.CACHE_VERSION, "entries": "x"})])
def test_a_corrupt_cache_is_ignored_with_a_warning(gpu_name, tmp_path, content):
    (tmp_path / auto.CACHE_FILE).write_text(content)
    fake = FakeMeasure()
    with pytest.warns(RuntimeWarning, match="ignoring the kernel choice cache"):
        backend = choose(CUDA, WORK, tmp_path, measure=fake)
    assert len(fake.calls) == len(WORK.measured_ops()) and backend.triton
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rewritten whole: the next run reads it silently
        assert auto.read_cache(tmp_path / auto.CACHE_FILE)


def test_a_bad_entry_is_measured_again(gpu_name, tmp_path):
    choose(CUDA, WORK, tmp_path, measure=FakeMeasure())
    path = tmp_path / auto.CACHE_FILE
    data = json.loads(path.read_text())
    key = next(k for k in data["entries"] if "| rmsnorm " in k)
    data["entries"][key] = {"choice": "maybe"}
    path.write_text(json.dumps(data))
    fake = FakeMeasure()
    choose(CUDA, WORK, tmp_path, measure=fake)
    assert [op for op, _ in fake.calls] == ["rmsnorm"]


# ---------------------------------------------------------------- resolve, the workload


def test_resolve_auto_measures_on_cuda_and_stays_torch_on_cpu(gpu_name, tmp_path, monkeypatch):
    fake = FakeMeasure({"swiglu": Measurement(True, 3.0, 1.0)})
    monkeypatch.setattr(auto, "measure_op", fake)
    backend = resolve("auto", CUDA, WORK, tmp_path)
    assert backend.name == "triton" and "swiglu" in backend.torch_ops and fake.calls
    assert resolve("auto", "cpu", WORK, tmp_path) == TORCH
    assert resolve("triton", CUDA, WORK, tmp_path) == KernelBackend("triton")  # triton is every op, unmeasured
    blind = resolve("auto", "cuda")  # no workload: nothing verified, every op on torch
    assert blind.triton and blind.torch_ops == frozenset(OPS)


def test_workload_of_a_model_config():
    from abl.contracts.config import ModelConfig

    mc = ModelConfig(d_model=1024, n_layers=2, n_heads=16, context=1024, vocab_size=50304)
    w = auto.workload_of(mc, 16, torch.bfloat16)
    assert (w.batch, w.context, w.d_model, w.n_heads, w.head_dim, w.vocab, w.dtype) == (
        16, 1024, 1024, 16, 64, 50304, "bfloat16")
    assert w.ssd is None and "ssd_scan" not in w.measured_ops()
    assert auto.shape_class("flash_attention", w) == (16, 16, 1024, 64)
    assert auto.shape_class("linear_cross_entropy", w) == (16384, 1024, 50304)
    hybrid = auto.workload_of(ModelConfig(d_model=256, n_heads=4, layer_pattern="mamba2,mha", vocab_size=100),
                              8, torch.float32)
    assert hybrid.ssd is not None and "ssd_scan" in hybrid.measured_ops() and hybrid.dtype == "float32"
    assert auto.shape_class("ssd_scan", hybrid)[2:] == hybrid.ssd  # (heads, head_dim, d_state, chunk)
