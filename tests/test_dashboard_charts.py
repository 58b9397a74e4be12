"""What a researcher sees, on a norms-shaped store (13 cells x 2 seeds, built in place, no training).

The chart specs the pages send (CI bands only from 3 seeds, one distinct
colour per cell, legends below the plot and never cut, contended runs
marked), the Run detail figures (a table: no value cut), and the bad input of
``abl dashboard --snapshot``.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, chart_specs, dashboard_app

pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install 'abl[dashboard]'")
from streamlit.testing.v1 import AppTest  # noqa: E402

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent / "dashboard"))
import norms_store  # noqa: E402
import pandas as pd  # noqa: E402

from abl.dashboard import charts  # noqa: E402
from abl.grid import labels as abl_labels  # noqa: E402
from abl.present import palette  # noqa: E402

CONTENDED_CELLS = {(n, b) for n, b, _ in norms_store.CONTENDED}


@pytest.fixture(scope="module")
def norms2(tmp_path_factory) -> Path:
    return norms_store.build(tmp_path_factory.mktemp("norms2"))


@pytest.fixture(scope="module")
def norms3(tmp_path_factory) -> Path:
    return norms_store.build(tmp_path_factory.mktemp("norms3"), seeds=(0, 1, 2))


def layers(spec: dict) -> list[dict]:
    return spec.get("layer") or layers(spec["spec"]) if "spec" in spec or "layer" in spec else [spec]


def marks(spec: dict) -> list[str]:
    return [m["mark"]["type"] if isinstance(m["mark"], dict) else m["mark"] for m in layers(spec)]


def toggle(at: AppTest, label: str):
    return next(t for t in at.toggle if t.label == label)


def expected_labels() -> set[str]:
    configs = {f"{n}/{b}": norms_store.config(n, b, 0) for n, b in norms_store.cells()}
    stored = {f"{n}/{b}": f"norm={n}, block={b}" for n, b in norms_store.cells()}
    out = set(abl_labels.cell_labels(configs, norms_store.GRID_PATHS, stored).values())
    assert len(out) == 13 and "norm=none, block=pre" in out
    return out


# ---------------------------------------------------------------- Curves


def test_curves_with_two_seeds_draw_seed_lines_not_bands(norms2, monkeypatch):
    at = dashboard_app(norms2, monkeypatch, "curves")
    assert toggle(at, "95% CI band").value is False
    assert toggle(at, "individual seeds").value is True
    spec = chart_specs(at)[0]
    assert "area" not in marks(spec) and marks(spec).count("line") == 2  # seeds (faint), mean
    seed_layer = layers(spec)[0]
    detail = seed_layer["encoding"]["detail"]  # a line per seed (of each cell, on a factorial grid)
    assert "seed" in [d["field"] for d in (detail if isinstance(detail, list) else [detail])]
    assert seed_layer["encoding"]["opacity"]["value"] < 1  # faint (the unselected value is fainter still)
    assert any("bands are off" in c.value for c in at.caption)
    # the toggle brings the band back
    toggle(at, "95% CI band").set_value(True)
    at.run()
    assert "area" in marks(chart_specs(at)[0])


def test_curves_with_three_seeds_draw_bands(norms3, monkeypatch):
    at = dashboard_app(norms3, monkeypatch, "curves")
    assert toggle(at, "95% CI band").value is True
    assert toggle(at, "individual seeds").value is False
    assert marks(chart_specs(at)[0]) == ["area", "line"]


def test_curves_colours_legend_and_labels(norms2, monkeypatch):
    """Issue 40 item 2: a factorial grid's curves take one channel per axis, colour for the norm and line
    style for the block layout (abl.present.palette.grid_styles), a legend of 4 + 4 entries, not 13."""
    at = dashboard_app(norms2, monkeypatch, "curves")
    for spec in chart_specs(at):
        enc = layers(spec)[-1]["encoding"]
        color, dash = enc["color"], enc["strokeDash"]
        assert color["field"] == "colour_level" and color["title"] == "model.norm"
        assert dash["field"] == "form_level" and dash["title"] == "model.block"
        assert color["scale"]["domain"] == norms_store.NORMS and dash["scale"]["domain"] == norms_store.BLOCKS
        colours, dashes = color["scale"]["range"], dash["scale"]["range"]
        assert len(set(colours)) == 4 and set(colours) <= set(palette.COLOURS)  # colour-blind safe
        assert len({tuple(d) for d in dashes}) == 4
        assert enc["detail"]["field"] == "cell"  # still one line per cell
        data = next(d for d in spec["_data"].values() if "kind" in d)
        mean = data[data["kind"] == "mean"].drop_duplicates("cell")
        assert len(mean) == 13 and len({(a, b) for a, b in zip(mean["colour_level"], mean["form_level"])}) == 13
        assert set(mean["cell"]) <= expected_labels()
        legend = color["legend"]
        assert legend["orient"] == "bottom" and legend["labelLimit"] == 0  # outside the plot, never cut
        x_axis = layers(spec)[-1]["encoding"]["x"]["axis"]
        assert x_axis["labelOverlap"] is True and x_axis["labelAngle"] == 0


def _by_metric(at: AppTest) -> dict[str, dict]:
    """The Curves page's charts by metric (their y titles are the catalogue's titles, "val loss [nats/token]")."""
    from abl.analysis.metrics import metric

    names = {metric(m).title: m for m in ("train_loss", "val_loss")}
    return {names.get(t, t): sp for sp in chart_specs(at) for t in [layers(sp)[-1]["encoding"]["y"]["title"]]}


def test_val_loss_is_drawn_raw_and_the_axis_holds_every_final_value(norms2, monkeypatch):
    """An EMA of 0.6 on val_loss ended the best line near 2.84 with its final value 2.747, off the axis."""
    import duckdb

    con = duckdb.connect(str(norms2), read_only=True)
    finals = dict(con.sql("SELECT r.label, avg(m.value) FROM metrics m JOIN runs r USING (run_id) "
                          "WHERE m.name = 'val_loss' AND m.step = 200 GROUP BY r.label").fetchall())
    raw_train = dict(con.sql("SELECT r.label, avg(m.value) FROM metrics m JOIN runs r USING (run_id) "
                             "WHERE m.name = 'train_loss' AND m.step = 101 GROUP BY r.label").fetchall())
    con.close()
    at = dashboard_app(norms2, monkeypatch, "curves")
    assert next(s for s in at.slider if s.label.startswith("EMA smoothing")).value == 0.0  # off by default
    next(s for s in at.slider if s.label.startswith("EMA smoothing")).set_value(0.8)
    at.run()
    charts_ = _by_metric(at)
    val = charts_["val_loss"]
    data = next(d for d in val["_data"].values() if "kind" in d)
    mean = data[data["kind"] == "mean"]
    last = mean[mean["step"] == 200].set_index("cell")["mean"]
    assert len(last) == 13
    for label, v in last.items():
        assert v == pytest.approx(finals[label])  # the line ends at the tables' number
    lo, hi = layers(val)[-1]["encoding"]["y"]["scale"]["domain"]
    assert lo <= min(finals.values()) and hi >= max(finals.values())
    # the training loss is smoothed at 0.8 (its line is not the raw mean) and its caption says so
    train = next(d for d in charts_["train_loss"]["_data"].values() if "kind" in d)
    tm = train[(train["kind"] == "mean") & (train["step"] == 101)].set_index("cell")["mean"]
    assert any(abs(tm[k] - raw_train[k]) > 1e-3 for k in tm.index)
    captions = " ".join(c.value for c in at.caption)
    assert "train_loss smoothed: EMA 0.80" in captions and "raw values (no smoothing)" in captions


def test_the_y_axis_spans_what_is_drawn_not_the_hidden_bands(norms2, monkeypatch):
    """With 2 seeds the bands are off, yet the axis made room for them: the t(1) interval of a spiky early
    train_loss stretched a real run's axis to [-5, 15] around lines between 2 and 6 (a loss below zero).
    The axis spans the lines drawn (means, seeds) and the final values, and the band only when it is on."""
    at = dashboard_app(norms2, monkeypatch, "curves")
    for metric, spec in _by_metric(at).items():
        data = next(d for d in spec["_data"].values() if "kind" in d)
        drawn = pd.concat([data[data["kind"] == "mean"]["mean"], data[data["kind"] == "seed"]["y"]]).dropna()
        lo, hi = layers(spec)[-1]["encoding"]["y"]["scale"]["domain"]
        span = float(drawn.max() - drawn.min())
        assert lo >= float(drawn.min()) - 0.1 * span - 1e-9, (metric, lo, float(drawn.min()))
        assert hi <= float(drawn.max()) + 0.1 * span + 1e-9, (metric, hi, float(drawn.max()))
    toggle(at, "95% CI band").set_value(True)  # the band drawn: the axis holds it
    at.run()
    spec = _by_metric(at)["train_loss"]
    band = next(d for d in spec["_data"].values() if "kind" in d)
    lo, hi = layers(spec)[-1]["encoding"]["y"]["scale"]["domain"]
    assert lo <= float(band["lo"].min()) and hi >= float(band["hi"].max())


def _colour_of(spec: dict) -> dict[str, tuple]:
    """Each cell's (colour, line style or marker) as a chart draws it: through the levels of a factorial
    grid's channels."""
    for layer in layers(spec):
        enc = layer.get("encoding", {})
        color = enc.get("color", {})
        form = enc.get("strokeDash") or enc.get("shape")
        if color.get("field") == "colour_level" and "range" in color.get("scale", {}) and form:
            colours = dict(zip(color["scale"]["domain"], color["scale"]["range"]))
            forms = dict(zip(form["scale"]["domain"], form["scale"]["range"]))
            data = max((d for d in spec["_data"].values() if "colour_level" in d), key=len)
            return {c: (colours[a], forms.get(b) if isinstance(forms.get(b), str) else
                        palette.VEGA_SHAPES[[tuple(x) for x in forms.values()].index(tuple(forms[b]))])
                    for c, a, b in zip(data["cell"], data["colour_level"], data["form_level"])}
    raise AssertionError("no colour per level")


def test_one_cell_one_colour_on_every_page(norms2, monkeypatch):
    """Curves ranked the cells, Trade-offs kept the grid's order: a cell changed colour between pages. Its
    colour is its grid position's (the order its first run started), on every page."""
    curves = _colour_of(chart_specs(dashboard_app(norms2, monkeypatch, "curves"))[0])
    trade = _colour_of(chart_specs(dashboard_app(norms2, monkeypatch, "tradeoffs"))[0])
    assert set(curves) == set(trade) and len(curves) == 13
    # the same colour and the same form index (line style on Curves, marker on Trade-offs) for every cell
    assert {c: v[0] for c, v in curves.items()} == {c: v[0] for c, v in trade.items()}
    assert {c: v[1] for c, v in curves.items()} == {c: v[1] for c, v in trade.items()}
    assert len(set(curves.values())) == 13
    for lbl, (colour, _) in curves.items():  # the norm's colour, by its place in the grid file
        norm, _block = _cell_of(lbl)
        assert colour == palette.COLOURS[norms_store.NORMS.index(norm)]


def test_more_cells_than_colours_are_faceted_by_the_first_axis():
    n = charts.MAX_COLOURS + 1
    mean = pd.DataFrame({"cell": [f"c{i}" for i in range(n)], "x": 1.0, "mean": 2.0, "lo": 1.5, "hi": 2.5,
                         "n": 2, "step": 1, "norm": [f"n{i % 3}" for i in range(n)]})
    spec = charts.curve_chart(mean, None, "step", "loss", band=False, facet="norm").to_dict()
    assert spec["facet"]["field"] == "norm"
    few = charts.curve_chart(mean.head(5), None, "step", "loss", band=False, facet="norm").to_dict()
    assert "facet" not in few
    assert few["layer"][-1]["encoding"]["color"]["scale"]["range"] == list(palette.COLOURS[:5])


# ---------------------------------------------------------------- contention


def _cell_of(label: str) -> tuple[str, str]:
    parts = dict(p.split("=", 1) for p in label.split(", "))
    return parts["norm"], parts.get("block", "pre")


def test_tradeoffs_ring_contended_cells_and_show_the_speed_spread(norms2, monkeypatch):
    at = dashboard_app(norms2, monkeypatch, "tradeoffs")
    speed = chart_specs(at)[0]  # val_loss vs tokens_per_s
    rings = [m for m in layers(speed) if m["encoding"].get("stroke", {}).get("field") == "speed"]
    assert len(rings) == 1
    ring = rings[0]
    assert ring["mark"]["filled"] is False
    assert ring["encoding"]["stroke"]["scale"] == {"domain": ["contended"], "range": [charts.CONTENDED_COLOUR]}
    assert {"filter": "datum.contended"} in ring["transform"]
    data = next(d for d in speed["_data"].values() if "contended" in d and len(d) == 13)
    ringed = {_cell_of(c) for c in data.loc[data["contended"], "cell"]}
    assert ringed == CONTENDED_CELLS
    # two seeds: the min-max of tokens/s per cell, drawn as a horizontal bar
    assert (data["x_lo"] <= data["x"]).all() and (data["x"] <= data["x_hi"]).all()
    assert (data["x_hi"] > data["x_lo"]).all()
    # a cell's speed is its runs on a quiet machine (rmsnorm/post: seed 0 quiet, seed 1 contended and slower),
    # and a cell with no quiet run is never on the Pareto front
    by_cell = {_cell_of(c): row for c, row in zip(data["cell"], data.to_dict("records"))}
    assert by_cell[("rmsnorm", "post")]["x"] == pytest.approx(by_cell[("rmsnorm", "post")]["x_hi"])
    assert by_cell[("scalenorm", "sandwich")]["front"] is False or not by_cell[("scalenorm", "sandwich")]["front"]
    assert all(not row["front"] or row["x_front"] == row["x_front"] for row in by_cell.values())  # not NaN
    assert any(m["encoding"].get("x", {}).get("field") == "x_lo" and "x2" in m["encoding"] for m in layers(speed))
    assert any("Red rings" in c.value for c in at.caption)
    # a cost that is not a speed is never marked; one that every cell shares within 5% (the store's
    # parameters, 215,872 + 64 i) is a sentence, not a plot
    for other in chart_specs(at)[1:]:
        assert not [m for m in layers(other) if "stroke" in m.get("encoding", {})]
    assert any("Every cell shown has the same n_params" in i.value for i in at.info)


def test_tradeoffs_tell_every_cell_apart_past_the_nine_colours(norms2, monkeypatch):
    """A real 13-cell norms run showed two cells per colour on Trade-offs with the same round marker (the
    marker encoded the Pareto front): past the palette's nine colours a point is told apart by its cell's
    marker (abl.present.palette), and the Pareto front by a heavy outline."""
    at = dashboard_app(norms2, monkeypatch, "tradeoffs")
    for spec in chart_specs(at):
        pts = next(m for m in layers(spec) if m["mark"]["type"] == "point" and "shape" in m["encoding"])
        enc = pts["encoding"]
        colours = dict(zip(enc["color"]["scale"]["domain"], enc["color"]["scale"]["range"]))
        shapes = dict(zip(enc["shape"]["scale"]["domain"], enc["shape"]["scale"]["range"]))
        # a factorial grid: colour for the norm, marker for the block layout (issue 40 item 2)
        assert enc["color"]["field"] == "colour_level" and enc["shape"]["field"] == "form_level"
        assert len(colours) == len(shapes) == 4
        data = max((d for d in spec["_data"].values() if "colour_level" in d), key=len)  # the points, not the front
        assert len({(colours[a], shapes[b]) for a, b in zip(data["colour_level"], data["form_level"])}) == 13
        assert "datum.front" in json.dumps(enc["strokeWidth"])  # the front: a heavier outline


def test_runs_table_flags_contended_runs(norms2, monkeypatch):
    at = dashboard_app(norms2, monkeypatch, "experiments")
    table = at.dataframe[-1].value
    flagged = {(n, b, int(s)) for n, b, s, c in zip(table["model.norm"], table["model.block"], table["seed"],
                                                    table["contended"]) if c}
    assert flagged == norms_store.CONTENDED
    assert any("contended" in c.value for c in at.caption)
    next(s for s in at.get("button_group") if s.label == "Rows").set_value("one per cell (seeds aggregated)")
    at.run()
    cells = at.dataframe[-1].value
    assert "tokens_per_s min–max" in cells and cells["tokens_per_s min–max"].str.contains("–").all()
    assert int(cells["contended seeds"].sum()) == len(norms_store.CONTENDED)


# ---------------------------------------------------------------- Run detail


def test_run_detail_figures_are_a_table_with_full_values(norms2, monkeypatch):
    at = dashboard_app(norms2, monkeypatch, "run_detail")
    assert not at.metric  # no tiles: a tile cuts a long value at a laptop width ("573.8 …")
    figures = at.table[0].value.T  # shown one figure a row
    assert list(figures.columns)[:4] == ["final val_loss", "final train_loss", "tokens/s (median)", "peak memory"]
    assert figures["peak memory"].iloc[0].endswith("MiB") and "…" not in figures["peak memory"].iloc[0]
    assert "over 2 seeds" in figures["tokens/s (median)"].iloc[0]  # the cell's spread beside the run's number
    assert "contended" not in figures["tokens/s (median)"].iloc[0]


def test_run_detail_marks_a_contended_run(norms2, monkeypatch):
    run_id = next(r for r in _run_ids(norms2) if r.startswith("scalsand") and r.endswith("s0"))
    at = dashboard_app(norms2, monkeypatch, "run_detail", detail_run=run_id)
    figures = at.table[0].value.T
    assert "⚠ contended" in figures["tokens/s (median)"].iloc[0]
    assert any("busy with other work" in c.value for c in at.caption)


def _run_ids(db: Path) -> list[str]:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
    finally:
        con.close()


# ---------------------------------------------------------------- abl dashboard --snapshot, bad input


def _abl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "abl.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_snapshot_without_a_store_is_a_one_line_error(tmp_path):
    r = _abl("dashboard", "--db", str(tmp_path / "none.duckdb"), "--snapshot", str(tmp_path / "shots"))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no database" in r.stderr and "Traceback" not in r.stderr


def test_snapshot_into_an_unwritable_folder_is_a_one_line_error(norms2, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    r = _abl("dashboard", "--db", str(norms2), "--snapshot", str(blocker / "shots"))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "cannot write" in r.stderr and "Traceback" not in r.stderr


def test_width_without_snapshot_is_refused(norms2):
    r = _abl("dashboard", "--db", str(norms2), "--width", "1024")
    assert r.returncode == 2 and "--snapshot" in r.stderr


def test_compare_warns_when_a_speed_was_measured_on_a_contended_machine(norms2, monkeypatch):
    at = dashboard_app(norms2, monkeypatch, "compare")
    assert not [w for w in at.warning if "contended" in w.value or "busy" in w.value]  # val_loss: no warning
    at = dashboard_app(norms2, monkeypatch, "compare", cmp_metric="tokens_per_s")
    assert [w for w in at.warning if "3 run(s)" in w.value and "busy with other work" in w.value]


def test_the_sidebar_shows_a_store_inside_the_working_folder_as_typed(tmp_path, monkeypatch):
    from abl.dashboard.common import shown_path

    monkeypatch.chdir(tmp_path)
    assert shown_path(tmp_path / "results" / "abl.duckdb") == str(Path("results") / "abl.duckdb")
    outside = tmp_path.parent / "elsewhere.duckdb"
    assert shown_path(outside) == str(outside)
