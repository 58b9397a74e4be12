"""Issue 40 item 2: one visual channel per axis for a factorial grid (abl.present.palette.grid_styles).

Colour for one axis, marker and line style for the other(s), from what the runs recorded (grid_varied,
grid_paths, grid_index), never from a grid file; one look per cell for a one-axis grid, as before."""

from types import SimpleNamespace

import pytest

from abl.present import palette

NORMS = ["layernorm", "rmsnorm", "scalenorm", "none"]
BLOCKS = ["pre", "post", "sandwich", "post_branch"]


def run(norm, block, index, seed=0, varied=True, experiment="norms"):
    return SimpleNamespace(experiment=experiment, cell_key=f"{norm}-{block}", grid_file="ablations/norms.toml",
                           grid_index=index, grid_paths=["model.norm", "model.block"],
                           grid_varied={"model.norm": norm, "model.block": block} if varied else {},
                           config={"model": {"norm": norm, "block": block}}, seed=seed)


def norms_runs(varied=True):
    out = []
    for i, n in enumerate(NORMS):
        for j, b in enumerate(BLOCKS):
            if n == "none" and b != "pre":
                continue
            out += [run(n, b, i * len(BLOCKS) + j, s, varied) for s in (0, 1)]
    return out


@pytest.mark.parametrize("varied", [True, False])  # recorded grid_varied, or only grid_paths + the config
def test_a_two_axis_grid_gets_colour_for_one_axis_and_marker_for_the_other(varied):
    ch = palette.grid_styles(norms_runs(varied))
    assert ch.factorial and ch.colour_axis == "model.norm" and ch.form_axes == ("model.block",)
    assert ch.colour_levels == tuple(NORMS) and ch.form_levels == tuple(BLOCKS)
    looks = ch.styles
    assert len(looks) == 13
    # distinct (colour, marker) and (colour, line style) per cell
    assert len({(s.colour, s.marker) for s in looks.values()}) == 13
    assert len({(s.colour, tuple(s.vega_dash)) for s in looks.values()}) == 13
    # one colour per norm, one marker per block, whatever the other axis
    for n in NORMS:
        assert len({looks[k].colour for k in looks if k.startswith(n + "-")}) == 1
    for b in BLOCKS:
        assert len({(looks[k].marker, looks[k].vega_shape, looks[k].mpl_ls) for k in looks
                    if k.endswith("-" + b)}) == 1
    assert len({looks[f"{n}-pre"].colour for n in NORMS}) == 4
    assert ch.colour_of["rmsnorm-post"] == "rmsnorm" and ch.form_of["rmsnorm-post"] == "post"
    assert "colour: model.norm" in ch.describe()


def test_the_mapping_does_not_depend_on_which_runs_came_first_or_are_shown():
    runs = norms_runs()
    a = palette.grid_styles(runs).styles
    b = palette.grid_styles(list(reversed(runs))).styles
    assert a == b


def test_the_axis_with_more_levels_takes_the_colour():
    runs = [run(n, b, i * 2 + j) for i, n in enumerate(NORMS) for j, b in enumerate(BLOCKS[:2])]
    for r in runs:  # block has 2 levels, norm 4: norm keeps the colour even listed second
        r.grid_paths = ["model.block", "model.norm"]
    ch = palette.grid_styles(runs)
    assert ch.colour_axis == "model.norm" and ch.form_axes == ("model.block",)


def test_a_one_axis_grid_keeps_one_look_per_cell_by_grid_position():
    runs = [SimpleNamespace(experiment="e", cell_key=f"c{i}", grid_file="g.toml", grid_index=i,
                            grid_paths=["model.norm"], grid_varied={"model.norm": f"n{i}"}, config={})
            for i in range(11)]
    ch = palette.grid_styles(runs)
    assert not ch.factorial
    assert ch.styles == palette.styles([f"c{i}" for i in range(11)])
    assert [ch.styles[f"c{i}"] for i in range(11)] == [palette.style(i) for i in range(11)]


def test_too_many_levels_for_a_channel_fall_back_to_one_look_per_cell():
    runs = [run(f"n{i}", b, i * 2 + j) for i in range(10) for j, b in enumerate(BLOCKS[:2])]
    ch = palette.grid_styles(runs)
    assert not ch.factorial  # ten norms: more than the eight colours
    runs = [run(f"n{i}", f"b{j}", i * 10 + j) for i in range(9) for j in range(9)]
    ch = palette.grid_styles(runs)
    assert not ch.factorial and len({(s.colour, s.marker) for s in ch.styles.values()}) == 64


def test_the_report_draws_a_factorial_grid_with_the_same_channels():
    from abl.present.figures import cell_styles

    runs = norms_runs()
    cells = [SimpleNamespace(key=k, runs=[r for r in runs if r.cell_key == k])
             for k in dict.fromkeys(r.cell_key for r in runs)]
    looks = palette.grid_styles(runs).styles
    drawn = cell_styles(cells)
    assert [d["color"] for d in drawn] == [looks[c.key].colour for c in cells]
    assert [(d["marker"], d["ls"]) for d in drawn] == [(looks[c.key].marker, looks[c.key].mpl_ls) for c in cells]
    assert len({(d["color"], d["marker"]) for d in drawn}) == 13
    assert len({d["color"] for d in drawn}) == 4  # one colour per norm
    # a one-axis grid: one look per cell by position, as before
    one = [SimpleNamespace(key=f"c{i}", runs=[SimpleNamespace(
        experiment="e", cell_key=f"c{i}", grid_file="g", grid_index=i, grid_paths=["model.norm"],
        grid_varied={"model.norm": f"n{i}"}, config={})]) for i in range(5)]
    assert cell_styles(one) == cell_styles(5)
