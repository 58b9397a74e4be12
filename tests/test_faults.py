"""Fault tolerance: kills, signals, divergence, resume, retry, code changes, executors."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from conftest import ROOT, default_signals, run_abl, tiny_grid_text

def grid_text(steps: int, ckpt: int) -> str:
    """The tiny grid (tests/conftest.py), two layers, rmsnorm or none, ``steps`` steps, a checkpoint every ``ckpt``."""
    return tiny_grid_text(experiment={"name": "faults"}, model={"n_layers": 2, "context": 32},
                          train={"steps": steps, "batch_size": 4, "eval_every": 50, "eval_batches": 2, "threads": None,
                                 "checkpoint_every": ckpt}, eval=None, grid={"model.norm": ["rmsnorm", "none"]})


def rows(db, sql, params=()):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def start_abl(args):
    return subprocess.Popen([sys.executable, "-m", "abl.cli", *args], cwd=ROOT,
                            preexec_fn=default_signals,  # noqa: PLW1509 - it only resets two signals
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_abl_started_by_a_test_gets_sigint_as_ctrl_c_even_from_a_backgrounded_suite():
    """The suite run under nohup / ``&`` (SIGINT ignored, inherited): start_abl's child still has the
    default SIGINT disposition, so ``test_two_ctrl_c...`` tests abl, not how pytest was started."""
    probe = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        inherited = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                   check=True).stdout
        reset = subprocess.run([sys.executable, "-c", probe], preexec_fn=default_signals,
                               capture_output=True, text=True, check=True).stdout
    finally:
        signal.signal(signal.SIGINT, previous)
    assert inherited.strip() == "False"  # what the backgrounded suite's children got before
    assert reset.strip() == "True"


def wait_for(pred, timeout=240, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def status_of(run_dir):
    try:
        return json.loads((run_dir / "status.json").read_text()).get("status")
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def n_steps(run_dir):
    try:
        return sum(1 for line in open(run_dir / "metrics.jsonl") if '"train_loss"' in line)
    except FileNotFoundError:
        return 0


def cell_dirs(tmp_path, grid):
    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid

    return [tmp_path / "runs" / c.run_id for c in load_grid(grid, get_registry()).cells]


@pytest.mark.slow
def test_sigkill_of_abl_run_mid_cell_then_resume(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(grid_text(300, 40))
    db = tmp_path / "x.duckdb"
    first, second = cell_dirs(tmp_path, grid)
    proc = start_abl(["run", str(grid), "--db", str(db)])
    wait_for(lambda: status_of(first) == "completed" and n_steps(second) >= 110, what="cell 2 mid-run")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    snapshot = [json.loads(line) for line in open(second / "metrics.jsonl") if line.endswith("\n")]
    wait_for(lambda: status_of(second) != "running" or not _alive(second), timeout=30, what="worker exit")
    first_started = rows(db, "SELECT started FROM runs WHERE run_id = ?", [first.name])[0][0]

    r = run_abl(["run", str(grid), "--db", str(db)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 already completed, skipped; 1 to run (1 resuming from a checkpoint)" in r.stdout
    got = dict(rows(db, "SELECT run_id, status FROM runs"))
    assert got == {first.name: "completed", second.name: "completed"}
    # the completed cell did not run again
    assert rows(db, "SELECT started, attempts FROM runs WHERE run_id = ?", [first.name])[0] == (first_started, 1)
    assert rows(db, "SELECT attempts FROM runs WHERE run_id = ?", [second.name])[0][0] == 2
    # every row written before the kill is present exactly once, with the same training values
    stored = rows(db, "SELECT step, name, value, count(*) OVER (PARTITION BY step, name) FROM metrics "
                      "WHERE run_id = ?", [second.name])
    assert all(c == 1 for *_, c in stored)
    by_key = {(s, n): v for s, n, v, _ in stored}
    for row in snapshot:
        for name, value in row.items():
            if name != "step":
                assert (row["step"], name) in by_key, (row["step"], name)
        assert by_key[(row["step"], "train_loss")] == pytest.approx(row["train_loss"], abs=1e-6) \
            if "train_loss" in row else True
    assert max(s for s, n in by_key if n == "train_loss") == 300
    # issue 13, 9: the resumed run keeps its mfu row (it lost it: the costs it needs were recorded at step 0),
    # unless its loop shared the machine (issue 27: no mfu for a contended run, which its notes say)
    from abl.analysis import health

    contended = health.contended(by_key.get((300, "load_per_core")), by_key.get((300, "cpu_util")), on_cpu=True)
    notes = rows(db, "SELECT notes FROM runs WHERE run_id = ?", [second.name])[0][0] or ""
    if contended or "too busy to measure" in notes:
        assert (300, "mfu") not in by_key and "mfu not recorded" in notes, notes
    else:
        assert (300, "mfu") in by_key and by_key[(300, "mfu")] > 0


def _alive(run_dir):
    try:
        pid = json.loads((run_dir / "status.json").read_text())["pid"]
        os.kill(pid, 0)
        return True
    except (FileNotFoundError, KeyError, ProcessLookupError, json.JSONDecodeError):
        return False


@pytest.mark.slow
def test_sigterm_stops_cleanly_and_marks_the_cell_killed(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(grid_text(2000, 0))
    db = tmp_path / "x.duckdb"
    first, _ = cell_dirs(tmp_path, grid)
    proc = start_abl(["run", str(grid), "--db", str(db)])
    wait_for(lambda: n_steps(first) >= 20, what="cell 1 running")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err
    assert rows(db, "SELECT status FROM runs WHERE run_id = ?", [first.name])[0][0] == "killed"
    assert status_of(first) == "killed"
    kept = rows(db, "SELECT count(*) FROM metrics WHERE run_id = ? AND name = 'train_loss'", [first.name])[0][0]
    assert kept >= 20


@pytest.mark.slow
def test_a_diverging_cell_stops_while_the_others_complete_and_retry(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(grid_text(30, 0).replace('"model.norm" = ["rmsnorm", "none"]',
                                                          '"train.lr" = [3e-3, 1e7]')
                    .replace("[train]", "[train]\ngrad_clip = 0.0\nwarmup_steps = 0"))
    db = tmp_path / "x.duckdb"
    r = run_abl(["run", str(grid), "--db", str(db)])
    assert r.returncode == 1
    got = dict(rows(db, "SELECT CAST(config->>'$.train.lr' AS DOUBLE), status FROM runs"))
    assert got == {3e-3: "completed", 1e7: "diverged"}
    err, = rows(db, "SELECT error FROM runs WHERE status = 'diverged'")[0]
    assert "diverged at step" in err
    step = int(err.split("diverged at step ")[1].split(":")[0])
    assert step < 30
    diverged_id = rows(db, "SELECT run_id FROM runs WHERE status = 'diverged'")[0][0]
    last = rows(db, "SELECT max(step) FROM metrics WHERE run_id = ? AND name = 'train_loss'", [diverged_id])
    assert last[0][0] == step  # it stopped at once

    again = run_abl(["run", str(grid), "--db", str(db)])
    assert again.returncode == 0
    assert "1 failed or diverged, skipped (--retry failed re-runs them)" in again.stdout
    retry = run_abl(["run", str(grid), "--db", str(db), "--retry", "failed"])
    assert retry.returncode == 1 and "1 already completed, skipped; 1 to run" in retry.stdout
    assert rows(db, "SELECT attempts FROM runs WHERE run_id = ?", [diverged_id])[0][0] == 2


@pytest.mark.slow
def test_a_code_change_between_attempts_is_recorded_and_flagged(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(grid_text(5, 0).replace('["rmsnorm", "none"]', '["rmsnorm"]'))
    db = tmp_path / "x.duckdb"
    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid

    (cell,) = load_grid(grid, get_registry()).cells
    run_dir = tmp_path / "runs" / cell.run_id
    # an earlier attempt made by other code: its folder says so and it never finished
    run_dir.mkdir(parents=True)
    (run_dir / "meta.json").write_text(json.dumps({"git_commit": "0" * 40, "attempts": 1}))
    (run_dir / "config.json").write_text(json.dumps(cell.config))
    (run_dir / "status.json").write_text(json.dumps({"status": "killed"}))
    r = run_abl(["run", str(grid), "--db", str(db)])
    assert r.returncode == 0, r.stderr
    assert "code changed between attempts" in r.stdout
    changed, notes, attempts = rows(db, "SELECT code_changed, notes, attempts FROM runs")[0]
    assert changed is True and "first " + "0" * 40 in notes and attempts == 2


@pytest.mark.slow
def test_ddp_cell_on_two_cpu_processes(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(grid_text(6, 0).replace('["rmsnorm", "none"]', '["rmsnorm"]')
                    .replace("[train]", "[train]\ndevices = 2"))
    db = tmp_path / "x.duckdb"
    r = run_abl(["run", str(grid), "--db", str(db)])
    assert r.returncode == 0, r.stdout + r.stderr
    (env, status), = rows(db, "SELECT env, status FROM runs")
    assert status == "completed" and json.loads(env)["processes"] == 2
    # only rank 0 records: one row per step
    assert rows(db, "SELECT count(*), count(DISTINCT step) FROM metrics WHERE name = 'train_loss'")[0] == (6, 6)


@pytest.mark.slow
@pytest.mark.parametrize("executor", [["--executor", "slurm", "--slurm-cluster", "local"],
                                      ["--executor", "ray"]], ids=["submitit-local", "ray-local"])
def test_remote_executors_run_a_two_cell_grid_into_the_store(tmp_path, executor):
    pytest.importorskip("submitit" if "slurm" in executor else "ray")
    grid = tmp_path / "g.toml"
    grid.write_text(grid_text(6, 0))
    db = tmp_path / "x.duckdb"
    r = run_abl(["run", str(grid), "--db", str(db), *executor], timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    got = rows(db, "SELECT status, executor FROM runs")
    assert len(got) == 2 and {s for s, _ in got} == {"completed"}
    assert {e for _, e in got} == {"slurm-local" if "slurm" in executor else "ray"}
    assert rows(db, "SELECT count(DISTINCT run_id) FROM metrics WHERE name = 'val_loss'")[0][0] == 2


def test_worker_truncates_metrics_to_the_checkpoint(tmp_path):
    from abl.store.rundir import truncate_metrics

    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps({"step": s, "train_loss": 1.0}) + "\n" for s in range(10)) + '{"step": 10, "tr')
    truncate_metrics(p, 6)
    assert [json.loads(line)["step"] for line in p.read_text().splitlines()] == list(range(7))
    truncate_metrics(p, None)
    assert not p.exists()


def test_checkpoint_round_trip_continues_identically(registry, tmp_path):
    from abl.grid.gridfile import expand
    from abl.train.loop import train

    raw = {"experiment": {"name": "t", "seeds": [3]},
           "model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "context": 32},
           "train": {"steps": 12, "batch_size": 4, "eval_every": 12, "eval_batches": 2, "checkpoint_every": 5},
           "dataset": {"pystdlib": {"max_bytes": 300000}}}

    class Sink:
        def __init__(self):
            self.rows = []

        def log(self, step, m):
            self.rows.append((step, m))

    full = Sink()
    train(expand(raw, registry).cells[0], registry, full)
    ckpt = tmp_path / "c.pt"
    part = Sink()
    cell = expand(raw, registry).cells[0]
    cell.train.steps = 12
    # run to step 12 writing checkpoints, then resume from the step-10 checkpoint
    train(cell, registry, part, checkpoint_path=ckpt)
    resumed = Sink()
    train(expand(raw, registry).cells[0], registry, resumed, checkpoint_path=ckpt)
    loss = lambda sink: {s: m["train_loss"] for s, m in sink.rows if "train_loss" in m}  # noqa: E731
    assert min(loss(resumed)) == 11
    for s in (11, 12):
        assert loss(resumed)[s] == pytest.approx(loss(full)[s], abs=1e-6)


# ---------------------------------------------------------------- issue 13: honest statuses

TINY = {"experiment": {"name": "tiny", "seeds": [0]},
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "context": 32},
        "train": {"steps": 3, "batch_size": 4, "eval_every": 3, "eval_batches": 1},
        "eval": {"decode": False, "extrapolation": False},
        "dataset": {"pystdlib": {"max_bytes": 300000}}}


def tiny_folder(tmp_path, registry, name="run"):
    from abl.grid.gridfile import expand
    from abl.store import rundir

    cell = expand(json.loads(json.dumps(TINY)), registry).cells[0]
    d = tmp_path / name
    rundir.prepare(d, cell.config, {"attempts": 1})
    return d


def start_worker(run_dir, env=None):
    log = open(run_dir / "worker.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "abl.run.worker", str(run_dir)], cwd=ROOT, stdout=log,
                            stderr=log, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("delay", [0.0, 0.4, 1.2])
def test_a_signal_during_worker_start_up_is_recorded_killed(tmp_path, registry, delay):
    """The issue: the parent-death SIGTERM arrived during imports, the worker stored a
    RecursionError from numpy.linalg as failed, and the cell was skipped forever."""
    d = tiny_folder(tmp_path, registry)
    proc = start_worker(d)
    wait_for(lambda: status_of(d) == "running", timeout=120, what="the worker's handlers")
    time.sleep(delay)  # somewhere in importing torch, the plugins, the data
    assert n_steps(d) == 0  # still starting up
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 5  # EXIT_CODES["killed"]
    st = json.loads((d / "status.json").read_text())
    assert st["status"] == "killed" and "SIGTERM" in st["error"], st
    from abl.contracts.status import runs_again

    assert runs_again(st["status"])  # a plain re-run restarts it


SWALLOWING_PLUGIN = """
import time
from pathlib import Path

# stands for start-up code a signal's exception cannot pass through unharmed: a C extension's
# import (where it once ended in SIGABRT, exit -6, under load) or a library that catches everything
Path({mark!r}).touch()
deadline = time.time() + 3
while time.time() < deadline:
    try:
        time.sleep(0.05)
    except BaseException:
        pass
"""


def test_a_signal_during_start_up_ends_the_worker_even_where_its_exception_would_be_lost(tmp_path, registry):
    """During start-up the signal handler itself records the cell as killed and leaves (exit 5),
    instead of raising into whatever code is running: there, the exception can be swallowed (the
    cell then trains on, unwanted) or turn into an abort that loses the status."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    mark = tmp_path / "importing"
    (plugins / "swallow.py").write_text(SWALLOWING_PLUGIN.format(mark=str(mark)))
    d = tiny_folder(tmp_path, registry)
    proc = start_worker(d, env={"ABL_PLUGINS_DIR": str(plugins)})
    wait_for(mark.exists, timeout=120, what="the plugin's import")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 5  # EXIT_CODES["killed"], not a cell that went on to complete
    st = json.loads((d / "status.json").read_text())
    assert st["status"] == "killed" and "SIGTERM" in st["error"], st
    assert n_steps(d) == 0
    assert not list(d.glob("*.tmp"))


FLAKY_PLUGIN = """
import sys
from pathlib import Path

MARK = Path({mark!r})
if sys.argv[0].endswith("worker.py") and ({always} or not MARK.exists()):
    MARK.touch()
    raise RuntimeError("flaky start-up: the file system hiccuped")
"""


@pytest.mark.parametrize("always", [False, True], ids=["transient", "persistent"])
def test_a_start_up_failure_is_retried_once(tmp_path, registry, always):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "flaky.py").write_text(FLAKY_PLUGIN.format(mark=str(tmp_path / "mark"), always=always))
    d = tiny_folder(tmp_path, registry)
    proc = start_worker(d, env={"ABL_PLUGINS_DIR": str(plugins)})
    code = proc.wait(timeout=600)
    st = json.loads((d / "status.json").read_text())
    log = (d / "worker.log").read_text()
    assert log.count("start-up failed, retrying once") == 1
    assert "flaky start-up" in st["startup_retried"]
    assert st["pid"] == proc.pid  # the retry is the same process (exec), so the parent keeps watching it
    if always:
        assert (code, st["status"]) == (1, "failed") and "flaky start-up" in st["error"]
    else:
        assert (code, st["status"]) == (0, "completed"), st


@pytest.mark.slow
def test_kill_9_of_abl_run_during_worker_start_up_leaves_a_cell_that_runs_again(tmp_path):
    grid = tmp_path / "g.toml"
    # 300 steps: the cell must still be running when the kill lands (at 5 it could complete first)
    grid.write_text(grid_text(300, 0).replace('["rmsnorm", "none"]', '["rmsnorm"]'))
    db = tmp_path / "x.duckdb"
    (cell,) = cell_dirs(tmp_path, grid)
    proc = start_abl(["run", str(grid), "--db", str(db)])
    wait_for(lambda: status_of(cell) == "running", what="the worker starting")
    proc.send_signal(signal.SIGKILL)  # the worker gets its parent-death SIGTERM while importing
    proc.wait()
    wait_for(lambda: status_of(cell) != "running" or not _alive(cell), timeout=60, what="the worker's end")
    assert status_of(cell) in ("killed", "running")  # killed, or gone before it could say so
    r = run_abl(["run", str(grid), "--db", str(db)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "failed or diverged, skipped" not in r.stdout and "1 to run" in r.stdout
    assert rows(db, "SELECT status, attempts FROM runs") == [("completed", 2)]


@pytest.mark.slow
def test_two_ctrl_c_leave_the_store_in_line_with_the_folders_and_unstarted_cells_keep_their_attempts(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(grid_text(2000, 0))
    db = tmp_path / "x.duckdb"
    first, second = cell_dirs(tmp_path, grid)
    proc = start_abl(["run", str(grid), "--db", str(db)])
    wait_for(lambda: n_steps(first) >= 5, what="cell 1 training")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err
    assert status_of(first) == "killed"
    assert rows(db, "SELECT run_id, status FROM runs") == [(first.name, "killed")]
    # the second cell never started: no folder set up, no attempt counted
    assert not (second / "meta.json").exists()

    # the same cells, shorter (the run ids change with steps, so count attempts on a grid interrupted
    # the same way); 300 steps, not 3: a 3-step cell could complete before the Ctrl-C reached it
    short = tmp_path / "short.toml"
    short.write_text(grid_text(300, 0))
    a, b = cell_dirs(tmp_path, short)
    proc = start_abl(["run", str(short), "--db", str(db)])
    wait_for(lambda: status_of(a) == "running", what="cell 1 starting")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    r = run_abl(["run", str(short), "--db", str(db)])
    assert r.returncode == 0, r.stdout + r.stderr
    got = dict((run_id, (status, attempts)) for run_id, status, attempts in
               rows(db, "SELECT run_id, status, attempts FROM runs WHERE run_id IN (?, ?)", [a.name, b.name]))
    assert got == {a.name: ("completed", 2), b.name: ("completed", 1)}


# ---------------------------------------------------------------- issue 13, 6: ingest checks completeness


@pytest.mark.slow
def test_ingest_stores_a_cut_or_garbled_run_as_incomplete_and_a_repair_restores_it(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(grid_text(20, 0).replace('["rmsnorm", "none"]', '["rmsnorm"]'))
    db = tmp_path / "x.duckdb"
    r = run_abl(["run", str(grid), "--db", str(db)])
    assert r.returncode == 0, r.stderr
    (run_dir,) = cell_dirs(tmp_path, grid)
    whole = (run_dir / "metrics.jsonl").read_bytes()
    final = rows(db, "SELECT value FROM metrics WHERE name = 'val_loss' AND step = 20")
    n_rows = rows(db, "SELECT count(*) FROM metrics")[0][0]

    def ingest():
        return run_abl(["ingest", "--db", str(db)])

    # cut mid-file: the issue stored this as completed with half the steps and a wrong final val_loss
    (run_dir / "metrics.jsonl").write_bytes(whole[: len(whole) // 2])
    r = ingest()
    assert r.returncode == 1 and "1 incomplete" in r.stdout, r.stdout + r.stderr
    status, error = rows(db, "SELECT status, error FROM runs")[0]
    assert status == "incomplete"
    assert "metrics.jsonl ends in a cut line" in error and "steps is missing" in error
    assert "no val_loss, wall_s, peak_mem_bytes at step 20" in error and "abl ingest" in error
    assert "incomplete" in r.stderr
    # a garbled middle line is no longer dropped in silence
    lines = whole.split(b"\n")
    lines[7] = b'{"step": 7, "train_lo\x00ss": '
    (run_dir / "metrics.jsonl").write_bytes(b"\n".join(lines))
    assert ingest().returncode == 1
    status, error = rows(db, "SELECT status, error FROM runs")[0]
    assert status == "incomplete" and "1 damaged line(s) (line 8)" in error
    # the summary shows no final val_loss for it, and the run summary counts it as not completed
    from abl.analysis.verdicts import cell_inputs
    from abl.present import summary

    (cell,) = cell_inputs(summary.load(db, run_ids=[run_dir.name]))
    assert cell.statuses == {"incomplete": 1} and cell.values == {}

    # repaired: a second ingest restores it
    (run_dir / "metrics.jsonl").write_bytes(whole)
    r = ingest()
    assert r.returncode == 0 and "1 completed" in r.stdout
    assert rows(db, "SELECT status, error FROM runs")[0] == ("completed", None)
    assert rows(db, "SELECT value FROM metrics WHERE name = 'val_loss' AND step = 20") == final
    assert rows(db, "SELECT count(*) FROM metrics")[0][0] == n_rows

    # damaged again, and the store rebuilt from the folders: abl run finds it incomplete and trains it again
    (run_dir / "metrics.jsonl").write_bytes(whole[: len(whole) // 3])
    db.unlink()
    r = run_abl(["run", str(grid), "--db", str(db)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 already completed, skipped; 1 to run" in r.stdout and "1 stored incomplete" in r.stdout
    assert rows(db, "SELECT status, attempts FROM runs")[0] == ("completed", 2)
    assert rows(db, "SELECT value FROM metrics WHERE name = 'val_loss' AND step = 20") == final


# ---------------------------------------------------------------- issue 13: the soak

SOAK_GRID = """
[experiment]
name = "soak"
seeds = [0]
[model]
d_model = 32
n_layers = 2
n_heads = 4
context = 32
[train]
steps = {steps}
batch_size = 4
eval_every = 500
eval_batches = 2
checkpoint_every = 10
[eval]
decode = false
[dataset.pystdlib]
max_bytes = 300000
[grid]
"model.norm" = ["rmsnorm", "none"]
"""
# long enough that no cell can finish before the 10th kill: a worker forked from the zygote starts in
# a fraction of a second, and a step of this model takes milliseconds
SOAK_STEPS = 1500

# figures that depend on the clock or the machine's load, not on the training
TIMING = ("tokens_per_s", "train_tokens_per_s", "elapsed_s", "wall_s", "eval_s", "post_eval_s", "peak_mem_bytes", "baseline_rss_bytes", "mfu",
          "device_peak_flops", "cpu_util", "load_per_core", "contended")  # the machine's share: not the model's


def _live_workers(dirs):
    out = []
    for d in dirs:
        try:
            st = json.loads((d / "status.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            continue
        pid = st.get("pid")
        if st.get("status") == "running" and isinstance(pid, int):
            try:
                os.kill(pid, 0)
                out.append((d, pid))
            except ProcessLookupError:
                pass
    return out


def _deterministic_rows(db):
    return {(run_id, step, name): value for run_id, step, name, value in
            rows(db, "SELECT run_id, step, name, value FROM metrics") if name not in TIMING}


@pytest.mark.slow
def test_soak_ten_random_sigkills_of_parent_workers_and_group_lose_nothing(tmp_path):
    """10 SIGKILLs (3 of the abl run parent, 4 of a worker, 3 of both at once), at random moments of
    start-up and training of a checkpointed grid: every cell ends completed, every step is stored once,
    and every figure equals an uninterrupted run's."""
    import random

    rng = random.Random(13)
    grid = tmp_path / "g.toml"
    grid.write_text(SOAK_GRID.format(steps=SOAK_STEPS))
    db = tmp_path / "soak.duckdb"
    dirs = cell_dirs(tmp_path, grid)
    kinds = ["parent"] * 3 + ["worker"] * 4 + ["group"] * 3
    rng.shuffle(kinds)
    args = [sys.executable, "-m", "abl.cli", "run", str(grid), "--db", str(db)]
    proc = None
    log = []
    for kind in kinds:
        if proc is None or proc.poll() is not None:
            proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
        wait_for(lambda: _live_workers(dirs), timeout=300, what="a worker")
        run_dir, pid = _live_workers(dirs)[0]
        if rng.random() < 0.4:  # during start-up (loading data, building the model) or early
            time.sleep(rng.uniform(0, 0.5))
        else:  # mid-training, a few steps on
            target = n_steps(run_dir) + rng.randint(1, 6)
            wait_for(lambda: n_steps(run_dir) >= target or not _live_workers(dirs), timeout=300, what="steps")
        log.append((kind, run_dir.name, n_steps(run_dir)))
        if kind in ("worker", "group"):
            for _, wpid in _live_workers(dirs):
                os.kill(wpid, signal.SIGKILL)
        if kind in ("parent", "group"):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            # the workers die with their parent (parent-death signal) before the next abl run starts
            wait_for(lambda: not _live_workers(dirs), timeout=120, what="orphaned workers to exit")
    if proc.poll() is None:
        proc.wait(timeout=600)
    assert len(log) == 10 and {k for k, *_ in log} == {"parent", "worker", "group"}

    final = run_abl(["run", str(grid), "--db", str(db)])
    assert final.returncode == 0, final.stdout + final.stderr
    assert rows(db, "SELECT status, count(*) FROM runs GROUP BY status") == [("completed", 2)], log
    assert rows(db, "SELECT count(*) FROM (SELECT run_id, step, name FROM metrics GROUP BY ALL "
                    "HAVING count(*) > 1)")[0][0] == 0, "a step stored twice"
    for run_dir in dirs:
        steps = [s for (s,) in rows(db, "SELECT step FROM metrics WHERE run_id = ? AND name = 'train_loss' "
                                        "ORDER BY step", [run_dir.name])]
        assert steps == list(range(1, SOAK_STEPS + 1)), (run_dir.name, log)

    # the same grid, uninterrupted
    ref_db = tmp_path / "ref" / "ref.duckdb"
    ref = run_abl(["run", str(grid), "--db", str(ref_db)])
    assert ref.returncode == 0, ref.stderr
    got, want = _deterministic_rows(db), _deterministic_rows(ref_db)
    assert set(got) == set(want)
    assert {k: v for k, v in got.items() if v != want[k]} == {}, log
    attempts = dict(rows(db, "SELECT run_id, attempts FROM runs"))
    assert sum(attempts.values()) > 2  # the kills did land on started cells
