"""Plugin provenance (issue 40, finding 5 and item 4): each run records which plugin provided each component
(abl's version for a built-in, a package and its version for an entry point, the folder as given, the file
and its sha256 for a plugins-folder file), meta.json to the store to ``StoredRun.plugins``; runs of a plugin
are reported and compared after its folder is gone, the cost check saying which cells it could not compare
and which plugin to load; what genuinely needs the plugin (a grid file naming its component) names it.

The plugin is the docs' own mixer (docs/plugins.md, ``local_mqa``), written to a plugins folder of a temporary
directory. Plugins load once per process, so every step that loads one runs in a subprocess."""

import hashlib
import json
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT, run_abl

from abl.store import rundir
from abl.store.reader import read_runs

GRID = """[experiment]
name = "plug"
seeds = [0, 1]
[model]
d_model = 32
n_layers = 2
n_heads = 4
context = 16
vocab_size = 4096
[train]
steps = 20
batch_size = 4
eval_every = 10
[grid]
"model.mixer" = ["mha", "local_mqa"]
"""

# Run folders as ``abl run`` prepares them (runner.make_jobs' meta.json, rundir.prepare), each completed with the
# figures a worker records: its own cost predictions and measurements (the prediction's, the peak 2% above).
MAKE_RUNS = """
import json, sys, time
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from abl.contracts.plugin_manager import get_registry
from abl.grid.gridfile import load_grid
from abl.model.costmodel import predict
from abl.run.runner import make_jobs
from abl.store import database as store, rundir
from abl.store.workspace import Workspace

reg = get_registry()
grid = load_grid("g.toml", reg)
ws = Workspace.at("abl.duckdb")
jobs, metas = make_jobs(grid, grid.cells, reg, ws, SimpleNamespace(name="local"), Console(quiet=True))
for i, cell in enumerate(grid.cells):
    d = rundir.prepare(ws.runs / cell.run_id, cell.config, metas[cell.run_id])
    p = predict(cell, reg, vocab_size=4096)
    rundir.write_json(d / rundir.INFO, {"device": "cpu (test)", "data_fingerprint": "f" * 64, "vocab_size": 4096,
                                        "precision": "fp32", "kernels": "torch"})
    rows = [{"step": 0, "n_params": p["n_params"], "n_params_non_embedding": p["n_params_non_embedding"],
             "n_params_predicted": p["n_params"], "flops_per_step_predicted": p["flops_per_step"]}]
    loss = 3.0 + 0.3 * (cell.components["mixer"]["name"] == "local_mqa") + 0.01 * cell.seed
    rows += [{"step": s, "train_loss": loss + 1.0 / s, "tokens_per_s": 4e4} for s in range(1, 21)]
    rows.append({"step": 20, "val_loss": loss, "wall_s": 2.0, "peak_mem_bytes": 5e8,
                 "flops_per_step_measured": p["flops_per_step"], "peak_tensor_bytes": p["train_peak_bytes"] * 1.02})
    (d / rundir.METRICS).write_text("".join(json.dumps(r) + "\\n" for r in rows))
    rundir.write_status(d, {"status": "completed", "started": time.time() + i, "finished": time.time() + i + 1})
store.ingest_dirs(ws.db, sorted(ws.runs.iterdir()))
"""


def docs_mixer() -> tuple[str, str]:
    text = (ROOT / "docs" / "plugins.md").read_text()
    ((name, body),) = re.findall(r"<!-- mixer: (\S+) -->\n```python\n(.*?)```", text, re.S)
    return name, body


def python(code: str, cwd, env=None) -> subprocess.CompletedProcess:
    import os

    full = {k: v for k, v in os.environ.items() if k not in ("ABL_PLUGINS_DIR", "ABL_PLUGINS")} | (env or {})
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=full, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


@pytest.fixture(scope="module")
def plugin_store(tmp_path_factory):
    """(folder, the plugin file's sha256): a store of 2 cells x 2 seeds, one cell the plugins folder's mixer,
    made with ``--plugins-dir plug`` given relative; the plugins folder removed afterwards."""
    tmp = tmp_path_factory.mktemp("provenance")
    name, body = docs_mixer()
    (tmp / "plug").mkdir()
    (tmp / "plug" / name).write_text(body)
    (tmp / "g.toml").write_text(GRID)
    python(MAKE_RUNS, tmp, {"ABL_PLUGINS_DIR": "plug"})
    digest = hashlib.sha256((tmp / "plug" / name).read_bytes()).hexdigest()
    shutil.rmtree(tmp / "plug")
    return tmp, name, digest


def test_each_run_records_which_plugin_provided_each_component(plugin_store):
    import importlib.metadata as md

    tmp, name, digest = plugin_store
    runs = read_runs(tmp / "abl.duckdb")
    assert len(runs) == 4
    for run in runs:
        meta = json.loads((tmp / "runs" / run.run_id / "meta.json").read_text())
        assert run.plugins == meta["plugins"]  # meta.json at preparation, the store after ingest
        mixer = run.config["components"]["mixer"]["name"]
        assert set(run.plugins) >= {f"mixer:{mixer}", "norm:rmsnorm", "precision:fp32", "dataset:pystdlib"}
        assert run.plugins["norm:rmsnorm"] == {"kind": "builtin", "plugin": "norms", "package": "abl",
                                               "version": md.version("abl")}
    plugin = next(r for r in runs if "mixer:local_mqa" in r.plugins).plugins["mixer:local_mqa"]
    # the folder as the user gave it (relative), the file inside it, the hash of what ran: no machine path
    assert plugin == {"kind": "file", "plugin": f"file:{name.removesuffix('.py')}", "folder": "plug", "file": name,
                      "sha256": digest}
    assert str(tmp) not in json.dumps([r.plugins for r in runs])


def test_a_folder_plugins_hash_changes_with_its_file_and_an_entry_point_records_its_package(tmp_path):
    name, body = docs_mixer()
    (tmp_path / "plug").mkdir()
    (tmp_path / "plug" / name).write_text(body)
    # an installed distribution with an entry point in group "abl" (a dist-info folder on the path)
    site = tmp_path / "site"
    (site / "epnorm-1.2.3.dist-info").mkdir(parents=True)
    (site / "epnorm-1.2.3.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: epnorm\nVersion: 1.2.3\n")
    (site / "epnorm-1.2.3.dist-info" / "entry_points.txt").write_text("[abl]\nepnorm = epnorm_plugin\n")
    (site / "epnorm_plugin.py").write_text(
        "import torch.nn as nn\nfrom abl import hookimpl\n\n\nclass EpNorm(nn.LayerNorm):\n"
        "    \"\"\"A LayerNorm from an installed package.\"\"\"\n\n\n@hookimpl\ndef register_components(register):\n"
        "    register('norm', 'epnorm', EpNorm, params={})\n")
    code = """
        import json
        from abl.contracts.config import cell_from_config
        from abl.contracts.plugin_manager import get_registry
        from abl.grid.gridfile import load_grid
        from abl.store.provenance import plugin_records
        reg = get_registry()
        grid = load_grid("g.toml", reg)
        print(json.dumps({c.label: plugin_records(c, reg) for c in grid.cells}))
    """
    (tmp_path / "g.toml").write_text(GRID.replace('"model.mixer" = ["mha", "local_mqa"]',
                                                  '"model.mixer" = ["local_mqa"]\n"model.norm" = ["epnorm"]')
                                     .replace("seeds = [0, 1]", "seeds = [0]"))
    env = {"ABL_PLUGINS_DIR": "plug", "PYTHONPATH": str(site)}
    first = json.loads(python(code, tmp_path, env).stdout.strip().splitlines()[-1])
    (record,) = first.values()
    assert record["norm:epnorm"] == {"kind": "package", "plugin": "epnorm:epnorm", "package": "epnorm",
                                     "version": "1.2.3", "entry_point": "epnorm"}
    assert record["mixer:local_mqa"]["sha256"] == hashlib.sha256(body.encode()).hexdigest()
    (tmp_path / "plug" / name).write_text(body + "\n# changed\n")
    (again,) = json.loads(python(code, tmp_path, env).stdout.strip().splitlines()[-1]).values()
    assert again["mixer:local_mqa"]["sha256"] == hashlib.sha256((body + "\n# changed\n").encode()).hexdigest()
    assert again["mixer:local_mqa"]["sha256"] != record["mixer:local_mqa"]["sha256"]


def test_plugins_dir_is_kept_as_typed(monkeypatch):
    import os

    from abl.cli.common import _add_plugins_dirs

    monkeypatch.setenv("ABL_PLUGINS_DIR", "")
    _add_plugins_dirs(None, None, ("plug", "../other"))
    assert os.environ["ABL_PLUGINS_DIR"].split(os.pathsep) == ["plug", "../other"]


def test_a_plugins_runs_are_reported_and_compared_after_its_folder_is_removed(plugin_store):
    tmp, name, digest = plugin_store
    r = run_abl(["report", "plug", "--db", "abl.duckdb", "--out", "rep"], cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    md = (tmp / "rep" / "report.md").read_text()
    assert "mixer=local_mqa" in md
    # the cost check says which cells it compared, which plugin is missing and how to load it
    assert "1 of 2 cells compared on every check" in md
    assert f"plugin file {name} in folder plug (sha256 {digest[:12]})" in md and "--plugins-dir plug" in md
    rows = json.loads((tmp / "rep" / "report.json").read_text())["predicted_vs_measured"]
    plugin_rows = {x["figure"]: x for x in rows if x["label"] == "mixer=local_mqa"}
    # the runs' own predictions (recorded with the plugin loaded) are compared; the rest say why not
    assert plugin_rows["n_params"]["source"] == "recorded" and plugin_rows["n_params"]["agreement"] == "agrees (exact)"
    assert plugin_rows["flops_per_step"]["agreement"].startswith("agrees")
    assert plugin_rows["train_peak_bytes"]["agreement"].startswith("not compared: mixer 'local_mqa'")
    r = run_abl(["compare", "plug", "--db", "abl.duckdb"], cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mixer=local_mqa" in r.stdout and "Traceback" not in r.stderr


@pytest.mark.parametrize("command", ["report", "compare", "run"])
def test_a_grid_file_naming_the_missing_plugin_names_it_and_how_to_load_it(plugin_store, command):
    tmp, name, _ = plugin_store
    before = sorted(p.name for p in (tmp / "runs").iterdir())
    r = run_abl([command, "g.toml", "--db", "abl.duckdb"], cwd=tmp)
    assert sorted(p.name for p in (tmp / "runs").iterdir()) == before
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert "unknown mixer 'local_mqa'" in r.stderr
    assert f"from plugin file {name} in folder plug" in r.stderr and "load it with --plugins-dir plug" in r.stderr


def test_a_store_without_the_record_still_says_how_a_plugin_is_loaded(tmp_path):
    from abl.store.provenance import plugin_hint

    msg = plugin_hint("model.mixer: unknown mixer 'gated_attn'. Valid mixer names: mha.", str(tmp_path / "no.db"))
    assert "--plugins-dir DIR" in msg and "install its package" in msg


def test_ingest_keeps_only_a_well_formed_record():
    hostile = {"mixer:x": {"kind": "file", "sha256": 3}, 5: {}, "norm:y": "z"}
    assert rundir.plugins_record({"plugins": hostile}) == {"mixer:x": {"kind": "file"}}
    assert rundir.plugins_record({}) == rundir.plugins_record({"plugins": [1]}) == rundir.plugins_record(None) == {}


def test_the_costs_page_counts_the_cells_it_did_not_compare(plugin_store, monkeypatch):
    testing = pytest.importorskip("streamlit.testing.v1", reason="streamlit is in the dashboard extra")
    tmp, name, _ = plugin_store
    monkeypatch.setenv("ABL_DB", str(tmp / "abl.duckdb"))
    monkeypatch.setenv("ABL_RUNS_DIR", str(tmp / "runs"))
    at = testing.AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    at.switch_page("views/costs.py")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.success  # no green "every check agrees" over a cell it could not compare
    warnings = "\n".join(str(w.value) for w in at.warning)
    assert "1 of 2 cells compared on every check" in warnings and f"plugin file {name} in folder plug" in warnings


def test_the_cost_check_counts_every_cell_it_did_not_compare_and_says_why():
    from abl.present.report.costs import compared_note

    def row(cell, figure, agreement, not_loaded=""):
        return {"cell_key": cell, "label": cell.upper(), "figure": figure, "agreement": agreement,
                "not_loaded": not_loaded}

    full = [row("a", "n_params", "agrees (exact)"), row("a", "flops_per_step", "DISAGREES (outside 5%)")]
    assert compared_note(full) == ""  # every cell compared: nothing to add to the summary
    note = compared_note(full + [
        row("b", "n_params", "agrees (exact)"),
        row("b", "train_peak_bytes", "not compared: the run used the Triton kernels, which keep less"),
        row("c", "n_params", "not measured"),
        row("d", "n_params", "not compared: x", not_loaded="mixer 'm' (...) is not loaded: load it with --plugins-dir p"),
    ])
    assert note.startswith("1 of 4 cells compared on every check; ")
    assert "1 not (or only where the runs recorded a prediction) because mixer 'm'" in note and "[D]" in note
    assert "train_peak_bytes not compared (the run used the Triton kernels) [B]" in note
    assert "n_params not measured [C]" in note


def test_the_run_detail_page_shows_which_plugin_provided_each_component(plugin_store, monkeypatch):
    testing = pytest.importorskip("streamlit.testing.v1", reason="streamlit is in the dashboard extra")
    tmp, name, digest = plugin_store
    run = next(r for r in read_runs(tmp / "abl.duckdb") if "mixer:local_mqa" in r.plugins)
    monkeypatch.setenv("ABL_DB", str(tmp / "abl.duckdb"))
    monkeypatch.setenv("ABL_RUNS_DIR", str(tmp / "runs"))
    at = testing.AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    at.switch_page("views/run_detail.py")
    at.query_params["run"] = run.run_id
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    text = "\n".join(str(m.value) for m in at.markdown)
    assert f"plugin file {name} in folder plug (sha256 {digest[:12]})" in text and "mixer:local_mqa" in text


def test_the_report_names_the_plugins_and_warns_when_one_changed_between_runs(plugin_store, tmp_path):
    tmp, name, digest = plugin_store
    copy = tmp_path / "copy"
    shutil.copytree(tmp / "runs", copy / "runs")
    edited = next(d for d in sorted((copy / "runs").iterdir())
                  if "mixer:local_mqa" in json.loads((d / "meta.json").read_text())["plugins"])
    meta = json.loads((edited / "meta.json").read_text())
    meta["plugins"]["mixer:local_mqa"]["sha256"] = "0" * 64  # the plugin file was edited before this run
    (edited / "meta.json").write_text(json.dumps(meta))
    from abl.store import database

    database.ingest_dirs(copy / "abl.duckdb", sorted((copy / "runs").iterdir()))
    for db, warned in ((tmp / "abl.duckdb", False), (copy / "abl.duckdb", True)):
        r = run_abl(["report", "plug", "--db", str(db), "--out", str(tmp_path / f"rep{warned}")], cwd=tmp)
        assert r.returncode == 0, r.stdout + r.stderr
        md = (tmp_path / f"rep{warned}" / "report.md").read_text()
        assert "Components from plugins that are not built in: mixer 'local_mqa' from plugin file" in md
        assert f"{name} in folder plug (sha256 {digest[:12]})" in md
        assert ("WARNING: the runs got mixer 'local_mqa' from 2 different plugins or versions" in md) is warned
        assert ("sha256 000000000000" in md) is warned
        assert "norm 'rmsnorm' from" not in md  # the built-ins are not listed
