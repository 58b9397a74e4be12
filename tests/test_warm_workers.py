"""Warm workers (issue 37, item 2): one process per slot trains cell after cell, and nothing of one cell
reaches the next: a crash ends only its own cell and its worker, the state a fresh process starts from is
put back before each cell, and the losses are those of one process per cell, bit for bit.

No GPU here: CUDA's part of the reset is checked with torch.cuda's queries stood in for."""

from __future__ import annotations

import json
import os
import random

import pytest
from conftest import run_abl, tiny_grid_text

CRASH_PLUGIN = """
import os
import signal
import sys

import torch

from abl import Cost, hookimpl


class Crash(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, x):
        main = getattr(sys.modules.get("__main__"), "__spec__", None)
        if "abl.run.worker" in sys.modules or getattr(main, "name", "") == "abl.run.worker":  # not the parent
            os.kill(os.getpid(), signal.SIGSEGV)
        return self.norm(x)


def _cost(dim, **_):
    return Cost(params=2 * dim, activation_elements_per_token=dim + 2)


@hookimpl
def register_components(register):
    register('norm', 'crash', Crash, cost=_cost)
"""


def grid_text(norms: list[str]) -> str:
    return tiny_grid_text(experiment={"name": "warm"}, model={"d_model": 16, "n_heads": 2},
                          train={"steps": 3, "eval_every": 3, "threads": 1}, grid={"model.norm": norms})


def cells(runs):
    """(status.json, final metrics row with a train loss, last val loss) of every run folder, by start time."""
    out = []
    for d in runs.iterdir():
        status = json.loads((d / "status.json").read_text())
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()] \
            if (d / "metrics.jsonl").exists() else []
        train = [r["train_loss"] for r in rows if "train_loss" in r]
        val = [r["val_loss"] for r in rows if "val_loss" in r]
        out.append((d.name, status, train[-1] if train else None, val[-1] if val else None))
    return sorted(out, key=lambda c: c[1]["started"])


def run_grid(tmp_path, name, norms, warm, plugins=None):
    grid = tmp_path / f"{name}.toml"
    grid.write_text(grid_text(norms))
    runs = tmp_path / name
    args = ["--plugins-dir", str(plugins)] if plugins else []
    r = run_abl([*args, "run", str(grid), "--db", str(tmp_path / f"{name}.duckdb"), "--runs-dir", str(runs),
                 "--workers", "1", "--warm-workers", warm], env={"ABL_ZYGOTE": "0"})
    return r, cells(runs)


def test_a_grid_in_warm_workers_has_the_losses_of_one_process_per_cell_bit_for_bit(tmp_path):
    norms = ["rmsnorm", "layernorm", "scalenorm"]
    r, warm = run_grid(tmp_path, "warm", norms, "on")
    assert r.returncode == 0, r.stdout + r.stderr
    r, fresh = run_grid(tmp_path, "fresh", norms, "off")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [c[1]["origin"] for c in warm] == ["warm"] * 3
    assert len({c[1]["pid"] for c in warm}) == 1  # one worker trained all three
    assert {c[1]["origin"] for c in fresh} == {"spawned"} and len({c[1]["pid"] for c in fresh}) == 3
    by_id = {c[0]: c for c in fresh}
    for run_id, status, train, val in warm:
        assert status["status"] == "completed"
        assert train is not None and val is not None
        assert (train, val) == by_id[run_id][2:], run_id  # float equality: bit for bit


def test_a_crashing_cell_in_a_warm_worker_loses_no_other_cell_and_its_worker_is_replaced(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "crash.py").write_text(CRASH_PLUGIN)
    norms = ["rmsnorm", "crash", "layernorm", "scalenorm"]
    r, warm = run_grid(tmp_path, "warm", norms, "on", plugins)
    assert "Traceback" not in r.stderr, r.stderr
    r, fresh = run_grid(tmp_path, "fresh", norms, "off", plugins)
    crashed = [c for c in warm if c[1]["status"] != "completed"]
    assert len(crashed) == 1 and len(warm) == 4, [(c[0], c[1]["status"]) for c in warm]
    # recorded exactly as the same crash in a process of its own: the same status, the signal named
    same = {c[0]: c for c in fresh}[crashed[0][0]][1]
    assert crashed[0][1]["status"] == same["status"] == "failed"
    assert "SIGSEGV" in crashed[0][1]["error"] and crashed[0][1]["error"] == same["error"]
    # the worker that crashed took no other cell down, and the next cell got a fresh one
    assert any(a[1]["status"] == "failed" for a in warm[:-1]), "the crash must not be the last cell"
    for a, b in zip(warm, warm[1:]):
        assert (a[1]["pid"] == b[1]["pid"]) == (a[1]["status"] == "completed"), (a, b)
    completed = {c[0]: c[2:] for c in fresh if c[1]["status"] == "completed"}
    assert {c[0]: c[2:] for c in warm if c[1]["status"] == "completed"} == completed


@pytest.fixture
def restored_torch_state():
    """The test process's global torch state and environment, put back afterwards."""
    import torch

    from abl.run import warm

    base, env = warm.capture(), dict(os.environ)
    yield base
    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads(base.threads)
    warm._set_flags(base.flags)
    torch.set_rng_state(base.torch_rng)


def test_the_state_a_cell_leaves_is_put_back_before_the_next(restored_torch_state):
    import numpy as np
    import torch

    from abl.run import warm, worker
    from abl.train.measure import cpu_peak_rss_bytes

    base = restored_torch_state
    first = torch.rand(3)  # what a cell's first draw would be
    torch.set_rng_state(base.torch_rng)
    # what a cell could leave behind
    torch.backends.cuda.matmul.allow_tf32 = not base.flags["tf32_matmul"]
    torch.backends.cudnn.benchmark = not base.flags["cudnn_benchmark"]
    torch.use_deterministic_algorithms(not base.flags["deterministic"])
    torch.set_default_dtype(torch.float64)
    torch.set_float32_matmul_precision("medium" if base.flags["matmul_precision"] != "medium" else "high")
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    worker._signalled = "SIGTERM"
    big = np.ones(300 * 2**20 // 8)
    big += 1
    before = cpu_peak_rss_bytes()
    del big
    env = {"PATH": os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1", "ABL_X": "cell"}
    warm.reset_state(env, base)
    assert warm._flags() == base.flags
    assert torch.get_default_dtype() == torch.float32
    assert torch.get_num_threads() == 1  # the cell's OMP_NUM_THREADS, applied
    assert torch.equal(torch.rand(3), first)  # the RNG as at start-up, not the last cell's
    assert random.getstate() == base.py_rng
    assert np.random.get_state()[1].tolist() == base.np_rng[1].tolist()
    assert worker.signalled() is None
    assert os.environ["ABL_X"] == "cell" and os.environ["ABL_WORKER_ORIGIN"] == "warm"
    assert cpu_peak_rss_bytes() < before - 200 * 2**20  # the peak is the next cell's own
    warm.reset_state({"PATH": env["PATH"]}, base)
    assert torch.get_num_threads() == base.threads and "ABL_X" not in os.environ


def test_cuda_peak_memory_is_reset_and_the_generators_reseeded_per_cell(monkeypatch):
    import torch

    from abl.run import warm

    calls = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda i: calls.append(("peak", i)))
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda s: calls.append(("seed", s)))
    warm.reset_cuda(42)
    assert calls == ["sync", "empty", ("peak", 0), ("peak", 1), ("seed", 42)]
    calls.clear()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # a CPU worker: nothing to reset
    warm.reset_cuda(42)
    assert calls == []


@pytest.mark.parametrize("mode,gpus,expected", [("auto", [0], True), ("auto", [], False), ("on", [], True),
                                                ("off", [0], False)])
def test_warm_workers_by_default_on_cuda_and_the_zygote_on_a_cpu(monkeypatch, mode, gpus, expected):
    from abl.run import executors

    monkeypatch.setenv("ABL_WARM_WORKERS", mode)
    monkeypatch.delenv("ABL_ZYGOTE", raising=False)
    ex = executors.LocalExecutor(workers=1, gpus=gpus)
    assert ex.use_warm is expected
    monkeypatch.setenv("ABL_ZYGOTE", "0")  # a fresh process per cell asked for: auto is off, on is on
    assert executors.LocalExecutor(workers=1, gpus=gpus).use_warm is (mode == "on")
    ex.use_zygote = ex.use_zygote and not gpus  # no zygote process for a stood-in GPU
    ex.prestart()
    try:
        assert (ex.zygote is None) == (expected or bool(gpus))  # a warm executor starts no zygote
    finally:
        ex.close()


def test_a_warm_worker_serves_only_cells_of_its_device_set(monkeypatch, tmp_path):
    from abl.run import warm

    started = []

    class Fake:
        def __init__(self, env, log):
            self.key, self.current, self.proc = env.get("CUDA_VISIBLE_DEVICES", ""), None, self
            self.closed = False
            started.append(self)

        def poll(self):
            return 0 if self.closed else None

        @property
        def idle(self):
            return not self.closed

        def submit(self, run_dir, env):
            return self

        def close(self):
            self.closed = True

    monkeypatch.setattr(warm, "WarmWorker", Fake)
    pool = warm.WarmPool(slots=2)
    a = pool.start(tmp_path, {"CUDA_VISIBLE_DEVICES": "0"})
    assert pool.start(tmp_path, {"CUDA_VISIBLE_DEVICES": "0"}) is a  # idle, same device: reused
    b = pool.start(tmp_path, {"CUDA_VISIBLE_DEVICES": "1"})
    assert b is not a and len(started) == 2
    c = pool.start(tmp_path, {"CUDA_VISIBLE_DEVICES": "2"})  # a third device set: an idle worker makes room
    assert len(started) == 3 and len(pool.workers) == 2 and a.closed and c.key == "2"


@pytest.mark.slow
def test_a_hung_cell_in_a_warm_worker_is_stopped_at_its_time_limit_and_the_next_cell_gets_a_fresh_worker(tmp_path):
    from test_cell_timeout import HANG_PLUGIN

    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "hang.py").write_text(HANG_PLUGIN)
    grid = tmp_path / "g.toml"
    grid.write_text(tiny_grid_text(experiment={"name": "warm"}, model={"d_model": 16, "n_heads": 2},
                                   train={"steps": 3, "eval_every": 3, "threads": 1, "timeout_s": 40},
                                   grid={"model.norm": ["rmsnorm", "hang_in_worker", "layernorm"]}))
    runs = tmp_path / "runs"
    r = run_abl(["--plugins-dir", str(plugins), "run", str(grid), "--db", str(tmp_path / "x.duckdb"),
                 "--runs-dir", str(runs), "--workers", "1", "--warm-workers", "on"], timeout=400)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    got = cells(runs)
    assert [c[1]["status"] for c in got] == ["completed", "failed", "completed"], got
    assert "timed out" in got[1][1]["error"] and "train.timeout_s = 40 s" in got[1][1]["error"]
    assert got[0][1]["pid"] == got[1][1]["pid"] != got[2][1]["pid"]  # stopped with its worker; a fresh one next
