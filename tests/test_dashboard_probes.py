"""The dashboard's Probes page and abl report's task section, on a tiny task grid trained through the CLI."""

import json
import sys
from pathlib import Path

import duckdb
import pytest

from conftest import ROOT, run_abl

pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install 'abl[dashboard]'")
from streamlit.testing.v1 import AppTest  # noqa: E402

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

APP = ROOT / "dashboard" / "app.py"
GRID = """
[experiment]
name = "probe_dash"
seeds = [0, 1]
[model]
n_layers = 2
n_heads = 2
context = 32
[train]
steps = 4
batch_size = 4
warmup_steps = 1
eval_every = 2
eval_batches = 1
threads = 1
[data]
dataset = "mqar"
[dataset.mqar]
vocab_size = 64
num_kv_pairs = 2
eval_kv_pairs = [2, 4]
[eval]
decode = false
extrapolation = false
[grid]
"model.layer_pattern" = ["mha", "linear"]
"model.d_model" = [16, 32]
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe_dash")
    (d / "g.toml").write_text(GRID)
    r = run_abl(["run", "g.toml", "--db", "abl.duckdb"], cwd=d)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return d


def test_run_summary_reports_accuracy_per_cell(store):
    out = run_abl(["run", "g.toml", "--db", "abl.duckdb"], cwd=store).stdout  # nothing left to train
    assert "final mqar_accuracy by cell" in out
    assert "pairs_2" in out and "pairs_4" in out


def test_probes_page(store, monkeypatch):
    monkeypatch.setenv("ABL_DB", str(store / "abl.duckdb"))
    monkeypatch.setenv("ABL_RUNS_DIR", str(store / "runs"))
    at = AppTest.from_file(str(APP), default_timeout=90)
    at.switch_page("views/probes.py")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert [t.value for t in at.title] == ["Probes"]
    assert [s.value for s in at.subheader] == ["Accuracy during training", "Accuracy vs model width, per mixer",
                                               "Per slice"]
    specs = [json.loads(el.proto.spec) for el in at.get("vega_lite_chart")]
    assert len(specs) == 2
    # the width chart: one point per (mixer, d_model), its mean over the two seeds from the store
    from streamlit import dataframe_util

    width = at.get("vega_lite_chart")[1]
    data = [dataframe_util.convert_arrow_bytes_to_pandas_df(d.data.data) for d in width.proto.datasets]
    summary = next(df for df in data if "mean" in df.columns)
    assert sorted(zip(summary["mixer"], summary["d_model"])) == [("linear", 16), ("linear", 32),
                                                                  ("mha", 16), ("mha", 32)]
    con = duckdb.connect(str(store / "abl.duckdb"), read_only=True)
    rows = con.execute("""
        SELECT json_extract_string(r.config, '$.model.layer_pattern') AS mixer,
               CAST(json_extract_string(r.config, '$.model.d_model') AS INT) AS d, avg(m.value)
        FROM metrics m JOIN runs r USING (run_id)
        WHERE m.name = 'mqar_accuracy' AND m.step = 4 GROUP BY 1, 2""").fetchall()
    expected = {(m, d): v for m, d, v in rows}
    for m, d, v in zip(summary["mixer"], summary["d_model"], summary["mean"]):
        assert v == pytest.approx(expected[(m, d)])
    table = at.dataframe[0].value
    assert list(table.columns) == ["cell", "mqar_accuracy", "pairs_2", "pairs_4"]


def test_report_has_the_task_section(store, tmp_path):
    r = run_abl(["report", "probe_dash", "--db", "abl.duckdb", "--out", str(tmp_path)], cwd=store)
    assert r.returncode == 0, r.stdout + r.stderr
    md = (tmp_path / "report.md").read_text()
    assert "## Task accuracy" in md and "task_accuracy.png" in md
    assert (tmp_path / "task_accuracy.png").stat().st_size > 1000
    section = md.split("## Task accuracy")[1]
    assert "pairs_2" in section and "pairs_4" in section and "paired t" in section
    # MQAR's no-recall baseline beside the accuracy, and 4 steps of training sit at it (abl.analysis.health)
    assert "no-recall baseline" in section and "did not learn 2/2" in section
