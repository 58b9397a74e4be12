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

from conftest import ROOT, run_abl

GRID = """
[experiment]
name = "faults"
seeds = [0]
[model]
d_model = 32
n_layers = 2
n_heads = 4
context = 32
[train]
steps = {steps}
batch_size = 4
eval_every = 50
eval_batches = 2
checkpoint_every = {ckpt}
[dataset.pystdlib]
max_bytes = 300000
[grid]
"model.norm" = ["rmsnorm", "none"]
"""


def rows(db, sql, params=()):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def start_abl(args):
    return subprocess.Popen([sys.executable, "-m", "abl.cli", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


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
    from abl.config import load_grid
    from abl.plugin_manager import get_registry

    return [tmp_path / "runs" / c.run_id for c in load_grid(grid, get_registry()).cells]


@pytest.mark.slow
def test_sigkill_of_abl_run_mid_cell_then_resume(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(GRID.format(steps=300, ckpt=40))
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
    grid.write_text(GRID.format(steps=2000, ckpt=0))
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
    grid.write_text(GRID.format(steps=30, ckpt=0).replace('"model.norm" = ["rmsnorm", "none"]',
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
    grid.write_text(GRID.format(steps=5, ckpt=0).replace('["rmsnorm", "none"]', '["rmsnorm"]'))
    db = tmp_path / "x.duckdb"
    from abl.config import load_grid
    from abl.plugin_manager import get_registry

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
    grid.write_text(GRID.format(steps=6, ckpt=0).replace('["rmsnorm", "none"]', '["rmsnorm"]')
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
    grid.write_text(GRID.format(steps=6, ckpt=0))
    db = tmp_path / "x.duckdb"
    r = run_abl(["run", str(grid), "--db", str(db), *executor], timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    got = rows(db, "SELECT status, executor FROM runs")
    assert len(got) == 2 and {s for s, _ in got} == {"completed"}
    assert {e for _, e in got} == {"slurm-local" if "slurm" in executor else "ray"}
    assert rows(db, "SELECT count(DISTINCT run_id) FROM metrics WHERE name = 'val_loss'")[0][0] == 2


def test_worker_truncates_metrics_to_the_checkpoint(tmp_path):
    from abl.rundir import truncate_metrics

    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps({"step": s, "train_loss": 1.0}) + "\n" for s in range(10)) + '{"step": 10, "tr')
    truncate_metrics(p, 6)
    assert [json.loads(line)["step"] for line in p.read_text().splitlines()] == list(range(7))
    truncate_metrics(p, None)
    assert not p.exists()


def test_checkpoint_round_trip_continues_identically(registry, tmp_path):
    from abl.config import expand
    from abl.train import train

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
