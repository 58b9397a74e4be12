"""A ladder grid's size axis is no question asked (issues 40/41 review): the run summary and ``abl compare`` of a
ladder grid give the variants' per-axis answers and name the sizes run, but no verdict for the size axis ("the
bigger model has the lower loss"); ``abl ladder`` answers whether the variants' ordering holds across sizes."""

from __future__ import annotations

import json

from click.testing import CliRunner

from abl.cli import cli
from conftest import completed_store, tiny_grid_text

LADDER = """
[ladder]
sizes = [{ d_model = 32, n_layers = 1 }, { d_model = 48, n_layers = 2 }, { d_model = 64, n_layers = 3 }]
"""


def _ladder_store(tmp_path, registry):
    """A ladder grid (3 sizes, the norm axis swept beside them) with completed fake runs, ingested: bigger is
    better by a wide margin, layernorm a little worse than rmsnorm at every size. (grid file, store, grid)"""
    grid = tmp_path / "grid.toml"
    grid.write_text(tiny_grid_text(experiment={"seeds": [0, 1, 2, 3]}, grid={"model.norm": ["rmsnorm", "layernorm"]})
                    + LADDER)
    noise = {0: 0.001, 1: -0.002, 2: 0.0015, 3: -0.0005}

    def loss(cell):
        return (4.0 - cell.model.d_model / 32 + (0.05 if cell.model.norm == "layernorm" else 0.0)
                + noise[cell.seed])

    g, db = completed_store(grid, registry, loss)
    return grid, db, g


def _text(out) -> str:
    return " ".join(out.output.split())


def test_compare_of_a_ladder_grid_gives_no_verdict_for_the_size_axis(tmp_path, monkeypatch, registry):
    monkeypatch.chdir(tmp_path)
    grid, db, _ = _ladder_store(tmp_path, registry)
    out = CliRunner().invoke(cli, ["compare", str(grid), "--db", str(db), "--wide"])
    assert out.exit_code == 0, out.output
    text = _text(out)
    assert "model.norm: best rmsnorm; verdict: rmsnorm is better than layernorm" in text  # the question asked
    assert "model.d_model: best" not in text and "verdict: 64" not in text, text
    assert "model.d_model: the ladder's sizes, smallest first: 32, 48, 64" in text, text
    data = json.loads(CliRunner().invoke(cli, ["compare", str(grid), "--db", str(db), "--json"]).output)
    axes = {e["axis"]: e for e in data[0]["axes"]}
    assert axes["model.d_model"]["best"] is None and axes["model.d_model"]["contrasts"] == []
    assert axes["model.norm"]["best"] == "rmsnorm"


def test_the_run_summary_of_a_ladder_grid_gives_no_verdict_for_the_size_axis(tmp_path, monkeypatch, registry):
    from rich.console import Console

    from abl.present.summary import print_run_summary
    from abl.present.termlayout import Presentation

    monkeypatch.chdir(tmp_path)
    _, db, g = _ladder_store(tmp_path, registry)
    console = Console(record=True, width=200)
    print_run_summary(console, db, g, presentation=Presentation(layout="wide"))
    text = " ".join(console.export_text().split())
    assert "Verdict, model.norm: rmsnorm is better than layernorm" in text  # the closing answer: the question asked
    assert "Verdict, model.d_model" not in text and "model.d_model: best" not in text, text
    assert "the ladder's sizes, smallest first: 32, 48, 64" in text


def test_a_swept_width_without_a_ladder_is_still_a_question(tmp_path, monkeypatch, registry):
    """A [grid] sweep of model.d_model alone (no tied key beside it) is the user's own question: it keeps its
    verdict."""
    monkeypatch.chdir(tmp_path)
    grid = tmp_path / "grid.toml"
    grid.write_text(tiny_grid_text(experiment={"seeds": [0, 1, 2]}, grid={"model.d_model": [32, 64]}))
    _, db = completed_store(grid, registry, lambda c: 4.0 - c.model.d_model / 32 + 0.001 * c.seed)
    out = CliRunner().invoke(cli, ["compare", str(grid), "--db", str(db), "--wide"])
    assert out.exit_code == 0, out.output
    assert "model.d_model: best 64; verdict: 64 is better than 32" in _text(out), _text(out)
