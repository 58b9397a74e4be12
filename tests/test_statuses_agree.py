"""Statuses never contradict (issue 39, findings 9 and 11).

- ``killed`` means stopped from outside (SIGKILL from the OOM killer or a user, SIGTERM or SIGINT from
  abl's own shutdown): a plain ``abl run`` restarts it;
- a worker that dies of a signal of its own (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL: a crash) is
  ``failed``, with the signal named, and a plain re-run does not retry it (``--retry failed`` does);
- a run folder and its store row agree after any signal: a stopped cell's folder is settled with the
  same status and reason as its row, and ingest settles a folder left ``running`` by a worker that is gone.
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from conftest import run_abl, tiny_grid_text

from abl.contracts.status import FAILED, KILLED, runs_again

SEGV_PLUGIN = """
import os
import signal
import sys

from abl import hookimpl


def in_worker():
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    return "abl.run.worker" in sys.modules or getattr(main, "name", "") == "abl.run.worker"


def segv(dim):
    if in_worker():  # the parent builds the model too (its cost): only the worker crashes
        os.kill(os.getpid(), signal.SIGSEGV)  # a crash in native code, as a broken extension would die
    import torch

    return torch.nn.LayerNorm(dim)


@hookimpl
def register_components(register):
    register('norm', 'segv', segv)
"""


def rows(db, sql, params=()):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def status_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL])
def test_a_crash_signal_is_failed_with_the_signal_named(sig):
    from abl.contracts.status import signal_reason

    status, why = signal_reason(sig)
    assert status == FAILED and not runs_again(status)
    assert f"{signal.Signals(sig).name} (signal {int(sig)})" in why


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_a_signal_from_outside_is_killed_with_the_signal_named(sig):
    from abl.contracts.status import signal_reason

    status, why = signal_reason(sig)
    assert status == KILLED and runs_again(status)
    assert signal.Signals(sig).name in why


def test_an_exit_without_a_signal_is_not_read_as_one():
    from abl.contracts.status import launcher_signal

    assert launcher_signal(0) is None and launcher_signal(1) is None and launcher_signal(None) is None
    assert launcher_signal(-11) == signal.SIGSEGV and launcher_signal(128 + 9) == signal.SIGKILL


@pytest.mark.slow
@pytest.mark.parametrize("zygote", ["1", "0"], ids=["forked", "spawned"])
def test_a_segfaulting_worker_is_failed_named_and_not_retried_by_a_plain_rerun(tmp_path, zygote):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "segv.py").write_text(SEGV_PLUGIN)
    grid = tmp_path / "g.toml"
    grid.write_text(tiny_grid_text(grid={"model.norm": ["rmsnorm", "segv"]}))
    db, runs = tmp_path / "x.duckdb", tmp_path / "runs"
    args = ["--plugins-dir", str(plugins), "run", str(grid), "--db", str(db), "--runs-dir", str(runs)]
    r = run_abl(args, env={"ABL_ZYGOTE": zygote})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    got = dict(rows(db, "SELECT config->>'$.model.norm', status FROM runs"))
    assert got == {"rmsnorm": "completed", "segv": "failed"}, got
    run_id, error = rows(db, "SELECT run_id, error FROM runs WHERE status = 'failed'")[0]
    assert "SIGSEGV (signal 11)" in error, error
    folder = status_json(runs / run_id)
    assert folder["status"] == "failed" and "SIGSEGV" in folder["error"]  # the folder says what the store says

    again = run_abl(args, env={"ABL_ZYGOTE": zygote})
    assert again.returncode == 0, again.stdout + again.stderr
    assert "0 to run" in again.stdout, again.stdout
    assert status_json(runs / run_id) == folder  # not started again
    assert rows(db, "SELECT status FROM runs WHERE run_id = ?", [run_id])[0][0] == "failed"


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A tiny grid run to completion once: its store and run folders, copied by each test that changes them."""
    base = tmp_path_factory.mktemp("finished")
    grid = base / "g.toml"
    grid.write_text(tiny_grid_text(grid={"model.norm": ["rmsnorm"]}))
    r = run_abl(["run", str(grid), "--db", str(base / "x.duckdb"), "--runs-dir", str(base / "runs")])
    assert r.returncode == 0, r.stdout + r.stderr
    return base


def copy_of(finished: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    import shutil

    shutil.copytree(finished, tmp_path / "w")
    runs = tmp_path / "w" / "runs"
    (run_dir,) = [d for d in runs.iterdir() if (d / "config.json").exists()]
    return tmp_path / "w" / "x.duckdb", runs, run_dir


@pytest.mark.slow
def test_ingest_settles_a_folder_left_running_by_a_worker_that_is_gone(finished, tmp_path):
    db, runs, run_dir = copy_of(finished, tmp_path)
    st = status_json(run_dir)
    st.update(status="running", pid=dead_pid())  # what a killed parent and worker leave behind
    st.pop("error", None)
    (run_dir / "status.json").write_text(json.dumps(st))
    fresh = tmp_path / "rebuilt.duckdb"
    r = run_abl(["ingest", str(run_dir), "--db", str(fresh)])
    assert r.returncode == 0, r.stdout + r.stderr
    status, error = rows(fresh, "SELECT status, error FROM runs WHERE run_id = ?", [run_dir.name])[0]
    assert status == "killed" and error, (status, error)
    assert "gone" in error
    folder = status_json(run_dir)
    assert (folder["status"], folder["error"]) == (status, error)  # the folder and the store agree


@pytest.mark.slow
def test_ingest_keeps_a_folder_running_while_its_worker_lives(finished, tmp_path):
    db, runs, run_dir = copy_of(finished, tmp_path)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        st = status_json(run_dir)
        st.update(status="running", pid=live.pid)
        (run_dir / "status.json").write_text(json.dumps(st))
        r = run_abl(["ingest", str(run_dir), "--db", str(tmp_path / "rebuilt.duckdb")])
        assert r.returncode == 0, r.stdout + r.stderr
        assert rows(tmp_path / "rebuilt.duckdb", "SELECT status FROM runs")[0][0] == "running"
        assert status_json(run_dir)["status"] == "running"
    finally:
        live.kill()
        live.wait()


class _Display:
    def __init__(self):
        self.printed = []

    def update(self, job):
        pass

    def finish(self, job, status, wall_s, note=""):
        pass

    def print(self, text):
        self.printed.append(text)


@pytest.mark.slow
@pytest.mark.parametrize("worker_wrote", [None, "running"])
def test_a_cell_stopped_by_abl_run_gets_the_same_status_and_reason_in_its_folder_and_the_store(
        finished, tmp_path, worker_wrote):
    """The parent stopped the cell (SIGTERM to abl run) and its worker died before writing its end
    (SIGKILL after the grace period, or a signal during start-up): the folder must not keep running."""
    from abl.run.executors import Job
    from abl.run.runner import CellEvents

    db, runs, run_dir = copy_of(finished, tmp_path)
    if worker_wrote is None:
        (run_dir / "status.json").unlink()
    else:
        st = status_json(run_dir)
        st.update(status=worker_wrote, pid=dead_pid())
        st.pop("error", None)
        (run_dir / "status.json").write_text(json.dumps(st))
    cell = type("C", (), {"run_id": run_dir.name, "label": "x", "seed": 0,
                          "config": json.loads((run_dir / "config.json").read_text())})()
    job = Job(cell=cell, run_dir=run_dir, index=0, handle=object(), returncode=-signal.SIGKILL, killed=True)
    events = CellEvents(db, runs, {}, {}, _Display())
    events.stop_reason = "stopped by SIGTERM to abl run"
    events.on_done(job)
    status, error = rows(db, "SELECT status, error FROM runs WHERE run_id = ?", [run_dir.name])[0]
    folder = status_json(run_dir)
    assert status == "killed" and "SIGTERM to abl run" in (error or ""), (status, error)
    assert (folder["status"], folder["error"]) == (status, error)


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["start-up", "training"])
def test_sigterm_of_abl_run_leaves_each_folder_and_its_row_agreeing(tmp_path, moment):
    """SIGTERM to abl run as a worker starts (the race that left status.json running) or trains: the
    store row and the folder hold the same status and reason, and a store rebuilt from the folders too."""
    from test_faults import cell_dirs, n_steps, start_abl, wait_for

    grid = tmp_path / "g.toml"
    grid.write_text(tiny_grid_text(train={"steps": 2000, "eval_every": 1000}, grid={"model.norm": ["rmsnorm"]}))
    db = tmp_path / "x.duckdb"
    (first,) = cell_dirs(tmp_path, grid)
    proc = start_abl(["run", str(grid), "--db", str(db), "--runs-dir", str(tmp_path / "runs")])
    if moment == "start-up":
        wait_for(lambda: (first / "worker.log").exists(), timeout=240, what="the worker launched")
    else:
        wait_for(lambda: n_steps(first) >= 5, what="the cell training")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    stored = rows(db, "SELECT status, error FROM runs WHERE run_id = ?", [first.name])
    if not stored and moment == "start-up":  # stopped before its worker was started: nothing says running
        time.sleep(3)  # a worker forked just then ends on its parent-death signal, never left running
        assert not (first / "status.json").exists() or status_json(first)["status"] == "killed"
        return
    status, error = stored[0]
    assert status == "killed" and "SIGTERM" in (error or ""), (status, error)
    folder = status_json(first)
    assert (folder["status"], folder.get("error")) == (status, error)
    r = run_abl(["ingest", str(first), "--db", str(tmp_path / "rebuilt.duckdb")])
    assert r.returncode == 0, r.stdout + r.stderr
    assert rows(tmp_path / "rebuilt.duckdb", "SELECT status, error FROM runs")[0] == (status, error)
