"""Plugin code the ``abl`` parent runs after loading is bounded too (issue 39): ``abl cost``'s and ``abl report``'s
cost functions and checks, the lr sweep's phase-2 grid, ``--plugin-timeout`` over the load while ``abl run``
reads its options, a step stuck in native code (the watchdog, ``ABL_NATIVE_GRACE_S``), and SIGTERM while
``abl run`` prepares its data.

One plugin stands for every kind of hang: its norm's check or cost function sleeps for ever in the parent
when ``HANG_AT`` names it (``check`` / ``cost``; ``HANG_WHEN`` a file that must exist first, ``HANG_IN`` a
function that must be on the stack), its dataset sleeps while it loads when ``HANG_AT=dataset``, and
``HANG_NATIVE=1`` blocks SIGALRM first, as native code that never gives the interpreter back would.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from conftest import ROOT, default_signals, run_abl, stopping, tiny_grid_text, write_plugins

HANG_PLUGIN = '''
import inspect
import os
import signal
import sys
import time

import torch

from abl import Cost, hookimpl


def in_parent():
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(main, "name", "") == "abl.cli.__main__"


def hang_here(step):
    if os.environ.get("HANG_AT") != step or not in_parent():
        return
    if os.environ.get("HANG_WHEN") and not os.path.exists(os.environ["HANG_WHEN"]):
        return
    if os.environ.get("HANG_IN") and os.environ["HANG_IN"] not in {f.function for f in inspect.stack()}:
        return
    if os.environ.get("HANG_NATIVE"):  # "stops": the stop signals too, as native code that never returns
        stops = {signal.SIGTERM, signal.SIGINT} if os.environ["HANG_NATIVE"] == "stops" else set()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, *stops})
    if os.environ.get("HANG_SAYS"):
        open(os.environ["HANG_SAYS"], "w").close()
    time.sleep(10**6)


class Norm(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, x):
        if os.environ.get("TRAINED_MARK"):
            open(os.environ["TRAINED_MARK"], "w").close()
        return self.norm(x)


def _cost(cfg, **_):
    hang_here("cost")
    return Cost(params=2 * cfg.d_model, activation_elements_per_token=cfg.d_model + 2)


def _check(cfg, params):
    hang_here("check")
    return []


def slow_text(max_bytes: int = 300000):
    from abl.plugins.datasets import python_stdlib

    hang_here("dataset")
    return python_stdlib(max_bytes=max_bytes)


def slow_bytes():
    from abl.plugins.tokenizers import ByteTokenizer

    class SlowBytes(ByteTokenizer):
        def encode(self, docs):
            hang_here("tokenizer")
            return super().encode(docs)

    return SlowBytes()


@hookimpl
def register_components(register):
    register("norm", "hangnorm", Norm, cost=_cost, check=_check)
    register("dataset", "slow_text", slow_text)
    register("tokenizer", "slow_bytes", slow_bytes)


@hookimpl
def run_finished(run_id, status, config, summary):
    if os.environ.get("HANG_AT") == "run_finished_raises":
        raise RuntimeError("the notification service is down")
    hang_here("run_finished")
    if os.environ.get("FINISHED_LOG"):
        with open(os.environ["FINISHED_LOG"], "a") as f:
            f.write(run_id + "\\n")


def _executor(options):
    from abl import LocalExecutor

    hang_here("executor")
    return LocalExecutor(workers=options.workers or 1)


@hookimpl
def register_executors(register):
    register("hanging", _executor, doc="a local executor whose factory can hang")
'''


@pytest.fixture
def plugins(tmp_path):
    return write_plugins(tmp_path / "plug", {"hang_plugin.py": HANG_PLUGIN})


@pytest.fixture(autouse=True)
def _no_env_limit(monkeypatch):
    monkeypatch.delenv("ABL_PLUGIN_TIMEOUT", raising=False)
    monkeypatch.delenv("ABL_NATIVE_GRACE_S", raising=False)


def _grid(tmp_path, **sections) -> Path:
    grid = tmp_path / "g.toml"
    grid.write_text(tiny_grid_text(**{"grid": {"model.norm": ["hangnorm"]}, **sections}))
    return grid


def _stopped(r, started, step_words, line_of="hang_here in hang_plugin.py, line", within=60):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert time.time() - started < within
    assert "Traceback" not in r.stderr, r.stderr
    text = " ".join(r.stderr.split())
    assert "did not return within 2 s" in text and step_words in text, r.stderr
    assert line_of in text, r.stderr


def test_abl_run_plugin_timeout_bounds_the_plugin_load_while_it_reads_its_options(tmp_path):
    hang = write_plugins(tmp_path / "imp", {"hang_at_import.py": "import time\n\nX = 1\ntime.sleep(10**6)\n"})
    grid = _grid(tmp_path, grid={"model.norm": ["rmsnorm"]})
    db = tmp_path / "x.duckdb"
    for at_end in (False, True):  # before and after --executor (whose choices load the plugins)
        opts = ["--plugin-timeout", "2"]
        args = ["--plugins-dir", str(hang), "run", str(grid), "--db", str(db), *([] if at_end else opts),
                "--executor", "local", *(opts if at_end else [])]
        started = time.time()
        r = run_abl(args, timeout=90)
        _stopped(r, started, "importing plugin file hang_at_import.py", "hang_at_import.py, line 4")
        assert not Path(str(db) + ".lock").exists() and not db.exists()


@pytest.mark.parametrize("step", ["check", "cost"])
def test_abl_cost_stops_on_a_cost_function_or_check_that_never_returns(tmp_path, plugins, step):
    started = time.time()
    r = run_abl(["--plugins-dir", str(plugins), "cost", str(_grid(tmp_path))],
                env={"HANG_AT": step, "ABL_PLUGIN_TIMEOUT": "2"}, timeout=90)
    _stopped(r, started, "did not return")


@pytest.mark.parametrize("command", ["report", "compare"])
def test_abl_report_and_compare_stop_on_a_check_that_never_returns(tmp_path, plugins, command):
    started = time.time()
    r = run_abl(["--plugins-dir", str(plugins), command, str(_grid(tmp_path)), "--db", str(tmp_path / "x.duckdb")],
                env={"HANG_AT": "check", "ABL_PLUGIN_TIMEOUT": "2"}, timeout=90)
    _stopped(r, started, "did not return")


def _runs(db):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT experiment, status FROM runs").fetchall()
    finally:
        con.close()


@pytest.mark.slow
def test_abl_report_stops_on_a_cost_function_that_hangs_while_the_report_is_built(tmp_path, plugins):
    grid = _grid(tmp_path, grid={"model.norm": ["hangnorm"]})
    db = tmp_path / "x.duckdb"
    base = ["--plugins-dir", str(plugins)]
    r = run_abl([*base, "run", str(grid), "--db", str(db)], env={"ABL_ZYGOTE": "0"}, timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    started = time.time()
    r = run_abl([*base, "report", str(grid), "--db", str(db), "--out", str(tmp_path / "rep")],
                env={"HANG_AT": "cost", "HANG_IN": "attach_predictions", "ABL_PLUGIN_TIMEOUT": "2"}, timeout=120)
    _stopped(r, started, "the report")


@pytest.mark.slow
def test_a_check_that_hangs_in_the_lr_sweeps_phase_2_stops_abl_run_with_no_lock_and_no_phase_2_run(tmp_path,
                                                                                                 plugins):
    """The check hangs only once a cell has trained (its forward leaves a mark): phase 1 runs, phase 2's grid is
    built from phase 1's best rates, and that expansion runs the check again, in the parent."""
    mark = tmp_path / "trained"
    grid = _grid(tmp_path, experiment={"seeds": [0, 1]}, train={"lr_sweep": [1e-3, 3e-3]})
    db, runs = tmp_path / "x.duckdb", tmp_path / "runs"
    started = time.time()
    r = run_abl(["--plugins-dir", str(plugins), "run", str(grid), "--db", str(db), "--runs-dir", str(runs),
                 "--plugin-timeout", "2"],
                env={"ABL_ZYGOTE": "0", "HANG_AT": "check", "HANG_WHEN": str(mark), "TRAINED_MARK": str(mark)},
                timeout=400)
    _stopped(r, started, "phase 2", within=400)
    assert mark.exists()  # phase 1 trained
    assert not Path(str(db) + ".lock").exists()
    stored = _runs(db)
    assert stored and all(e == "tiny.lr_tuning" for e, _ in stored), stored  # nothing of phase 2
    assert len(list(runs.iterdir())) == len(stored) == 2


@pytest.mark.slow
def test_a_check_that_hangs_in_a_later_until_decided_round_stops_abl_run_with_no_lock(tmp_path, plugins):
    mark = tmp_path / "trained"
    grid = _grid(tmp_path, experiment={"seeds": [0, 1, 2]}, grid={"model.norm": ["hangnorm", "rmsnorm"]})
    db = tmp_path / "x.duckdb"
    started = time.time()
    r = run_abl(["--plugins-dir", str(plugins), "run", str(grid), "--db", str(db), "--until-decided", "--budget",
                 "4", "--plugin-timeout", "2"],
                env={"ABL_ZYGOTE": "0", "HANG_AT": "check", "HANG_WHEN": str(mark), "TRAINED_MARK": str(mark)},
                timeout=500)
    _stopped(r, started, "a round's grid", within=500)
    assert mark.exists()  # the first round trained
    assert not Path(str(db) + ".lock").exists()
    assert len(_runs(db)) == 6  # the first round's three seeds of both cells, nothing after


def test_an_executor_factory_that_never_returns_stops_abl_run_with_no_lock(tmp_path, plugins):
    db, runs = tmp_path / "x.duckdb", tmp_path / "runs"
    started = time.time()
    r = run_abl(["--plugins-dir", str(plugins), "run", str(_grid(tmp_path, grid={"model.norm": ["rmsnorm"]})),
                 "--db", str(db), "--runs-dir", str(runs), "--executor", "hanging", "--plugin-timeout", "2"],
                env={"HANG_AT": "executor"}, timeout=90)
    _stopped(r, started, "making the executor 'hanging'")
    assert not Path(str(db) + ".lock").exists()
    assert not runs.exists() or not any(runs.iterdir())


def test_plugin_code_stuck_in_native_code_is_ended_by_the_watchdog_after_abl_native_grace_s(tmp_path, plugins):
    """The cost function blocks SIGALRM, so the limit's Python handler never runs in the main thread: the
    watchdog ends ``abl run`` ABL_NATIVE_GRACE_S after the limit, exit 2, the message, the lock removed."""
    said = tmp_path / "stuck"
    db, runs = tmp_path / "x.duckdb", tmp_path / "runs"
    r = run_abl(["--plugins-dir", str(plugins), "run", str(_grid(tmp_path)), "--db", str(db), "--runs-dir",
                 str(runs), "--plugin-timeout", "8"],  # long enough to reach the cost function on a loaded machine
                env={"ABL_ZYGOTE": "0", "HANG_AT": "cost", "HANG_NATIVE": "1", "HANG_SAYS": str(said),
                     "ABL_NATIVE_GRACE_S": "1"}, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert said.exists()  # it did hang, with SIGALRM blocked
    # ended within the limit and ABL_NATIVE_GRACE_S of the hang's start: the default grace alone is 30 s
    assert time.time() - said.stat().st_mtime < 8 + 1 + 12
    text = " ".join(r.stderr.split())
    assert "did not return within 8 s; it was in native code" in text, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert not Path(str(db) + ".lock").exists()
    assert not runs.exists() or not any(runs.iterdir())


def test_a_bad_abl_native_grace_s_is_refused_with_exit_2(tmp_path):
    r = run_abl(["plugins"], env={"ABL_NATIVE_GRACE_S": "soon"}, timeout=60)
    assert r.returncode == 2 and "ABL_NATIVE_GRACE_S" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("where,native", [("dataset", False), ("tokenizer", False), ("tokenizer", True)],
                         ids=["dataset", "tokenizer", "tokenizer-native"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_abl_run_prepares_its_data_exits_130_with_no_lock(tmp_path, plugins, sig, where, native):
    """The dataset's load (the memory check reads it first) or the tokenizer's encoding (the token store's
    build) is slow when the signal comes. native: the tokenizer blocks the stop signals in the main thread and
    sleeps, as native code that never gives the interpreter back: the watchdog around the data preparation
    learns of the signal and ends abl run (exit 130, the lock removed) STOP_GRACE_S later."""
    said = tmp_path / "loading"
    grid = _grid(tmp_path, grid={"model.norm": ["rmsnorm"]},
                 data={"dataset": "slow_text", "tokenizer": "slow_bytes" if where == "tokenizer" else "byte"},
                 dataset={"slow_text": {"max_bytes": 300000}})
    db, runs = tmp_path / "x.duckdb", tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "abl.cli", "--plugins-dir", str(plugins), "run", str(grid),
                             "--db", str(db), "--runs-dir", str(runs)], cwd=ROOT, stdout=subprocess.PIPE,
                            preexec_fn=default_signals,  # noqa: PLW1509 - a suite started in the background ignores SIGINT
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, ABL_ZYGOTE="0", HANG_AT=where, HANG_SAYS=str(said),
                                     **({"HANG_NATIVE": "stops"} if native else {})))
    with stopping(proc) as stop:
        deadline = time.time() + 120
        while not said.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert said.exists(), proc.communicate(timeout=30)
        assert Path(str(db) + ".lock").exists()  # the lock is held while the data is prepared
        sent = time.time()
        out, err = stop(sig)
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert time.time() - sent < 30
    assert "Traceback" not in err, err
    if native:
        assert f"stopped by {signal.Signals(sig).name} while the data preparation" in " ".join(err.split()), err
    else:
        assert "stopped; finished cells are stored" in err, err
    assert not Path(str(db) + ".lock").exists()
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.parametrize("how", ["run_finished", "run_finished_raises"], ids=["hangs", "raises"])
def test_a_run_finished_hook_that_hangs_or_raises_costs_no_cell_and_is_said(tmp_path, plugins, how):
    """The parent calls run_finished after each cell is stored: a hook that never returns is left after
    --plugin-timeout, one that raises is said; either way a warning names the plugin, and every cell of the
    grid trains and is stored."""
    db, runs = tmp_path / "x.duckdb", tmp_path / "runs"
    r = run_abl(["--plugins-dir", str(plugins), "run", str(_grid(tmp_path, grid={"model.norm": ["rmsnorm"]},
                                                                 experiment={"name": "tiny", "seeds": [0, 1]})),
                 "--db", str(db), "--runs-dir", str(runs), "--plugin-timeout", "3"],
                env={"HANG_AT": how}, timeout=150)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    text = " ".join((r.stdout + r.stderr).split())
    assert "Traceback" not in text
    assert "warning: plugin 'file:hang_plugin''s run_finished hook" in text and "the grid goes on" in text, text
    assert ("did not return within 3 s" if how == "run_finished" else "the notification service is down") in text
    assert sorted(s for _, s in _runs(db)) == ["completed", "completed"]
    assert not Path(str(db) + ".lock").exists()
