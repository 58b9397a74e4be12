"""``abl run --until-decided`` (issue 41, item 4): seeds are added only where a comparison is undecided."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from abl.analysis import sequential as sq
from abl.contracts.config import ConfigError
from abl.run.until_decided import run_until_decided, seed_sequence
from conftest import tiny_grid_text, write_completed_runs

EFFECT = {"rmsnorm": 0.0, "layernorm": 0.08, "scalenorm": 0.0}


def _value(cell):
    noise = np.random.default_rng(zlib.crc32(f"{cell.model.norm}{cell.seed}".encode())).standard_normal()
    seed_effect = np.random.default_rng(cell.seed).standard_normal() * 0.05  # shared by every cell of a seed
    return 3.0 + EFFECT[cell.model.norm] + seed_effect + 0.01 * noise


def _setup(tmp_path, registry, seeds=(0, 1, 2)):
    from abl.grid.gridfile import load_grid
    from abl.store import database as store
    from abl.store.reader import read_runs

    path = tmp_path / "g.toml"
    path.write_text(tiny_grid_text(experiment={"seeds": list(seeds)},
                                   grid={"model.norm": ["rmsnorm", "layernorm", "scalenorm"]}))
    runs_dir, db = tmp_path / "runs", tmp_path / "abl.duckdb"
    trained: list = []

    def expand(s):
        return load_grid(path, registry, [] if s is None else [f"experiment.seeds={list(s)!r}"])

    def train(grid):
        trained.append([(c.model.norm, c.seed) for c in grid.cells])
        write_completed_runs(grid.cells, runs_dir, str(path), _value)
        store.ingest_dirs(db, [runs_dir / c.run_id for c in grid.cells])

    def read(run_ids):
        return read_runs(db, run_ids=run_ids) if db.exists() else []

    return expand, read, train, trained


def test_seeds_go_only_to_undecided_comparisons_until_the_budget(tmp_path, registry):
    expand, read, train, trained = _setup(tmp_path, registry)
    said: list[str] = []
    decisions = run_until_decided(expand, read, train, budget=7, say=said.append)
    by = {(d.a, d.b): d for d in decisions}
    planted = next(d for k, d in by.items() if "layernorm" in k[0] + k[1] and "rmsnorm" in k[0] + k[1])
    null = next(d for k, d in by.items() if "scalenorm" in k[0] + k[1] and "rmsnorm" in k[0] + k[1])
    assert planted.look.decision in (sq.BETTER, sq.WORSE)
    assert planted.look.seeds < 7  # decided before the budget
    assert null.look.decision == sq.SAME and null.look.seeds == 7  # the budget spent, no verdict invented
    # the first round trains the grid's own seeds; later rounds only what an undecided pair needs
    assert sorted(trained[0]) == sorted((n, s) for n in EFFECT for s in (0, 1, 2))
    last = trained[-1]
    assert {n for n, _ in last} <= {"rmsnorm", "scalenorm"}
    assert all(s >= 3 for _, s in last)
    assert any("undecided" in line for line in said)


def test_new_seeds_continue_the_grid_and_keep_its_run_ids(tmp_path, registry):
    expand, *_ = _setup(tmp_path, registry)
    assert seed_sequence([0, 1, 2], 5) == [0, 1, 2, 3, 4]
    assert seed_sequence([5, 9, 7], 4) == [5, 9, 7, 10]
    small, large = expand(None), expand([0, 1, 2, 3])
    assert {c.run_id for c in small.cells} < {c.run_id for c in large.cells}


def test_too_few_seeds_or_no_pairs_is_refused(tmp_path, registry):
    expand, read, train, _ = _setup(tmp_path, registry, seeds=(0, 1))
    with pytest.raises(ConfigError, match="at least 3"):
        run_until_decided(expand, read, train, budget=6, say=lambda s: None)


def test_abl_run_until_decided_trains_rounds_and_answers_with_the_sequential_test(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from abl.cli import cli
    from abl.store.reader import read_runs

    monkeypatch.chdir(tmp_path)
    grid = tmp_path / "g.toml"
    grid.write_text(tiny_grid_text(experiment={"seeds": [0, 1, 2]}))
    out = CliRunner().invoke(cli, ["run", str(grid), "--until-decided", "--budget", "4", "--db", "s/abl.duckdb"])
    assert out.exit_code == 0, out.output
    assert "until decided: 1 comparison(s)" in out.output
    assert "(model.norm):" in out.output  # the one pair's answer
    runs = read_runs(tmp_path / "s" / "abl.duckdb")
    seeds = sorted({r.seed for r in runs})
    assert seeds[:3] == [0, 1, 2] and len(runs) in (6, 8)
    assert "Verdict," not in out.output  # no fixed-seed verdict beside the sequential answer
    bad = CliRunner().invoke(cli, ["run", str(grid), "--until-decided", "--cells", "1", "--db", "s/abl.duckdb"])
    assert bad.exit_code == 2 and "cannot be combined" in bad.output
