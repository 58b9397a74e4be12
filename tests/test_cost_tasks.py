"""``abl cost`` on grids that train on a task (a probe dataset): the vocabulary is the task's, as training
takes it (the cost command had asked the task for a text corpus and exited 2 on every task grid)."""

import json

import pytest
from click.testing import CliRunner

from abl.cli import cli
from abl.contracts.plugin_manager import get_registry
from abl.data.tasks import is_task_factory
from abl.grid.gridfile import load_grid, packaged_grids


def _task_grids():
    reg = get_registry()
    out = []
    for name, path in sorted(packaged_grids().items()):
        cell = load_grid(path, reg).cells[0]
        spec = cell.components["dataset"]
        if is_task_factory(reg.get("dataset", spec["name"]).factory):
            out.append((name, path, spec["params"]["vocab_size"]))
    return out


TASK_GRIDS = _task_grids()


def test_the_shipped_task_grids_are_found():
    assert {"recall", "selective_copy", "separator_reset"} <= {n for n, _, _ in TASK_GRIDS}


@pytest.mark.parametrize("name,path,vocab", TASK_GRIDS, ids=[n for n, _, _ in TASK_GRIDS])
def test_abl_cost_prints_every_task_grid_at_the_tasks_vocabulary(tmp_path, monkeypatch, name, path, vocab):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["cost", str(path), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert rows and all(row["vocab_size"] == vocab and row["n_params"] > 0 for row in rows)
    assert not (tmp_path / "results").exists()
