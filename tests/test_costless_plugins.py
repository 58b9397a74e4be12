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
         "train": {"steps": 2, "batch_size": 4, "eval_batches": 1},
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


NO_COST_PLUGIN = '''
import torch
import torch.nn as nn

from abl import Param, hookimpl


class DyT(nn.Module):
    def __init__(self, dim, alpha_init=0.5):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(alpha_init))
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return torch.tanh(self.alpha * x) * self.weight


@hookimpl
def register_components(register):
    register("norm", "dyt_nocost", DyT, params={"alpha_init": Param(0.5, min=0.0)})
'''

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


@pytest.fixture
def plugin_dir(tmp_path):
    folder = tmp_path / "plug"
    folder.mkdir()
    (folder / "dyt_nocost.py").write_text(NO_COST_PLUGIN)
    return folder


def test_abl_run_refuses_a_costless_cell_that_cannot_fit(tmp_path, plugin_dir):
    grid = tmp_path / "big.toml"
    grid.write_text(BIG_GRID)
    db = tmp_path / "x.duckdb"
    free = admission.ram_free_bytes()
    r = run_abl(["--plugins-dir", str(plugin_dir), "run", str(grid), "--db", str(db)], cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert free is not None and "2 cell(s) need more memory" in out, out  # was 1: the costless one went through
    assert "norm=dyt_nocost seed=0" in out and "measured peak" in out and "predicted peak" in out
    assert "norm 'dyt_nocost'" in out and "Traceback" not in out
    assert not db.exists() and not (tmp_path / "runs").exists()
