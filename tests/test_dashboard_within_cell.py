"""The Compare page answers within each cell (issue 41, item 2), as the summary and the report do."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install 'abl[dashboard]'")
from streamlit.testing.v1 import AppTest  # noqa: E402

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent / "dashboard"))
import norms_store  # noqa: E402


def test_the_compare_page_shows_the_within_cell_answers(tmp_path, monkeypatch):
    import duckdb

    db = norms_store.build(tmp_path, seeds=(0, 1, 2))
    con = duckdb.connect(str(db))
    con.execute("INSERT INTO metrics SELECT run_id, step, 'val_loss_x1', value FROM metrics "
                "WHERE name = 'val_loss' AND step = 200")
    # every cell degrades at 4x by 0.5 nats, give or take a few thousandths per run
    con.execute("INSERT INTO metrics SELECT run_id, step, 'val_loss_x4', value + 0.5 + (hash(run_id) % 7) / 1000.0 "
                "FROM metrics WHERE name = 'val_loss' AND step = 200")
    con.close()
    monkeypatch.setenv("ABL_DB", str(db))
    monkeypatch.setenv("ABL_RUNS_DIR", str(db.parent / "runs"))
    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    at.switch_page("views/compare.py")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert "Within each cell" in [s.value for s in at.subheader]
    from test_dashboard import text_tables  # the page's plain tables (HTML in markdown) as DataFrames

    tables = [t for t in text_tables(at) if "answer" in t.columns]
    assert tables, "no within-cell table on the page"
    answers = set(tables[0]["answer"])
    assert answers == {"degrades at 4x"}
    assert set(tables[0]["contrast"]) == {"length x4 vs x1"}
