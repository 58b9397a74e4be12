"""abl selftest's determinism check (abl.bench.determinism) in the interpreter at small sizes: the real
kernels repeat bit for bit, a nondeterministic fake op fails, an op with atomics is left out."""

import importlib.util

import torch

from abl import kernels
from abl.bench import determinism as det
from abl.bench.selftest import determinism_checks, determinism_rows

PLAN = [("swiglu", (7, 50), torch.bfloat16), ("flash_attention", (1, 2, 37, 32), torch.bfloat16),
        ("rmsnorm", (7, 100), torch.bfloat16)]


def test_the_kernels_repeat_bit_for_bit(device):
    rows = det.check_determinism(torch.device(device), repeats=3, plan=PLAN)
    assert [r["op"] for r in rows] == ["swiglu", "flash_attention", "rmsnorm"]
    for r in rows:
        assert r["ok"] is True and r["runs_differing"] == 0 and "bitwise equal" in r["detail"], r


class _Racy(torch.autograd.Function):
    """silu(gate) * up whose backward adds a different last-bit error on every call (as a race would)."""

    calls = 0

    @staticmethod
    def forward(ctx, g, u):
        ctx.save_for_backward(g, u)
        return torch.nn.functional.silu(g) * u

    @staticmethod
    def backward(ctx, dy):
        g, u = ctx.saved_tensors
        with torch.enable_grad():
            g_, u_ = g.detach().requires_grad_(), u.detach().requires_grad_()
            dg, du = torch.autograd.grad(torch.nn.functional.silu(g_) * u_, (g_, u_), dy)
        _Racy.calls += 1
        bump = torch.zeros_like(dg)
        bump.view(-1)[_Racy.calls % bump.numel()] = 1e-2 * _Racy.calls
        return dg + bump, du


def test_a_nondeterministic_op_fails_the_check(monkeypatch, device):
    real = kernels.load

    def load(op):
        kernel, ref = real(op)
        return (_Racy.apply, ref) if op == "swiglu" else (kernel, ref)

    monkeypatch.setattr(kernels, "load", load)
    rows = det.check_determinism(torch.device(device), repeats=4, plan=PLAN[:1] + PLAN[2:])
    racy, fine = rows
    assert racy["ok"] is False and racy["runs_differing"] == 3 and racy["differing"] == ["grad 0"]
    assert racy["max_abs_diff"] > 0 and "3 of 3 repeats differ" in racy["detail"]
    assert fine["ok"] is True
    checks = determinism_rows(rows)
    assert [c.status for c in checks] == ["fail", "pass"] and checks[0].value == 3


def test_a_kernel_that_raises_fails_and_the_others_still_run(monkeypatch, device):
    def load(op):
        raise RuntimeError("boom")

    monkeypatch.setattr(kernels, "load", load)
    rows = det.check_determinism(torch.device(device), repeats=2, plan=PLAN[:1])
    assert rows[0]["ok"] is False and "boom" in rows[0]["detail"]


def test_ops_with_atomics_are_left_out(monkeypatch, tmp_path, device):
    src = tmp_path / "fake_kernel.py"
    src.write_text("def k(X):\n    tl.atomic_add(X, 1)\n")
    spec = importlib.util.spec_from_file_location("fake_kernel", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    real = kernels.module_of
    monkeypatch.setattr(kernels, "module_of", lambda op: mod if op == "swiglu" else real(op))
    assert det.uses_atomics("swiglu") and not det.uses_atomics("rmsnorm")
    rows = det.check_determinism(torch.device(device), repeats=2, plan=PLAN[:1])
    assert rows[0]["ok"] is None and "atomics" in rows[0]["detail"]
    assert determinism_rows(rows)[0].status == "skip"


def test_an_atomic_in_an_ops_second_kernel_module_counts(monkeypatch):
    """ssd_scan's backward kernels live beside its forward (abl.kernels.ssd_scan_bwd): an atomic there
    makes the op's sums order-dependent as much as one in the forward's module."""
    import inspect

    assert not det.uses_atomics("ssd_scan")
    real = inspect.getsource
    monkeypatch.setattr(det.inspect, "getsource", lambda obj: "tl.atomic_add(X, 1)"
                        if getattr(obj, "__name__", "") == "abl.kernels.ssd_scan_bwd" else real(obj))
    assert det.uses_atomics("ssd_scan") and not det.uses_atomics("rmsnorm")


def test_the_selftest_section_is_a_skip_on_a_cpu():
    (check,) = determinism_checks(torch.device("cpu"), quick=True, log=lambda m: None)
    assert check.status == "skip" and "CUDA" in check.detail


def test_the_plan_holds_the_attention_shapes_the_race_was_seen_at():
    plan = det.determinism_plan(torch.device("cuda"))
    attention = [s for op, s, d in plan if op == "flash_attention"]
    assert attention == [(2, 16, 2048, 128), (2, 16, 2048, 64)]
    assert {op for op, _, _ in plan} == set(kernels.OPS) and {d for _, _, d in plan} == {torch.bfloat16}
