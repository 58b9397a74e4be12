"""``abl ladder`` (issue 41, item 5): stored runs of a [ladder] grid read back as verdicts along the sizes."""

from __future__ import annotations

import math

import numpy as np
from click.testing import CliRunner

from abl.cli import cli
from abl.model.costmodel import predict
from conftest import completed_store, tiny_grid_text

LADDER = """
[ladder]
sizes = [{ d_model = 32, n_layers = 1 }, { d_model = 48, n_layers = 2 }, { d_model = 64, n_layers = 3 }]
tokens_per_param = 1
"""


def _store(grid_path, loss_of, registry):
    """Completed runs of the ladder grid, ``loss_of(cell, its training FLOPs)`` each, recorded with ``flops``."""
    from abl.grid.gridfile import load_grid

    g = load_grid(grid_path, registry)
    compute = {c.run_id: predict(c, registry)["train_flops_per_token"] * c.train.steps * c.train.batch_size
               * c.model.context for c in g.cells}
    return completed_store(grid_path, registry, lambda c: loss_of(c, compute[c.run_id]),
                           extra=lambda c: {"flops": compute[c.run_id]})


def test_a_planted_flip_reads_flips_near_and_a_steady_gap_holds(tmp_path, monkeypatch, registry):
    monkeypatch.chdir(tmp_path)
    text = tiny_grid_text(experiment={"seeds": [0, 1, 2, 3]},
                          grid={"model.norm": ["rmsnorm", "layernorm"]}) + LADDER
    grid = tmp_path / "grid.toml"
    grid.write_text(text)
    rng = np.random.default_rng(0)
    seed_noise = {s: rng.standard_normal() * 0.002 for s in range(4)}
    computes = []

    def loss_of(cell, compute):
        computes.append(compute)
        # layernorm has the steeper law: worse below 1e10 FLOPs, better above
        b = 0.08 if cell.model.norm == "layernorm" else 0.05
        return 3.0 * (compute / 1e10) ** -b + seed_noise[cell.seed]

    _, db = _store(grid, loss_of, registry)
    out = CliRunner().invoke(cli, ["ladder", str(grid), "--db", str(db), "--at", "1e15"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "norm=rmsnorm vs norm=layernorm" in text
    # the true crossing of the two laws lies within the ladder's range, so the verdict must find a flip
    c_star = 1e10
    assert min(computes) < c_star < max(computes)
    assert "flips near" in text, text
    assert "predicted difference at 1e+15 FLOPs" in text


def test_runs_without_sizes_are_refused_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(cli, ["ladder", "nosuch-experiment", "--db", str(tmp_path / "none.duckdb")])
    assert out.exit_code == 2
    assert "Traceback" not in out.output


def test_ladder_and_compare_resolve_a_source_alike(tmp_path, monkeypatch):
    """One resolver (abl.cli.resolve) for both commands: the same message for a missing grid file and for a
    store that is not there."""
    monkeypatch.chdir(tmp_path)
    db = str(tmp_path / "none.duckdb")
    for source, words in (("missing.toml", "missing.toml: no such grid file"),
                          ("nosuch-experiment", "no database at")):
        outs = [CliRunner().invoke(cli, [cmd, source, "--db", db]) for cmd in ("ladder", "compare")]
        for out in outs:
            assert out.exit_code == 2 and "Traceback" not in out.output, out.output
            assert words in " ".join(out.output.split()), out.output
        assert outs[0].output == outs[1].output


def test_a_probe_beside_the_ladder_is_read_against_the_largest_size(tmp_path, monkeypatch, registry):
    """``abl ladder --probe``: a recorded probe accuracy at each size against the largest size's loss order,
    and the smaller sizes' own loss as the reference; a probe no run recorded is refused, exit 2."""
    monkeypatch.chdir(tmp_path)
    text = tiny_grid_text(experiment={"seeds": [0, 1, 2]},
                          grid={"model.norm": ["rmsnorm", "layernorm", "scalenorm"]}) + LADDER
    grid = tmp_path / "grid.toml"
    grid.write_text(text)
    rank = {"rmsnorm": 0, "layernorm": 1, "scalenorm": 2}
    rng = np.random.default_rng(1)
    noise = {(n, s): 0.001 * rng.standard_normal() for n in rank for s in range(3)}

    from abl.grid.gridfile import load_grid

    g = load_grid(grid, registry)
    compute = {c.run_id: predict(c, registry)["train_flops_per_token"] * c.train.steps * c.train.batch_size
               * c.model.context for c in g.cells}
    _, db = completed_store(grid, registry,
                            lambda c: 3.0 * (compute[c.run_id] / 1e9) ** -0.05 + 0.03 * rank[c.model.norm]
                            + noise[(c.model.norm, c.seed)],
                            extra=lambda c: {"flops": compute[c.run_id],
                                             "mqar_accuracy": 0.9 - 0.2 * rank[c.model.norm]
                                             + noise[(c.model.norm, c.seed)]})
    out = CliRunner().invoke(cli, ["ladder", str(grid), "--db", str(db)])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "beside the ladder" in text
    assert text.count("mqar_accuracy at d_model=32") == 1 and "ranks them as the largest size does" in text
    assert "val_loss at d_model=32 n_layers=1 against val_loss at d_model=64 n_layers=3" in text, text
    bad = CliRunner().invoke(cli, ["ladder", str(grid), "--db", str(db), "--probe", "induction_accuracy"])
    assert bad.exit_code == 2 and "no run recorded induction_accuracy" in bad.output
    assert "mqar_accuracy" in bad.output  # what the runs did record
