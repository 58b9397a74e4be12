"""A cell's grid position on the dashboard (its colour, line style and marker: abl.present.palette) comes from
its grid file's order of cells - the order ``abl run`` expands the grid into - not from the order its runs
started (issue 25). Each run records its position when it runs (issue 38), so the order, the labels and the
colours stay the same after the grid file is moved, edited or deleted; only a run folder from before runs
recorded it falls back to first-run order."""

import json
import shutil
import time
from pathlib import Path

import pytest

pytest.importorskip("pandas", reason="the dashboard extra is not installed: pip install 'abl[dashboard]'")

from abl.dashboard import queries as q  # noqa: E402
from abl.present import palette  # noqa: E402

GRID = """
[experiment]
name = "normslike"
seeds = [0, 1]
[model]
d_model = 32
n_layers = 2
n_heads = 4
context = 16
vocab_size = 4096
[train]
steps = 20
batch_size = 4
eval_every = 10
[grid]
"model.norm" = ["layernorm", "rmsnorm", "scalenorm"]
"model.block" = ["pre", "post"]
exclude = [{ "model.norm" = "scalenorm", "model.block" = "post" }]
"""
# the order the cells' first runs start: not the grid's (as with --workers, a resumed grid or a retry)
START_ORDER = [3, 0, 4, 1, 2]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """(store, grid order of cell keys, first-run order of cell keys): 5 cells x 2 seeds, their runs started in
    START_ORDER, the grid file beside the store's folder (as abl run leaves a relative GRID_FILE)."""
    from test_report_sections import _write_run

    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid
    from abl.store import database as abl_store

    tmp = tmp_path_factory.mktemp("gridorder")
    grid = tmp / "normslike.toml"  # the grid_file the runs record (test_report_sections._write_run)
    grid.write_text(GRID)
    g = load_grid(grid, get_registry())
    keys = list(dict.fromkeys(c.cell_key for c in g.cells))
    assert len(keys) == len(START_ORDER)
    runs = tmp / "results" / "runs"
    now = time.time()
    for cell in g.cells:
        started = now + 10 * START_ORDER.index(keys.index(cell.cell_key)) + cell.seed
        final = {"n_params": 1000, "n_params_non_embedding": 100, "peak_tensor_bytes": 1e6}
        _write_run(runs / cell.run_id, cell, status="completed", info=True, final=final,
                   loss=3.0 + 0.01 * keys.index(cell.cell_key), tokens_per_s=1000.0, wall=1.0, started=started)
    db = tmp / "results" / "abl.duckdb"
    abl_store.ingest_dirs(db, sorted(runs.iterdir()))
    return q.Store(str(db), str(runs)), keys, [keys[i] for i in START_ORDER]


def test_cells_take_their_grid_files_order_not_their_runs(store):
    st, grid_order, run_order = store
    assert grid_order != run_order  # the premise
    assert q.grid_cell_order(st, q.Selection()) == grid_order
    # a filter does not move a cell: the page asks for its experiments' whole listing
    assert q.grid_cell_order(st, q.Selection(experiments=("normslike",))) == grid_order


def test_a_store_copied_without_its_grid_file_keeps_the_grid_order(store, tmp_path):
    st, grid_order, run_order = store
    copied = tmp_path / "elsewhere" / "abl.duckdb"  # a store copied without its grid file
    copied.parent.mkdir()
    shutil.copy(st.db, copied)
    assert q.grid_cell_order(q.Store(str(copied), str(tmp_path / "runs")), q.Selection()) == grid_order


def test_cells_that_recorded_no_grid_position_follow_in_first_run_order():
    """Runs from before runs recorded their grid (no index): after the indexed cells, in start order; the
    indexed ones by (the grid file's first run, their index), experiment by experiment."""
    from types import SimpleNamespace as R

    runs = [R(experiment="e", cell_key="old2", grid_file="", grid_index=None),
            R(experiment="e", cell_key="b", grid_file="g.toml", grid_index=3),
            R(experiment="e", cell_key="old1", grid_file="", grid_index=float("nan")),
            R(experiment="e", cell_key="a", grid_file="g.toml", grid_index=1),
            R(experiment="e", cell_key="c", grid_file="h.toml", grid_index=0),
            R(experiment="d", cell_key="z", grid_file="g.toml", grid_index=7)]
    assert palette.grid_order(runs) == ["z", "a", "b", "c", "old2", "old1"]


def test_the_curves_page_colours_cells_by_grid_position(store, monkeypatch):
    testing = pytest.importorskip("streamlit.testing.v1", reason="streamlit is in the dashboard extra")
    from conftest import ROOT

    st, grid_order, _ = store
    monkeypatch.setenv("ABL_DB", st.db)
    monkeypatch.setenv("ABL_RUNS_DIR", st.runs_dir)
    at = testing.AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    at.switch_page("views/curves.py")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    labels = {k: lbl for k, lbl in st.query("SELECT DISTINCT cell_key, label FROM runs").itertuples(index=False)}
    from abl.store.reader import read_runs

    channels = palette.grid_styles(read_runs(st.db))  # from what the runs recorded, as the report draws them
    assert list(channels.styles) == grid_order
    if channels.factorial:  # one colour per level of the colour axis, in the order the grid file lists them
        want = dict(zip(channels.colour_levels, palette.COLOURS))
    else:
        want = {labels[k]: palette.style(i).colour for i, k in enumerate(grid_order)}
    scales = [enc["scale"] for spec in at.get("vega_lite_chart")
              for enc in _encodings(json.loads(spec.proto.spec), "color") if "domain" in enc.get("scale", {})]
    assert scales, "the Curves page drew no chart with a colour per cell"
    for scale in scales:
        got = dict(zip(scale["domain"], scale["range"]))
        assert got and all(want[lbl if channels.factorial else _grid_label(lbl, want)] == colour
                           for lbl, colour in got.items()), (got, want)


def _encodings(spec: dict, channel: str) -> list[dict]:
    out = [spec["encoding"][channel]] if channel in spec.get("encoding", {}) else []
    for part in spec.get("layer", []) + ([spec["spec"]] if "spec" in spec else []):
        out += _encodings(part, channel)
    return out


def _grid_label(shown: str, labels: dict) -> str:
    """The stored grid label a chart's series name stands for (the page may shorten or reorder the pairs)."""
    parts = set(shown.replace(" ", "").split(","))
    (match,) = [lbl for lbl in labels if set(lbl.replace(" ", "").split(",")) == parts]
    return match


def test_a_report_by_experiment_name_orders_cells_as_the_dashboard_does(store, tmp_path):
    """``abl report NAME`` (no grid file given) used to order cells by first run while the dashboard used the
    grid's order, so one cell could take two colours. Both now use the grid position the runs recorded."""
    from abl.present.report.runs import load_runs
    from abl.present.report.runs import group_cells

    st, grid_order, run_order = store
    runs = load_runs(st.db, experiment="normslike")
    order = palette.grid_order(runs)
    assert order == grid_order
    assert [c.key for c in group_cells(runs, order)] == grid_order
    # the CLI: the report's cell table lists them in grid order
    from conftest import run_abl

    out = tmp_path / "rep"
    r = run_abl(["report", "normslike", "--db", st.db, "--format", "md", "--out", str(out)])
    assert r.returncode == 0, r.stderr
    text = next(out.glob("*.md")).read_text()
    labels = {k: lbl for k, lbl in st.query("SELECT DISTINCT cell_key, label FROM runs").itertuples(index=False)}
    positions = [text.find(f"| {labels[k]} |") for k in grid_order]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), positions


def test_a_finished_grid_shows_the_same_labels_and_colours_after_its_grid_file_is_deleted(store, tmp_path):
    """Issue 38: the labels (the grid's axes named first, from the paths each run recorded) and the colours
    (from the position each run recorded) of a finished grid do not depend on its grid file still being there:
    the report's cells and the dashboard's order, before and after the file is deleted."""
    from abl.present.report.runs import load_runs
    from abl.present.report.runs import group_cells, label_cells

    st, grid_order, _ = store

    def shown(db: str) -> tuple[list[tuple[str, str]], list[str]]:
        runs = load_runs(db, experiment="normslike")
        cells = group_cells(runs, palette.grid_order(runs))
        label_cells(cells)
        colours = palette.styles(c.key for c in cells)
        return ([(c.label, colours[c.key].colour) for c in cells],
                q.grid_cell_order(q.Store(db, str(tmp_path / "runs")), q.Selection()))

    before = shown(st.db)
    assert before[1] == grid_order
    # the grid's axes, in the grid file's order, name every cell (norm before block)
    assert before[0][0][0] == "norm=layernorm, block=pre", before[0]
    grid_file = Path(st.db).parent.parent / "normslike.toml"
    saved = grid_file.read_text()
    grid_file.unlink()
    try:
        assert shown(st.db) == before
        copied = tmp_path / "elsewhere" / "abl.duckdb"  # and a copy of the store far from where it ran
        copied.parent.mkdir()
        shutil.copy(st.db, copied)
        assert shown(str(copied)) == before
    finally:
        grid_file.write_text(saved)
