"""Issue 40 item 1: the Compare page leads with the answer, and every interval chart can be read.

On a norms-shaped store (13 cells x 2 seeds, tests/dashboard/norms_store.py) with seed noise that makes the
2-seed t(1) intervals of the cells wide: each axis's main effect is a forest plot above the per-cell figures;
every row of every interval chart is labelled (one row per label, a fixed height per row, labels never
thinned); the x axis is set by what is drawn and an interval that runs past it is cut at the edge and marked;
the statistics legend is printed once; a cell that no test could rank (2 seeds) says so instead of a rank.
"""

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, chart_specs, dashboard_app

pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install 'abl[dashboard]'")
from streamlit.testing.v1 import AppTest  # noqa: E402

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent / "dashboard"))
import norms_store  # noqa: E402

from abl.dashboard import charts, intervals  # noqa: E402


def _noisy(folder: Path, seeds=(0, 1)) -> Path:
    """The norms store with seed-to-seed noise in the final val_loss (a 2-seed cell's t(1) interval is then
    many times the spread of the cells' means)."""
    import duckdb

    db = norms_store.build(folder, seeds=seeds)
    con = duckdb.connect(str(db))
    con.execute("UPDATE metrics SET value = value + CASE WHEN run_id LIKE '%s1' THEN 0.35 "
                "WHEN run_id LIKE '%s2' THEN -0.1 ELSE 0.0 END * (1 + (hash(run_id) % 5) / 10.0) "
                "WHERE name = 'val_loss' AND step = 200")
    con.close()
    return db


@pytest.fixture(scope="module")
def noisy2(tmp_path_factory) -> Path:
    return _noisy(tmp_path_factory.mktemp("noisy2"))


@pytest.fixture(scope="module")
def noisy3(tmp_path_factory) -> Path:
    return _noisy(tmp_path_factory.mktemp("noisy3"), seeds=(0, 1, 2))


def app(db: Path, monkeypatch, **state) -> AppTest:
    return dashboard_app(db, monkeypatch, "compare", timeout=120, **state)


def interval_panels(spec: dict) -> list[dict]:
    """The layered interval charts of a spec (one, or one per panel of a vconcat)."""
    return [p for p in spec.get("vconcat", [spec]) if "layer" in p]


def check_every_row(panel: dict, data: pd.DataFrame) -> int:
    """Every row labelled and drawn inside the axis, or cut at the edge with a triangle there; returns rows."""
    layers = panel["layer"]
    point = next(m for m in layers if m["mark"]["type"] == "point" and "filter" not in json.dumps(
        m.get("transform", [])))
    y = point["encoding"]["y"]
    assert y["axis"]["labelOverlap"] is False and y["axis"]["labelLimit"] == 0  # no label thinned or cut
    assert panel["height"] == {"step": intervals.ROW_PX} and intervals.ROW_PX >= 24  # a row per label
    rows = data[y["field"]].astype(str)
    assert rows.is_unique and (rows.str.len() > 0).all()
    assert list(y["sort"]) == list(rows)  # every row is on the axis, in order
    lo_edge, hi_edge = point["encoding"]["x"]["scale"]["domain"]
    x = point["encoding"]["x"]["field"]
    assert ((data[x] >= lo_edge) & (data[x] <= hi_edge)).all()  # every point on the axis
    rule = next(m for m in layers if m["mark"]["type"] == "rule" and m["encoding"].get("x2"))
    lo_col, hi_col = rule["encoding"]["x"]["field"], rule["encoding"]["x2"]["field"]
    assert (lo_col, hi_col) == ("lo_drawn", "hi_drawn")
    for _, r in data.iterrows():
        for end, edge, off in (("lo", lo_edge, "off_lo"), ("hi", hi_edge, "off_hi")):
            drawn = r[f"{end}_drawn"]
            if pd.isna(drawn):
                continue
            assert lo_edge - 1e-12 <= drawn <= hi_edge + 1e-12
            assert bool(r[off]) == (abs(drawn - edge) < 1e-12 and r[off]), r.to_dict()
    marks = {m["mark"].get("shape"): m for m in layers if m["mark"]["type"] == "point" and "shape" in m["mark"]}
    assert {"triangle-left", "triangle-right"} <= set(marks)
    assert "datum.off_lo" in json.dumps(marks["triangle-left"]["transform"])
    assert "datum.off_hi" in json.dumps(marks["triangle-right"]["transform"])
    return len(data)


def _data_of(spec: dict, panel: dict) -> pd.DataFrame:
    name = panel["layer"][-1].get("data", {}).get("name") or spec.get("data", {}).get("name")
    frames = [d for d in spec["_data"].values() if "lo_drawn" in d]
    if name in spec["_data"]:
        return spec["_data"][name]
    # a vconcat: each panel's rows are its own dataset
    return next(d for d in frames if set(d["_row"]) == set(panel["layer"][-1]["encoding"]["y"]["sort"])) \
        if "_row" in frames[0] else frames[0]


def test_the_answer_comes_first_as_a_forest_plot_per_axis(noisy2, monkeypatch):
    at = app(noisy2, monkeypatch)
    heads = [s.value for s in at.subheader]
    assert heads[0].startswith("The answer:")
    verdicts = [m.value for m in at.markdown if m.value.startswith("**model.")]
    assert [v.split("**")[1] for v in verdicts] == ["model.block", "model.norm"]  # the verdict line of each axis
    all_specs = chart_specs(at)
    forests = [s for s in all_specs if any("level" in d for d in s["_data"].values())]
    assert len(forests) == 2
    for spec in forests:
        data = next(d for d in spec["_data"].values() if "level" in d)
        assert check_every_row(spec, data) == 4  # four levels, four labelled rows
        assert all("·" in lbl for lbl in data["label"])  # each row: level · rank (letters), or why not ranked
    # per-cell figures are folded below the answer
    labels = [e.label for e in at.expander]
    assert any(lbl.startswith("Per-cell comparisons") for lbl in labels)
    assert any(lbl.startswith("Per-cell means") for lbl in labels)


def test_every_interval_row_is_labelled_and_inside_the_axis_or_marked(noisy2, monkeypatch):
    """Before: the per-cell chart labelled 4 of 8 rows, and the t(1) intervals of 2-seed cells set an axis
    on which the differences between the means could not be seen."""
    at = app(noisy2, monkeypatch, cmp_baseline=None)
    n_rows = cut = 0
    for spec in chart_specs(at):
        for panel in interval_panels(spec):
            data = _data_of(spec, panel)
            n_rows += check_every_row(panel, data)
            cut += int((data["off_lo"] | data["off_hi"]).sum())
    assert n_rows >= 13 + 8
    assert cut > 0  # the noisy 2-seed cells' intervals run off the axis, and are marked there
    per_cell = next(d for s in chart_specs(at) for d in s["_data"].values() if "ci_lo" in d and "lo_drawn" in d)
    means = per_cell["mean"]
    lo, hi = intervals.interval_domain(means, per_cell["ci_lo"], per_cell["ci_hi"], [per_cell["baseline"].iloc[0]])
    spread = means.max() - means.min()
    assert hi - lo <= 3 * spread  # the axis is the means', not the t(1) intervals'
    assert (per_cell["ci_hi"] - per_cell["ci_lo"]).max() > hi - lo  # which are wider than the axis


def test_three_comparisons_get_three_rows():
    """Before: with 3 comparisons every row collapsed onto one line and the labels printed over each other."""
    df = pd.DataFrame({"cell": ["a − b", "a − c", "b − c"], "delta": [0.02, 0.45, 0.2],
                       "delta_lo": [-1.5, 0.3, -0.1], "delta_hi": [2.0, 0.6, 0.5],
                       "p": [0.5, 0.01, 0.2], "marker": ["x", "y", "z"],
                       "significance": ["not distinguishable", "worse", "not distinguishable"]})
    spec = charts.delta_chart(df, list(df["cell"]), "Δ val loss").to_dict()
    frame = next(pd.DataFrame(d) for d in spec["datasets"].values() if d and "lo_drawn" in d[0])
    assert check_every_row(spec, frame) == 3
    lo, hi = spec["layer"][-1]["encoding"]["x"]["scale"]["domain"]
    assert lo > -1.0 and hi < 1.5  # set by the differences (0 .. 0.45), not by a t(1) interval (-1.5 .. 2.0)
    assert frame.loc[0, "off_lo"] and frame.loc[0, "off_hi"] and not frame.loc[1, "off_hi"]
    with pytest.raises(ValueError):  # two rows under one label would be drawn on one line: refused
        intervals.interval_chart(pd.concat([df, df.head(1)]), row="cell", x="delta", lo="delta_lo", hi="delta_hi",
                              x_title="Δ")


def test_the_statistics_legend_is_printed_once(noisy2, monkeypatch):
    at = app(noisy2, monkeypatch)
    texts = [c.value for c in at.caption] + [m.value for m in at.markdown]
    assert sum("Holm correction" in t or "no comparison has a p-value" in t or "comparisons that can be decided" in t
               for t in texts if t.startswith("**How these were computed.**")) == 1
    assert sum("Test: paired t-test" in t for t in texts) == 1
    assert sum("Per axis: each swept axis's main effect" in t for t in texts) == 1


def _rank_column(at: AppTest) -> list[str]:
    return list(_cells_table(at)["rank"])


def test_cells_no_test_could_rank_say_so_instead_of_a_rank(noisy2, noisy3, monkeypatch):
    """Before: at 2 seeds all 13 cells ranked '1=' (no pair was tested) and 'none' read as tied for best."""
    ranks = _rank_column(app(noisy2, monkeypatch))
    # a factorial grid ranks its axes' levels (the forest plots, where a 2-run level reads "untested"), never
    # its cells, at any seed count: at 2 seeds no cell reads "1=" (issue 40 item 3)
    assert len(ranks) == 13 and all(r == "per axis" for r in ranks), ranks
    at3 = app(noisy3, monkeypatch)
    ranks3 = _rank_column(at3)
    # 3 seeds, factorial grid: the axes' levels are ranked (the forest plots), the cells are not, as in the
    # terminal summary (abl.analysis.answers.reconcile: one answer per question)
    assert len(ranks3) == 13 and all(r == "per axis" for r in ranks3), ranks3


def _cells_table(at: AppTest) -> pd.DataFrame:
    from html.parser import HTMLParser

    rows: list[list[str]] = []

    class Cells(HTMLParser):
        cell = None

        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                rows.append([])
            elif tag in ("td", "th"):
                self.cell = ""

        def handle_endtag(self, tag):
            if tag in ("td", "th") and self.cell is not None:
                rows[-1].append(self.cell.strip())
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell += data

    for md in at.markdown:
        if "abl-text-table" in md.value:
            rows.clear()
            Cells().feed(md.value)
            t = pd.DataFrame(rows[1:], columns=rows[0])
            if "seeds" in t.columns and "rank" in t.columns:
                return t
    raise AssertionError("no cells table")


def test_the_cells_table_gives_no_second_verdict_beside_the_per_axis_answer(tmp_path, monkeypatch):
    """Before: on a factorial grid whose cells ran 3 seeds, the Cells table called cells better or worse than
    the baseline and ranked them against each other by another Holm family: a cell that the verdict column
    called worse than the baseline was ranked above it. The summary and abl compare call those rows
    diagnostics and rank per axis; so does the page, with the same words."""
    from abl.present.summary import build, load

    db = _noisy(tmp_path, seeds=(0, 1, 2))
    table = _cells_table(app(db, monkeypatch))
    assert set(table["rank"]) == {"per axis"}, table
    assert not {"better", "worse", "not distinguishable"} & set(table["verdict"]), table
    view = build(load(db, experiment=norms_store.EXPERIMENT), metrics=["val_loss"], title="t")
    words = {r.verdict for r in view.tables[0][1].comparisons}
    assert all(w.startswith(stats_diagnostic()) or "too few" in w for w in words), words


def stats_diagnostic() -> str:
    from abl.analysis import stats

    return stats.DIAGNOSTIC


def test_grouped_and_faceted_cells_keep_a_labelled_row_each(noisy2, monkeypatch):
    at = app(noisy2, monkeypatch)
    next(s for s in at.selectbox if s.label == "Group by").set_value("model.norm")
    at.run()
    next(s for s in at.selectbox if s.label == "Facet by").set_value("model.block")
    at.run()
    assert not at.exception and not at.error
    spec = next(s for s in chart_specs(at) if "vconcat" in s)
    panels = interval_panels(spec)
    assert [p["title"] for p in panels] == [f"model.block = {b}" for b in norms_store.BLOCKS]
    rows = 0
    for panel in panels:
        names = [panel.get("data", {}).get("name")] + [m.get("data", {}).get("name") for m in panel["layer"]]
        data = next(spec["_data"][n] for n in names if n in spec["_data"] and "lo_drawn" in spec["_data"][n])
        rows += check_every_row(panel, data)
    assert rows == 13


def test_each_forest_row_reads_from_its_own_level(noisy3, monkeypatch):
    """A forest plot's row is a level against the best one: its words say what the level is ("vs post: worse"
    on the pre row). Before, the row copied the contrast's own orientation (best − level: "better"), so the
    pre row read "vs post: better" while its interval sat to the right of post's line."""
    at = app(noisy3, monkeypatch)
    forests = [s for s in chart_specs(at) if any("level" in d for d in s["_data"].values())]
    assert forests
    seen = set()
    for spec in forests:
        data = next(d for d in spec["_data"].values() if "level" in d)
        for _, row in data.iterrows():
            if row["verdict"] == "best level":
                continue
            word = row["verdict"].split(": ", 1)[1]
            seen.add(word)
            assert word != "better", row.to_dict()  # no level is distinguishably better than the best one
            if word == "worse":
                assert row["lo"] > data.loc[data["verdict"] == "best level", "mean"].iloc[0], row.to_dict()
    assert "worse" in seen, seen
