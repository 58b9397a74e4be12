"""The dashboard against a real store: a tiny grid trained through the CLI once per session.

- every page under Streamlit's AppTest: the widgets and charts it shows, and the
  numbers behind them checked against the store and scipy;
- the store is watched with the dashboard's own read-only queries while the
  grid trains: the writer is never blocked and running runs are seen;
- ``abl dashboard`` serves on 127.0.0.1, and headless Chromium (Playwright)
  renders its charts.
"""

import json
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import duckdb
import numpy as np
import pytest
from conftest import ROOT

pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install 'abl[dashboard]'")
from streamlit.testing.v1 import AppTest  # noqa: E402

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from abl.dashboard import charts as dash_charts  # noqa: E402
from abl.dashboard import queries  # noqa: E402
from abl.contracts.config import run_id_of  # noqa: E402
from abl.store import database as abl_store  # noqa: E402
from abl.store.readonly import StoreBusy, StoreUnavailable  # noqa: E402

pytestmark = pytest.mark.slow  # the fixture store trains a grid through the CLI

APP = ROOT / "dashboard" / "app.py"
GRID = Path(__file__).parent / "dashboard" / "tiny_grid.toml"
EXPERIMENT = "dash_tiny"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


# ---------------------------------------------------------------- the fixture store


class Fixture:
    def __init__(self, db: Path, seen: Counter, errors: list, writer_rc: int, writer_out: str):
        self.db, self.runs_dir = db, db.parent / "runs"
        self.seen, self.errors, self.writer_rc, self.writer_out = seen, errors, writer_rc, writer_out

    def sql(self, query, params=()):
        con = duckdb.connect(str(self.db), read_only=True)
        try:
            return con.execute(query, list(params)).fetchall()
        finally:
            con.close()


@pytest.fixture(scope="module")
def fixture_store(tmp_path_factory) -> Fixture:
    """Train tests/dashboard/tiny_grid.toml with ``abl run``, reading the store all the while."""
    tmp = tmp_path_factory.mktemp("dash_store")
    db = tmp / "abl.duckdb"
    log = tmp / "abl_run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "abl.cli", "run", str(GRID), "--db", str(db),
                                 "--workers", "2"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        reader = queries.Store(str(db), str(tmp / "runs"))
        seen: Counter = Counter()
        errors: list[str] = []
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if db.exists():
                    for status, n in reader.query("SELECT status, count(*) AS n FROM runs GROUP BY status")\
                            .itertuples(index=False):
                        seen[status] += 1
                    live = queries.live_snapshot(reader)
                    if live:
                        seen["live_rows"] = max(seen["live_rows"], len(live.frame))
                    seen["reads"] += 1
            except StoreBusy:
                seen["busy"] += 1
            except StoreUnavailable as exc:  # before the first migration commits
                seen["unavailable"] += 1
                if "not an abl store" not in str(exc):
                    errors.append(repr(exc))
            except Exception as exc:  # noqa: BLE001 - recorded, asserted on in a test
                errors.append(repr(exc))
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        rc = proc.wait()
    return Fixture(db, seen, errors, rc, log.read_text())


@pytest.fixture(autouse=True)
def _env(request, monkeypatch):
    if "fixture_store" in request.fixturenames:
        fx = request.getfixturevalue("fixture_store")
        monkeypatch.setenv("ABL_DB", str(fx.db))
        monkeypatch.setenv("ABL_RUNS_DIR", str(fx.runs_dir))


def test_the_grid_trained_while_the_dashboard_was_reading(fixture_store):
    fx = fixture_store
    # one cell diverges by design, so abl run reports one failure class: exit status 1
    assert fx.writer_rc == 1, fx.writer_out[-3000:]
    assert fx.errors == []
    rows = dict(fx.sql("SELECT status, count(*) FROM runs GROUP BY status"))
    assert rows == {"completed": 6, "diverged": 2}
    assert fx.seen["reads"] > 10
    assert fx.seen["running"] > 0, fx.seen  # in-progress runs were visible
    assert fx.seen["live_rows"] > 0, fx.seen  # with metrics read from their run folders


# ---------------------------------------------------------------- AppTest helpers


def app(page: str | None = None, query: dict | None = None, errors_allowed: bool = False, **state) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=90)
    for k, v in state.items():
        at.session_state[k] = v
    if query:
        at.query_params.update(query)
    if page:
        at.switch_page(f"views/{page}.py")
    at.run()
    assert_ok(at, errors_allowed)
    return at


def assert_ok(at: AppTest, errors_allowed: bool = False) -> None:
    assert not at.exception, [e.message + "\n" + "\n".join(e.stack_trace[-6:]) for e in at.exception]
    if not errors_allowed:
        assert not at.error, [e.value for e in at.error]


def ok(x) -> AppTest:
    """Run the app after a widget change (``x``: the widget or the AppTest) and check it did not fail."""
    at = x.run()
    assert_ok(at)
    return at


def find(widgets, label):
    for w in widgets:
        if w.label == label:
            return w
    raise AssertionError(f"no widget {label!r} among {[w.label for w in widgets]}")


def text_tables(at: AppTest) -> list:
    """The plain tables of a page (abl.dashboard.common.text_table: HTML in markdown) as DataFrames of text."""
    import html as html_lib
    from html.parser import HTMLParser

    import pandas as pd

    class Cells(HTMLParser):
        def __init__(self):
            super().__init__()
            self.rows, self.cell = [], None

        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                self.rows.append([])
            elif tag in ("td", "th"):
                self.cell = ""

        def handle_endtag(self, tag):
            if tag in ("td", "th") and self.cell is not None:
                self.rows[-1].append(html_lib.unescape(self.cell).strip())
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell += data

    out = []
    for md in at.markdown:
        if "abl-text-table" in md.value:
            p = Cells()
            p.feed(md.value)
            out.append(pd.DataFrame(p.rows[1:], columns=p.rows[0]))
    return out


def cell_frame(at: AppTest):
    """The Compare page's per-cell numbers (mean, CI, rank, delta, p, verdict, health): the data of its per-cell
    chart, the numbers its text tables print."""
    return next(d for sp in vega(at) for d in sp["_data"].values() if "ci_lo" in d and "health" in d)


def vega(at: AppTest) -> list[dict]:
    """Each chart's spec, with its datasets as DataFrames under '_data'."""
    import altair as alt
    from streamlit import dataframe_util

    out = []
    for el in at.get("vega_lite_chart"):
        spec = json.loads(el.proto.spec)
        # the app skips Altair's schema check for speed; the tests keep every chart valid
        alt.utils.schemapi.validate_jsonschema(spec, alt.vegalite.v6.schema.core.load_schema())
        spec["_data"] = {d.name: dataframe_util.convert_arrow_bytes_to_pandas_df(d.data.data)
                         for d in el.proto.datasets}
        out.append(spec)
    return out


def text_of(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption] + [s.value for s in at.subheader]
    parts += [i.value for i in at.info] + [w.value for w in at.warning]
    return "\n".join(str(p) for p in parts)


def downloads(at: AppTest) -> list[str]:
    return [b.label for b in at.get("download_button")]


def _layers(spec: dict) -> list[dict]:
    if "layer" in spec:
        return spec["layer"]
    if "spec" in spec:
        return _layers(spec["spec"])
    return [spec]


# ---------------------------------------------------------------- pages


def test_runs_page_lists_varied_axes_and_final_metrics(fixture_store):
    at = app()
    assert [t.value for t in at.title] == ["Experiments & runs"]
    assert find(at.sidebar.multiselect, "Experiments").value == [EXPERIMENT]
    table = at.dataframe[-1].value
    assert len(table) == 8
    for col in ("cell", "model.norm", "model.block", "train.diverge_loss", "seed", "status", "progress",
                "val_loss", "train_loss", "tokens_per_s", "peak_mem_bytes", "n_params"):
        assert col in table.columns, table.columns
    done = table[table["status"] == "completed"]
    assert done["progress"].eq(1.0).all() and done["val_loss"].notna().all()
    db_vals = dict(fixture_store.sql(
        "SELECT run_id, arg_max(value, step) FROM metrics WHERE name = 'val_loss' GROUP BY run_id"))
    assert sorted(done["val_loss"].round(6)) == sorted(round(v, 6) for r, v in db_vals.items()
                                                        if r in set(done["run_id"]))
    assert set(table.loc[table["status"] == "diverged", "train.diverge_loss"]) == {"1.0"}
    # the diverged runs are listed with their error
    assert "did not complete (2)" in text_of(at) and "diverged at step 1" in text_of(at)
    assert {"Refresh"} <= {b.label for b in at.sidebar.button}
    assert "Download this table (CSV)" in downloads(at)
    ok(find(at.sidebar.toggle, "Live").set_value(True))  # re-reads the store every few seconds


def test_runs_page_one_row_per_cell(fixture_store):
    at = app()
    ok(find(at.get("button_group"), "Rows").set_value("one per cell (seeds aggregated)"))
    table = at.dataframe[-1].value
    assert len(table) == 4 and set(table["seeds"]) == {2}
    assert "val_loss ±95% CI" in table.columns


def test_sidebar_axis_filter_and_cell_selection_reach_every_page(fixture_store):
    at = app()
    ok(find(at.sidebar.multiselect, "model.norm").set_value(["layernorm"]))
    table = at.dataframe[-1].value
    assert len(table) == 2 and set(table["cell"]) == {"norm=layernorm, block=pre, diverge_loss=1000.0"}
    # cells picked for comparison restrict the other pages
    at = app()
    cells = find(at.sidebar.multiselect, "Cells to compare")
    keys = [k for k in cells.options]
    assert len(keys) == 4
    cell_keys = [r[0] for r in fixture_store.sql(
        "SELECT DISTINCT cell_key FROM runs WHERE status = 'completed' ORDER BY cell_key")][:2]
    ok(cells.set_value(cell_keys))
    ok(at.switch_page("views/compare.py"))
    table = cell_frame(at)
    assert len(table) == 2


def test_curves_page_mean_band_seeds_axes_and_smoothing(fixture_store):
    at = app("curves")
    assert [t.value for t in at.title] == ["Curves"]
    assert find(at.multiselect, "Metrics").value == ["train_loss", "val_loss"]
    x_axis = find(at.radio, "x axis")
    has_flops = bool(fixture_store.sql("SELECT 1 FROM metrics WHERE name = 'flops_per_step_measured' LIMIT 1"))
    assert x_axis.options == ["step", "tokens seen", *(["training FLOPs"] if has_flops else []), "wall time [s]"]
    specs = vega(at)
    assert len(specs) == 2
    marks = [layer["mark"]["type"] for layer in _layers(specs[0])]
    assert marks == ["line", "line"]  # 2 seeds: each seed's line and the mean, no CI band (a smear at n = 2)
    assert find(at.toggle, "95% CI band").value is False and find(at.toggle, "individual seeds").value is True
    assert len(downloads(at)) >= 4 and {"CSV", "PNG"} <= set(downloads(at))
    ok(find(at.toggle, "95% CI band").set_value(True))
    ok(find(at.toggle, "individual seeds").set_value(False))
    marks = [layer["mark"]["type"] for layer in _layers(vega(at)[0])]
    assert marks == ["area", "line"]  # CI band, mean line

    # raw (no EMA): the mean at step 1 is the mean of the seeds' train_loss at step 1
    # smoothing is off by default, labelled for the training loss, and never touches val_loss
    assert find(at.slider, "EMA smoothing of train_loss").value == 0.0
    data = next(iter(vega(at)[0]["_data"].values()))
    data = data[data["kind"] == "mean"]
    raw = fixture_store.sql("""
        SELECT r.label, avg(m.value), count(*) FROM metrics m JOIN runs r USING (run_id)
        WHERE m.name = 'train_loss' AND m.step = 1 AND r.status = 'completed' GROUP BY r.label""")
    for label, mean, n in raw:
        row = data[(data["cell"] == label) & (data["step"] == 1)]
        assert row["mean"].iloc[0] == pytest.approx(mean) and row["n"].iloc[0] == n
        assert row["lo"].iloc[0] < mean < row["hi"].iloc[0]

    ok(find(at.toggle, "individual seeds").set_value(True))
    ok(find(at.toggle, "log y").set_value(True))
    ok(x_axis.set_value("tokens"))
    spec = vega(at)[0]
    layers = _layers(spec)
    assert [layer["mark"]["type"] for layer in layers] == ["area", "line", "line"]
    detail = layers[1]["encoding"]["detail"]  # a line per seed (of each cell, on a factorial grid)
    assert "seed" in [d["field"] for d in (detail if isinstance(detail, list) else [detail])]
    assert layers[2]["encoding"]["y"]["scale"]["type"] == "log"
    mean = [d[d["kind"] == "mean"] for d in spec["_data"].values() if "mean" in d][0]
    assert (mean["x"] == mean["step"] * 4 * 32).all()  # tokens = step x batch_size x context
    if has_flops:  # FLOPs = step x the FLOPs of one training step
        ok(x_axis.set_value("flops"))
        per_step = dict(fixture_store.sql("SELECT r.label, avg(m.value) FROM metrics m JOIN runs r USING (run_id) "
                                          "WHERE m.name = 'flops_per_step_measured' GROUP BY r.label"))
        mean = [d[d["kind"] == "mean"] for d in vega(at)[0]["_data"].values() if "mean" in d][0]
        assert np.allclose(mean["x"], mean["step"] * mean["cell"].map(per_step))


def test_compare_page_cis_tests_and_facets(fixture_store):
    at = app("compare")
    assert [t.value for t in at.title] == ["Compare"]
    assert find(at.selectbox, "Metric").value == "val_loss"
    ok(find(at.toggle, "Holm correction").set_value(False))
    baseline = find(at.selectbox, "Baseline cell")
    assert_ok(at)
    table = cell_frame(at)
    assert len(table) == 3  # the diverged cell has no completed run
    assert list(table["mean"]) == sorted(table["mean"])  # best first
    # the numbers, recomputed from the store with scipy
    import pandas as pd
    from scipy import stats as sps

    vals: dict[str, dict[int, float]] = {}
    for label, seed, v in fixture_store.sql("""
            SELECT r.label, r.seed, arg_max(m.value, m.step) FROM metrics m JOIN runs r USING (run_id)
            WHERE m.name = 'val_loss' AND r.status = 'completed' GROUP BY r.run_id, r.label, r.seed
            ORDER BY r.seed"""):
        vals.setdefault(label, {})[seed] = v
    stuck = {lbl for (lbl,) in fixture_store.sql(
        "SELECT DISTINCT r.label FROM runs r JOIN metrics m USING (run_id) "
        "WHERE m.name = 'did_not_learn' AND m.value = 1 AND r.status = 'completed'")}
    base_label = table.loc[table["verdict"] == "baseline", "cell"].iloc[0]
    base = vals[base_label]
    for _, row in table.iterrows():
        x = np.array(list(vals[row["cell"]].values()))
        lo, hi = sps.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=sps.sem(x))
        assert row["mean"] == pytest.approx(x.mean()) and row["ci_lo"] == pytest.approx(lo)
        assert row["ci_hi"] == pytest.approx(hi)
        if row["cell"] in stuck:  # at the unigram floor after 16 steps: not ranked, not tested
            assert row["health"].startswith("did not learn") and pd.isna(row["rank"])
        if row["cell"] != base_label and (row["cell"] in stuck or base_label in stuck):
            assert row["verdict"].startswith("did not learn") and pd.isna(row["p"])
        elif row["cell"] != base_label:
            cell = vals[row["cell"]]
            if set(cell) == set(base):  # same seeds, same data: paired by seed
                p = sps.ttest_rel([cell[s] for s in sorted(base)], [base[s] for s in sorted(base)]).pvalue
            else:
                p = sps.ttest_ind(list(cell.values()), list(base.values()), equal_var=False).pvalue
            assert row["p"] == pytest.approx(p)
            assert row["delta"] == pytest.approx(x.mean() - np.mean(list(base.values())))
            assert row["verdict"].startswith("too few seeds to decide")  # 2 seeds
    assert "Welch" in text_of(at) and "no multiple-comparison correction" in text_of(at)
    assert "did not learn" in text_of(at) or not stuck
    specs = vega(at)
    assert len(specs) >= 1  # per-axis effects, the per-cell CIs, the differences that can decide
    assert {"CSV", "PNG"} <= set(downloads(at))

    # another baseline, Holm back on
    other = [k for (k,) in fixture_store.sql("SELECT DISTINCT cell_key FROM runs WHERE status = 'completed'")
             if k != baseline.value][0]
    ok(baseline.set_value(other))
    assert at.session_state["baseline"] == other
    ok(find(at.toggle, "Holm correction").set_value(True))
    text = text_of(at)  # Holm on: over the comparisons with a p-value, or none to correct (issue 26 footer)
    assert "Holm correction over the" in text or "none is corrected (Holm)" in text

    # chosen pairs and one axis: the same engine
    ok(find(at.radio, "Comparisons").set_value("by"))
    assert "every pair of cells that differ in" in text_of(at)
    ok(find(at.radio, "Comparisons").set_value("baseline"))

    # group by one axis, facet by another
    ok(find(at.selectbox, "Group by").set_value("model.norm"))
    ok(find(at.selectbox, "Facet by").set_value("model.block"))
    spec = next(sp for sp in vega(at) if "vconcat" in sp)  # the per-cell chart: one panel per block layout
    assert all(panel["title"].startswith("model.block = ") for panel in spec["vconcat"])


def test_tradeoffs_page_pareto_fronts(fixture_store):
    at = app("tradeoffs")
    assert [t.value for t in at.title] == ["Trade-offs"]
    heads = {s.value for s in at.subheader}
    from abl.analysis.metrics import metric

    # readable names from the metric catalogue, not raw ones (issue 40 item 11)
    assert heads == {f"{metric('val_loss').label} vs {metric(c).label}"
                     for c in ("tokens_per_s", "peak_mem_bytes", "kv_bytes_per_token", "n_params")}
    costs = ("tokens_per_s", "peak_mem_bytes", "kv_bytes_per_token", "n_params")
    recorded = [c for c in costs if fixture_store.sql("SELECT 1 FROM metrics WHERE name = ? LIMIT 1", [c])]
    for c in set(costs) - set(recorded):
        assert f"No run of the selection records {c} yet" in text_of(at)
    # a cost every cell shares within 5% (abl.analysis.sections.differs) is a sentence, not a plot; speed is always drawn
    same = [c for c in recorded if f"Every cell shown has the same {c}" in text_of(at)]
    assert "tokens_per_s" not in same
    specs = vega(at)
    assert len(specs) == len(recorded) - len(same) >= 1 and len(recorded) >= 3
    for spec in specs:
        pts = [d for d in spec["_data"].values() if "front" in d and len(d) == 3][0]
        front = pts[pts["front"]]
        # a speed measured on a contended machine never enters the front (this store's runs trained on a
        # busy CI machine may all be): the front is over the quiet cells only
        quiet = pts[pts["x_front"].notna()] if "x_front" in pts else pts
        assert len(front) >= (1 if len(quiet) else 0) and set(front.index) <= set(quiet.index)
        # nothing on the front is dominated (lower y; lower x, or higher for throughput)
        higher = spec["layer"][0]["mark"].get("interpolate") == "step-before"
        for _, a in front.iterrows():
            for _, b in pts.iterrows():
                better_x = b["x"] > a["x"] if higher else b["x"] < a["x"]
                assert not (b["y"] < a["y"] and better_x)
    ok(find(at.toggle, "one point per run").set_value(True))
    assert max(len(d) for d in vega(at)[0]["_data"].values()) == 6


def test_costs_page_predicted_vs_measured(fixture_store):
    """The page shows abl report's cost rows for the selection, every check listed."""
    at = app("costs")
    assert [t.value for t in at.title] == ["Costs & scaling"]
    assert_ok(at)
    table = at.dataframe[0].value
    n_cells = fixture_store.sql("SELECT count(DISTINCT cell_key) FROM runs WHERE experiment = ?", [EXPERIMENT])[0][0]
    assert len(table) == 4 * n_cells  # params, non-embedding params, FLOPs/step, peak memory
    params = table[table["figure"] == "n_params"]
    # the diverged cell has no completed run, so nothing measured to compare
    assert set(params["agreement"]) == {"agrees (exact)", "not measured"}
    params = params.dropna(subset=["measured"])
    assert len(params) == 3
    counted = dict(fixture_store.sql(
        "SELECT r.label, max(m.value) FROM runs r JOIN metrics m USING (run_id) "
        "WHERE m.name = 'n_params' AND r.experiment = ? GROUP BY r.label", [EXPERIMENT]))
    for row in params.itertuples():
        assert row.measured == counted[row.cell]
    mem = table[table["figure"] == "train_peak_bytes"].dropna(subset=["measured"])
    assert len(mem) == 3 and (mem["measured"] > 0).all()  # the three cells that completed
    verdicts = set(table["agreement"])
    if any(v.startswith("DISAGREES") for v in verdicts):
        assert "disagree" in text_of(at)
    elif "not measured" in verdicts:  # never a green "all agree" over checks that were not compared
        assert not at.success
        assert any("Every compared check agrees" in w.value and "but" in w.value for w in at.warning)
    else:
        assert [s.value for s in at.success]
    assert "Scaling fit" in {s.value for s in at.subheader}


def _store_copy(fixture_store, tmp_path, monkeypatch) -> Path:
    db = tmp_path / "abl.duckdb"
    shutil.copy(fixture_store.db, db)
    monkeypatch.setenv("ABL_DB", str(db))
    return db


def test_kernels_page_without_a_bench_table(fixture_store, tmp_path, monkeypatch):
    db = _store_copy(fixture_store, tmp_path, monkeypatch)
    with duckdb.connect(str(db)) as con:  # a store from before the bench table existed
        con.execute("DROP TABLE IF EXISTS bench")
    at = app("kernels")
    assert "No kernel benchmarks in this store yet" in text_of(at)
    assert not at.get("vega_lite_chart")


def test_kernels_page_with_bench_rows(fixture_store, tmp_path, monkeypatch):
    db = _store_copy(fixture_store, tmp_path, monkeypatch)
    at = app("kernels")  # the table exists (migrations create it) but is empty
    assert "The bench table is empty" in text_of(at)
    rows = []
    for bench_id, created, speedup in (("old", "2026-01-01 10:00:00", 9.0), ("new", "2026-02-01 10:00:00", 2.5)):
        for shape, scale in (("B8-T1024-D768", 1.0), ("B8-T4096-D768", 4.0)):
            for provider, speed in (("torch", 1.0), ("triton", speedup)):
                for p in ("fwd", "bwd"):
                    t = 0.1 * scale / speed * (2 if p == "bwd" else 1)
                    gbps = 1500 * speed
                    rows.append({"bench_id": bench_id, "created": created, "op": "rmsnorm", "provider": provider,
                                 "shape": shape, "dtype": "bf16", "pass": p, "p20": t * 0.95, "p50": t,
                                 "p80": t * 1.1, "gbps": gbps, "tflops": None, "peak_fraction": gbps / 3350,
                                 "peak_basis": "datasheet (h100)", "device": "NVIDIA H100 80GB HBM3",
                                 "versions": '{"triton": "3.3"}'})
    with duckdb.connect(str(db)) as con:
        cols = list(rows[0])
        con.executemany(f"INSERT INTO bench ({', '.join(chr(34) + c + chr(34) for c in cols)}) VALUES "
                        f"({', '.join('?' for _ in cols)})", [list(r.values()) for r in rows])
    at = app("kernels")
    session = find(at.selectbox, "Benchmark run")
    assert session.value == "new"  # the latest run first
    assert find(at.selectbox, "Op").value == "rmsnorm"
    specs = vega(at)
    assert len(specs) == 3  # providers side by side, speed-up, fraction of peak
    assert _layers(specs[0])[0]["encoding"]["xOffset"]["field"] == "provider"
    cases = [d for d in specs[0]["_data"].values() if "case" in d][0]
    assert set(cases["case"]) == {f"{s} · {p}" for s in ("B8-T1024-D768", "B8-T4096-D768") for p in ("fwd", "bwd")}
    speed = [d for d in specs[1]["_data"].values() if "speedup" in d][0]
    assert set(speed.loc[speed["provider"] == "triton", "speedup"].round(6)) == {2.5}
    frac = [d for d in specs[2]["_data"].values() if "peak_fraction" in d][0]
    assert frac["peak_fraction"].max() == pytest.approx(3750 / 3350)
    assert "datasheet (h100)" in text_of(at)
    # own peak figures instead of the recorded ones
    ok(find(at.toggle, "use my own peak figures").set_value(True))
    ok(find(at.number_input, "peak bandwidth [GB/s]").set_value(7500.0))
    frac = [d for d in vega(at)[2]["_data"].values() if "peak_fraction" in d][0]
    assert frac["peak_fraction"].max() == pytest.approx(0.5)


def test_run_detail_shows_error_config_diff_environment_and_metrics(fixture_store):
    run_id, cell = fixture_store.sql("SELECT run_id, cell_key FROM runs WHERE status = 'diverged' LIMIT 1")[0]
    base = fixture_store.sql("SELECT cell_key FROM runs WHERE status = 'completed' AND label = "
                             "'norm=rmsnorm, block=pre, diverge_loss=1000.0' LIMIT 1")[0][0]
    at = app("run_detail", query={"run": run_id}, errors_allowed=True, baseline=base)
    assert find(at.selectbox, "Run").value == run_id
    assert [e.value for e in at.error] == ["**diverged:** diverged at step 1: train_loss=" +
                                           at.error[0].value.rsplit("=", 1)[1]]
    assert [t.label for t in at.tabs] == ["Metrics", "Config", "Diff vs baseline", "Environment", "Run folder"]
    assert find(at.selectbox, "Baseline cell").value == base
    frames = text_tables(at)
    diff = next(f for f in frames if list(f.columns) == ["path", "this run", "baseline"])
    assert list(diff["path"]) == ["train.diverge_loss"]
    env = next(f for f in frames if "value" in f.columns and "device" in set(f.iloc[:, 0]))
    facts = dict(zip(env.iloc[:, 0], env["value"]))
    assert facts["device"] and facts["git commit"] != "–"
    summary = next(f for f in frames if "final" in f.columns and "metric" in f.columns)
    assert "train_loss" in set(summary["metric"])
    # every figure in its unit: a parameter count with separators, memory in MiB (not 268231000)
    by_name = dict(zip(summary["metric"], summary["final"]))
    if "n_params" in by_name:
        assert "," in by_name["n_params"] or float(by_name["n_params"]) < 1000
    if "peak_mem_bytes" in by_name:
        assert by_name["peak_mem_bytes"].endswith("iB"), by_name["peak_mem_bytes"]
    assert at.get("json")  # the full config

    # a completed run: its metric chart
    ok = fixture_store.sql("SELECT run_id FROM runs WHERE status = 'completed' LIMIT 1")[0][0]
    at = app("run_detail", query={"run": ok})
    spec = vega(at)[0]
    data = next(iter(spec["_data"].values()))
    assert len(data) == 16  # train_loss at every step
    assert "All metrics of this run (CSV, long format)" in downloads(at)


def test_running_runs_show_progress_from_their_run_folder(fixture_store, tmp_path, monkeypatch):
    """What abl run does when a cell starts: ingest it as running, then the worker appends metrics."""
    db = tmp_path / "abl.duckdb"
    shutil.copy(fixture_store.db, db)
    src_id = fixture_store.sql("SELECT run_id FROM runs WHERE status = 'completed' LIMIT 1")[0][0]
    src = fixture_store.runs_dir / src_id
    config = json.loads((src / "config.json").read_text())
    config["seed"] = 7
    run_dir = tmp_path / "runs" / run_id_of(config)  # named by its run id, as the worker's folder is
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(config))
    shutil.copy(src / "meta.json", run_dir / "meta.json")
    (run_dir / "status.json").write_text(json.dumps({"status": "running", "started": time.time()}))
    (run_dir / "metrics.jsonl").write_text("")
    con = abl_store.open_store(db)
    abl_store.ingest_run(con, run_dir, "running")
    con.close()
    lines = (src / "metrics.jsonl").read_text().splitlines()
    partial = [ln for ln in lines if '"train_loss"' in ln][:6]
    (run_dir / "metrics.jsonl").write_text("\n".join(partial) + '\n{"step": 7, "train_lo')  # a torn last line
    monkeypatch.setenv("ABL_DB", str(db))
    monkeypatch.setenv("ABL_RUNS_DIR", str(tmp_path / "runs"))

    at = app()
    assert "1 run(s) in progress" in text_of(at)
    table = at.dataframe[-1].value
    row = table[table["run_id"] == run_dir.name].iloc[0]
    assert row["status"] == "running" and row["progress"] == pytest.approx(6 / 16)
    assert "updated" in row["activity"]
    ok(at.switch_page("views/curves.py"))
    data = next(iter(vega(at)[0]["_data"].values()))
    data = data[data["kind"] == "mean"]  # the seeds' own lines are in the same frame
    label = row["cell"]
    n_by_step = dict(zip(data.loc[data["cell"] == label, "step"], data.loc[data["cell"] == label, "n"]))
    assert n_by_step[1] == 3 and n_by_step[16] == 2  # the running seed joins its cell's mean so far


def test_chart_png_and_csv_exports(fixture_store):
    at = app("compare")
    labels = downloads(at)
    assert labels.count("CSV") == labels.count("PNG") == len(at.get("vega_lite_chart"))
    import altair as alt
    import pandas as pd

    chart = dash_charts.compare_chart(
        pd.DataFrame({"cell": ["a", "b"], "mean": [1.0, 2.0], "ci_lo": [0.9, 1.8], "ci_hi": [1.1, 2.2], "n": [2, 2],
                      "marker": ["baseline", "*"], "significance": ["baseline", "worse"], "baseline": [1.0, 1.0]}),
        "cell", None, "val_loss", "significance", None, ["a", "b"], 1.0)
    assert isinstance(chart, alt.TopLevelMixin)
    png = dash_charts.png_bytes(chart)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


# ---------------------------------------------------------------- abl dashboard, served


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net shows them) with a socket listening on ``port``."""
    out = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            addr, hexport = fields[1].rsplit(":", 1)
            if int(hexport, 16) == port and fields[3] == "0A":
                out.append(addr)
    return out


@pytest.fixture(scope="module")
def server(fixture_store, tmp_path_factory):
    """``abl dashboard`` on a free port (default host), stopped at the end."""
    port = _free_port()
    log = tmp_path_factory.mktemp("dash_server") / "server.log"
    out = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "abl.cli", "dashboard", "--db", str(fixture_store.db),
                             "--port", str(port)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    from abl.dashboard import snapshot  # the same wait and stop as abl dashboard --snapshot

    try:
        try:
            snapshot.wait_healthy(url, proc)
        except snapshot.SnapshotError:
            raise AssertionError(f"abl dashboard did not start:\n{log.read_text()[-3000:]}") from None
        yield url, port, proc
    finally:
        snapshot.stop(proc)
        out.close()


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net to see listening sockets")
def test_served_dashboard_listens_on_loopback_only(server):
    url, port, proc = server
    addrs = _listening(port)
    assert addrs, "nothing listens on the dashboard's port"
    loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1
    assert set(addrs) <= loopback, addrs


# true once at least n Vega charts have drawn their marks (svg or canvas renderer) at a real size
RENDERED_CHARTS = """n => [...document.querySelectorAll('[data-testid=stVegaLiteChart]')].filter(el => {
    const svg = el.querySelector('svg.marks'), canvas = el.querySelector('canvas');
    if (svg) return svg.clientWidth > 200 && svg.clientHeight > 100 && svg.querySelectorAll('path').length > 3;
    return canvas !== null && canvas.width > 200 && canvas.height > 100;
}).length >= n"""


def visible(page, text: str) -> None:
    """Wait until some element showing ``text`` is visible (Streamlit keeps stale copies while it reruns)."""
    page.get_by_text(text).filter(visible=True).first.wait_for(timeout=30_000)


def _chromium() -> str | None:
    return shutil.which("chromium")  # Debian's package (apt-get install chromium)


@pytest.mark.skipif(_chromium() is None,
                    reason="Debian's chromium is not installed (apt-get install chromium); CI installs it")
def test_browser_renders_the_charts(server, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the snapshot and dev extras")
    url, port, proc = server
    shots = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=_chromium(), args=CHROMIUM_FLAGS, headless=True,
            viewport={"width": 1440, "height": 1400}, accept_downloads=True)
        try:
            page = browser.new_page()
            page.goto(url, wait_until="domcontentloaded")
            page.get_by_role("heading", name="Experiments & runs").wait_for(timeout=60_000)
            page.locator('[data-testid="stDataFrame"] >> visible=true').first.wait_for(timeout=60_000)
            visible(page, EXPERIMENT)

            page.get_by_role("link", name="Compare").click()
            page.get_by_role("heading", name="Compare").wait_for(timeout=60_000)
            visible(page, "Baseline cell")
            # the answer leads; per-cell charts that cannot decide stay folded (issue 40, item 1)
            page.wait_for_function(RENDERED_CHARTS, arg=1, timeout=60_000)
            visible(page, "Welch's t-test")
            assert page.locator('[data-testid="stException"]').count() == 0
            assert page.locator('[data-testid="stVegaLiteChart"]').count() >= 1  # the charts that can decide here
            page.wait_for_timeout(1000)  # let vega finish its transitions
            shots.append(tmp_path / "compare.png")
            page.screenshot(path=str(shots[-1]), full_page=True)

            # the first chart's downloads: its data as CSV, the chart as PNG (rendered on the click)
            with page.expect_download(timeout=60_000) as dl:
                page.locator(".st-key-dl_csv_compare button").first.click()
            csv = Path(dl.value.path()).read_text()
            assert csv.splitlines()[0].startswith(("cell,", "rank,cell,", "rank,rank_text,cell,")) and len(csv.splitlines()) == 4  # header + 3 cells
            assert dl.value.suggested_filename == "compare_val_loss.csv"
            with page.expect_download(timeout=60_000) as dl:
                page.locator(".st-key-dl_png_compare button").first.click()
            assert Path(dl.value.path()).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

            page.goto(f"{url}/curves", wait_until="domcontentloaded")
            page.get_by_role("heading", name="Curves").wait_for(timeout=60_000)
            page.wait_for_function(RENDERED_CHARTS, arg=2, timeout=60_000)
            visible(page, "EMA smoothing")
            assert page.locator('[data-testid="stException"]').count() == 0
            page.wait_for_timeout(1000)
            shots.append(tmp_path / "curves.png")
            page.screenshot(path=str(shots[-1]), full_page=True)
        finally:
            browser.close()
    for shot in shots:
        assert shot.stat().st_size > 20_000
        print(f"screenshot: {shot}")
