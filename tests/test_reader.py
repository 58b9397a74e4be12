"""abl.store.reader.read_runs: the one reader of stored runs (every metric's final value unless told which,
curves only on demand, what the grid knew when the store records it, an older store read as it is)."""

import json

import duckdb
import pytest

from abl.store import database as store
from abl.store import reader

CONFIG = {"model": {"context": 8}, "train": {"batch_size": 2}}
# (run, step, name, value); val_loss deliberately out of step order, a metric no list names, a peak (max)
ROWS = [("a0", 4, "val_loss", 3.0), ("a0", 2, "val_loss", 3.5), ("a0", 1, "plugin_score", 0.25),
        ("a0", 3, "plugin_score", 0.5), ("a0", 1, "peak_mem_bytes", 900.0), ("a0", 2, "peak_mem_bytes", 500.0),
        ("b0", 6, "val_loss", 2.0), ("b0", 3, "val_loss", 1.0)]


def _fill(con, *, grid: bool) -> None:
    for run_id, cell, started in (("a0", "A", "2026-01-01 00:00:02"), ("b0", "B", "2026-01-01 00:00:01")):
        con.execute("INSERT INTO runs (run_id, experiment, cell_key, label, seed, status, config, started, env) "
                    "VALUES (?, 'e', ?, ?, 0, 'completed', ?, ?, ?)",
                    [run_id, cell, cell, json.dumps(CONFIG), started, json.dumps({"scored_targets": {"v": "f"}})])
    con.execute("INSERT INTO runs (run_id, experiment, seed, status) VALUES ('x0', 'other', 0, 'failed')")
    con.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?)", ROWS)
    if grid:
        con.execute("UPDATE runs SET grid_paths = ?, grid_index = ?, grid_varied = ? WHERE run_id = 'a0'",
                    [json.dumps(["model.norm"]), 1, json.dumps({"model.norm": "rmsnorm"})])
        con.execute("INSERT INTO run_settings VALUES ('a0', 'model.norm', ?), ('a0', 'train.lr', ?)",
                    [json.dumps("rmsnorm"), json.dumps(0.001)])


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "abl.duckdb"
    store.open_store(path).close()
    con = duckdb.connect(str(path))
    try:
        cols = {r[0] for r in con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = 'runs'").fetchall()}
        _fill(con, grid="grid_index" in cols)
    finally:
        con.close()
    return path


@pytest.fixture
def old_db(tmp_path):
    """A store of the first schema only: no attempts, executor, grid columns or run_settings table."""
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    try:
        first = next(sql for version, _, sql in store.MIGRATIONS if version == 1)
        for stmt in [s for s in first.split(";") if s.strip()]:
            con.execute(stmt)
        _fill(con, grid=False)
    finally:
        con.close()
    return path


def test_metrics_none_reads_every_stored_metric_final_value(db):
    runs = {r.run_id: r for r in reader.read_runs(db, experiment="e")}
    assert set(runs) == {"a0", "b0"}
    assert runs["a0"].final == {"val_loss": 3.0, "plugin_score": 0.5, "peak_mem_bytes": 900.0}
    assert runs["b0"].final == {"val_loss": 2.0}


def test_metrics_named_reads_only_those(db):
    (a0,) = reader.read_runs(db, run_ids=["a0"], metrics=["plugin_score", "absent"])
    assert a0.final == {"plugin_score": 0.5}
    assert reader.read_runs(db, run_ids=["a0"], metrics=[])[0].final == {}


def test_curves_only_on_demand_and_in_step_order(db):
    (a0,) = reader.read_runs(db, run_ids=["a0"])
    assert a0.curves == {}
    (a0,) = reader.read_runs(db, run_ids=["a0"], curves=("val_loss",))
    assert a0.curves == {"val_loss": [(2, 3.5), (4, 3.0)]}


def test_order_filters_and_fields(db):
    assert [r.run_id for r in reader.read_runs(db, experiment="e")] == ["b0", "a0"]  # by start
    assert [r.run_id for r in reader.read_runs(db)] == ["b0", "a0", "x0"]  # never started: last
    assert reader.read_runs(db, experiment="e", run_ids=["x0"]) == []
    assert reader.read_runs(db, run_ids=[]) == []
    x0 = reader.read_runs(db, run_ids=["x0"])[0]
    assert (x0.cell_key, x0.label, x0.config, x0.git_commit, x0.final) == ("x0", "", {}, "unknown", {})
    a0 = reader.read_runs(db, run_ids=["a0"])[0]
    assert a0.scored_targets == {"v": "f"} and a0.tokens_per_step == 16 and a0.status == "completed"
    assert reader.experiments(db) == ["e", "other"]


def test_what_the_grid_knew_when_recorded(db):
    con = duckdb.connect(str(db), read_only=True)
    try:
        recorded = "grid_index" in {r[0] for r in con.execute("DESCRIBE runs").fetchall()}
    finally:
        con.close()
    if not recorded:
        pytest.skip("this store's schema does not record the grid yet (migration 7)")
    a0, = reader.read_runs(db, run_ids=["a0"])
    assert (a0.grid_paths, a0.grid_index, a0.grid_varied) == (["model.norm"], 1, {"model.norm": "rmsnorm"})
    assert a0.settings == {"model.norm": "rmsnorm", "train.lr": 0.001}
    b0, = reader.read_runs(db, run_ids=["b0"])
    assert (b0.grid_paths, b0.grid_index, b0.grid_varied, b0.settings) == ([], None, {}, {})


def test_an_older_store_reads_as_it_is_and_is_not_migrated(old_db):
    runs = {r.run_id: r for r in reader.read_runs(old_db, experiment="e", curves=("val_loss",))}
    a0 = runs["a0"]
    assert a0.final["plugin_score"] == 0.5 and a0.curves["val_loss"][-1] == (4, 3.0)
    assert (a0.grid_paths, a0.grid_index, a0.grid_varied, a0.settings) == ([], None, {}, {})
    assert (a0.attempts, a0.executor) == (1, None)
    con = duckdb.connect(str(old_db), read_only=True)
    try:
        assert "schema_migrations" not in {r[0] for r in con.execute("SHOW TABLES").fetchall()}
    finally:
        con.close()


def test_no_store_or_no_runs_table_is_a_user_error(tmp_path):
    with pytest.raises(reader.NotAStore, match="no database at"):
        reader.read_runs(tmp_path / "none.duckdb")
    empty = tmp_path / "empty.duckdb"
    duckdb.connect(str(empty)).close()
    with pytest.raises(reader.NotAStore, match="no runs table"):
        reader.read_runs(empty)
    assert reader.experiments(empty) == [] and reader.experiments(tmp_path / "none.duckdb") == []
