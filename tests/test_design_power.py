"""What a grid's design can decide before it runs (issue 26): the detectable difference per axis, checked
against a simulation of the same design, and every shipped grid's header held to it."""

import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from abl.analysis import stats
from abl.cli.common import load_registry
from abl.grid.design import compared_seeds, detectable
from abl.grid.gridfile import load_grid

ROOT = Path(__file__).resolve().parents[1]
GRIDS = sorted((ROOT / "ablations").glob("*.toml"))


def test_power_is_finite_where_the_lower_tail_underflows():
    # scipy's nct.cdf(-crit) is NaN at large noncentrality; the power must still be a number, and rise
    for df in (2, 10, 100):
        ps = [stats.power_t(k, 1.0, df, 0.05 / 36) for k in np.linspace(0.5, 40, 80)]
        assert all(np.isfinite(ps)) and all(b >= a - 1e-12 for a, b in zip(ps, ps[1:]))
    crit = sps.t.ppf(1 - 0.05 / 2, 10)  # one exact value, from the definition
    assert stats.power_t(3.0, 1.0, 10) == pytest.approx(sps.nct.sf(crit, 10, 3) + sps.nct.cdf(-crit, 10, 3))


def _design(levels_a, levels_b, seeds):
    cells = []
    for a in levels_a:
        for b in levels_b:
            cells.append(stats.CellInput(f"{a}/{b}", f"{a}/{b}", {s: 0.0 for s in seeds}, None,
                                         settings={"x": a, "y": b}))
    return cells


def test_the_design_figure_is_the_power_a_simulation_of_that_design_finds():
    cells = _design(["p", "q", "r"], ["u", "v"], range(3))
    k = stats.detectable_by_design(cells, ["x", "y"])["x"].sigmas
    assert k is not None and 1.0 < k < 10.0
    rng = np.random.default_rng(7)
    hits, reps = 0, 300
    for _ in range(reps):  # true effect k sigma between p and q, r halfway, plus seed and y blocks
        seed_fx, y_fx = rng.normal(0, 1, 3), {"u": 0.0, "v": 0.7}
        sim = []
        for c in cells:
            shift = {"p": 0.0, "q": k, "r": k / 2}[c.settings["x"]] + y_fx[c.settings["y"]]
            sim.append(stats.CellInput(c.key, c.label, {s: shift + seed_fx[s] + rng.normal() for s in range(3)},
                                       None, settings=c.settings))
        e = next(e for e in stats.main_effects(sim, ["x", "y"]) if e.axis == "x")
        pq = next(c for c in e.contrasts if {c.a, c.b} == {"p", "q"})
        hits += pq.verdict in (stats.BETTER, stats.WORSE)
    # Holm tests the most significant pair at alpha / 3 and the others at more lenient steps: the figure,
    # computed at the strictest step, is a floor of the power
    assert hits / reps >= 0.8 - 3 * np.sqrt(0.16 / reps)


def test_too_few_runs_on_a_level_give_no_figure():
    one_axis = _design(["p", "q"], ["u"], range(2))  # 2 runs per level
    found = stats.detectable_by_design(one_axis, ["x", "y"])
    assert found["x"].sigmas is None and found["x"].short == ["p", "q"] and found["y"].sigmas is None
    assert stats.detectable_by_design(_design(["p", "q"], ["u"], range(3)), ["x"])["x"].sigmas is not None
    # a level short of runs drops out of the figure, and is named
    uneven = _design(["p", "q", "r"], ["u", "v"], range(2))
    uneven = [c for c in uneven if not (c.settings["x"] == "r" and c.settings["y"] == "v")]
    d = stats.detectable_by_design(uneven, ["x", "y"])["x"]
    assert d.short == ["r"] and d.sigmas is not None


HEADER = re.compile(r"^# Decides: (?P<axis>\S+) at (?P<k>[0-9.]+) σ(?P<rest>.*)$|^# Cannot decide: (?P<no>\S+) ", re.M)


@pytest.mark.parametrize("path", GRIDS, ids=lambda p: p.stem)
def test_every_shipped_grid_header_states_its_question_and_what_its_seeds_can_decide(path):
    text = path.read_text()
    header = text[:text.index("\n[")]
    assert re.search(r"^# Question: \S", header, re.M), f"{path.name}: no '# Question:' line in the header"
    grid = load_grid(path, load_registry(), [])
    found = detectable(grid)
    lines = {m["axis"] or m["no"]: m for m in HEADER.finditer(header)}
    stated = {a: (float(m["k"]) if m["k"] else None) for a, m in lines.items()}
    assert set(stated) == set(found), (f"{path.name}: the header must say, for each swept axis {sorted(found)}, "
                                       f"'# Decides: AXIS at K σ' or '# Cannot decide: AXIS (why)'")
    for axis, d in found.items():
        assert (stated[axis] is None) == (d.sigmas is None), (path.name, axis, d)
        if d.sigmas is not None:
            assert stated[axis] == pytest.approx(d.sigmas, abs=0.05), (path.name, axis, round(d.sigmas, 1))
            for level in d.short:  # the levels that get no verdict are named on the line
                assert re.search(rf"\b{re.escape(level)}\b", lines[axis]["rest"]), (path.name, axis, level)
    assert compared_seeds(grid)


def test_the_dry_run_says_what_the_seeds_can_decide(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from abl.cli import cli

    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["run", str(ROOT / "ablations" / "norms.toml"), "--dry-run"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("design:"))
    assert "seeds [0, 1]" in line and "model.norm: levels 1.8 σ apart (not none" in line and "model.block" in line
    r = CliRunner().invoke(cli, ["run", str(ROOT / "ablations" / "ffn.toml"), "--dry-run",
                                 "--set", "experiment.seeds=[0,1]"])  # one axis: 2 runs per level
    assert r.exit_code == 0 and "model.ffn: no verdict at 2 seed(s)" in r.output
