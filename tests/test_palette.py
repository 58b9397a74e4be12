"""abl.present.palette: one cell, one style, shared by the report's figures and the dashboard's charts."""

import pytest

from abl.present import palette


def test_colours_are_okabe_ito_and_distinct():
    okabe_ito = {"#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000"}
    assert len(palette.COLOURS) == len(set(palette.COLOURS)) == 8 and set(palette.COLOURS) == okabe_ito
    assert palette.NEUTRAL not in palette.COLOURS


@pytest.mark.parametrize("n", [8, 13, 36, 64])
def test_styles_stay_distinct_past_the_colours(n):
    looks = palette.distinct(n)
    assert len({(s.colour, s.mpl_ls, s.marker) for s in looks}) == n
    assert len({(s.colour, s.marker) for s in looks}) == n  # a scatter (no lines) tells them apart too
    if n <= len(palette.COLOURS) * len(palette.LINE_STYLES):
        assert len({(s.colour, tuple(s.vega_dash)) for s in looks}) == n  # and a Vega line chart


def test_a_cell_keeps_its_style_by_grid_position_whatever_is_shown():
    grid = ["a", "b", "c", "d"]
    whole = palette.styles(grid)
    assert [whole[k].position for k in grid] == [0, 1, 2, 3]
    assert palette.styles(["a", "b", "a"]) == {"a": palette.style(0), "b": palette.style(1)}
    with pytest.raises(ValueError):
        palette.style(-1)


def test_report_and_dashboard_draw_a_position_in_the_same_colour():
    from abl.present.figures import cell_styles

    for i, st in enumerate(cell_styles(20)):
        assert st["color"] == palette.style(i).colour and st["ls"] == palette.style(i).mpl_ls
    pytest.importorskip("altair")
    charts = pytest.importorskip("abl.dashboard.charts")
    colour, dash = charts.cell_scales([f"c{i}" for i in range(12)])
    assert list(colour.range) == [palette.style(i).colour for i in range(12)]
    assert list(dash.range) == [palette.style(i).vega_dash for i in range(12)]
