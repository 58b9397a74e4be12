"""What a new user meets at the command line (issue 25, parts 3 and 4): one message per problem,
the closest shipped grid, a note on a new store, --plugins-dir after the command, a plugin's cells
kept out of a shipped experiment, and abl cost for a component that declares no cost function."""

import json
import re

import pytest
from click.testing import CliRunner
from conftest import run_abl

from abl.cli import cli

GRID = """
[experiment]
name = "msgs"
seeds = [0, 1]
[model]
d_model = 32
n_layers = 2
n_heads = 4
context = 32
ffn = "swigl"
[grid]
"model.norm" = ["rmsnorm", "layernorm", "scalenorm"]
"model.block" = ["pre", "post"]
"""

TINY = ["--set", "model.d_model=32", "--set", "model.n_layers=2", "--set", "model.n_heads=4",
        "--set", "model.context=32", "--set", "train.batch_size=2", "--set", "experiment.seeds=[0]",
        "--set", 'grid.model.block=["pre"]']


def test_a_problem_every_cell_shares_is_one_line(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(GRID)
    r = CliRunner().invoke(cli, ["run", str(grid), "--dry-run", "--db", str(tmp_path / "x.duckdb")])
    assert r.exit_code == 2
    lines = [line for line in r.output.splitlines() if "unknown ffn 'swigl'" in line]
    assert len(lines) == 1, r.output  # was one line per cell: 6 here
    assert "in every cell" in lines[0] and "'swiglu'" in lines[0]


def test_a_problem_some_cells_share_names_them():
    from abl.grid.validation import one_per_problem

    msgs = [f"g.toml: cell [norm={n}, block={b}]: model.context too long"
            for n in ("a", "b", "c", "d") for b in ("pre",)]
    msgs.append("g.toml: cell [norm=a, block=pre]: something else")
    msgs.append("g.toml: unknown key 'model.x'")
    out = one_per_problem(msgs, n_cells=8)
    assert out == [("g.toml: model.context too long (in 4 cells: norm=a, block=pre; norm=b, block=pre; "
                    "norm=c, block=pre; and 1 more)"),
                   "g.toml: cell [norm=a, block=pre]: something else",
                   "g.toml: unknown key 'model.x'"]
    assert one_per_problem(msgs[:4], n_cells=4) == ["g.toml: model.context too long (in every cell)"]


def test_fail_prints_one_line_for_a_shared_problem(capsys):
    """fail() merges them too: the data layer's checks (abl.data.tokenstore) write 'cell [...]' lines."""
    from abl.cli.common import fail

    with pytest.raises(SystemExit):
        fail("cell [norm=a]: model.context=999 is too long\ncell [norm=b]: model.context=999 is too long")
    err = capsys.readouterr().err
    assert err.count("too long") == 1 and "in 2 cells: norm=a; norm=b" in err


@pytest.mark.parametrize("name, close", [("nrms", "norms"), ("ablations/positon.toml", "position"),
                                         ("ffm.toml", "ffn")])
def test_a_misspelled_shipped_grid_gets_the_closest_name(tmp_path, name, close):
    r = CliRunner().invoke(cli, ["run", name, "--dry-run"])
    assert r.exit_code == 2 and "no such file" in r.output
    assert f"did you mean {close!r}" in r.output, r.output


def test_a_misspelled_grid_file_gets_the_closest_file_beside_it(tmp_path):
    (tmp_path / "mygrid.toml").write_text("[experiment]\nname = 'x'\n")
    r = CliRunner().invoke(cli, ["run", str(tmp_path / "mygird.toml"), "--dry-run"])
    assert r.exit_code == 2 and "mygrid.toml" in r.output.split("did you mean")[1]


def test_a_db_in_a_new_folder_says_new_store(tmp_path):
    db = tmp_path / "new" / "folder" / "abl.duckdb"
    runs = tmp_path / "runs"
    runs.mkdir()
    r = CliRunner().invoke(cli, ["ingest", "--db", str(db), "--runs-dir", str(runs)])
    assert r.exit_code == 0, r.output
    assert f"new store at {db}" in r.output and f"creating the folder {tmp_path / 'new'}" in r.output
    again = CliRunner().invoke(cli, ["ingest", "--db", str(db), "--runs-dir", str(runs)])
    assert again.exit_code == 0 and "new store" not in again.output


def test_plugins_dir_is_accepted_after_the_command(no_cost_plugin_dir):
    r = run_abl(["plugins", "--json", "--plugins-dir", str(no_cost_plugin_dir)])
    assert r.returncode == 0, r.stderr
    assert ("norm", "dyt_nocost") in {(row["axis"], row["name"]) for row in json.loads(r.stdout)}
    r = run_abl(["run", "norms", "--dry-run", "--plugins-dir", str(no_cost_plugin_dir),
                 "--set", 'grid.model.norm=["dyt_nocost"]', *TINY])
    assert r.returncode == 0, r.stderr


def _run_ids(output: str) -> set[str]:
    return set(re.findall(r"\b[0-9a-f]{16}\b", output))


def test_a_plugins_cells_never_join_the_shipped_experiment(no_cost_plugin_dir):
    shipped = run_abl(["run", "norms", "--dry-run", "--set", 'grid.model.norm=["rmsnorm"]', *TINY])
    mixed = run_abl(["run", "norms", "--dry-run", "--plugins-dir", str(no_cost_plugin_dir),
                     "--set", 'grid.model.norm=["rmsnorm", "dyt_nocost"]', *TINY])
    assert shipped.returncode == 0 and mixed.returncode == 0, shipped.stderr + mixed.stderr
    # the rmsnorm cell of the mixed grid is another run: its experiment is not the shipped 'norms'
    assert not _run_ids(shipped.stdout) & _run_ids(mixed.stdout)
    assert "experiment 'norms+dyt_nocost'" in mixed.stderr and "apart from the shipped 'norms'" in mixed.stderr
    # naming the experiment is the user's choice, and then it holds
    named = run_abl(["run", "norms", "--dry-run", "--plugins-dir", str(no_cost_plugin_dir),
                     "--set", "experiment.name=norms", "--set", 'grid.model.norm=["rmsnorm", "dyt_nocost"]', *TINY])
    assert named.returncode == 0 and _run_ids(shipped.stdout) <= _run_ids(named.stdout)
    assert "apart from the shipped" not in named.stderr


def test_abl_cost_measures_a_component_without_a_cost_function(no_cost_plugin_dir):
    r = run_abl(["cost", "norms", "--json", "--plugins-dir", str(no_cost_plugin_dir),
                 "--set", 'grid.model.norm=["rmsnorm", "dyt_nocost"]', *TINY])
    assert r.returncode == 0, r.stderr
    rows = {row["cell"].split(",")[0]: row for row in json.loads(r.stdout)}
    pred, meas = rows["norm=rmsnorm"], rows["norm=dyt_nocost"]
    assert pred["cost_source"] == "predicted" and meas["cost_source"] == "measured"
    # alpha and gamma per norm against rmsnorm's gamma: one more parameter per norm layer (2 per block + final)
    assert meas["n_params"] == pred["n_params"] + 2 * 2 + 1
    # the same matrix products: the counted FLOPs agree with the other cell's prediction as the cost model's
    # own check does (abl.model.costmodel.CHECKS: 5%)
    assert meas["flops_per_step"] == pytest.approx(pred["flops_per_step"], rel=0.05)
    assert meas["train_peak_bytes"] == pytest.approx(pred["train_peak_bytes"], rel=0.25)
    text = run_abl(["cost", "norms", "--plugins-dir", str(no_cost_plugin_dir),
                    "--set", 'grid.model.norm=["rmsnorm", "dyt_nocost"]', *TINY])
    assert text.returncode == 0, text.stderr
    assert "measured" in text.stdout and "norm 'dyt_nocost' declare(s) no cost function" in text.stdout


def test_a_refused_grid_does_not_leave_a_new_store_announced_as_made(tmp_path):
    """``note: new store at ...`` is printed before the memory check; when the grid is then refused nothing is
    created, and the message must say so rather than leave the note standing as if the store existed."""
    db = tmp_path / "new" / "abl.duckdb"
    r = CliRunner().invoke(cli, ["run", "norms", "--db", str(db), "--set", "model.d_model=65536",
                                 "--set", "model.n_layers=1024", "--set", "train.batch_size=65536"])
    assert r.exit_code == 2, r.output
    assert "does not fit in memory" in r.output
    assert not db.exists() and not (tmp_path / "new").exists()
    assert f"no store was created at {db}" in r.output, r.output
