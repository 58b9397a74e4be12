"""The run summary, abl compare, abl report, the task report, the lr sweep and the dashboard read stored runs
through the one reader, abl.store.reader.read_runs (issue 38, item 2): each is run on a small stored grid with
read_runs wrapped by a recorder, and must call it, and show what it read."""

import json
import time
from io import StringIO

import pytest

from abl.store import reader

GRID = """
[experiment]
name = "onereader"
seeds = [0, 1]
[model]
d_model = 32
n_layers = 1
n_heads = 2
context = 8
vocab_size = 256
[train]
steps = 4
batch_size = 2
eval_every = 2
[grid]
"model.norm" = ["layernorm", "rmsnorm"]
"""
PLUGIN_METRIC = "plugin_only_score"  # a metric no list of abl names


def _write(d, cell, started: float) -> None:
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(cell.config))
    meta = {"cell_key": cell.cell_key, "label": cell.label, "git_commit": "abc", "versions": {},
            "grid_file": "onereader.toml"}
    if hasattr(cell, "grid_record"):
        meta["grid"] = cell.grid_record("onereader.toml")
    (d / "meta.json").write_text(json.dumps(meta))
    (d / "info.json").write_text(json.dumps({"device": "cpu (test)", "data_fingerprint": "f" * 64}))
    (d / "status.json").write_text(json.dumps({"status": "completed", "started": started, "finished": started + 1}))
    shift = 0.1 if cell.config["model"]["norm"] == "rmsnorm" else 0.0
    rows = [{"step": 0, "n_params": 1000}]
    rows += [{"step": s, "train_loss": 5.0 - s / 10 + shift, "elapsed_s": s / 10} for s in range(1, 5)]
    rows[2].update(val_loss=4.5 + shift + cell.seed / 100, probe_x_accuracy=0.25)
    rows[4].update(val_loss=4.0 + shift + cell.seed / 100, wall_s=0.4, tokens_per_s=1000.0, peak_mem_bytes=1e6,
                   probe_x_accuracy=0.5, **{PLUGIN_METRIC: 0.75})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """(grid file, db, grid): 2 cells x 2 seeds, completed, written as run folders and ingested."""
    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid
    from abl.store import database as store

    tmp = tmp_path_factory.mktemp("onereader")
    path = tmp / "onereader.toml"
    path.write_text(GRID)
    grid = load_grid(path, get_registry())
    runs = tmp / "results" / "runs"
    now = time.time()
    for i, cell in enumerate(grid.cells):
        _write(runs / cell.run_id, cell, now + i)
    db = tmp / "results" / "abl.duckdb"
    store.ingest_dirs(db, sorted(runs.iterdir()))
    return path, db, grid


@pytest.fixture
def calls(monkeypatch):
    """Every read_runs call: (run_ids, experiment, metrics, curves)."""
    seen: list[dict] = []
    real = reader.read_runs

    def recording(db_path, **kw):
        seen.append(kw)
        return real(db_path, **kw)

    monkeypatch.setattr(reader, "read_runs", recording)
    return seen


def test_the_run_summary_reads_through_the_reader(stored, calls):
    from rich.console import Console

    from abl.present import summary

    _, db, grid = stored
    out = StringIO()
    summary.print_run_summary(Console(file=out, width=200), db, grid)
    assert calls and set(calls[0]["run_ids"]) == {c.run_id for c in grid.cells}
    assert "layernorm" in out.getvalue() and "rmsnorm" in out.getvalue()


def test_abl_compare_and_abl_report_read_through_the_reader(stored, calls, tmp_path):
    from click.testing import CliRunner

    from abl import cli

    path, db, _ = stored
    r = CliRunner().invoke(cli.cli, ["compare", "onereader", "--db", str(db), "--format", "json"])
    assert r.exit_code == 0, r.output
    assert calls and calls[-1]["experiment"] == "onereader"
    n = len(calls)
    r = CliRunner().invoke(cli.cli, ["report", "onereader", "--db", str(db), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    assert len(calls) > n
    # a metric on no list reaches the report: read_runs gives every stored metric's final value
    assert any(kw.get("metrics") is None for kw in calls[n:])
    (md,) = (tmp_path / "rep").rglob("*.md")
    assert "layernorm" in md.read_text()


def test_every_stored_metric_reaches_the_report_runs(stored, calls):
    from abl.present.report.runs import load_runs

    _, db, _ = stored
    runs = load_runs(db, experiment="onereader", curve_names=())
    assert calls and all(r.final.get(PLUGIN_METRIC) == 0.75 for r in runs) and len(runs) == 4


def test_the_task_report_reads_through_the_reader(stored, calls):
    from abl.present import taskreport

    _, db, grid = stored
    ids = [c.run_id for c in grid.cells]
    finals, curves = taskreport.load(db, ids)
    assert calls and set(calls[0]["run_ids"]) == set(ids)
    assert finals == {rid: {"probe_x_accuracy": 0.5} for rid in ids}
    assert curves == {rid: {"probe_x_accuracy": [(2, 0.25), (4, 0.5)]} for rid in ids}


def test_the_lr_sweep_reads_through_the_reader(stored, calls):
    from abl.run import lr_sweep

    _, db, grid = stored
    per_seed = lr_sweep.tuning_runs(db, grid)
    assert calls and set(calls[0]["run_ids"]) == {c.run_id for c in grid.cells}
    values = [v for by_lr in per_seed.values() for by_seed in by_lr.values() for v in by_seed.values()]
    assert len(values) == 4 and all(why == "" and loss is not None for loss, why in values)


def test_the_dashboard_reads_through_the_reader(stored, calls):
    pytest.importorskip("pandas", reason="the dashboard extra is not installed")
    from abl.dashboard import queries as q

    _, db, grid = stored
    s = q.Store(str(db), str(db.parent / "runs"))
    cells, analysis, _ = q.verdicts(s, q.Selection(experiments=("onereader",)))
    assert calls and set(calls[0]["run_ids"]) == {c.run_id for c in grid.cells}
    assert len(cells) == 2 and all(len(c.values) == 2 for c in cells)
