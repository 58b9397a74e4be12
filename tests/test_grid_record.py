"""Runs record what their grid knew (issue 38): the grid's paths, the cell's position among the grid file's
points and its swept settings go from the expanded cell into meta.json and, at ingest, into ``runs`` columns;
every flattened setting into ``run_settings`` (abl.store.database.write_settings, the one place)."""

from __future__ import annotations

import json

import duckdb

from abl.analysis.tables import settings_of
from abl.contracts.plugin_manager import get_registry
from abl.grid.gridfile import load_grid
from abl.store import database as store

GRID = """
[experiment]
name = "recorded"
seeds = [0]
[model]
d_model = 32
n_layers = 2
n_heads = 4
context = 16
vocab_size = 4096
[train]
steps = 4
batch_size = 2
[grid]
"model.norm" = ["layernorm", "rmsnorm"]
"train.lr" = [0.001, 0.003]
exclude = [{ "model.norm" = "layernorm", "train.lr" = 0.003 }]
"""


def _folder(root, cell, meta_extra):
    d = root / cell.run_id
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(cell.config))
    (d / "meta.json").write_text(json.dumps({"cell_key": cell.cell_key, "label": cell.label, **meta_extra}))
    (d / "status.json").write_text(json.dumps({"status": "queued"}))
    return d


def test_ingest_stores_the_grid_record_and_every_setting(tmp_path):
    grid_file = tmp_path / "g.toml"
    grid_file.write_text(GRID)
    grid = load_grid(grid_file, get_registry(), [])
    # the excluded point (layernorm, 0.003) keeps its place: the indices are those of the full product
    assert [(c.varied["model.norm"], c.varied["train.lr"], c.grid_index) for c in grid.cells] == [
        ("layernorm", 0.001, 0), ("rmsnorm", 0.001, 2), ("rmsnorm", 0.003, 3)]
    dirs = [_folder(tmp_path / "runs", c, {"grid_file": grid.path, "grid": c.grid_record(grid.path)})
            for c in grid.cells]
    db = tmp_path / "abl.duckdb"
    store.ingest_dirs(db, dirs)
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = {r[0]: r[1:] for r in con.execute(
            "SELECT run_id, grid_paths, grid_index, grid_varied FROM runs").fetchall()}
        settings = con.execute("SELECT run_id, path, value FROM run_settings").fetchall()
    finally:
        con.close()
    for c in grid.cells:
        paths, index, varied = rows[c.run_id]
        assert json.loads(paths) == ["model.norm", "train.lr"] and index == c.grid_index
        assert json.loads(varied) == c.varied
        mine = {p: json.loads(v) for rid, p, v in settings if rid == c.run_id}
        assert mine == settings_of(c.config) and mine["model.norm"] == c.varied["model.norm"]
        assert mine["train.lr"] == c.varied["train.lr"]


def test_a_folder_without_or_with_a_damaged_grid_record_stores_nulls(tmp_path):
    """Folders from before runs recorded their grid, and hostile ones: NULL columns, no traceback."""
    grid_file = tmp_path / "g.toml"
    grid_file.write_text(GRID)
    cells = load_grid(grid_file, get_registry(), []).cells
    bad = [{}, {"grid": {"paths": [1], "index": 0, "varied": {}}},
           {"grid": {"paths": ["model.norm"], "index": -3, "varied": {"model.norm": "rmsnorm"}}}]
    dirs = [_folder(tmp_path / "runs", c, extra) for c, extra in zip(cells, bad)]
    db = tmp_path / "abl.duckdb"
    store.ingest_dirs(db, dirs)
    con = duckdb.connect(str(db), read_only=True)
    try:
        by_id = {r[0]: r[1:] for r in con.execute("SELECT run_id, grid_paths, grid_index FROM runs").fetchall()}
    finally:
        con.close()
    assert by_id[cells[0].run_id] == (None, None)  # no record: an older folder
    assert by_id[cells[1].run_id] == (None, None)  # a path that is no string: not a record
    paths, index = by_id[cells[2].run_id]  # a negative index is dropped, the paths kept
    assert json.loads(paths) == ["model.norm"] and index is None
