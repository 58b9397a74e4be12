"""The CLI as a user runs it: subprocesses, a temporary database, assertions on stored rows."""

import json
import subprocess
import sys

import duckdb
import pytest

from conftest import ROOT, run_abl

TINY = """
[experiment]
name = "tiny"
seeds = [0, 1]
[model]
d_model = 32
n_layers = 2
n_heads = 4
context = 32
[train]
steps = 12
batch_size = 4
eval_every = 6
eval_batches = 2
[dataset.pystdlib]
max_bytes = 300000
[grid]
"model.norm" = ["rmsnorm", "none"]
"""


def test_help_is_fast_and_does_not_import_torch():
    code = ("import sys\nfrom click.testing import CliRunner\nfrom abl.cli import cli\n"
            "r = CliRunner().invoke(cli, ['--help'])\nassert r.exit_code == 0, r.output\n"
            "assert 'run' in r.output\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_plugins_json_lists_every_component_with_provenance():
    r = run_abl(["plugins", "--json"])
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {"axis", "name", "plugin"} <= set(rows[0])
    found = {(x["axis"], x["name"]): x for x in rows}
    assert found[("norm", "scalenorm")]["plugin"] == "norms"
    assert found[("block", "post_branch")]["package"] == "abl"
    r = run_abl(["plugins"])
    assert r.returncode == 0 and "post_branch" in r.stdout and "abl 0.1.0" in r.stdout


@pytest.mark.slow
def test_run_stores_rows_and_a_second_run_skips_them(tmp_path):
    grid = tmp_path / "tiny.toml"
    grid.write_text(TINY)
    db = tmp_path / "out" / "x.duckdb"
    r = run_abl(["run", str(grid), "--db", str(db)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 already completed" in r.stdout
    con = duckdb.connect(str(db), read_only=True)
    runs = con.execute("SELECT run_id, status, seed, config->>'$.model.norm', git_commit, device,"
                       " data_fingerprint FROM runs").fetchall()
    assert len(runs) == 4 and {x[1] for x in runs} == {"completed"}
    assert {(x[2], x[3]) for x in runs} == {(0, "rmsnorm"), (1, "rmsnorm"), (0, "none"), (1, "none")}
    assert all(x[4] and x[5] and len(x[6]) == 64 for x in runs)
    for name in ("train_loss", "val_loss", "tokens_per_s", "peak_mem_bytes", "lr", "grad_norm",
                 "n_params", "wall_s"):
        n = con.execute("SELECT count(DISTINCT run_id) FROM metrics WHERE name = ?", [name]).fetchone()[0]
        assert n == 4, name
    steps = con.execute("SELECT count(*) FROM metrics WHERE name = 'train_loss' GROUP BY run_id").fetchall()
    assert {s[0] for s in steps} == {12}
    n_metrics = con.execute("SELECT count(*) FROM metrics").fetchone()[0]
    con.close()
    assert "val_loss" in r.stdout and "rmsnorm" in r.stdout  # the summary table

    again = run_abl(["run", str(grid), "--db", str(db)])
    assert again.returncode == 0, again.stderr
    assert "4 already completed, skipped; 0 to run" in again.stdout
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM metrics").fetchone()[0] == n_metrics
    con.close()


@pytest.mark.slow
def test_a_failing_cell_does_not_lose_the_others(tmp_path):
    # a missing data file is refused before training (tests/test_tokenstore.py); this cell fails in its worker
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "boom.py").write_text(
        "from abl import hookimpl\n\n"
        "def boom(dim):\n    raise RuntimeError('the boom norm always fails')\n\n"
        "@hookimpl\ndef register_components(register):\n    register('norm', 'boom', boom)\n")
    grid = tmp_path / "g.toml"
    grid.write_text(TINY.replace('"model.norm" = ["rmsnorm", "none"]', '"model.norm" = ["rmsnorm", "boom"]')
                    .replace("seeds = [0, 1]", "seeds = [0]"))
    db = tmp_path / "x.duckdb"
    r = run_abl(["--plugins-dir", str(plugins), "run", str(grid), "--db", str(db)])
    assert r.returncode == 1, r.stdout + r.stderr
    con = duckdb.connect(str(db), read_only=True)
    rows = dict(con.execute("SELECT config->>'$.model.norm', status FROM runs").fetchall())
    err = con.execute("SELECT error FROM runs WHERE status = 'failed'").fetchone()[0]
    assert rows == {"rmsnorm": "completed", "boom": "failed"}
    assert "the boom norm always fails" in err


def _assert_user_error(r, db):
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not db.exists()


def test_misspelled_component_exits_2_with_the_valid_choices(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(TINY.replace('"none"]', '"layernrom"]'))
    db = tmp_path / "x.duckdb"
    r = run_abl(["run", str(grid), "--db", str(db)])
    _assert_user_error(r, db)
    assert "layernorm, none, rmsnorm, scalenorm" in r.stderr
    assert "Closest match: 'layernorm'" in r.stderr


def test_toml_syntax_error_exits_2_naming_file_and_line(tmp_path):
    grid = tmp_path / "broken.toml"
    grid.write_text(TINY.replace("d_model = 32", "d_model = = 32"))
    db = tmp_path / "x.duckdb"
    r = run_abl(["run", str(grid), "--db", str(db)])
    _assert_user_error(r, db)
    assert "broken.toml:6:" in r.stderr and "line 6" in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--set", "model.n_heads=5"], "not divisible"),
    (["--set", "model.d_model"], "expected KEY=VALUE"),
    (["--set", "train.stepz=3"], "did you mean 'steps'"),
    (["--max-cells", "2"], "more than --max-cells=2"),
])
def test_bad_overrides_exit_2(tmp_path, args, needle):
    grid = tmp_path / "g.toml"
    grid.write_text(TINY)
    db = tmp_path / "x.duckdb"
    r = run_abl(["run", str(grid), "--db", str(db), *args])
    _assert_user_error(r, db)
    assert needle in r.stderr


def test_missing_grid_file_exits_2(tmp_path):
    r = run_abl(["run", str(tmp_path / "nope.toml"), "--db", str(tmp_path / "x.duckdb")])
    _assert_user_error(r, tmp_path / "x.duckdb")
    assert "no such file" in r.stderr


def test_dry_run_lists_cells_without_training(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(TINY)
    r = run_abl(["run", str(grid), "--dry-run", "--db", str(tmp_path / "x.duckdb")])
    assert r.returncode == 0 and "4 runs" in r.stdout
    assert not (tmp_path / "x.duckdb").exists()


@pytest.mark.slow
def test_norms_grid_end_to_end_at_30_steps(tmp_path):
    """The foundation issue's acceptance run: every cell of ablations/norms.toml completes."""
    db = tmp_path / "x.duckdb"
    r = run_abl(["run", "ablations/norms.toml", "--set", "train.steps=30", "--set", "train.eval_every=30",
                 "--db", str(db), "--workers", "2"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*), count(*) FILTER (WHERE status = 'completed') FROM runs").fetchone() == (26, 26)
    for name in ("train_loss", "val_loss", "tokens_per_s", "peak_mem_bytes"):
        assert con.execute("SELECT count(DISTINCT run_id) FROM metrics WHERE name = ?", [name]).fetchone()[0] == 26
    con.close()
    again = run_abl(["run", "ablations/norms.toml", "--set", "train.steps=30", "--set", "train.eval_every=30",
                     "--db", str(db)])
    assert again.returncode == 0 and "26 already completed, skipped; 0 to run" in again.stdout
