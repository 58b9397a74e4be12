"""``abl run GRID --only AXIS=V1,V2 --cells 1,3``: a sub-grid whose runs keep the full grid's run ids."""

import re

import pytest
from click.testing import CliRunner

GRID = """
[experiment]
name = "subgrid"
seeds = [0, 1]
[model]
d_model = 16
n_heads = 2
n_layers = 1
context = 16
[train]
steps = 3
batch_size = 2
eval_every = 3
eval_batches = 1
[data]
dataset = "pystdlib"
[data.pystdlib]
[grid]
"model.norm" = ["layernorm", "rmsnorm"]
"norm.rmsnorm.eps" = [1e-6, 1e-5]
"model.tie_embeddings" = [true, false]
exclude = [{ "model.norm" = "layernorm", "norm.rmsnorm.eps" = 1e-5 }]
"""


@pytest.fixture
def grid_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "grid.toml"
    p.write_text(GRID.replace("[data.pystdlib]\n", ""))
    return p


def full_grid(path):
    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid

    return load_grid(path, get_registry())


def dry(args):
    from abl.cli import cli

    return CliRunner().invoke(cli, ["run", "grid.toml", "--dry-run", *args], terminal_width=200)


def listed(output):
    """(cell number, run id) of every row of the --dry-run table."""
    return re.findall(r"│\s+(\d+) │ ([0-9a-f]{16}) │", output)


def test_the_dry_run_numbers_cells_and_cells_selects_them_by_number(grid_file):
    from abl.grid.selection import cell_numbers

    g = full_grid(grid_file)
    numbers = cell_numbers(g)
    r = dry([])
    assert r.exit_code == 0, r.output
    rows = listed(r.output)
    assert [(str(numbers[c.cell_key]), c.run_id) for c in g.cells] == rows
    assert len(numbers) == 6 and len(rows) == 12  # 6 cells x 2 seeds, numbered 1..6 in grid order

    r = dry(["--cells", "1,3-4"])
    assert r.exit_code == 0, r.output
    want = [(str(numbers[c.cell_key]), c.run_id) for c in g.cells if numbers[c.cell_key] in (1, 3, 4)]
    assert listed(r.output) == want and len(want) == 6


def test_only_selects_by_the_grids_values_and_keeps_the_run_ids(grid_file):
    g = full_grid(grid_file)
    r = dry(["--only", "norm.rmsnorm.eps=1e-5"])  # written as the grid writes it, shown as 1e-05
    assert r.exit_code == 0, r.output
    want = [c.run_id for c in g.cells if c.varied["norm.rmsnorm.eps"] == 1e-5]
    assert [rid for _, rid in listed(r.output)] == want and len(want) == 4

    r = dry(["--only", "model.norm=rmsnorm", "--only", "model.tie_embeddings=false"])
    assert r.exit_code == 0, r.output
    want = [c.run_id for c in g.cells if c.model.norm == "rmsnorm" and not c.model.tie_embeddings]
    assert [rid for _, rid in listed(r.output)] == want and len(want) == 4

    # both: the cells that pass each
    r = dry(["--only", "model.norm=layernorm,rmsnorm", "--only", "model.tie_embeddings=true", "--cells", "1-3"])
    assert r.exit_code == 0, r.output
    nums = sorted({n for n, _ in listed(r.output)})
    assert nums == ["1", "3"]


@pytest.mark.parametrize("args, words", [
    (["--only", "model.nrm=rmsnorm"], ["model.nrm is not an axis", "model.norm, norm.rmsnorm.eps, "
                                                                    "model.tie_embeddings"]),
    (["--only", "model.norm=scalenorm"], ["no value 'scalenorm'", "its values: layernorm, rmsnorm"]),
    (["--only", "norm.rmsnorm.eps=1e-4"], ["no value '1e-4'", "1e-06, 1e-05"]),
    (["--only", "model.norm"], ["expected AXIS=VALUE"]),
    (["--only", "model.norm=rmsnorm", "--only", "model.norm=layernorm"], ["given twice"]),
    (["--cells", "7"], ["no cell 7", "valid cell numbers: 1-6"]),
    (["--cells", "0"], ["no cell 0", "1-6"]),
    (["--cells", "2-x"], ["not a cell number or a range", "1-6"]),
    (["--cells", "4-2"], ["range '4-2' is empty"]),
    (["--only", "model.tie_embeddings=true", "--cells", "2"], ["keeps no cell"]),
])
def test_bad_selections_exit_2_with_one_line_listing_the_choices(grid_file, args, words):
    for extra in ([], ["--dry-run"]):
        from abl.cli import cli

        r = CliRunner().invoke(cli, ["run", "grid.toml", *extra, *args, "--db", "out/abl.duckdb"])
        assert r.exit_code == 2, r.output
        msg = r.output.strip()
        assert msg.startswith("error: ") and "\n" not in msg and "Traceback" not in msg
        for w in words:
            assert w in msg
    import os

    assert not os.path.exists("out")  # refused before the store was touched


def test_an_lr_sweep_grid_refuses_a_selection(grid_file):
    grid_file.write_text(GRID.replace("[data.pystdlib]\n", "").replace("eval_batches = 1",
                                                                        "eval_batches = 1\nlr_sweep = [1e-3, 3e-3]"))
    r = dry(["--cells", "1"])
    assert r.exit_code == 2 and "train.lr_sweep" in r.output


@pytest.mark.slow
def test_a_sub_grid_run_shares_its_cells_with_the_later_full_run(grid_file, tmp_path):
    from conftest import run_abl

    base = ["run", "grid.toml", "--db", str(tmp_path / "abl.duckdb"), "--set", "experiment.seeds=[0]",
            "--set", "grid.model.tie_embeddings=[true]"]
    r = run_abl([*base, "--only", "model.norm=rmsnorm", "--cells", "2"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "1 runs (1 cells x seeds); 0 already completed, skipped; 1 to run" in " ".join(r.stdout.split())
    r = run_abl(base, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "3 runs (3 cells x seeds); 1 already completed, skipped; 2 to run" in " ".join(r.stdout.split())
