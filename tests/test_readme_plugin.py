"""The external plugin of docs/plugins.md, installed with pip the way a user would, then trained with."""

import json
import os
import re
import subprocess
import sys

import duckdb
import pytest

from conftest import ROOT, run_abl


def readme_files():
    text = (ROOT / "docs" / "plugins.md").read_text()
    blocks = re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", text, re.S)
    assert len(blocks) == 2, "docs/plugins.md's plugin example should be two files"
    return blocks


def test_example_is_20_to_40_lines():
    n = sum(len([line for line in body.splitlines() if line.strip()]) for _, body in readme_files())
    assert 20 <= n <= 40, n


@pytest.mark.slow
def test_readme_plugin_installs_and_trains(tmp_path):
    for name, body in readme_files():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--target", str(site), str(tmp_path / "abl-dyt")], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    env = {"PYTHONPATH": str(site) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env_clean = {k: v for k, v in os.environ.items() if k != "ABL_PLUGINS"}
    env_clean.update(env)

    listed = subprocess.run([sys.executable, "-m", "abl.cli", "plugins", "--json"], cwd=ROOT,
                            capture_output=True, text=True, env=env_clean)
    rows = {(r["axis"], r["name"]): r for r in json.loads(listed.stdout)}
    assert rows[("norm", "dyt")]["package"] == "abl-dyt"
    assert rows[("norm", "dyt")]["plugin"] == "abl-dyt:dyt"

    grid = tmp_path / "g.toml"
    grid.write_text("""
[experiment]
name = "dyt"
seeds = [0]
[model]
d_model = 32
n_layers = 2
n_heads = 4
context = 32
norm = "dyt"
[norm.dyt]
alpha_init = 0.8
[train]
steps = 8
batch_size = 4
eval_every = 8
eval_batches = 2
[dataset.pystdlib]
max_bytes = 300000
""")
    # its cost function: abl cost predicts the cell before it runs (params: alpha, gamma, beta per norm)
    r = subprocess.run([sys.executable, "-m", "abl.cli", "cost", str(grid), "--json"], cwd=ROOT,
                       capture_output=True, text=True, env=env_clean, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    norms = [part for part in json.loads(r.stdout)[0]["parts"] if part["axis"] == "norm"]
    assert norms and all(part["component"] == "dyt" and part["params"] == 1 + 2 * 32 for part in norms)

    db = tmp_path / "x.duckdb"
    r = subprocess.run([sys.executable, "-m", "abl.cli", "run", str(grid), "--db", str(db)], cwd=ROOT,
                       capture_output=True, text=True, env=env_clean, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    con = duckdb.connect(str(db), read_only=True)
    status, comp, alpha = con.execute(
        "SELECT status, versions->>'$.components.norm', config->>'$.components.norm.params.alpha_init'"
        " FROM runs").fetchone()
    assert status == "completed" and "abl-dyt" in comp and float(alpha) == 0.8

    # without the package on the path, the same grid is a clear error listing the valid norms
    r = run_abl(["run", str(grid), "--db", str(tmp_path / "y.duckdb")])
    assert r.returncode == 2 and "unknown norm 'dyt'" in r.stderr and "rmsnorm" in r.stderr
