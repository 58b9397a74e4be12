"""Hung cells and hung plugins (issue 39, finding 12).

- a plugin whose forward never returns must not hang ``abl run`` in the parent (the memory check measures
  a component without a cost function by running its forward): the parent's plugin work runs under a
  time limit, and ``abl run`` stops with exit 2 naming what did not return;
- SIGTERM to ``abl run`` at any point (here: while the parent waits on a plugin) exits 130 and leaves no
  lock file;
- ``train.timeout_s``: a cell that runs past it is stopped by the parent and stored ``failed`` with the
  reason, in its run folder and the store alike, and the grid goes on;
- a cell that reports no progress for ``train.stall_warning_s`` is named once on the terminal.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from conftest import ROOT, run_abl, stopping, tiny_grid_text

HANG_PLUGIN = """
import os
import sys
import time

import torch

from abl import Cost, hookimpl


def in_worker():
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    return "abl.run.worker" in sys.modules or getattr(main, "name", "") == "abl.run.worker"


class Hang(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, x):
        while True:  # a forward that never returns
            time.sleep(0.05)


class HangInWorker(Hang):
    def forward(self, x):
        if in_worker():
            return super().forward(x)
        return self.norm(x)


def _cost(dim, **_):
    return Cost(params=2 * dim, activation_elements_per_token=dim + 2)


@hookimpl
def register_components(register):
    register('norm', 'hang', Hang)  # no cost function: the parent measures its forward
    register('norm', 'hang_in_worker', HangInWorker, cost=_cost)
"""


def rows(db, sql, params=()):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


@pytest.fixture
def hang_plugins(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "hang.py").write_text(HANG_PLUGIN)
    return plugins


def start_abl(args, env=None):
    return subprocess.Popen([sys.executable, "-m", "abl.cli", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, **(env or {})))


def wait_for(pred, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_sigterm_while_the_parent_waits_on_a_hung_plugin_exits_130_and_leaves_no_lock(tmp_path, hang_plugins):
    grid = tmp_path / "g.toml"
    grid.write_text(tiny_grid_text(grid={"model.norm": ["hang"]}))
    db, runs = tmp_path / "x.duckdb", tmp_path / "runs"
    proc = start_abl(["--plugins-dir", str(hang_plugins), "run", str(grid), "--db", str(db),
                      "--runs-dir", str(runs)], env={"ABL_ZYGOTE": "0"})
    lock = Path(str(db) + ".lock")
    with stopping(proc) as stop:
        assert wait_for(lock.exists, 120), "abl run never took the store's lock"
        time.sleep(3)  # into the memory check, which measures the hanging forward
        assert proc.poll() is None, proc.communicate()
        out, err = stop(signal.SIGTERM)
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert "Traceback" not in err, err
    assert not lock.exists()


@pytest.mark.slow
def test_a_plugin_that_hangs_in_the_parent_stops_abl_run_with_exit_2_naming_it(tmp_path, hang_plugins):
    grid = tmp_path / "g.toml"
    grid.write_text(tiny_grid_text(grid={"model.norm": ["hang"]}))
    db, runs = tmp_path / "x.duckdb", tmp_path / "runs"
    started = time.time()
    r = run_abl(["--plugins-dir", str(hang_plugins), "run", str(grid), "--db", str(db), "--runs-dir", str(runs),
                 "--plugin-timeout", "5"], env={"ABL_ZYGOTE": "0"}, timeout=240)
    assert r.returncode == 2, r.stdout + r.stderr
    assert time.time() - started < 200
    assert "Traceback" not in r.stderr, r.stderr
    assert "did not return within 5 s" in r.stderr and "forward in hang.py" in r.stderr, r.stderr
    assert not Path(str(db) + ".lock").exists()
    assert not runs.exists() or not any(runs.iterdir())  # nothing trained


def test_plugin_code_stuck_in_native_code_is_ended_by_the_watchdog_with_the_clean_ups_run(tmp_path):
    """No signal handler runs while native code keeps the interpreter (stood in for by blocking SIGALRM):
    the watchdog thread says so, runs the registered clean-ups (the store's lock) and exits 2."""
    marker = tmp_path / "cleaned"
    code = f"""
import signal, time
from abl.run import guard
guard.NATIVE_GRACE_S = 1.0
guard.at_hard_exit(lambda: open({str(marker)!r}, "w").close())
with guard.time_limit("the test step", 1.0):
    signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGALRM}})
    time.sleep(60)
"""
    started = time.time()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert time.time() - started < 30
    assert "the test step did not return within 1 s" in r.stderr and "native code" in r.stderr, r.stderr
    assert marker.exists()


def test_plugin_timeout_passes_through_a_plugin_call_site_that_catches_exception():
    from abl.run.guard import PluginTimeout, time_limit

    with pytest.raises(PluginTimeout, match="the test step did not return within 0.2 s; it was in"):
        with time_limit("the test step", 0.2):
            try:
                while True:
                    time.sleep(0.01)
            except Exception:  # noqa: BLE001 - what a fallback around a plugin's call does
                pass


@pytest.mark.slow
def test_a_cell_past_train_timeout_s_is_failed_with_the_reason_and_the_grid_goes_on(tmp_path, hang_plugins):
    grid = tmp_path / "g.toml"
    grid.write_text(tiny_grid_text(train={"timeout_s": 20, "stall_warning_s": 4},
                                   grid={"model.norm": ["hang_in_worker", "rmsnorm"]}))
    db, runs = tmp_path / "x.duckdb", tmp_path / "runs"
    args = ["--plugins-dir", str(hang_plugins), "run", str(grid), "--db", str(db), "--runs-dir", str(runs)]
    r = run_abl(args, timeout=400)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    got = dict(rows(db, "SELECT config->>'$.model.norm', status FROM runs"))
    assert got == {"hang_in_worker": "failed", "rmsnorm": "completed"}, got  # the grid went on
    run_id, error = rows(db, "SELECT run_id, error FROM runs WHERE status = 'failed'")[0]
    assert "timed out" in error and "train.timeout_s = 20 s" in error, error
    folder = json.loads((runs / run_id / "status.json").read_text())
    assert (folder["status"], folder["error"]) == ("failed", error)  # the folder says what the store says
    out = " ".join(r.stdout.split())  # the terminal folds long lines
    # the stall warning, once (the other cell may get its own on a machine slow to start it)
    assert out.count("norm=hang_in_worker seed=0: no progress reported for") == 1, r.stdout
    assert "train.stall_warning_s = 4 s" in out and "ran past train.timeout_s = 20 s" in out, r.stdout
    # a plain re-run does not retry it; the limit is not part of the run id, so a longer one is the same run
    again = run_abl(args, timeout=200)
    assert again.returncode == 0 and "0 to run" in again.stdout, again.stdout + again.stderr


def test_the_time_limit_and_stall_warning_are_not_part_of_the_run_id(registry):
    from conftest import tiny_grid_raw

    from abl.grid.gridfile import expand

    plain = expand(tiny_grid_raw(), registry).cells
    limited = expand(tiny_grid_raw(train={"timeout_s": 30, "stall_warning_s": 5}), registry).cells
    assert [c.run_id for c in plain] == [c.run_id for c in limited]
    assert limited[0].train.timeout_s == 30 and limited[0].config["train"]["timeout_s"] == 30
    assert "timeout_s" not in plain[0].config["train"]  # left out at its default


def test_a_negative_time_limit_is_refused_like_any_train_setting(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(tiny_grid_text(train={"timeout_s": -1}))
    r = run_abl(["run", str(grid), "--dry-run", "--db", str(tmp_path / "x.duckdb")])
    assert r.returncode == 2 and "train.timeout_s" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_sigterm_while_plugin_code_is_stuck_in_native_code_exits_130_with_the_clean_ups_run(tmp_path):
    """SIGTERM and SIGALRM blocked in the main thread stand for native code that never gives the interpreter
    back: the Python handler cannot run, so the watchdog learns of the signal from the wakeup fd and ends
    the process with 130 after the clean-ups."""
    marker = tmp_path / "cleaned"
    code = f"""
import signal, sys, threading, time
from abl.run import guard
guard.STOP_GRACE_S = 1.0
guard.stop_on_signals()
guard.at_hard_exit(lambda: open({str(marker)!r}, "w").close())
with guard.time_limit("the test step", 300):
    signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGALRM, signal.SIGTERM}})
    # said from another thread once the main thread sleeps: a SIGTERM sent before the sleep began would find
    # the main thread still running Python code, whose handler then raises (the Python-code path, not this one)
    threading.Timer(0.5, lambda: print("stuck", flush=True)).start()
    time.sleep(120)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with stopping(proc) as stop:
        assert proc.stdout.readline().strip() == "stuck"
        started = time.time()
        out, err = stop(signal.SIGTERM)
    assert proc.returncode == 130, (proc.returncode, err)
    assert time.time() - started < 30
    assert "stopped by SIGTERM while the test step was stuck in native code" in err, err
    assert marker.exists()


class _Display:
    def __init__(self):
        self.printed = []

    def update(self, job):
        pass

    def print(self, text):
        self.printed.append(text)


class _Executor:
    def __init__(self):
        self.calls = []

    def stop(self, job):
        self.calls.append("stop")

    def kill(self, job):
        self.calls.append("kill")


def test_the_watch_stops_a_cell_at_its_limit_kills_it_after_the_grace_and_warns_of_a_stall_once(
        tiny_cell, tmp_path, monkeypatch):
    from abl.run import runner
    from abl.run.executors import Job

    now = [1000.0]
    monkeypatch.setattr(runner.time, "time", lambda: now[0])
    quiet = tiny_cell(train={"timeout_s": 0, "stall_warning_s": 30})
    job = Job(cell=quiet, run_dir=tmp_path / "a", index=0, started=1000.0)
    display, executor = _Display(), _Executor()
    events = runner.CellEvents(tmp_path / "x.duckdb", tmp_path, {}, {}, display)
    for t in (1010.0, 1031.0, 1100.0, 5000.0):
        now[0] = t
        events.watch(job, executor)
    stalls = [p for p in display.printed if "no progress reported for" in p]
    assert len(stalls) == 1 and "31s" in stalls[0] and "no time limit" in stalls[0], display.printed
    assert executor.calls == []  # a stall alone never stops a cell

    limited = tiny_cell(train={"timeout_s": 60, "stall_warning_s": 0})
    job = Job(cell=limited, run_dir=tmp_path / "b", index=1, started=1000.0)
    executor = _Executor()
    for t, calls in ((1059.0, []), (1061.0, ["stop"]), (1065.0, ["stop"]),
                     (1061.0 + runner.STOP_GRACE_S + 1, ["stop", "kill"]), (1200.0, ["stop", "kill"])):
        now[0] = t
        events.watch(job, executor)
        assert executor.calls == calls, (t, executor.calls)
    assert any("ran past train.timeout_s = 60 s" in p for p in display.printed)
