"""A stored error names no path of the machine that ran it (issue 39, minor items): the error of an ``oom``
run is the allocation error itself and where it was raised, not a traceback's tail of absolute paths; a
``failed`` run's traceback tail names its files relative to where Python found them (site-packages, the
working directory, the home folder). Stores and run folders are shared and copied; the paths say nothing
there and show a user's folders."""

import os
import sys

import duckdb
import pytest
from conftest import ROOT, run_abl, tiny_grid_text

OOM_PLUGIN = """
import sys

import torch

from abl import Cost, hookimpl


def in_worker():
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    return "abl.run.worker" in sys.modules or getattr(main, "name", "") == "abl.run.worker"


class Greedy(torch.nn.LayerNorm):
    def forward(self, x):
        if in_worker():
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                               "1099511627776 bytes. Error code 12 (Cannot allocate memory)")
        return super().forward(x)


def _cost(dim, **_):
    return Cost(params=2 * dim, activation_elements_per_token=dim + 2)


@hookimpl
def register_components(register):
    register('norm', 'greedy', Greedy, cost=_cost)
"""


def machine_paths():
    return [p for p in {str(ROOT), sys.prefix, os.path.expanduser("~"), os.path.dirname(os.__file__)} if len(p) > 1]


@pytest.mark.slow
def test_an_oom_runs_stored_error_is_the_allocation_error_without_absolute_paths(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "greedy.py").write_text(OOM_PLUGIN)
    grid = tmp_path / "g.toml"
    grid.write_text(tiny_grid_text(grid={"model.norm": ["greedy"]}))
    db = tmp_path / "x.duckdb"
    r = run_abl(["--plugins-dir", str(plugins), "run", str(grid), "--db", str(db), "--runs-dir", str(tmp_path / "runs")])
    assert r.returncode == 1, r.stdout + r.stderr
    con = duckdb.connect(str(db), read_only=True)
    try:
        status, error = con.execute("SELECT status, error FROM runs").fetchone()
    finally:
        con.close()
    assert status == "oom", (status, error)
    assert "can't allocate memory" in error and "greedy.py" in error, error
    assert 'File "/' not in error and not any(p in error for p in machine_paths() + [str(tmp_path)]), error


def test_a_traceback_tail_names_files_without_the_machines_folders():
    from abl.run.worker import error_tail

    def inner():
        import json

        json.loads("{not json")

    try:
        inner()
    except ValueError as exc:
        tail = error_tail(exc)
    assert "JSONDecodeError" in tail and "json/decoder.py" in tail.replace(os.sep, "/"), tail
    assert 'File "/' not in tail and not any(p in tail for p in machine_paths()), tail
