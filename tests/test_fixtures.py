"""The shared fixtures of tests/conftest.py: the tiny grid, the metric sink, a cell built without TOML."""

import tomllib

from conftest import TINY_GRID, tiny_grid_raw, tiny_grid_text, toml_text


def test_the_tiny_grid_text_parses_back_to_its_dict():
    assert tomllib.loads(tiny_grid_text()) == TINY_GRID
    odd = {"experiment": {"name": 'a "quoted" name'},
           "grid": {"model.norm": ["rmsnorm"], "exclude": [{"model.norm": "rmsnorm", "train.lr": 0.001}]},
           "dataset": {"pystdlib": {"max_bytes": 1}}, "train": {"compile": True, "lr": 3e-4}}
    assert tomllib.loads(toml_text(odd)) == odd


def test_sections_are_replaced_key_by_key_and_dropped_with_none():
    raw = tiny_grid_raw(experiment={"name": "x"}, train={"steps": 5, "threads": None}, eval=None)
    assert raw["experiment"] == {"name": "x", "seeds": [0]}
    assert raw["train"]["steps"] == 5 and "threads" not in raw["train"] and "eval" not in raw
    assert TINY_GRID["train"]["steps"] == 2  # the shared dict is never changed
    assert tiny_grid_raw(grid={"model.block": ["pre", "post"]})["grid"] == {"model.block": ["pre", "post"]}


def test_the_tiny_grid_file_expands_to_two_cells(tiny_grid, registry):
    from abl.grid.gridfile import load_grid

    grid = load_grid(tiny_grid(), registry)
    assert [c.components["norm"]["name"] for c in grid.cells] == ["rmsnorm", "layernorm"]


def test_a_tiny_cell_trains_into_the_metric_sink(tiny_cell, metric_sink, registry):
    from abl.train.loop import train

    cell = tiny_cell(1)
    assert cell.components["norm"]["name"] == "layernorm" and cell.train.steps == 2
    train(cell, registry, metric_sink)
    assert [s for s, _ in metric_sink.series("val_loss")] == [2]
