"""The dashboard's query layer, statistics and command, on small stores built in place (fast)."""

import json
import subprocess
import sys
import time

import duckdb
import numpy as np
import pytest
from conftest import ROOT

pd = pytest.importorskip("pandas", reason="the dashboard extra is not installed: pip install 'abl[dashboard]'")
pytest.importorskip("scipy")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from scipy import stats as sps  # noqa: E402

from abl.analysis import stats  # noqa: E402
from abl.analysis.tables import config_diff  # noqa: E402
from abl.dashboard import queries as q  # noqa: E402
from abl.store import database as abl_store  # noqa: E402
from abl.store.readonly import StoreBusy, StoreUnavailable  # noqa: E402

APP = ROOT / "dashboard" / "app.py"


def _config(norm, seed, eps=None):
    comp = {"name": norm, "params": {} if eps is None else {"eps": eps}}
    return {"experiment": "e", "seed": seed, "model": {"norm": norm, "context": 8},
            "train": {"steps": 4, "batch_size": 2}, "components": {"norm": comp}}


@pytest.fixture
def small_store(tmp_path):
    """3 runs: rmsnorm seeds 0/1 (completed), layernorm seed 0 (running); plus an experiment 'other'."""
    db = tmp_path / "abl.duckdb"
    abl_store.open_store(db).close()
    con = duckdb.connect(str(db))
    runs = [("a0", "e", "A", "norm=rmsnorm", 0, "completed", _config("rmsnorm", 0, 1e-6)),
            ("a1", "e", "A", "norm=rmsnorm", 1, "completed", _config("rmsnorm", 1, 1e-6)),
            ("b0", "e", "B", "norm=layernorm", 0, "running", _config("layernorm", 0)),
            ("z0", "other", "Z", "", 0, "failed", _config("rmsnorm", 0, 1e-6))]
    for r in runs:
        con.execute("INSERT INTO runs (run_id, experiment, cell_key, label, seed, status, config) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)", [*r[:6], json.dumps(r[6])])
    rows = []
    for run, base in (("a0", 3.0), ("a1", 3.2), ("b0", 4.0), ("z0", 9.0)):
        for step in (1, 2, 3, 4):
            rows += [(run, step, "train_loss", base + 1 / step), (run, step, "tokens_per_s", 100.0 * step)]
        rows += [(run, 2, "val_loss", base + 0.5), (run, 4, "val_loss", base), (run, 4, "peak_mem_bytes", 1e6)]
    con.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?)", rows)
    con.close()
    return q.Store(str(db), str(tmp_path / "runs"))


def test_filters_reach_sql_only_as_parameters(small_store):
    hostile = "e' OR '1'='1"
    assert q.runs(small_store, q.Selection(experiments=(hostile,))).empty
    assert q.runs(small_store, q.Selection(statuses=("completed'; DROP TABLE runs; --",))).empty
    assert len(q.runs(small_store, q.Selection(experiments=("e",)))) == 3
    sel = q.Selection(axes=(("$.model.norm", ("rmsnorm",)),))
    assert set(q.runs(small_store, sel)["run_id"]) == {"a0", "a1", "z0"}
    sel = q.Selection(axes=(("$.model.norm", ("x') OR TRUE OR ('",)),))
    assert q.runs(small_store, sel).empty
    for bad in ("$.model.norm') OR TRUE --", "model.norm", "$.a b", "$..x", ""):
        with pytest.raises(ValueError):
            q.runs(small_store, q.Selection(axes=((bad, ("x",)),)))
        with pytest.raises(ValueError):
            q.runs(small_store, q.Selection(), axis_paths=[bad])
    assert len(q.runs(small_store, q.Selection())) == 4  # nothing was dropped


def test_config_axes_find_what_varies(small_store):
    axes = q.config_axes(small_store, q.Selection(experiments=("e",)))
    varied = dict(zip(axes.loc[axes["varied"], "label"], axes.loc[axes["varied"], "values"]))
    # the seed, the experiment and the component names (they repeat model.norm) are not axes, nor is
    # rmsnorm's eps: it differs between runs only because layernorm has none
    assert set(varied) == {"model.norm"}
    assert varied["model.norm"] == ["layernorm", "rmsnorm"]
    assert axes.set_index("label").loc["norm.eps", "implied"]
    assert list(axes["label"])[:1] == ["model.context"]  # sections' keys before component parameters
    with duckdb.connect(small_store.db) as con:  # sweep rmsnorm's eps: now it is an axis
        con.execute("INSERT INTO runs (run_id, experiment, cell_key, label, seed, status, config) "
                    "VALUES ('c0', 'e', 'C', 'eps', 0, 'completed', ?)", [json.dumps(_config("rmsnorm", 0, 1e-5))])
    axes = q.config_axes(small_store, q.Selection(experiments=("e",)))
    varied = dict(zip(axes.loc[axes["varied"], "label"], axes.loc[axes["varied"], "values"]))
    assert set(varied) == {"model.norm", "norm.eps"}
    assert varied["norm.eps"][-1] is None  # absent in the layernorm run
    sel = q.Selection(axes=(("$.components.norm.params.eps", (None,)),))
    assert list(q.runs(small_store, sel)["run_id"]) == ["b0"]
    assert q.axis_label("$.components.mixer.params.n_kv_heads") == "mixer.n_kv_heads"


def test_finals_take_last_median_and_peak(small_store):
    sel = q.Selection(experiments=("e",))
    f = q.finals(small_store, sel, ["val_loss", "train_loss", "tokens_per_s", "peak_mem_bytes"]).set_index("run_id")
    assert f.loc["a1", "val_loss"] == 3.2  # the last evaluation, not the min
    assert f.loc["a0", "train_loss"] == pytest.approx(3.25)
    assert f.loc["a0", "tokens_per_s"] == 250.0  # median of 100..400
    assert f.loc["a0", "last_step"] == 4
    vals = q.cell_values(small_store, sel, "val_loss")
    assert set(vals["run_id"]) == {"a0", "a1"}  # completed runs only
    assert set(q.cell_values(small_store, sel, "val_loss", completed_only=False)["run_id"]) == {"a0", "a1", "b0"}
    assert q.metric_names(small_store, sel) == ["peak_mem_bytes", "tokens_per_s", "train_loss", "val_loss"]


def test_running_runs_are_read_from_their_metrics_file(small_store, tmp_path):
    d = tmp_path / "runs" / "b0"
    d.mkdir(parents=True)
    (d / "status.json").write_text('{"status": "running"}')
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "train_loss": 5.0 - s}) + "\n"
                                             for s in range(1, 7)) + '{"step": 7, "train_lo')
    live = q.live_snapshot(small_store)
    assert q.running_ids(small_store) == ["b0"]
    assert live.progress["b0"]["step"] == 6 and live.progress["b0"]["folder_status"] == "running"
    curves = q.curves(small_store, ["a0", "b0"], "train_loss", live=live)
    assert list(curves.loc[curves["run_id"] == "b0", "step"]) == [1, 2, 3, 4, 5, 6]  # the file, not the store
    assert list(curves.loc[curves["run_id"] == "a0", "step"]) == [1, 2, 3, 4]
    assert q.live_key(small_store, ["b0"]) == live.key
    (d / "metrics.jsonl").write_text('{"step": 1, "train_loss": 1.0}\n')
    assert q.live_key(small_store, ["b0"]) != live.key


def test_a_session_shares_one_connection_and_closes_it(small_store, monkeypatch):
    opened = []
    real = duckdb.connect

    def counting(*a, **kw):
        con = real(*a, **kw)
        opened.append(con)
        return con

    monkeypatch.setattr(duckdb, "connect", counting)  # the module abl.store.readonly opens with
    for _ in range(3):
        q.status_values(small_store)
    assert len(opened) == 3
    with small_store.session():
        for _ in range(3):
            q.status_values(small_store)
    assert len(opened) == 4
    with pytest.raises(duckdb.Error):
        opened[-1].execute("SELECT 1")  # closed on exit


HOLD = "import duckdb, sys, time\ncon = duckdb.connect(sys.argv[1])\nprint('locked', flush=True)\n" \
       "time.sleep(float(sys.argv[2]))\ncon.close()\n"


def _hold_write_lock(db, seconds):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(db), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_reader_waits_for_the_writer_then_reads_or_says_busy(small_store):
    proc = _hold_write_lock(small_store.db, 1.0)
    try:
        t0 = time.monotonic()
        assert q.status_values(small_store) == ["completed", "failed", "running"]
        assert time.monotonic() - t0 > 0.3  # it waited for the lock instead of failing
    finally:
        proc.wait(timeout=30)
    proc = _hold_write_lock(small_store.db, 1.0)
    try:
        with pytest.raises(StoreBusy, match="busy"):
            small_store.query("SELECT 1", retry_s=0.3)
    finally:
        proc.wait(timeout=30)


def test_missing_and_foreign_databases_are_reported(tmp_path):
    with pytest.raises(StoreUnavailable, match="No database at"):
        q.experiments(q.Store(str(tmp_path / "none.duckdb"), str(tmp_path)))
    db = tmp_path / "other.duckdb"
    duckdb.connect(str(db)).close()
    with pytest.raises(StoreUnavailable, match="not an abl store"):
        q.experiments(q.Store(str(db), str(tmp_path)))
    assert q.bench_columns(q.Store(str(db), str(tmp_path))) is None


def test_bench_columns_are_checked_before_use(small_store):
    cols = q.bench_columns(small_store)
    assert {"op", "provider", "p50"} <= set(cols)
    with pytest.raises(ValueError):
        q.bench_rows(small_store, cols, {'op" = op OR "1': ["x"]})
    with pytest.raises(ValueError):
        q.bench_rows(small_store, cols, {"not_a_column": ["x"]})
    assert q.bench_rows(small_store, cols, {"op": ["rmsnorm"]}).empty


# ---------------------------------------------------------------- statistics


def test_t_interval_matches_scipy():
    x = np.array([3.1, 3.3, 2.9, 3.0])
    lo, hi = sps.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=sps.sem(x))
    s = stats.summarize_groups(pd.DataFrame({"g": ["a"] * 4, "value": x}), "g")
    assert s["ci_lo"].iloc[0] == pytest.approx(lo) and s["ci_hi"].iloc[0] == pytest.approx(hi)
    assert np.isnan(stats.t_halfwidth(1.0, 1))  # one seed: no interval


def test_welch_and_paired_match_scipy():
    a, b = np.array([3.0, 3.2, 3.1]), np.array([3.4, 3.3, 3.6, 3.5])
    w = stats.welch(a.mean(), a.std(ddof=1), len(a), b.mean(), b.std(ddof=1), len(b))
    ref = sps.ttest_ind(a, b, equal_var=False)
    assert float(w["p"]) == pytest.approx(ref.pvalue) and float(w["t"]) == pytest.approx(ref.statistic)
    ci = ref.confidence_interval(0.95)
    assert float(w["diff_lo"]) == pytest.approx(ci.low) and float(w["diff_hi"]) == pytest.approx(ci.high)
    assert np.isnan(stats.welch(1.0, 0.1, 1, 2.0, 0.1, 3)["p"])  # n < 2 on one side
    p = stats.paired({0: 3.0, 1: 3.2, 2: 3.1, 9: 1.0}, {0: 3.4, 1: 3.3, 2: 3.6})
    assert p["pairs"] == 3 and p["p"] == pytest.approx(sps.ttest_rel([3.0, 3.2, 3.1], [3.4, 3.3, 3.6]).pvalue)


def test_holm_stars_pareto_ema_downsample_diff():
    assert np.allclose(stats.holm([0.01, 0.04, 0.03, np.nan]), [0.03, 0.06, 0.06, np.nan], equal_nan=True)
    assert [stats.stars(p) for p in (0.0001, 0.005, 0.03, 0.2, np.nan)] == ["***", "**", "*", "n.s.", "n/a"]
    # lower cost better: (1, 5) (2, 3) (4, 1) are the front, (3, 4) is dominated by (2, 3)
    assert list(stats.pareto_mask([1, 2, 3, 4], [5, 3, 4, 1])) == [True, True, False, True]
    # higher throughput better: (10, 2) dominates (5, 3)? no: (5, 3) is worse on both -> off the front
    assert list(stats.pareto_mask([10, 5, 20], [2, 3, 2.5], "higher")) == [True, False, True]
    assert np.allclose(stats.ema(np.full(5, 2.0), 0.9), 2.0)  # debiased: no warm-up bias
    assert np.allclose(stats.ema(np.array([1.0, 2.0]), 0.0), [1.0, 2.0])
    df = pd.DataFrame({"g": ["a"] * 1000 + ["b"] * 3, "v": range(1003)})
    ds = stats.downsample(df, "g", 100)
    assert len(ds[ds["g"] == "a"]) <= 101 and ds["v"].iloc[0] == 0 and 999 in set(ds["v"])
    assert len(ds[ds["g"] == "b"]) == 3
    d = config_diff(_config("rmsnorm", 0, 1e-6), _config("layernorm", 1))
    assert set(d["path"]) == {"model.norm", "components.norm.name", "components.norm.params.eps"}


# ---------------------------------------------------------------- the app and its command


def test_abl_dashboard_defaults_to_127_0_0_1(monkeypatch, tmp_path):
    pytest.importorskip("streamlit", reason="the dashboard extra is not installed")
    from click.testing import CliRunner

    from abl import cli
    from abl.cli import dashboard as dashboard_command

    calls = []
    monkeypatch.setattr(dashboard_command.os, "execve", lambda exe, argv, env: calls.append((argv, env)))
    monkeypatch.setattr(subprocess, "call", lambda argv, env: calls.append((argv, env)) or 0)
    r = CliRunner().invoke(cli.cli, ["dashboard", "--db", str(tmp_path / "x.duckdb"), "--port", "8765"])
    assert r.exit_code == 0, r.output
    argv, env = calls[0]
    assert argv[argv.index("--server.address") + 1] == "127.0.0.1"
    assert argv[argv.index("--server.port") + 1] == "8765"
    assert env["ABL_DB"] == str((tmp_path / "x.duckdb").resolve())
    assert env["ABL_RUNS_DIR"] == str((tmp_path / "runs").resolve())
    calls.clear()
    CliRunner().invoke(cli.cli, ["dashboard", "--host", "0.0.0.0"])
    assert calls[0][0][calls[0][0].index("--server.address") + 1] == "0.0.0.0"


def test_a_missing_store_is_a_message_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.setenv("ABL_DB", str(tmp_path / "nothing.duckdb"))
    pytest.importorskip("streamlit", reason="the dashboard extra is not installed")
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception
    assert any("No database at" in e.value for e in at.error)


def test_verdict_runs_carry_what_each_run_was_scored_on(small_store):
    """The dashboard's comparisons see the runs' scored_targets fingerprints (stored in runs.env), so a
    comparison across different validation targets is flagged there as in the CLI and the report."""
    con = duckdb.connect(small_store.db)
    con.execute("UPDATE runs SET env = ? WHERE run_id = 'a0'", [json.dumps({"scored_targets": {"val_loss": "f0"}})])
    con.close()
    records = {r.seed: r for r in q.verdict_runs(small_store, q.Selection(experiments=("e",)), "val_loss")
               if r.cell_key == "A"}
    assert records[0].scored_targets == {"val_loss": "f0"}
    assert records[1].scored_targets == {}


def test_the_run_summary_keeps_what_each_run_was_scored_on():
    from abl.present.summary import relabel
    from abl.store.reader import StoredRun

    run = StoredRun(run_id="a0", experiment="e", cell_key="A", label="A", seed=0, status="completed",
                    config=_config("rmsnorm", 0), data_fingerprint="d", final={"val_loss": 3.0},
                    env={"scored_targets": {"val_loss": "f0"}})
    assert relabel([run])[0].scored_targets == {"val_loss": "f0"}
