"""The GPU probe's determinism stage (abl.bench.probe, stage a) in the interpreter: the tiles are read
from the attention launcher at run time and each is forced in turn; a fake launcher module shows the
enumeration and the forcing without a GPU."""

import json

import pytest
import torch

from abl.bench import probe, probe_kernels


class FakeLauncher:
    """A module with flash_attention's launch plumbing: two backward kinds with their own tile lists."""

    def __init__(self):
        self._chosen = {}
        self.launched = []
        self.tables = {"fwd": ((64, 64, 4, 2),), "bwd_dkdv": ((64, 64, 4, 2), (32, 64, 4, 2)),
                       "bwd_dq": ((32, 64, 4, 2), (16, 16, 4, 1))}

    def _candidates(self, kind, q):
        return self.tables[kind]

    def _launch(self, kind, q, launch):
        cfg = self._candidates(kind, q)[0]
        self._chosen[(kind, 0)] = cfg
        self.launched.append((kind, cfg))
        return launch(*cfg)


def test_the_tiles_are_the_union_of_the_backward_launches_and_each_is_forced():
    fa = FakeLauncher()
    configs = probe_kernels.tile_configs(fa, ["bwd_dkdv", "bwd_dq"], None)
    assert configs == [(64, 64, 4, 2), (32, 64, 4, 2), (16, 16, 4, 1)]
    fa._chosen[("bwd_dq", 0)] = (32, 64, 4, 2)
    with probe_kernels.forced_tile(fa, (16, 16, 4, 1), ["bwd_dkdv", "bwd_dq"], None) as forced:
        assert forced == ["bwd_dq"] and not fa._chosen  # dkdv cannot take it: left at its own choice
        fa._launch("bwd_dq", None, lambda *cfg: None)
        fa._launch("bwd_dkdv", None, lambda *cfg: None)
    assert fa.launched == [("bwd_dq", (16, 16, 4, 1)), ("bwd_dkdv", (64, 64, 4, 2))]
    assert fa._candidates("bwd_dq", None) == fa.tables["bwd_dq"]  # restored, and so is the choice cache
    assert fa._chosen == {("bwd_dq", 0): (32, 64, 4, 2)}


def test_the_determinism_stage_on_the_interpreter(tmp_path, device):
    if device != "cpu":
        pytest.skip("the interpreter run; on a GPU the probe itself runs it")
    report = probe.Report(tmp_path / "a.txt", "determinism", 120)
    probe_kernels.attention_tile_repeats(report, 64, (1, 2, 40, 64), torch.device(device), 2, None)
    report.close()
    text = (tmp_path / "a.txt").read_text()
    assert "backward launches ['bwd_dkdv', 'bwd_dq']" in text and "(16, 16, 1, 1)" in text
    rows = json.loads(next(ln for ln in text.splitlines() if ln.startswith("json: "))[6:])
    assert [r["tile"] for r in rows] == ["default", "forced (16, 16, 1, 1) on dkdv+dq"]
    assert all(r["equal"] and r["ok"] for r in rows)


@pytest.mark.parametrize("stage", ["attention", "lce", "ssd", "layernorm"])
def test_the_gpu_stages_run_in_the_interpreter_at_tiny_sizes(stage, tmp_path, probe_on_cpu):
    report = probe.Report(tmp_path / "x.txt", stage, 300)
    probe.RUNNERS[stage](report, torch.device("cpu"), True)
    report.close()
    rows = report.rows
    ran = [r for r in rows if "error" not in r]
    assert ran, (tmp_path / "x.txt").read_text()
    first = {"attention": "triton", "lce": "torch", "ssd": "triton", "layernorm": "triton default"}[stage]
    assert any(r.get("provider") == first for r in ran), (tmp_path / "x.txt").read_text()
    if stage == "layernorm":  # each forced num_warps ran (the interpreter ignores it, the plumbing does not)
        assert {r["provider"] for r in ran} >= {f"triton num_warps={w}" for w in (1, 2, 4, 8, 16, 32)}
    if stage == "lce":
        assert all(r["loss_diff"] < 1e-2 for r in ran)
    if stage == "ssd":
        assert next(r for r in ran if r["provider"] == "triton")["rel_diff"] < 2e-2
        assert "per launch" in (tmp_path / "x.txt").read_text()


def test_the_kernel_table_counts_each_launch_once():
    """torch.profiler's table gives inductor's CPU-side record around a launch (``_rope_kernel_0``) its
    kernel's CUDA time; the kernel table reads device events only, so shares and calls count each launch
    once (no GPU: profiler averages stood in)."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def avg(key, dev, us, n):
        return SimpleNamespace(key=key, device_type=dev, self_device_time_total=us, count=n)

    rows = [avg("_rope_kernel_0", DeviceType.CPU, 300.0, 40),  # the record inductor opens around a launch
            avg("_rope_kernel", DeviceType.CUDA, 300.0, 40),
            avg("sm90_gemm", DeviceType.CUDA, 900.0, 60)]
    prof = SimpleNamespace(key_averages=lambda: rows)
    lines = probe.kernel_table(prof)
    assert lines[0].startswith("GPU kernels alone (2 distinct, 1.20 ms")
    rope = next(line for line in lines if line.endswith("_rope_kernel"))
    assert rope.split()[:3] == ["25.0%", "0.300", "40"]
    assert not any("_rope_kernel_0" in line for line in lines)
    assert probe.kernel_table(SimpleNamespace(key_averages=lambda: rows[:1])) == ["GPU kernels: none recorded"]
