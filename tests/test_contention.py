"""Each run records what the machine gave its loop (cpu_util, load_per_core); ingest marks it contended."""

import math
import os

import duckdb
import pytest

from abl.analysis.health import contended, derived_rows
from abl.analysis.sections import CONTENDED, is_contended
from abl.contracts.status import COMPLETED, RUNNING
from abl.grid.gridfile import expand
from abl.train.loop import train
from abl.store import database as store
from abl.store import rundir

GRID = {
    "experiment": {"name": "c", "seeds": [0]},
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "context": 32},
    "train": {"steps": 12, "batch_size": 4, "eval_every": 6, "eval_batches": 1, "threads": 1, "device": "cpu"},
    "dataset": {"pystdlib": {"max_bytes": 200_000}},
}


@pytest.fixture(autouse=True)
def torch_threads():
    import torch

    before = torch.get_num_threads()  # train.threads = 1 sets it for this process
    yield
    torch.set_num_threads(before)


def test_the_contention_rule():
    assert contended(0.4, 0.95, on_cpu=True) is False
    assert contended(1.6, 0.95, on_cpu=True) is True  # more runnable threads than cores
    assert contended(0.4, 0.5, on_cpu=True) is True  # the run waited for the CPU
    assert contended(0.4, 0.5, on_cpu=False) is False  # on a GPU the CPU share is no signal
    assert contended(1.6, 0.2, on_cpu=False) is True
    assert contended(None, 0.5, on_cpu=False) is None  # nothing that counts: not marked
    assert contended(None, None, on_cpu=True) is None
    assert contended(None, 0.5, on_cpu=True) is True


def test_derived_rows_mark_only_runs_that_recorded_the_figures():
    rows = [(1, "train_loss", 3.0), (2, "train_loss", 2.9), (2, "cpu_util", 0.4), (2, "load_per_core", 0.2)]
    marked = {n: v for _, n, v in derived_rows(rows, {"device_type": "cpu"})}
    assert marked[CONTENDED] == 1.0
    marked = {n: v for _, n, v in derived_rows(rows, {"device_type": "cuda"})}
    assert marked[CONTENDED] == 0.0
    older = {n for _, n, _ in derived_rows(rows[:2], {"device_type": "cpu"})}  # a run from before the metrics
    assert CONTENDED not in older


class FolderSink:
    """The worker's sink, in-process (so a test can mock what the training loop sees)."""

    def __init__(self, run_dir):
        self.sink = rundir.JsonlSink(run_dir / rundir.METRICS)

    def log(self, step, metrics):
        self.sink.log(step, metrics)


def trained_folder(tmp_path, registry):
    cell = expand(GRID, registry).cells[0]
    run_dir = rundir.prepare(tmp_path / "runs" / cell.run_id, cell.config, {"label": cell.label})
    rundir.write_status(run_dir, {"status": RUNNING, "started": 0.0})
    sink = FolderSink(run_dir)
    summary = train(cell, registry, sink, on_info=lambda info: rundir.write_json(run_dir / rundir.INFO, info))
    sink.sink.close()
    rundir.write_status(run_dir, {"status": COMPLETED, "started": 0.0, "finished": 1.0})
    return run_dir, summary


def stored_final(tmp_path, run_dir):
    db = tmp_path / "x.duckdb"
    con = store.open_store(db)
    try:
        assert store.ingest_run(con, run_dir) == COMPLETED
        return {n: v for n, v in con.execute(
            f"SELECT name, value FROM ({store.final_values_sql()}) WHERE run_id = ?", [run_dir.name]).fetchall()}
    finally:
        con.close()


def test_a_trained_run_records_its_cpu_share_and_the_load(tmp_path, registry):
    run_dir, summary = trained_folder(tmp_path, registry)
    assert 0 < summary["cpu_util"] <= 1.05  # one thread given: at most one CPU second per second
    assert math.isfinite(summary["load_per_core"]) and summary["load_per_core"] >= 0
    final = stored_final(tmp_path, run_dir)
    assert final["cpu_util"] == pytest.approx(summary["cpu_util"])
    assert final["load_per_core"] == pytest.approx(summary["load_per_core"])
    assert final[CONTENDED] in (0.0, 1.0)
    assert final[CONTENDED] == float(contended(final["load_per_core"], final["cpu_util"], on_cpu=True))


def test_a_run_under_a_high_load_is_stored_contended(tmp_path, registry, monkeypatch):
    cores = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0 * cores, 3.0 * cores, 3.0 * cores))
    run_dir, summary = trained_folder(tmp_path, registry)
    assert summary["load_per_core"] == pytest.approx(3.0)
    final = stored_final(tmp_path, run_dir)
    assert final[CONTENDED] == 1.0 and is_contended(final)
