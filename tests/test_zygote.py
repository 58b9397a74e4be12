"""Workers forked from a pre-imported zygote: the same isolation, without paying the imports per cell."""

import json
import os
import signal
import time

import pytest
from conftest import run_abl, tiny_grid_text

def grid_text(steps: int) -> str:
    """The tiny grid (tests/conftest.py), two heads of 8, ``steps`` steps."""
    return tiny_grid_text(experiment={"name": "zygote"}, model={"d_model": 16, "n_heads": 2},
                          train={"steps": steps, "eval_every": 50, "threads": None})


def statuses(runs):
    return [json.loads(p.read_text()) for p in sorted(runs.glob("*/status.json"))]


def infos(runs):
    return [json.loads(p.read_text()) for p in sorted(runs.glob("*/info.json"))]


@pytest.mark.parametrize("zygote", ["1", "0"])
def test_cells_run_in_forked_or_spawned_workers_alike(tmp_path, zygote):
    grid = tmp_path / "g.toml"
    grid.write_text(grid_text(3))
    runs = tmp_path / "runs"
    r = run_abl(["run", str(grid), "--db", str(tmp_path / "x.duckdb"), "--runs-dir", str(runs),
                 "--workers", "2"], env={"ABL_ZYGOTE": zygote})
    assert r.returncode == 0, r.stdout + r.stderr
    sts = statuses(runs)
    assert [s["status"] for s in sts] == ["completed", "completed"]
    assert {s["origin"] for s in sts} == {"zygote" if zygote == "1" else "spawned"}
    assert len({s["pid"] for s in sts}) == 2  # one process per cell either way
    # the parent's per-worker environment reached the forked worker: 2 workers on this machine share
    # its cores, each gets the threads abl.run.threads chose as it started (its start line says how
    # many; OMP_NUM_THREADS), which the zygote applies with set_num_threads
    import re

    chosen = {int(n) for n in re.findall(r"^start .*: 3 steps, (\d+) thread\(s\)", r.stdout, re.MULTILINE)}
    assert chosen, r.stdout
    assert all(any(i["device"].endswith(f"{n} threads)") for n in chosen) for i in infos(runs)), (chosen, infos(runs))


def test_a_forked_worker_stopped_by_its_process_group_is_recorded_killed(tmp_path):
    from abl.contracts.plugin_manager import get_registry
    from abl.contracts.status import EXIT_CODES, KILLED
    from abl.grid.gridfile import expand
    from abl.grid.parsing import parse_toml_text
    from abl.run.zygote import Zygote
    from abl.store import rundir

    cell = expand(parse_toml_text(grid_text(100000), "g"), get_registry()).cells[0]
    run_dir = rundir.prepare(tmp_path / cell.run_id, cell.config, {})
    zygote = Zygote(dict(os.environ, TRITON_INTERPRET="1"))
    try:
        child = zygote.spawn(run_dir, dict(os.environ))
        deadline = time.time() + 120
        while time.time() < deadline and not (run_dir / "metrics.jsonl").exists():
            time.sleep(0.1)
        assert child.poll() is None
        os.killpg(child.pid, signal.SIGTERM)  # what the executor's stop does
        code = child.wait(timeout=60)
        assert code == EXIT_CODES[KILLED]
        assert json.loads((run_dir / "status.json").read_text())["status"] == KILLED
    finally:
        zygote.kill()


def test_when_the_zygote_dies_its_workers_stop_too(tmp_path):
    from abl.contracts.plugin_manager import get_registry
    from abl.contracts.status import KILLED
    from abl.grid.gridfile import expand
    from abl.grid.parsing import parse_toml_text
    from abl.run.zygote import Zygote
    from abl.store import rundir

    cell = expand(parse_toml_text(grid_text(100000), "g"), get_registry()).cells[0]
    run_dir = rundir.prepare(tmp_path / cell.run_id, cell.config, {})
    zygote = Zygote(dict(os.environ, TRITON_INTERPRET="1"))
    child = zygote.spawn(run_dir, dict(os.environ))
    deadline = time.time() + 120
    while time.time() < deadline and not (run_dir / "metrics.jsonl").exists():
        time.sleep(0.1)
    zygote.kill()  # SIGKILL: no goodbye; PR_SET_PDEATHSIG sends the worker SIGTERM
    code = child.wait(timeout=60)
    assert code is not None and code != 0
    deadline = time.time() + 30
    while time.time() < deadline and json.loads((run_dir / "status.json").read_text())["status"] == "running":
        time.sleep(0.1)
    assert json.loads((run_dir / "status.json").read_text())["status"] == KILLED


def test_the_zygote_never_forks_after_cuda_was_initialised_or_a_thread_started(monkeypatch):
    import torch

    from abl.run import zygote

    monkeypatch.setattr(zygote.threading, "active_count", lambda: 1)  # the zygote after its preload: one thread
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert zygote.fork_unsafe() is None
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # a GPU machine where a preload touched CUDA
    assert "CUDA was initialised" in zygote.fork_unsafe()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(zygote.threading, "active_count", lambda: 2)
    assert "thread" in zygote.fork_unsafe()


def test_a_zygote_that_cannot_start_leaves_the_executor_spawning_fresh_workers(monkeypatch):
    from abl.run import executors, zygote

    class Broken:
        def __init__(self, env):
            raise zygote.ZygoteError("the zygote exited at start-up: CUDA was initialised while preloading")

    monkeypatch.setattr(zygote, "Zygote", Broken)
    ex = executors.LocalExecutor(workers=1, gpus=[0])
    assert ex._zygote() is None and not ex.use_zygote
    assert "CUDA was initialised" in ex.zygote_note


def test_the_zygote_starts_before_the_first_cell_without_waiting_and_is_stopped_if_none_runs(monkeypatch):
    """Issue 27, 3: abl run starts the workers' zygote as soon as it holds the store, so its imports
    overlap the memory check and the token store; prestart returns at once, the first fork waits for it,
    and a zygote whose cells never ran is stopped."""
    from abl.run.executors import LocalExecutor

    ex = LocalExecutor(workers=1, gpus=[])
    ex.prestart()
    try:
        z = ex.zygote
        assert z is not None and z.alive and not z.is_ready  # returned while it still imports
        assert ex._zygote() is z and z.is_ready  # the first fork waits for the same process
    finally:
        ex.close()
    assert ex.zygote is None
    z.proc.wait(timeout=120)  # a ready zygote exits once told there is no more work

    ex = LocalExecutor(workers=1, gpus=[])
    ex.prestart()
    z = ex.zygote
    ex.close()  # refused before any cell ran: the importing zygote is stopped, not left behind
    assert z.proc.wait(timeout=60) is not None


def test_abl_run_starts_the_zygote_before_its_memory_check(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from abl.cli import cli
    from abl.run import admission
    from abl.run.executors import LocalExecutor

    seen = {}
    real = LocalExecutor.prestart

    def prestart(self):
        seen["prestart"] = True
        real(self)

    def check_run(*a, **k):
        seen["zygote at the memory check"] = seen.get("prestart", False)
        return ["too big (a test)"]

    monkeypatch.setattr(LocalExecutor, "prestart", prestart)
    monkeypatch.setattr(admission, "check_run", check_run)
    grid = tmp_path / "g.toml"
    grid.write_text(grid_text(3))
    r = CliRunner().invoke(cli, ["run", str(grid), "--db", str(tmp_path / "x.duckdb")])
    assert r.exit_code == 2 and "too big (a test)" in r.output, r.output
    assert seen == {"prestart": True, "zygote at the memory check": True}
