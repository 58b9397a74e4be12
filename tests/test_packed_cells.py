"""Several cells per GPU, speed measured alone, and the whole-grid figure (issue 37, items 1, 3 and 6).

There is no GPU here: the device queries (free memory, NVML) are stood in for, and the workers are
fake processes where a test only looks at placement. The speed pass and the grid figure run for real on
the CPU at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from abl.grid.gridfile import expand
from abl.run import admission, busy, executors, speedpass
from abl.run.admission import GPU_RESERVE_BYTES, Placement
from abl.run.executors import Job, LocalExecutor

GiB = 1024**3

SMALL = {"experiment": {"name": "packed", "seeds": [0]},
         "model": {"d_model": 32, "n_layers": 1, "n_heads": 4, "context": 16},
         "train": {"steps": 2, "batch_size": 2, "eval_every": 2, "eval_batches": 1, "threads": 1},
         "eval": {"decode": False, "extrapolation": False},
         "dataset": {"pystdlib": {"max_bytes": 300000}},
         "grid": {"model.norm": ["rmsnorm", "layernorm", "scalenorm"]}}


# ---------------------------------------------------------------- placement by predicted memory


def test_two_small_cells_share_a_gpu_and_a_large_one_does_not():
    free = {0: 10 * GiB}
    p = Placement([0], cap=4, free=free, needs={"a": 2 * GiB, "b": 2 * GiB, "big": 7.5 * GiB})
    assert p.choose("a") == [0]
    p.take("a", [0])
    assert p.choose("b") == [0]  # 2 + 2 + 1 reserve <= 10
    p.take("b", [0])
    assert p.choose("big") is None  # 2 + 2 + 7.5 + 1 > 10: it waits for the GPU
    p.release("a")
    p.release("b")
    assert p.choose("big") == [0]  # alone it goes
    p.take("big", [0])
    assert p.choose("a") is None  # 7.5 + 2 + 1 > 10


def test_the_reserve_is_kept_free():
    need = 4 * GiB
    p = Placement([0], cap=8, free={0: 2 * need + GPU_RESERVE_BYTES - 1}, needs={"a": need, "b": need})
    p.take("a", [0])
    assert p.choose("b") is None
    p = Placement([0], cap=8, free={0: 2 * need + GPU_RESERVE_BYTES}, needs={"a": need, "b": need})
    p.take("a", [0])
    assert p.choose("b") == [0]


def test_placement_never_exceeds_the_cap_and_spreads_over_gpus():
    needs = {f"c{i}": 1 * GiB for i in range(20)}
    p = Placement([0, 1], cap=3, free={0: 80 * GiB, 1: 80 * GiB}, needs=needs)
    placed = []
    for rid in needs:
        gpus = p.choose(rid)
        if gpus is None:
            continue
        p.take(rid, gpus)
        placed.append((rid, gpus[0]))
        assert all(len(cells) <= 3 for cells in p.on.values())
    assert len(placed) == 6  # 3 per GPU, never more
    assert [g for _, g in placed[:2]] == [0, 1]  # the emptiest GPU first


def test_a_cell_with_no_prediction_has_its_gpu_to_itself():
    p = Placement([0], cap=4, free={0: 80 * GiB}, needs={"a": 1 * GiB})
    p.take("unknown", [0])
    assert p.choose("a") is None
    p = Placement([0], cap=4, free={0: 80 * GiB}, needs={"a": 1 * GiB})
    p.take("a", [0])
    assert p.choose("unknown") is None


def test_the_default_cap_comes_from_the_cell_sizes():
    def need(per_process):
        n = admission.Need(cell=SimpleNamespace(run_id="x"), predicted=0.0, processes=1, device="cuda")
        n.predicted = (per_process - admission.PROCESS_BYTES["cuda"]) / n.band
        return n

    assert admission.default_cells_per_gpu([need(2 * GiB)], {0: 9 * GiB}) == 4  # (9 - 1) // 2
    # the largest cell (5) on the GPU with the most free memory: (20 - 1) // 5; GPU 0 takes fewer, by its own
    # free memory when the cells are placed (tests/test_placement_uneven_gpus.py)
    assert admission.default_cells_per_gpu([need(2 * GiB), need(5 * GiB)], {0: 9 * GiB, 1: 20 * GiB}) == 3
    assert admission.default_cells_per_gpu([need(2 * GiB), need(5 * GiB)], {0: 9 * GiB}) == 1  # (9 - 1) // 5
    assert admission.default_cells_per_gpu([need(1.1 * GiB)], {0: 80 * GiB}) == admission.MAX_DEFAULT_CELLS_PER_GPU
    assert admission.default_cells_per_gpu([need(2 * GiB)], None) == 1  # free memory unknown: as before


# ---------------------------------------------------------------- the executor, with fake GPUs and workers


class _FakePopen:
    launched: list[dict] = []

    def __init__(self, argv, env=None, **kw):
        type(self).launched.append(env or {})
        self.pid = 0

    def poll(self):
        return 0


def _jobs(tmp_path: Path, names: list[str]) -> list[Job]:
    jobs = []
    for i, name in enumerate(names):
        d = tmp_path / name
        d.mkdir()
        cell = SimpleNamespace(train=SimpleNamespace(devices=1, threads=0), run_id=name)
        jobs.append(Job(cell=cell, run_dir=d, index=i))  # type: ignore[arg-type]
    return jobs


def _need(run_id: str, per_process: float):
    n = admission.Need(cell=SimpleNamespace(run_id=run_id), predicted=0.0, processes=1, device="cuda")
    n.predicted = (per_process - admission.PROCESS_BYTES["cuda"]) / n.band
    return n


@pytest.fixture
def fake_workers(monkeypatch):
    monkeypatch.setenv("ABL_ZYGOTE", "0")
    monkeypatch.setattr(subprocess, "Popen", _FakePopen)
    _FakePopen.launched = []
    return _FakePopen


def test_the_executor_packs_small_cells_on_one_gpu_and_counts_the_packing(tmp_path, fake_workers):
    ex = LocalExecutor(gpus=[0], cells_per_gpu=4)
    a, b, big = _jobs(tmp_path, ["a", "b", "big"])
    ex.plan_devices([_need("a", 2 * GiB), _need("b", 2 * GiB), _need("big", 7.5 * GiB)], {0: 10 * GiB})
    assert ex.placement.cap == 4 and ex.slots == 4
    for job in (a, b):
        assert ex.can_launch(job)
        ex.launch(job)
        ex.running.append(job)
    assert not ex.can_launch(big)  # does not fit beside them
    assert [e["CUDA_VISIBLE_DEVICES"] for e in fake_workers.launched] == ["0", "0"]
    assert a.packed == b.packed == 2
    for job in (a, b):
        ex.running.remove(job)
        ex.release(job)
    assert ex.can_launch(big)
    ex.launch(big)
    assert big.packed == 1


def test_cells_per_gpu_caps_the_executor_and_without_a_plan_one_cell_per_gpu(tmp_path, fake_workers):
    ex = LocalExecutor(gpus=[0], cells_per_gpu=2)
    ex.plan_devices([_need(n, 1 * GiB) for n in "abc"], {0: 80 * GiB})
    assert ex.placement.cap == 2 and ex.slots == 2
    plain = LocalExecutor(gpus=[0, 1])  # no memory figures at all: as before, one cell per GPU
    assert plain.placement.cap == 1 and plain.slots == 2


def test_a_packed_cell_is_marked_contended_in_its_folder(tmp_path, fake_workers):
    ex = LocalExecutor(gpus=[0], cells_per_gpu=2)
    a, b = _jobs(tmp_path, ["a", "b"])
    for job in (a, b):
        (job.run_dir / "metrics.jsonl").write_text(json.dumps({"step": 2, "train_loss": 1.0}) + "\n")
        ex.launch(job)
        ex.running.append(job)
    ex.running.remove(a)
    ex.release(a)
    rows = [json.loads(line) for line in (a.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1] == {"step": 2, "packed_cells": 2.0, "contended": 1.0}
    # health's own rule never overrides the mark (it adds a contended row only where there is none)
    from abl.analysis import health
    from abl.store import rundir

    derived = health.derived_rows(rundir.read_metrics(a.run_dir / "metrics.jsonl"),
                                  {"device_type": "cuda"})
    assert not [r for r in derived if r[1] == "contended"]


def test_admission_refuses_a_cell_too_large_for_a_gpu_before_anything_starts(registry):
    cells = expand(json.loads(json.dumps(SMALL)), registry).cells
    needs = [admission.cell_need(c, registry, [0]) for c in cells]
    one = max(n.per_process for n in needs)
    ex = LocalExecutor(gpus=[0])
    msgs = admission.admit(cells, registry, slots=ex.slots, gpus=[0], ram_free=lambda: 0,
                           gpu_free=lambda idx: {0: int(one * 0.5)}, plan=ex.plan_devices)
    assert msgs and "need more GPU memory than is free" in msgs[0]
    msgs = admission.admit(cells, registry, slots=ex.slots, gpus=[0], ram_free=lambda: 0,
                           gpu_free=lambda idx: {0: int(3 * one + GPU_RESERVE_BYTES)}, plan=ex.plan_devices)
    assert msgs == []
    assert ex.placement.cap == 3  # as many of the largest cell as fit the free memory less the reserve
    assert set(ex.placement.needs) == {c.run_id for c in cells}


# ---------------------------------------------------------------- the whole-grid figure


def test_covered_is_the_union_of_the_intervals_inside_the_wall():
    assert busy.covered([(0, 2), (1, 3), (5, 6)], 0, 10) == pytest.approx(4.0)
    assert busy.covered([(-5, 1), (9, 20)], 0, 10) == pytest.approx(2.0)
    assert busy.covered([], 0, 10) == 0.0


def test_nvml_utilisation_is_averaged_over_the_samples(monkeypatch):
    calls = []

    class Rates:
        def __init__(self, gpu):
            self.gpu = gpu

    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: calls.append("init")
    fake.nvmlShutdown = lambda: calls.append("shutdown")
    fake.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"
    fake.nvmlDeviceGetHandleByUUID = lambda u: f"u{u}"
    seq = iter([80, 60, 100, 40])
    fake.nvmlDeviceGetUtilizationRates = lambda h: Rates(next(seq))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(busy, "SAMPLE_S", 3600.0)  # the thread never samples on its own here
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,GPU-abc")
    s = busy.Sampler.start([0, 1])
    assert s is not None and s.handles == ["h3", "uGPU-abc"]  # CUDA's numbering mapped to NVML's
    s.sample()
    s.sample()
    s.stop()
    assert s.busy == pytest.approx(0.7) and calls == ["init", "shutdown"]


def test_no_nvml_means_no_sampler(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert busy.Sampler.start([0]) is None


def test_the_figure_line_says_where_the_busy_share_came_from():
    cpu = busy.GridFigure(cells=4, wall_s=10.0, steps_s=6.0, busy=0.6, busy_source="loop", devices="cpu", packed=1)
    assert "cells training 60% of the wall time" in cpu.line() and "not a device utilisation" in cpu.line()
    gpu = busy.GridFigure(cells=26, wall_s=50.0, steps_s=90.0, busy=0.75, busy_source="nvml", devices="1 GPU(s)",
                          packed=4)
    assert "GPU busy 75% (NVML utilisation" in gpu.line() and "up to 4 cells per GPU" in gpu.line()


# ---------------------------------------------------------------- the speed pass, once per shape


def test_the_speed_pass_times_each_packed_shape_once_and_stores_its_figures(tmp_path, registry, monkeypatch):
    from abl.store import database as store
    from abl.store import reader

    raw = json.loads(json.dumps(SMALL))
    raw["experiment"]["seeds"] = [0, 1]
    cells = expand(raw, registry).cells  # 3 shapes x 2 seeds
    jobs = []
    for i, c in enumerate(cells):
        d = tmp_path / c.run_id
        d.mkdir()
        (d / "status.json").write_text(json.dumps({"status": "completed"}))
        jobs.append(Job(cell=c, run_dir=d, index=i, handle=object(), packed=2 if c.seed == 0 or i < 2 else 1))
    timed = []

    def fake_time(run_dir, env, timeout_s=0):
        timed.append(run_dir)
        return {"tokens_per_s": 1000.0 + len(timed), "mfu": 0.25, "warmup_steps": 5, "timed_steps": 20,
                "device": "cuda:0 (fake)", "contended": ""}

    monkeypatch.setattr(speedpass, "time_shape", fake_time)
    db = tmp_path / "s.duckdb"
    con = store.open_store(db)
    for c in cells:  # the runs as the store holds them
        con.execute("INSERT INTO runs (run_id, experiment, cell_key, label, seed, status, config) "
                    "VALUES (?, 'packed', ?, ?, ?, 'completed', ?)",
                    [c.run_id, c.cell_key, c.label, c.seed, json.dumps({"model": {}, "train": {}})])
        con.execute("INSERT INTO metrics VALUES (?, 2, 'val_loss', 3.0)", [c.run_id])
    con.close()
    ex = SimpleNamespace(local=True, speed_pass="auto", use_gpus=True, gpus=[0])
    lines = speedpass.run_speed_pass(jobs, ex, db)
    assert len(timed) == 3 and len(lines) == 3  # one per shape, not one per run
    runs = {r.run_id: r for r in reader.read_runs(db)}
    for r in runs.values():
        assert r.final["alone_mfu"] == 0.25 and r.final["alone_tokens_per_s"] > 1000
        assert r.final["val_loss"] == 3.0  # the loss figures are the runs' own
        assert r.speed_pass["timed_steps"] == 20 and r.speed_pass["reason"] == "its cells shared a GPU"
    assert "tokens/s (alone) and MFU (alone)" in lines[0]
    # the dashboard reads them as metrics too (abl.store.readonly: the speed pass's rows beside the metrics)
    from abl.dashboard import queries as q

    dash = q.Store(str(db), str(tmp_path / "runs"))
    assert {"alone_tokens_per_s", "alone_mfu", "val_loss"} <= set(q.metric_names(dash, q.Selection()))
    fin = q.finals(dash, q.Selection(), ["alone_mfu", "val_loss"]).set_index("run_id")
    assert fin["alone_mfu"].to_dict() == {c.run_id: 0.25 for c in cells}
    assert fin["val_loss"].to_dict() == {c.run_id: 3.0 for c in cells}
    # never: nothing; always: every shape even unpacked
    timed.clear()
    assert speedpass.run_speed_pass(jobs, SimpleNamespace(local=True, speed_pass="never"), db) == []
    for j in jobs:
        j.packed = 1
    assert speedpass.run_speed_pass(jobs, ex, db) == [] and timed == []  # auto: nothing was packed
    ex.speed_pass = "always"
    speedpass.run_speed_pass(jobs, ex, db)
    assert len(timed) == 3


# ---------------------------------------------------------------- for real, on the CPU

TINY_RUN = """[experiment]
name = "packing"
seeds = [0, 1]
[model]
d_model = 32
n_layers = 1
n_heads = 4
context = 16
[train]
steps = 4
batch_size = 2
eval_every = 2
eval_batches = 1
threads = 1
[eval]
decode = false
extrapolation = false
[dataset.pystdlib]
max_bytes = 300000
[grid]
"model.norm" = ["rmsnorm", "layernorm"]
"""


@pytest.mark.slow
def test_packed_and_serial_grids_give_identical_final_losses_and_the_speed_pass_changes_none(tmp_path):
    """Issue 37's target: the same final losses, bit for bit, whether the grid runs packed (--workers 2) or one
    cell at a time; the speed pass (always, here after the serial run) times each shape once and leaves every
    loss figure as the run recorded it. Both runs end with the whole-grid figure."""
    pytest.importorskip("torch")
    from conftest import run_abl

    from abl.store import reader

    grid = tmp_path / "g.toml"
    grid.write_text(TINY_RUN)
    packed = run_abl(["run", str(grid), "--db", str(tmp_path / "packed.duckdb"), "--runs-dir",
                      str(tmp_path / "packed-runs"), "--workers", "2", "--speed-pass", "never"])
    assert packed.returncode == 0, packed.stderr + packed.stdout
    serial = run_abl(["run", str(grid), "--db", str(tmp_path / "serial.duckdb"), "--runs-dir",
                      str(tmp_path / "serial-runs"), "--workers", "1", "--speed-pass", "always"])
    assert serial.returncode == 0, serial.stderr + serial.stdout
    for out in (packed.stdout, serial.stdout):
        assert "whole grid done: 4 cell(s) in" in out and "their training steps" in out
        assert "cells training" in out and "not a device utilisation" in out  # the CPU's figure, said as such
    assert "speed pass" not in packed.stdout
    assert serial.stdout.count("speed pass: timing") == 2  # one per shape (2 norms), not one per run (4)
    losses = ("val_loss", "train_loss", "val_bpb")
    a = {r.run_id: r for r in reader.read_runs(tmp_path / "packed.duckdb", metrics=losses)}
    b = {r.run_id: r for r in reader.read_runs(tmp_path / "serial.duckdb")}
    assert set(a) == set(b) and len(a) == 4
    for rid, run in a.items():
        assert run.status == b[rid].status == "completed"
        for m in losses:
            assert run.final[m] == b[rid].final[m], (rid, m)  # exactly equal, not approximately
    # the pass stored figures only where it ran undisturbed (this shared machine is often busy: then it says so)
    stored = [r for r in b.values() if "alone_tokens_per_s" in r.final]
    assert len(stored) in (0, 2, 4)
    assert all(r.speed_pass["timed_steps"] == speedpass.TIMED_STEPS for r in stored)
    if len(stored) < 4:
        assert "no figures (the machine was busy during the pass" in serial.stdout
    # where a pass stored figures, abl compare and abl report show them, marked as the speed pass's
    import time

    from abl.store import database as store

    store.store_speed_pass(tmp_path / "serial.duckdb", [
        [rid, "shape", rid, 1234.0, 0.125, 5, 20, "cpu", time.time(), "test"] for rid in b])
    compare = run_abl(["compare", "packing", "--db", str(tmp_path / "serial.duckdb")])
    assert compare.returncode == 0, compare.stderr
    assert "tokens/s (alone) 1,234" in compare.stdout and "MFU (alone) 12.5%" in compare.stdout
    report = run_abl(["report", "packing", "--db", str(tmp_path / "serial.duckdb"), "--out", str(tmp_path / "rep")])
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "tokens/s (alone)" in text and "MFU (alone)" in text and "by the speed pass after the grid" in text


@pytest.mark.slow
def test_bench_harness_reports_the_whole_grid_figure():
    pytest.importorskip("torch")
    from conftest import run_abl

    r = run_abl(["bench", "harness", "--steps", "4", "--cells", "2", "--json", "--set", "model.d_model=32",
                 "--set", "model.n_layers=1", "--set", "train.batch_size=2", "--set", "model.context=16",
                 "--set", "dataset.pystdlib.max_bytes=300000"])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    g = out["grid"]
    assert g["cells"] == 2 and 0 < g["grid_wall_s"] <= out["grid_wall_s"]
    assert 0 < g["grid_steps_s"] < g["grid_wall_s"]
    assert 0 < g["busy_fraction"] <= 1 and g["busy_source"] == "loop" and g["devices"] == "cpu"
    assert g["line"].startswith("whole grid done: 2 cell(s)")


@pytest.mark.slow
def test_the_gpu_commands_packing_stage_runs_packed_and_serial(tmp_path):
    """scripts/gpu_run.sh packing at tiny sizes on the CPU: both runs, each with its whole-grid line, in packing.txt."""
    import os

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), ABL_GPU_INSTALL="0", ABL_GPU_TINY="1", ABL_GPU_PYTHON=sys.executable,
               TMPDIR=str(tmp_path), TRITON_INTERPRET="1")
    r = subprocess.run(["bash", str(root / "scripts" / "gpu_run.sh"), "packing"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=900, check=False)
    status = (out / "status.txt").read_text() if (out / "status.txt").exists() else ""
    assert r.returncode == 0, status + r.stdout[-2000:] + r.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["env.txt", "packing.txt", "status.txt"]
    lines = status.strip().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["packing packed", "packing serial"] and "exit 0" in lines[1]
    text = (out / "packing.txt").read_text()
    assert text.count("whole grid done: 2 cell(s)") == 2
