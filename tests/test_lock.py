"""One writer per store (harness/lock.py; issue 13, 1)."""

import json
import os
import signal
import subprocess
import sys
import time

import duckdb
import pytest
from click.testing import CliRunner
from conftest import ROOT, tiny_grid_text

from abl.store.lock import StoreBusy, StoreLock, lock_path, read_holder

HOLD = """import sys, time
from abl.store.lock import StoreLock
lock = StoreLock(sys.argv[1], command="abl run holder.toml").acquire()
print("held", flush=True)
if len(sys.argv) > 3:  # a child that outlives this holder
    import subprocess
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print("child", flush=True)
time.sleep(float(sys.argv[2]))
"""


def hold(db, seconds, child=False):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(db), str(seconds), *(["child"] if child else [])],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    if child:
        assert proc.stdout.readline().strip() == "child"
    return proc


def test_a_second_writer_is_refused_at_once_naming_the_holder(tmp_path):
    db = tmp_path / "abl.duckdb"
    proc = hold(db, 60)
    try:
        t0 = time.monotonic()
        with pytest.raises(StoreBusy) as err:
            StoreLock(db).acquire()
        assert time.monotonic() - t0 < 2  # no retries
        msg = str(err.value)
        assert f"PID {proc.pid}" in msg and "abl run holder.toml" in msg and "--wait" in msg
        assert lock_path(db) == tmp_path / "abl.duckdb.lock"
        assert read_holder(lock_path(db))["pid"] == proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_the_lock_ends_with_its_holder_and_a_stale_file_is_taken_over(tmp_path):
    db = tmp_path / "abl.duckdb"
    proc = hold(db, 60)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert read_holder(lock_path(db))["pid"] == proc.pid  # the file still names the dead holder
    lock = StoreLock(db).acquire()
    try:
        assert lock.took_over is not None and lock.took_over["pid"] == proc.pid
        assert read_holder(lock_path(db))["pid"] == os.getpid()
    finally:
        lock.release()
    assert read_holder(lock_path(db)) == {}  # released: nobody named


def test_in_one_process_too_a_second_lock_is_refused(tmp_path):
    db = tmp_path / "abl.duckdb"
    with StoreLock(db):
        with pytest.raises(StoreBusy):
            StoreLock(db).acquire()
    with StoreLock(db):  # released on exit
        pass


def test_wait_queues_behind_the_holder(tmp_path):
    db = tmp_path / "abl.duckdb"
    proc = hold(db, 1.5)
    told = []
    try:
        lock = StoreLock(db).acquire(wait=True, poll_s=0.05, on_wait=told.append)
        lock.release()
    finally:
        proc.wait()
    assert len(told) == 1 and f"waiting for PID {proc.pid}" in told[0]


def test_a_child_of_the_holder_does_not_keep_the_lock(tmp_path):
    """Workers are children of abl run: the lock's descriptor is not handed down to them."""
    db = tmp_path / "abl.duckdb"
    proc = hold(db, 60, child=True)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lock = StoreLock(db).acquire()  # the sleeping grandchild is still alive
    lock.release()


def test_ingest_is_refused_while_the_store_is_written(tmp_path):
    from abl.cli import cli

    db = tmp_path / "abl.duckdb"
    proc = hold(db, 60)
    try:
        r = CliRunner().invoke(cli, ["ingest", "--db", str(db)])
        assert r.exit_code == 2 and f"PID {proc.pid}" in r.output and "one writer per store" in r.output
        assert not db.exists()
    finally:
        proc.kill()
        proc.wait()


GRID = tiny_grid_text(experiment={"name": "writers"}, model={"n_layers": 2, "context": 32},
                      train={"steps": 40, "batch_size": 4, "eval_every": 20, "eval_batches": 2, "threads": None},
                      grid={"model.norm": ["rmsnorm", "none"]})


@pytest.mark.slow
def test_two_abl_runs_on_one_store_one_is_refused_and_nothing_is_lost(tmp_path):
    """The issue: two parents 1 s apart both ran (one kept 100 of 300 rows) or the second marked
    completed cells failed. Now whichever takes the lock second is refused with exit 2."""
    grid = tmp_path / "g.toml"
    grid.write_text(GRID)
    db = tmp_path / "x.duckdb"
    args = [sys.executable, "-m", "abl.cli", "run", str(grid), "--db", str(db)]
    first = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1)
    second = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out2, err2 = second.communicate(timeout=600)
    out1, err1 = first.communicate(timeout=600)
    results = {first.pid: (first.returncode, out1, err1), second.pid: (second.returncode, out2, err2)}
    refused = [pid for pid, (rc, _, _) in results.items() if rc == 2]
    ran = [pid for pid, (rc, _, _) in results.items() if rc == 0]
    assert len(refused) == 1 and len(ran) == 1, results
    rc, out, err = results[refused[0]]
    assert f"PID {ran[0]}" in err and "abl run" in err and "one writer per store" in err, err
    assert "Traceback" not in err

    con = duckdb.connect(str(db), read_only=True)
    try:
        assert {s for (s,) in con.execute("SELECT status FROM runs").fetchall()} == {"completed"}
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 2
        # every step stored exactly once, none missing
        assert con.execute("SELECT count(*) FROM (SELECT run_id, step, name FROM metrics "
                           "GROUP BY ALL HAVING count(*) > 1)").fetchone()[0] == 0
        per_run = con.execute("SELECT run_id, count(*), min(step), max(step) FROM metrics "
                              "WHERE name = 'train_loss' GROUP BY run_id").fetchall()
        assert sorted(r[1:] for r in per_run) == [(40, 1, 40), (40, 1, 40)]
    finally:
        con.close()
    for run_dir in (tmp_path / "runs").iterdir():
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        steps = [json.loads(line)["step"] for line in lines if '"train_loss"' in line]
        assert steps == list(range(1, 41))

    # --wait queues behind a writer instead of stopping, then finds the work done
    holder = hold(db, 600)
    waiter = subprocess.Popen(args + ["--wait"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        line = waiter.stderr.readline()  # it says so at once, then waits
        assert f"waiting for PID {holder.pid}" in line, line
        time.sleep(1)
        assert waiter.poll() is None  # still queued
    finally:
        holder.kill()
        holder.wait()
    out, err = waiter.communicate(timeout=600)
    assert waiter.returncode == 0, err
    assert "2 already completed, skipped; 0 to run" in out
