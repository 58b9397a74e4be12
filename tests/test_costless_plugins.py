"""Cells with a component that declares no cost function (issue 25): ``cost=`` is optional, and without it
FLOPs and memory are measured once per shape (abl.model.measuredcost) - for ``abl cost``, for memory
admission before a grid starts, and for the report's (and the Costs page's) predicted-vs-measured section,
each saying "measured" where the figure came from measuring.

The class of problem is every model axis: a copy of each axis's default component, registered without its
cost function, stands for a plugin's component there."""

import dataclasses
import json

import pytest
from conftest import run_abl

from abl.contracts.registry import Registry
from abl.grid.gridfile import expand
from abl.model.costmodel import MEMORY_BAND, missing_costs, predict
from abl.run import admission

AXES = ("norm", "block", "position", "ffn", "mixer")

SMALL = {"experiment": {"name": "costless", "seeds": [0]},
         "model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "context": 32},
         "train": {"steps": 20, "batch_size": 4, "eval_every": 10, "eval_batches": 1},
         "eval": {"decode": False, "extrapolation": False},
         "dataset": {"pystdlib": {"max_bytes": 300000}}}


@pytest.fixture(scope="module")
def costless():
    """(registry, the default component of each axis): the real registry plus, for every model axis, a copy
    of its default component registered without a cost function (as a plugin that leaves out cost=)."""
    from abl.contracts.plugin_manager import get_registry

    base = get_registry()
    reg = Registry(components=dict(base.components), recipes=dict(base.recipes))
    (cell,) = expand(json.loads(json.dumps(SMALL)), base).cells
    defaults = {axis: cell.components[axis]["name"] for axis in AXES}
    for axis, name in defaults.items():
        comp = base.get(axis, name)
        assert comp.cost is not None  # the premise: the built-in one is predicted
        reg.components[(axis, f"nocost_{axis}")] = dataclasses.replace(
            comp, name=f"nocost_{axis}", cost=None, plugin="test_costless")
    return reg, defaults


def small_cells(reg, **model):
    raw = json.loads(json.dumps(SMALL))
    raw["model"].update(model)
    return expand(raw, reg).cells


# ---------------------------------------------------------------- memory admission


@pytest.mark.parametrize("axis", AXES)
def test_admission_takes_a_costless_cells_measured_peak(costless, axis):
    reg, defaults = costless
    (cell,) = small_cells(reg, **{axis: f"nocost_{axis}"})
    assert missing_costs(cell.components, reg) == [f"{axis} 'nocost_{axis}'"]
    need = admission.cell_need(cell, reg, gpus=[])
    assert need is not None, "a costless cell had nothing to go on"
    assert need.source == "measured"
    assert need.predicted == predict(cell, reg, measure_missing=True)["train_peak_bytes"]  # as abl cost has it
    # the same model as the built-in's: its measured peak lies in the cost model's calibrated band
    (twin,) = small_cells(reg, **{axis: defaults[axis]})
    predicted = admission.cell_need(twin, reg, gpus=[])
    assert predicted.source == "predicted"
    assert MEMORY_BAND[0] <= need.predicted / predicted.predicted <= MEMORY_BAND[1]
    # refused when it does not fit, and the message says the peak was measured
    msgs = admission.admit([cell], reg, slots=1, gpus=[], ram_free=lambda: int(need.per_process * 0.99))
    text = "\n".join(msgs)
    assert "1 cell(s) need more memory" in text and cell.run_id in text
    assert f"measured peak {admission.fmt(need.predicted)}" in text and "declares no cost function" in text
    assert admission.admit([cell], reg, slots=1, gpus=[], ram_free=lambda: int(need.per_process * 1.01)) == []


def test_measuring_for_admission_allocates_no_memory_of_the_cell(costless):
    """A cell far larger than this machine is measured on fake tensors (shapes only): admission refuses it
    instead of running out of memory while measuring it."""
    import resource

    reg, _ = costless
    (cell,) = small_cells(reg, norm="nocost_norm", d_model=1024, n_layers=4, n_heads=8, context=2048)
    cell = dataclasses.replace(cell, train=dataclasses.replace(cell.train, batch_size=64))
    need = admission.cell_need(cell, reg, gpus=[])
    assert need is not None and need.source == "measured"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert need.predicted > 30 * 1024**3 > rss  # measured 30+ GiB while this process never held that much
    twin = predict(dataclasses.replace(cell, components={**cell.components, "norm": {"name": "rmsnorm",
                                                                                     "params": {}}}), reg)
    assert MEMORY_BAND[0] <= need.predicted / twin["train_peak_bytes"] <= MEMORY_BAND[1]


BIG_GRID = """[experiment]
name = "big"
seeds = [0]
[model]
d_model = 2048
n_layers = 4
n_heads = 16
context = 4096
[train]
steps = 2
batch_size = 32
[grid]
"model.norm" = ["rmsnorm", "dyt_nocost"]
"""


def test_abl_run_refuses_a_costless_cell_that_cannot_fit(tmp_path, no_cost_plugin_dir):
    grid = tmp_path / "big.toml"
    grid.write_text(BIG_GRID)
    db = tmp_path / "x.duckdb"
    free = admission.ram_free_bytes()
    r = run_abl(["--plugins-dir", str(no_cost_plugin_dir), "run", str(grid), "--db", str(db)], cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert free is not None and "2 cell(s) need more memory" in out, out  # was 1: the costless one went through
    assert "norm=dyt_nocost seed=0" in out and "measured peak" in out and "predicted peak" in out
    assert "norm 'dyt_nocost'" in out and "Traceback" not in out
    assert not db.exists() and not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- the report's predicted vs measured section


@pytest.fixture(scope="module")
def costless_store(costless, tmp_path_factory):
    """A store of one completed run per cell: the defaults (predicted) and, for every axis, its costless copy
    (measured); each run's recorded figures are its cell's per-shape ones, its peak 2% above."""
    import time

    from test_report_sections import _write_run

    from abl.store import database as store

    reg, _ = costless
    tmp = tmp_path_factory.mktemp("costless")
    runs = tmp / "runs"
    cells = small_cells(reg) + [c for axis in AXES for c in small_cells(reg, **{axis: f"nocost_{axis}"})]
    for i, cell in enumerate(cells):
        p = predict(cell, reg, vocab_size=4096, measure_missing=True)
        final = {"n_params": p["n_params"], "n_params_non_embedding": p["n_params_non_embedding"],
                 "flops_per_step_measured": p["flops_per_step"], "peak_tensor_bytes": p["train_peak_bytes"] * 1.02,
                 "peak_mem_bytes": 5e8, "mfu": 0.2, "contended": 0.0}
        _write_run(runs / cell.run_id, cell, status="completed", info=True, final=final, loss=3.0 + 0.01 * i,
                   tokens_per_s=40_000.0, wall=2.0, started=time.time() + i)
    db = tmp / "abl.duckdb"
    store.ingest_dirs(db, sorted(runs.iterdir()))
    return db, cells


def test_the_report_compares_a_costless_cell_with_its_measured_per_shape_figures(costless, costless_store, tmp_path):
    from test_report import parse_table

    from abl.present.report.runs import load_runs
    from abl.present.report.sections import build_report, write_report

    reg, _ = costless
    db, cells = costless_store
    rep = build_report(load_runs(db, experiment="costless"), source="costless", db_path=str(db), registry=reg)
    md = write_report(rep, tmp_path / "rep", "md").read_text()
    label = {c.key: c.label for c in rep.cells}
    base = label[cells[0].cell_key]
    assert len(set(label.values())) == len(cells) == 1 + len(AXES)
    for cell in cells[1:]:
        assert not next(c for c in rep.cells if c.key == cell.cell_key).predict_error
        rows = {r["figure"]: r for r in rep.cost_rows if r["cell_key"] == cell.cell_key}
        memory = rows["train_peak_bytes"]
        assert memory["source"] == "measured" and memory["predicted"] is not None
        assert memory["ratio"] == pytest.approx(1.02) and memory["agreement"].startswith("agrees")
        assert rows["n_params"]["agreement"] == "agrees (exact)"
    assert {r["source"] for r in rep.cost_rows if r["cell_key"] == cells[0].cell_key} == {"predicted"}
    assert "Not predicted" not in md
    # the per-cell table says where each cell's figures came from, as abl cost does
    sources = {row["cell"]: row["source"] for row in parse_table(md, "Predicted vs measured costs")}
    assert sources == {lab: "predicted" if lab == base else "measured" for lab in label.values()}
    assert all(f"{axis} 'nocost_{axis}'" in md for axis in AXES) and "declare(s) no cost function" in md
    # memory is compared for every cell: none is left out of the summary as 'not compared'
    summary = {row["figure"]: row for row in parse_table(md, "| figure | cells |")}
    assert summary["train_peak_bytes"]["agree"] == str(len(cells))


def test_the_costs_page_says_measured_as_the_report_does(costless, costless_store, monkeypatch):
    testing = pytest.importorskip("streamlit.testing.v1", reason="streamlit is in the dashboard extra")
    from conftest import ROOT

    from abl.contracts import plugin_manager

    reg, _ = costless
    db, cells = costless_store
    monkeypatch.setattr(plugin_manager, "get_registry", lambda *a, **k: reg)  # as --plugins-dir would load it
    monkeypatch.setenv("ABL_DB", str(db))
    monkeypatch.setenv("ABL_RUNS_DIR", str(db.parent / "runs"))
    at = testing.AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    at.switch_page("views/costs.py")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    captions = "\n".join(str(c.value) for c in at.caption)
    assert "Source 'measured' (5 of 6 cells)" in captions and "norm 'nocost_norm'" in captions
    assert at.success and f"{4 * len(cells)} of {4 * len(cells)} checks" in at.success[0].value
    every = at.dataframe[0].value
    memory = every[every["figure"] == "train_peak_bytes"]
    assert sorted(memory["source"]) == ["measured"] * len(AXES) + ["predicted"]
