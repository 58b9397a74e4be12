"""The resolved config: each component named once, run ids from its canonical shape, the worker's Cell
built from it directly, and run folders written in the older shape still stored and resumed."""

import json

import duckdb
import pytest
from conftest import run_abl

from abl.contracts.config import (
    CONFIG_FORMAT,
    ConfigError,
    canonical_config,
    cell_from_config,
    compact_config,
    config_hash,
    run_id_of,
    selector,
)
from abl.contracts.registry import AXES
from abl.grid.gridfile import expand, load_grid, packaged_grids
from abl.grid.labels import grid_label

TINY = {"experiment": {"name": "rc", "seeds": [0]},
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "context": 32},
        "train": {"steps": 2, "batch_size": 4, "eval_every": 50, "eval_batches": 1},
        "dataset": {"pystdlib": {"max_bytes": 200000}}}


def _old_shape(config):
    """A config as abl wrote it before format 2 (every component named in components too)."""
    return canonical_config(config)


@pytest.mark.parametrize("name", sorted(packaged_grids()))
def test_every_shipped_cell_names_each_component_once(name, registry):
    for cell in load_grid(packaged_grids()[name], registry).cells:
        cfg = cell.config
        assert cfg["format"] == CONFIG_FORMAT
        for axis in AXES:
            section, key = selector(axis)
            assert "name" not in cfg["components"][axis], (name, axis)
            assert cfg[section][key] == cell.components[axis]["name"]
        # the run id is the hash of the canonical (older) shape, which names them twice
        old = _old_shape(cfg)
        assert all(old["components"][a]["name"] == cfg[selector(a)[0]][selector(a)[1]] for a in AXES)
        assert "format" not in old
        assert cell.run_id == config_hash(old) == run_id_of(cfg) == run_id_of(old)
        assert compact_config(old) == cfg


def test_the_worker_cell_is_the_grid_cell_from_either_shape(registry):
    raw = {**TINY, "norm": {"rmsnorm": {"eps": 1e-5}},
           "grid": {"model.norm": ["rmsnorm", "layernorm"], "mixer.mha.n_kv_heads": [2, 4]}}
    for cell in expand(raw, registry).cells:
        for stored in (json.loads(json.dumps(cell.config)), json.loads(json.dumps(_old_shape(cell.config)))):
            again = cell_from_config(stored, registry)
            assert again.run_id == cell.run_id and again.cell_key == cell.cell_key
            assert (again.model, again.train, again.data, again.eval, again.seed) == \
                (cell.model, cell.train, cell.data, cell.eval, cell.seed)
            assert again.components == cell.components
            assert again.config == cell.config  # the worker works on (and would store) the one shape


def test_a_token_budget_cell_rebuilds_in_the_worker(registry):
    # the stored [train] holds the resolved steps beside train.tokens; validating it a second time
    # refused it ("give train.steps or train.tokens, not both")
    raw = {**TINY, "train": {k: v for k, v in TINY["train"].items() if k != "steps"} | {"tokens": 1000}}
    cell = expand(raw, registry).cells[0]
    assert cell.train.steps == 8  # ceil(1000 / (4 * 32))
    again = cell_from_config(json.loads(json.dumps(cell.config)), registry)
    assert again.train.steps == 8 and again.run_id == cell.run_id


def test_a_budget_matched_preset_keeps_its_solved_depth_in_the_worker(registry):
    # a second validation applied model.scale again and undid the depth train.match had solved
    raw = {**TINY, "model": {"scale": "s", "context": 32},  # 4 layers
           "train": {**TINY["train"], "match": "params", "match_by": "n_layers"},
           "grid": {"ffn.gelu.ratio": [4.0, 10.0]}}  # the wider FFN's cell gets 2 layers
    cells = expand(raw, registry).cells
    resized = [c for c in cells if c.model.n_layers == 2]
    assert resized, [c.model.n_layers for c in cells]
    for c in resized:
        again = cell_from_config(json.loads(json.dumps(c.config)), registry)
        assert again.model.n_layers == c.model.n_layers and again.run_id == c.run_id


def test_a_stored_config_names_what_is_wrong_with_it(registry):
    cfg = expand(TINY, registry).cells[0].config
    with pytest.raises(ConfigError, match="model.norm: .*'nonorm'"):
        cell_from_config({**cfg, "model": {**cfg["model"], "norm": "nonorm"}}, registry)
    with pytest.raises(ConfigError, match="config format 7 is not one this abl reads"):
        cell_from_config({**cfg, "format": 7}, registry)
    with pytest.raises(ConfigError, match="this abl version: TypeError"):
        cell_from_config({**cfg, "model": {**cfg["model"], "wingspan": 3}}, registry)
    old = _old_shape(cfg)
    old["components"]["norm"]["name"] = "layernorm"  # two names that disagree: which one ran?
    with pytest.raises(ConfigError, match="names norm 'layernorm' in components but model.norm = 'rmsnorm'"):
        cell_from_config(old, registry)


def test_the_grid_label_is_computed_by_abl_grid_labels(registry):
    raw = {**TINY, "grid": {"model.tie_embeddings": [True, False], "train.lr": [0.001]}}
    cells = expand(raw, registry).cells
    assert [c.label for c in cells] == ["tie_embeddings=true, lr=0.001", "tie_embeddings=false, lr=0.001"]
    assert all(c.label == grid_label(c.varied) for c in cells)
    assert expand(TINY, registry).cells[0].label == "base"


@pytest.mark.slow
def test_a_run_folder_in_the_old_shape_is_stored_and_its_cell_not_run_again(tmp_path, registry):
    grid = tmp_path / "g.toml"
    grid.write_text('[experiment]\nname = "rc"\nseeds = [0]\n[model]\nd_model = 32\nn_layers = 2\nn_heads = 4\n'
                    'context = 32\n[train]\nsteps = 2\nbatch_size = 4\neval_every = 50\neval_batches = 1\n'
                    '[dataset.pystdlib]\nmax_bytes = 200000\n[grid]\n"model.norm" = ["rmsnorm", "layernorm"]\n')
    db, runs = tmp_path / "abl.duckdb", tmp_path / "runs"
    r = run_abl(["run", str(grid), "--db", str(db)], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    cells = load_grid(grid, registry).cells
    for c in cells:  # the folders as the previous abl wrote them
        (runs / c.run_id / "config.json").write_text(json.dumps(_old_shape(c.config)))
    db.unlink()
    r = run_abl(["ingest", "--db", str(db)], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    con = duckdb.connect(str(db), read_only=True)
    try:
        stored = dict(con.execute("SELECT run_id, config FROM runs WHERE status = 'completed'").fetchall())
    finally:
        con.close()
    assert stored == {c.run_id: json.dumps(_old_shape(c.config), sort_keys=True) for c in cells}
    r = run_abl(["run", str(grid), "--db", str(db)], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 already completed, skipped; 0 to run" in r.stdout, r.stdout
    # a cell of the old shape that a worker restarts (killed, say) trains from its folder as it is
    first = runs / cells[0].run_id
    (first / "status.json").write_text(json.dumps({"status": "killed", "error": "stopped by signal SIGTERM"}))
    (first / "metrics.jsonl").unlink()
    assert run_abl(["ingest", "--db", str(db)], cwd=tmp_path).returncode == 0
    r = run_abl(["run", str(grid), "--db", str(db)], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((first / "status.json").read_text())["status"] == "completed", r.stdout
    assert json.loads((first / "config.json").read_text()) == cells[0].config  # rewritten in today's shape


HOOK_PLUGIN = '''
import json
from pathlib import Path

from abl import hookimpl


@hookimpl
def run_finished(run_id, status, config, summary):
    Path({out!r}).write_text(json.dumps({{"run_id": run_id, "config": config}}))
'''

ONE_CELL = """
[experiment]
name = "hooked"
seeds = [0]
[model]
d_model = 16
n_layers = 1
n_heads = 2
context = 16
norm = "layernorm"
[train]
steps = 2
batch_size = 2
eval_every = 2
eval_batches = 1
[dataset.pystdlib]
max_bytes = 100000
"""


@pytest.mark.slow
def test_run_finished_gets_each_component_with_its_name(tmp_path):
    """A plugin's run_finished hook sees the shape the store keeps, whatever shape the run folder has:
    a hook written against ``config["components"][axis]["name"]`` keeps working."""
    out = tmp_path / "hook.json"
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "hook.py").write_text(HOOK_PLUGIN.format(out=str(out)))
    grid = tmp_path / "one.toml"
    grid.write_text(ONE_CELL)
    r = run_abl(["--plugins-dir", str(plugins), "run", str(grid), "--db", str(tmp_path / "x.duckdb")])
    assert r.returncode == 0, r.stdout + r.stderr
    seen = json.loads(out.read_text())
    cfg = seen["config"]
    assert cfg["components"]["norm"]["name"] == cfg["model"]["norm"] == "layernorm"
    assert all("name" in spec for axis, spec in cfg["components"].items() if axis in AXES)
    assert run_id_of(cfg) == seen["run_id"]
