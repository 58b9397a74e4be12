"""A run's final metric is one SQL fragment (abl.store.database.final_values_sql) shared by the CLI summary, the report
and the dashboard: the value at the run's highest step, whatever order the rows were stored in."""

import duckdb
import pytest

from abl.store import database as store

# (run, step, value) of val_loss, deliberately out of step order; the final value is at the highest step
VAL = [("a0", 4, 3.0), ("a0", 2, 3.5), ("a0", 3, 3.2),
       ("a1", 1, 4.0), ("a1", 5, 3.4), ("a1", 2, 3.9),
       ("b0", 6, 2.0), ("b0", 3, 1.0)]  # lower earlier: the final is not the best
FINAL = {"a0": 3.0, "a1": 3.4, "b0": 2.0}


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "abl.duckdb"
    store.open_store(path).close()
    con = duckdb.connect(str(path))
    for run_id, cell, seed in (("a0", "A", 0), ("a1", "A", 1), ("b0", "B", 0)):
        con.execute("INSERT INTO runs (run_id, experiment, cell_key, label, seed, status, config) "
                    "VALUES (?, 'e', ?, ?, ?, 'completed', ?)",
                    [run_id, cell, cell, seed, '{"model": {"context": 8}, "train": {"batch_size": 2}}'])
    con.executemany("INSERT INTO metrics VALUES (?, ?, 'val_loss', ?)", VAL)
    con.executemany("INSERT INTO metrics VALUES (?, ?, 'train_loss', ?)",
                    [(r, s, 9.0) for r, s, _ in VAL])
    con.close()
    return path


def test_the_fragment_takes_the_value_at_the_highest_step(db):
    con = duckdb.connect(str(db), read_only=True)
    try:
        got = con.execute(store.final_values_sql("name = 'val_loss'")).fetchall()
        last = con.execute(store.final_values_sql("name = 'val_loss'", agg=store.LAST_STEP)).fetchall()
    finally:
        con.close()
    assert {r: v for r, n, v in got} == FINAL and {n for _, n, _ in got} == {"val_loss"}
    assert {r: v for r, _, v in last} == {"a0": 4, "a1": 5, "b0": 6}


def test_cli_summary_and_report_use_the_final_value(db):
    from abl.present import summary
    from abl.present.report.runs import load_runs

    view = summary.build(summary.load(db, run_ids=["a0", "a1", "b0"]), metrics=["val_loss"], title="e")
    rows = {r.key: r for r in view.analysis.cells}
    assert rows["A"].mean == pytest.approx((3.0 + 3.4) / 2)
    assert rows["B"].mean == pytest.approx(2.0)
    assert {r.run_id: r.final["val_loss"] for r in load_runs(db, experiment="e", curve_names=())} == FINAL


def test_dashboard_uses_the_same_final_value(db, tmp_path):
    pytest.importorskip("pandas", reason="the dashboard extra is not installed")
    from abl.dashboard import queries as q

    s = q.Store(str(db), str(tmp_path / "runs"))
    fin = q.finals(s, q.Selection(), ["val_loss"]).set_index("run_id")
    assert fin["val_loss"].to_dict() == FINAL
    assert fin["last_step"].to_dict() == {"a0": 4, "a1": 5, "b0": 6}
    vals = q.cell_values(s, q.Selection(), "val_loss")
    assert dict(zip(vals["run_id"], vals["value"])) == FINAL
    summary = q.run_metric_summary(s, "b0").set_index("name")
    assert summary.loc["val_loss", "last"] == 2.0 and summary.loc["val_loss", "last_step"] == 6
