"""The speed pass times each shape on a GPU whose free memory holds it alone (issue 37).

It used to time every shape on the executor's first GPU: on GPUs with uneven free memory a large shape
could run out of memory there though another GPU holds it. There is no GPU here: the needs are given to
the executor's placement, the free memory query is stood in for, and the timing child is not started.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from abl.grid.gridfile import expand
from abl.run import admission, speedpass
from abl.run.executors import Job, LocalExecutor

GiB = 1024**3

SHAPES = {"experiment": {"name": "alone", "seeds": [0]},
          "model": {"d_model": 32, "n_layers": 1, "n_heads": 4, "context": 16},
          "train": {"steps": 2, "batch_size": 2, "eval_every": 2, "eval_batches": 1, "threads": 1},
          "eval": {"decode": False, "extrapolation": False},
          "dataset": {"pystdlib": {"max_bytes": 300000}},
          "grid": {"model.norm": ["rmsnorm", "layernorm"]}}


def _need(run_id: str, per_process: float) -> admission.Need:
    n = admission.Need(cell=SimpleNamespace(run_id=run_id), predicted=0.0, processes=1, device="cuda")  # type: ignore[arg-type]
    n.predicted = (per_process - admission.PROCESS_BYTES["cuda"]) / n.band
    return n


@pytest.fixture
def grid(tmp_path, registry, monkeypatch):
    """Two completed shapes (big: 6 GiB, small: 1 GiB) and a two-GPU executor that planned them on GPUs of
    2 and 10 GiB free; ``timed`` lists the GPUs each timing child was given."""
    monkeypatch.setenv("ABL_ZYGOTE", "0")
    big, small = expand(json.loads(json.dumps(SHAPES)), registry).cells
    jobs = []
    for i, c in enumerate((big, small)):
        d = tmp_path / c.run_id
        d.mkdir()
        (d / "status.json").write_text(json.dumps({"status": "completed"}))
        jobs.append(Job(cell=c, run_dir=d, index=i, handle=object(), packed=2))
    ex = LocalExecutor(gpus=[0, 1], cells_per_gpu=2)
    ex.plan_devices([_need(big.run_id, 6 * GiB), _need(small.run_id, 1 * GiB)], {0: 2 * GiB, 1: 10 * GiB})
    timed: list[tuple[str, str]] = []

    def fake_time(run_dir, env, timeout_s=0):
        timed.append((run_dir.name, env["CUDA_VISIBLE_DEVICES"]))
        return {"tokens_per_s": 1000.0, "mfu": 0.25, "warmup_steps": 5, "timed_steps": 20,
                "device": "cuda:0 (fake)", "contended": ""}

    monkeypatch.setattr(speedpass, "time_shape", fake_time)
    from abl.store import database as store

    db = tmp_path / "s.duckdb"
    store.open_store(db).close()
    return SimpleNamespace(ex=ex, jobs=jobs, big=big, small=small, timed=timed, db=db)


def test_a_large_shape_is_timed_on_the_gpu_whose_free_memory_holds_it(grid, monkeypatch):
    asked = []
    monkeypatch.setattr(admission, "gpu_free_bytes", lambda idx: asked.append(idx) or {0: 2 * GiB, 1: 10 * GiB})
    lines = speedpass.run_speed_pass(grid.jobs, grid.ex, grid.db)
    assert dict(grid.timed) == {grid.big.run_id: "1", grid.small.run_id: "1"}  # the most free memory first
    assert asked == [[0, 1]]  # free memory asked once, after the grid, for the whole pass
    assert len(lines) == 2 and all("tokens/s" in line for line in lines)


def test_the_free_memory_from_before_the_grid_serves_when_the_query_fails(grid, monkeypatch):
    monkeypatch.setattr(admission, "gpu_free_bytes", lambda idx: None)
    speedpass.run_speed_pass(grid.jobs, grid.ex, grid.db)
    assert dict(grid.timed)[grid.big.run_id] == "1"


def test_a_shape_that_no_gpu_holds_alone_now_is_not_timed_and_says_why(grid, monkeypatch):
    from abl.store import reader

    monkeypatch.setattr(admission, "gpu_free_bytes", lambda idx: {0: 2 * GiB, 1: 3 * GiB})  # another job came
    lines = speedpass.run_speed_pass(grid.jobs, grid.ex, grid.db)
    assert dict(grid.timed) == {grid.small.run_id: "1"}  # the big shape's child never started
    skipped = [line for line in lines if grid.big.label in line]
    assert len(skipped) == 1 and "no figures (no GPU's free memory holds it alone" in skipped[0]
    assert "6.0 GiB" in skipped[0] and "GPU 0: 2.0 GiB" in skipped[0] and "GPU 1: 3.0 GiB" in skipped[0]
    stored = {r.run_id: r.speed_pass for r in reader.read_runs(grid.db)}
    assert not stored.get(grid.big.run_id)


def test_without_a_need_or_free_memory_the_first_gpu_times_it_as_before(grid, monkeypatch):
    monkeypatch.setattr(admission, "gpu_free_bytes", lambda idx: pytest.fail("nothing to compare: no query"))
    plain = LocalExecutor(gpus=[3, 4])  # no plan: admission gave it no needs
    plain.speed_pass = "always"
    speedpass.run_speed_pass(grid.jobs, plain, grid.db)
    assert [gpu for _, gpu in grid.timed] == ["3", "3"]
