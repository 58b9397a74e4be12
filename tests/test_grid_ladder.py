"""A ladder of model sizes in a grid file (issue 41, item 5): sizes as a tied axis, each with its token budget."""

from __future__ import annotations

import math

import pytest

from abl.contracts.config import ConfigError
from abl.grid.gridfile import expand
from abl.model.costmodel import predict
from conftest import tiny_grid_raw

SIZES = [{"d_model": 32, "n_layers": 1}, {"d_model": 48, "n_layers": 2}]


def test_each_grid_point_at_every_size_with_its_token_budget(registry):
    raw = tiny_grid_raw(grid={"model.norm": ["rmsnorm", "layernorm"]})
    raw["ladder"] = {"sizes": SIZES, "tokens_per_param": 2}
    grid = expand(raw, registry)
    assert len(grid.cells) == 4
    assert grid.grid_paths == ["model.d_model", "model.norm"]  # the size axis named by its distinct key
    by = {(c.model.d_model, c.model.n_layers, c.varied["model.norm"]): c for c in grid.cells}
    assert set(by) == {(32, 1, "rmsnorm"), (32, 1, "layernorm"), (48, 2, "rmsnorm"), (48, 2, "layernorm")}
    for cell in grid.cells:
        n = predict(cell, registry)["n_params_non_embedding"]
        tokens = cell.train.steps * cell.train.batch_size * cell.model.context
        assert tokens >= 2 * n > tokens - cell.train.batch_size * cell.model.context  # ceil of 2 tokens/param
        assert cell.varied["model.d_model"] == cell.model.d_model
        assert f"d_model={cell.model.d_model}" in cell.label
    small, large = by[(32, 1, "rmsnorm")], by[(48, 2, "rmsnorm")]
    assert large.train.steps > small.train.steps
    assert [c.grid_index for c in grid.cells] == sorted(c.grid_index for c in grid.cells)
    assert any("2 tokens per non-embedding parameter" in n for n in grid.notes)


def test_without_a_token_rule_every_size_trains_the_grid_steps_and_lr_per_size(registry):
    raw = tiny_grid_raw(grid={"model.norm": ["rmsnorm"]})
    raw["ladder"] = {"sizes": [{**SIZES[0], "lr": 3e-3}, {**SIZES[1], "lr": 1e-3}], "lr": "per-size"}
    grid = expand(raw, registry)
    assert [c.train.steps for c in grid.cells] == [2, 2]
    assert sorted(c.train.lr for c in grid.cells) == [1e-3, 3e-3]
    assert {c.model.d_model: c.train.lr for c in grid.cells} == {32: 3e-3, 48: 1e-3}


@pytest.mark.parametrize("ladder, words", [
    ({"sizes": [SIZES[0]]}, "two or more tables"),
    ({"sizes": [{"d_model": 32}, {"n_layers": 2}]}, "same [model] keys"),
    ({"sizes": [{"d_modle": 32}, {"d_modle": 48}]}, "d_model"),
    ({"sizes": SIZES, "tokens_per_param": -1}, "positive number"),
    ({"sizes": SIZES, "lr": "sweep"}, "ladder.lr must be one of"),
    ({"sizes": [{**SIZES[0], "lr": 1e-3}, SIZES[1]]}, "per-size"),
    ({"sizes": [SIZES[0], SIZES[0]]}, "identical"),
    ({"sizes": [{"d_model": 32, "n_layers": 1}, {"d_model": 32, "n_layers": 2}, {"d_model": 48, "n_layers": 1}]},
     "differ in one key at every size"),
    ({"sizes": SIZES, "steps": 3}, "unknown key"),
])
def test_a_bad_ladder_is_refused_with_its_reason(registry, ladder, words):
    raw = tiny_grid_raw()
    raw["ladder"] = ladder
    with pytest.raises(ConfigError) as info:
        expand(raw, registry)
    assert words in str(info.value)


def test_the_ladder_and_the_grid_cannot_both_sweep_a_size_setting(registry):
    raw = tiny_grid_raw(grid={"model.d_model": [32, 64]})
    raw["ladder"] = {"sizes": SIZES}
    with pytest.raises(ConfigError, match="sweep it in ladder.sizes"):
        expand(raw, registry)


def test_max_cells_counts_the_sizes(registry):
    raw = tiny_grid_raw(grid={"model.norm": ["rmsnorm", "layernorm"]})
    raw["ladder"] = {"sizes": SIZES}
    with pytest.raises(ConfigError, match="more than --max-cells=3"):
        expand(raw, registry, max_cells=3)
    assert math.isfinite(len(expand(raw, registry, max_cells=4).cells))
