"""``abl bench seeds`` (issue 37, item 4): the seeds of one cell trained as one stacked model (torch.func
vmap), apart, and one process each. Only the numbers' agreement and the refusals are asserted here; the
timings are the benchmark's figures, never a test's."""

from __future__ import annotations

import json

import pytest
from conftest import run_abl

from abl.bench import seeds as bench_seeds

TINY = ["model.d_model=16", "model.n_layers=2", "model.n_heads=2", "model.context=16", "train.batch_size=4",
        "train.kernels=torch", "train.threads=1", "dataset.pystdlib.max_bytes=200000"]


def test_stacked_seeds_train_as_the_seeds_apart_each_clipped_by_its_own_norm():
    # a clip small enough to act on every step: one norm over all seeds (or none) would move the losses apart
    out = bench_seeds.run_seeds_bench(seeds=3, steps=3, warmup=1, check=4, concurrent=False,
                                      overrides=[*TINY, "train.grad_clip=0.05", "train.lr=0.05"])
    assert out["stacked_error"] is None, out
    assert out["stacked_step_s"] > 0 and out["apart_step_s"] > 0
    assert out["loss_check"]["steps"] == 4 and out["loss_check"]["max_abs_diff"] < 1e-4, out
    assert out["concurrent_error"] == "not run" and out["kernels"] == "torch"
    # the ops vmap loops over are named: torch 2.13's CPU flash attention has no batching rule
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in out["unbatched_ops"]


def test_the_stacked_step_clips_per_seed(monkeypatch):
    """The per-seed clip is what makes the losses agree: one norm over all seeds moves them apart."""
    import torch

    cells = bench_seeds.seed_cells(2, [*TINY, "train.grad_clip=0.05", "train.lr=0.05"])
    apart = bench_seeds._prepared(cells)
    want = [bench_seeds._apart_step(apart) for _ in range(3)]
    stacked = bench_seeds.Stacked(bench_seeds._prepared(cells))
    got = [stacked.step() for _ in range(3)]
    assert max(abs(a - b) for w, g in zip(want, got) for a, b in zip(w, g)) < 1e-4

    def one_norm(self, grads, k):  # clip_grad_norm_ over the stacked tensors: every seed's gradient in one norm
        norm = torch.stack([g.detach().float().pow(2).sum() for g in grads.values()]).sum().sqrt()
        return (self.clip / (norm + 1e-6)).clamp(max=1.0).expand(k)

    monkeypatch.setattr(bench_seeds.Stacked, "clip_scales", one_norm)
    shared = bench_seeds.Stacked(bench_seeds._prepared(cells))
    other = [shared.step() for _ in range(3)]
    assert max(abs(a - b) for w, g in zip(want, other) for a, b in zip(w, g)) > 1e-3


def test_a_policy_that_scales_its_loss_is_not_stacked_and_says_so():
    out = bench_seeds.run_seeds_bench(seeds=2, steps=1, warmup=0, concurrent=False,
                                      overrides=[*TINY, "train.precision=fp16"])
    assert out["stacked_step_s"] is None and "'fp16' scales the loss or steps its own way" in out["stacked_error"]
    assert out["apart_step_s"] > 0


def test_a_cuda_step_is_timed_between_two_synchronizations_and_a_cpu_step_never_touches_cuda(monkeypatch):
    """_sync's CUDA branch, which no CPU run reaches: on a CUDA device every step (warm-up too) is timed between
    two torch.cuda.synchronize calls on that device, so its queued kernels count; on CPU none is made."""
    import torch

    calls: list = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("sync", device)))

    def step():
        calls.append("step")
        return [1.0]

    cuda = torch.device("cuda", 0)  # a device object only: nothing initialises CUDA
    median, losses = bench_seeds._timed(step, cuda, 1, 2)
    assert calls == [("sync", cuda), "step", ("sync", cuda)] * 3 and losses == [[1.0]] * 3 and median >= 0
    calls.clear()
    bench_seeds._timed(step, torch.device("cpu"), 1, 2)
    bench_seeds._sync(torch.device("cpu"))
    assert calls == ["step"] * 3


@pytest.mark.slow
def test_abl_bench_seeds_runs_all_three_ways_and_refuses_bad_input():
    args = [f"--set={o}" for o in TINY]
    r = run_abl(["bench", "seeds", "--seeds", "2", "--steps", "2", "--warmup", "1", "--json", *args])
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["concurrent_error"] is None and out["concurrent_step_s"] > 0
    assert out["stacked_step_s"] > 0 and out["speedup_vs_concurrent"] > 0
    r = run_abl(["bench", "seeds", "--set", "model.nope=1"])
    assert r.returncode == 2 and "unknown key" in r.stderr and "Traceback" not in r.stderr
    r = run_abl(["bench", "seeds", "--set", "grid.model.norm=[\"rmsnorm\", \"layernorm\"]"])
    assert r.returncode == 2 and "the seeds of one cell" in r.stderr
