"""Display labels (abl.grid.labels): built from what differs between the cells shown, always distinct."""

from __future__ import annotations

import pytest

from abl.contracts.plugin_manager import get_registry
from abl.grid.gridfile import load_grid
from abl.grid.labels import cell_labels, recorded_paths, short_names, show

SHIPPED = ["norms", "position", "ffn", "attention", "moe", "precision", "ssm", "tokenizers", "recall"]


def _labels(grids, order=True):
    """Labels of the grids' cells with the grid's paths as given (``order``), or as the cells record them
    (abl.contracts.config.Cell.grid_paths; what a stored run keeps when its grid file is gone)."""
    cells = [c for g in grids for c in g.cells]
    configs = {c.cell_key: c.config for c in cells}
    fallback = {c.cell_key: c.label for c in cells}
    return cell_labels(configs, grids[0].grid_paths if order else recorded_paths(cells), fallback), cells


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("order", [True, False])
def test_every_shipped_grid_gets_one_distinct_label_per_cell(name, order):
    grid = load_grid(f"ablations/{name}.toml", get_registry(), [])
    labels, cells = _labels([grid], order)
    assert len(labels) == len({c.cell_key for c in cells})
    assert len(set(labels.values())) == len(labels)
    for c in cells:  # every swept axis that differs is named, with the cell's value
        for path, value in c.varied.items():
            vals = {str(x.varied.get(path)) for x in cells}
            if len(vals) > 1 and path.startswith("model."):
                assert f"{path.split('.')[-1]}={show(value)}" in labels[c.cell_key]


def test_cells_that_differ_only_in_a_component_parameter_get_distinct_labels():
    reg = get_registry()
    a = load_grid("ablations/position.toml", reg, [])
    b = load_grid("ablations/position.toml", reg, ["position.sinusoidal.embed_scale=false"])
    labels, cells = _labels([a, b], order=False)
    sinusoidal = sorted(v for v in labels.values() if "sinusoidal" in v)
    assert sinusoidal == ["position=sinusoidal, embed_scale=false", "position=sinusoidal, embed_scale=true"]
    assert labels[a.cells[0].cell_key] == "position=learned"  # a cell already distinct stays short


def test_settings_the_budget_solved_or_derived_do_not_lengthen_labels():
    grid = load_grid("ablations/tokenizers.toml", get_registry(), [])  # train.match solves the ffn width
    labels, _ = _labels([grid])
    assert not any("ratio" in v or "multiple_of" in v for v in labels.values()), labels
    grid = load_grid("ablations/recall.toml", get_registry(), [])  # head_dim, init_std follow d_model
    labels, _ = _labels([grid])
    assert not any("head_dim" in v or "init_std" in v for v in labels.values()), labels


def test_equal_settings_still_give_distinct_labels():
    cfg = {"model": {"norm": "rmsnorm"}}
    labels = cell_labels({"aaaaaaaaaa1": cfg, "bbbbbbbbbb2": dict(cfg)}, (), {})
    assert len(set(labels.values())) == 2


def test_cells_record_their_grid_paths_and_position():
    grid = load_grid("ablations/norms.toml", get_registry(), [])
    assert recorded_paths(grid.cells) == grid.grid_paths == ["model.norm", "model.block"]
    indices = list(dict.fromkeys(c.grid_index for c in grid.cells))
    assert indices == sorted(indices) and indices[0] == 0  # the expansion order, excluded points keep a place
    c = grid.cells[0]
    assert c.grid_record(grid.path) == {"file": grid.path, "paths": grid.grid_paths, "index": c.grid_index,
                                        "varied": c.varied}


def test_short_names_grow_only_where_ambiguous():
    names = short_names(["model.norm", "norm.rmsnorm.eps", "norm.layernorm.eps", "train.lr"])
    assert names == {"model.norm": "norm", "norm.rmsnorm.eps": "rmsnorm.eps",
                     "norm.layernorm.eps": "layernorm.eps", "train.lr": "lr"}


def test_values_show_as_a_grid_file_writes_them():
    assert [show(v) for v in (True, False, 0.003, 1e-6, 2.0, "rope", None)] == \
        ["true", "false", "0.003", "1e-06", "2.0", "rope", "none"]
    assert show("true") == "true" and show('"rope"') == "rope"  # JSON text from abl.analysis.verdicts.settings


def test_section_rules():
    from abl.analysis import sections

    assert sections.scaling_fit_applies([1e5 + i * 500 for i in range(9)])  # one model +- 4k: no fit
    assert sections.scaling_fit_applies([1e5, 2e5, 3e5])  # three sizes
    assert sections.scaling_fit_applies([1e5, 1.5e5, 2e5, 3e5])  # 3x span
    assert sections.scaling_fit_applies([1e5, 2e5, 4e5, 8e5]) is None
    assert not sections.differs([1e9, 1e9 * 1.001, None]) and sections.differs([1e9, 1.2e9])
    assert not sections.differs([212_992, 215_168])  # the norms grid's parameters: one size on an axis
    assert not sections.bands_by_default([2, 5]) and sections.bands_by_default([3, 3])
    assert sections.is_contended({"contended": 1.0}) and not sections.is_contended({"contended": 0.0})
    assert not sections.is_contended({})
