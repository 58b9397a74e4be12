"""abl bench harness: a one-cell grid's wall time split into training steps and the rest."""

import json

import pytest
from conftest import run_abl


def test_bench_harness_splits_the_cells_wall_time(tmp_path):
    pytest.importorskip("torch")
    r = run_abl(["bench", "harness", "--steps", "6", "--json", "--set", "model.d_model=32",
                 "--set", "model.n_layers=1", "--set", "train.batch_size=4", "--set", "model.context=32",
                 "--set", "dataset.pystdlib.max_bytes=400000", "--set", "train.eval_every=3"])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    parts = ("steps_s", "loop_other_s", "before_loop_s", "after_loop_s", "process_s")
    assert all(out[k] >= 0 for k in parts), out
    assert sum(out[k] for k in parts) == pytest.approx(out["cell_wall_s"], rel=1e-6)
    assert out["untimed_steps"] == [2]  # the memory-tracked step counts at the median
    assert 0 < out["overhead"] < 1 and out["overhead"] == pytest.approx(1 - out["steps_s"] / out["cell_wall_s"])
    # the grid's own evaluations (3 in the loop at steps 3 and 6, and decoding after it), timed by the worker,
    # lie inside the loop's rest and the time after its last step
    assert 0 < out["evaluations_s"] <= out["loop_other_s"] + out["after_loop_s"]
    assert out["overhead_besides_evaluations"] == pytest.approx(
        out["overhead"] - out["evaluations_s"] / out["cell_wall_s"])


def test_bench_harness_refuses_a_grid_of_several_cells():
    r = run_abl(["bench", "harness", "--steps", "2", "--set", "grid.model.norm=[\"rmsnorm\",\"layernorm\"]"])
    assert r.returncode == 2 and "one cell" in r.stderr + r.stdout


def test_bench_harness_reports_a_cell_in_a_running_grid_apart_from_the_first(tmp_path):
    pytest.importorskip("torch")
    r = run_abl(["bench", "harness", "--steps", "4", "--cells", "3", "--json", "--set", "model.d_model=32",
                 "--set", "model.n_layers=1", "--set", "train.batch_size=4", "--set", "model.context=32",
                 "--set", "dataset.pystdlib.max_bytes=400000"])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["cells"] == 3 and out["first_cell"]["cell_wall_s"] > 0
    assert 0 < out["steps_s"] < out["cell_wall_s"] < out["grid_wall_s"]
    assert out["overhead"] == pytest.approx(1 - out["steps_s"] / out["cell_wall_s"])
