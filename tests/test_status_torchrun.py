"""A multi-process cell's rank that dies of a signal is stored as that signal (issue 39).

torchrun (torch.distributed.run) never passes a rank's end on as its own exit status: it exits 1 and
prints a report whose "Root Cause" block names the rank and its exit code (minus the signal). Rank 0,
which owns the run folder, meanwhile writes killed (torchrun's SIGTERM reached it) or failed (a broken
collective): a consequence, not the cause. A crash signal of any rank is ``failed`` with the rank and
the signal named, a SIGKILL or SIGTERM from outside is ``killed``; 128 + N, the shell's convention,
reads as signal N on this launch path only.
"""

import signal
import subprocess
import sys

import pytest

from abl.contracts.status import FAILED, KILLED, launcher_signal, signal_reason, torchrun_signal


def report(rank: int, exitcode: int, name: str = "") -> str:
    """torchrun's report of a failed rank, as torch 2.13's ChildFailedError prints it."""
    message = (f"Signal {-exitcode} ({name}) received by PID 6235" if exitcode < 0 else
               "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
    return f"""E1128 11:42:23.025000 6213 torch/distributed/elastic/multiprocessing/api.py:1002] failed \
(exitcode: {exitcode}) local_rank: {rank} (pid: 6235) of binary: /usr/bin/python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
abl.run.worker FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-28_11:42:24
  host      : localhost
  rank      : {1 - rank} (local_rank: {1 - rank})
  exitcode  : 1 (pid: 6236)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_11:42:23
  host      : localhost
  rank      : {rank} (local_rank: {rank})
  exitcode  : {exitcode} (pid: 6235)  {f"({name})" if name else ""}
  error_file: <N/A>
  traceback : {message}
======================================================
"""


STOPPED = ("Traceback (most recent call last):\n  ...\n"
           "torch.distributed.elastic.multiprocessing.api.SignalException: Process 6309 got signal: 15\n")


@pytest.mark.parametrize("returncode, log, expected", [
    (1, report(1, -11, "SIGSEGV"), (11, "rank 1")),
    (1, report(0, -6, "SIGABRT"), (6, "rank 0")),
    (1, report(1, -9, "SIGKILL"), (9, "rank 1")),
    (1, report(1, 139), (11, "rank 1")),  # a rank behind a shell: 128 + SIGSEGV
    (1, report(1, 1), None),  # an ordinary failure of a rank
    (1, report(0, 7), None),
    (1, STOPPED, (15, "the cell's torchrun")),  # torchrun itself stopped from outside
    (-9, "", (9, "the cell's torchrun")),  # the whole process group killed
    (137, "", (9, "the cell's torchrun")),  # torchrun behind a shell, killed
    (1, "", None),
    (2, "usage: torchrun ...", None),
    (0, report(1, -11, "SIGSEGV"), None),  # ended well: an earlier report in the log says nothing
], ids=["segv", "abrt-rank0", "sigkill", "shell-139", "rank-exit-1", "rank-exit-7", "torchrun-sigterm",
        "group-killed", "shell-137", "exit-1-no-report", "usage", "ok"])
def test_torchruns_report_and_exit_status_read_as_the_signal(returncode, log, expected):
    got = torchrun_signal(returncode, log)
    assert (got if got is None else (got[0], got[1].split(" of ")[0])) == expected, got


def test_only_a_code_above_128_that_names_a_signal_reads_as_one():
    assert launcher_signal(-11) == 11 and launcher_signal(139) == 11 and launcher_signal(143) == 15
    assert [launcher_signal(c) for c in (None, 0, 1, 2, 5, 128, 255)] == [None] * 7


def test_a_crash_signal_is_failed_and_one_from_outside_killed():
    assert signal_reason(11, "rank 1 of the cell's torchrun")[0] == FAILED
    status, why = signal_reason(9, "rank 1 of the cell's torchrun")
    assert status == KILLED and "rank 1" in why and "SIGKILL" in why


def _cell(devices: int):
    return type("C", (), {"run_id": "abc", "label": "x", "seed": 0,
                          "train": type("T", (), {"devices": devices})()})()


@pytest.mark.parametrize("rank0_wrote", [None, KILLED, FAILED])
def test_a_rank_dead_of_sigsegv_makes_the_cell_failed_whatever_rank_0_wrote(tmp_path, rank0_wrote):
    from abl.run.executors import Job
    from abl.run.runner import CellEvents
    from abl.store import rundir

    run_dir = tmp_path / "runs" / "abc"
    run_dir.mkdir(parents=True)
    (run_dir / rundir.LOG).write_text(report(1, -11, "SIGSEGV"))
    st = {"status": "running", "pid": 1}
    if rank0_wrote:
        st.update(status=rank0_wrote, error="stopped by signal SIGTERM")
    rundir.write_status(run_dir, st)
    job = Job(cell=_cell(2), run_dir=run_dir, index=0, handle=object(), returncode=1)
    events = CellEvents(tmp_path / "x.duckdb", tmp_path / "runs", {}, {}, None)
    # as CellEvents.on_done settles it: a folder still running, or one rank 0 ended
    settle = events.settled if rank0_wrote is None else events.settle_from_signal
    assert settle(job, rundir.read_status(run_dir)) == FAILED
    saved = rundir.read_status(run_dir)
    assert saved["status"] == FAILED and "rank 1" in saved["error"].splitlines()[-1], saved
    assert "SIGSEGV" in saved["error"].splitlines()[-1], saved


def test_a_one_process_worker_exiting_139_is_not_a_signal(tmp_path):
    """A plain worker's signal death reaches abl as minus the signal; 139 there is an exit status."""
    from abl.run.executors import Job
    from abl.run.runner import CellEvents
    from abl.store import rundir

    run_dir = tmp_path / "runs" / "abc"
    run_dir.mkdir(parents=True)
    (run_dir / rundir.LOG).write_text("a plugin called sys.exit(139)\n")
    job = Job(cell=_cell(1), run_dir=run_dir, index=0, handle=object(), returncode=139)
    events = CellEvents(tmp_path / "x.duckdb", tmp_path / "runs", {}, {}, None)
    assert events.settled(job, {}) == FAILED
    assert "SIGSEGV" not in rundir.read_status(run_dir)["error"]


SEGV_SCRIPT = "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"


@pytest.mark.slow
def test_a_real_torchrun_rank_dead_of_sigsegv_is_failed_naming_it(tmp_path):
    """torchrun --nproc-per-node 1 of a script that kills itself with SIGSEGV, as the installed torch runs it."""
    from abl.run.executors import Job
    from abl.run.runner import CellEvents
    from abl.store import rundir

    pytest.importorskip("torch.distributed.run")
    run_dir = tmp_path / "runs" / "abc"
    run_dir.mkdir(parents=True)
    script = tmp_path / "segv.py"
    script.write_text(SEGV_SCRIPT)
    with open(run_dir / rundir.LOG, "ab") as log:
        try:
            code = subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                    "--nproc_per_node=1", str(script)], stdout=log, stderr=log, timeout=120)
        except subprocess.TimeoutExpired:
            pytest.skip("torchrun did not start on this machine within 120 s")
    text = (run_dir / rundir.LOG).read_text()
    if "Root Cause" not in text:
        pytest.skip(f"torchrun could not start here (exit {code}): {text[-500:]}")
    assert code == 1, text  # what the installed torchrun passes on, whatever ended the rank
    job = Job(cell=_cell(2), run_dir=run_dir, index=0, handle=object(), returncode=code)
    events = CellEvents(tmp_path / "x.duckdb", tmp_path / "runs", {}, {}, None)
    assert events.settled(job, {}) == FAILED
    error = rundir.read_status(run_dir)["error"]
    assert "rank 0" in error.splitlines()[-1] and "SIGSEGV" in error.splitlines()[-1], error
    assert str(tmp_path) not in error and sys.prefix not in error, error


def test_rank_0s_own_word_stands_when_no_rank_died_of_a_signal(tmp_path):
    from abl.run.executors import Job
    from abl.run.runner import CellEvents
    from abl.store import rundir

    run_dir = tmp_path / "runs" / "abc"
    run_dir.mkdir(parents=True)
    (run_dir / rundir.LOG).write_text(report(0, 1))
    st = {"status": FAILED, "error": "ValueError: bad shape"}
    job = Job(cell=_cell(2), run_dir=run_dir, index=0, handle=object(), returncode=1)
    events = CellEvents(tmp_path / "x.duckdb", tmp_path / "runs", {}, {}, None)
    assert events.settle_from_signal(job, st) is None
    # an earlier attempt's report of a SIGSEGV is not this attempt's
    (run_dir / rundir.LOG).write_text(report(1, -11, "SIGSEGV"))
    assert events.end_signal(job) == (11, "rank 1 of the cell's torchrun")
    job.log_offset = rundir.log_size(run_dir)
    assert events.settle_from_signal(job, st) is None


RANK1_SEGV_PLUGIN = """
import os
import signal
import sys

from abl import hookimpl


def segv_on_rank_1(dim):
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    in_worker = "abl.run.worker" in sys.modules or getattr(main, "name", "") == "abl.run.worker"
    if in_worker and os.environ.get("RANK") == "1":  # rank 0 and the parent build it too
        os.kill(os.getpid(), signal.SIGSEGV)
    import torch

    return torch.nn.LayerNorm(dim)


@hookimpl
def register_components(register):
    register('norm', 'segv_on_rank_1', segv_on_rank_1)
"""


@pytest.mark.slow
def test_a_ddp_cell_whose_rank_1_crashes_is_stored_failed_naming_it(tmp_path):
    """abl run of a two-process cell on CPU (gloo) whose rank 1 dies of SIGSEGV: torchrun stops rank 0 (which
    writes killed) and exits 1; the store and the folder say failed, rank 1, SIGSEGV."""
    import json

    import duckdb
    from conftest import run_abl, tiny_grid_text

    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "segv1.py").write_text(RANK1_SEGV_PLUGIN)
    grid = tmp_path / "g.toml"
    grid.write_text(tiny_grid_text(train={"devices": 2}, grid={"model.norm": ["segv_on_rank_1"]}))
    db, runs = tmp_path / "x.duckdb", tmp_path / "runs"
    r = run_abl(["--plugins-dir", str(plugins), "run", str(grid), "--db", str(db), "--runs-dir", str(runs)])
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    con = duckdb.connect(str(db), read_only=True)
    try:
        run_id, status, error = con.execute("SELECT run_id, status, error FROM runs").fetchone()
    finally:
        con.close()
    last = error.splitlines()[-1]
    assert status == FAILED and "rank 1" in last and "SIGSEGV" in last, error
    folder = json.loads((runs / run_id / "status.json").read_text())
    assert (folder["status"], folder["error"]) == (status, error)
    assert str(tmp_path) not in error and sys.prefix not in error, error


def test_torchrun_stopped_from_outside_is_killed_even_where_rank_0_failed_on_the_way(tmp_path):
    """SIGTERM to torchrun (not from abl run): a collective broken as the ranks stop is no failure of the cell."""
    from abl.run.executors import Job
    from abl.run.runner import CellEvents
    from abl.store import rundir

    run_dir = tmp_path / "runs" / "abc"
    run_dir.mkdir(parents=True)
    (run_dir / rundir.LOG).write_text(STOPPED)
    st = {"status": FAILED, "error": "RuntimeError: Connection reset by peer"}
    job = Job(cell=_cell(2), run_dir=run_dir, index=0, handle=object(), returncode=1)
    events = CellEvents(tmp_path / "x.duckdb", tmp_path / "runs", {}, {}, None)
    assert events.settle_from_signal(job, st) == KILLED
    error = rundir.read_status(run_dir)["error"]
    assert "torchrun was stopped from outside by SIGTERM" in error.splitlines()[-1], error
