"""Issue 27, 1: threads chosen per cell from cores, workers and load; the whole grid's ETA; a warning
when the machine is oversubscribed."""

import io
import math
import time

import pytest
from rich.console import Console

from abl.run import threads
from abl.run.estimate import GridEstimate
from abl.run.executors import LocalExecutor
from abl.run.progress import LineProgress


@pytest.fixture
def jobs(norm_grid_jobs):
    return norm_grid_jobs


@pytest.mark.parametrize("requested,cores,workers,load,ours,want", [
    (0, 2, 1, 0.1, 0, 2),  # idle: every core
    (0, 2, 1, 2.0, 0, 1),  # another job keeps both cores busy: one thread, not torch's two
    (0, 2, 1, 40.0, 0, 1),  # load 40 (the machine): still at least one
    (0, 8, 2, 0.0, 0, 4),  # two cells at once share the cores
    (0, 8, 2, 4.0, 4, 4),  # the load of this run's own running cell is not "another job"
    (0, 8, 1, 3.4, 0, 5),  # load rounds to whole cores
    (3, 2, 1, 40.0, 0, 3),  # train.threads overrides
    (-1, 2, 1, 40.0, 0, None),  # train.threads = -1: torch's default, as before
])
def test_the_threads_rule(requested, cores, workers, load, ours, want):
    n, why = threads.choose(requested, cores, workers, load, ours)
    assert n == want, why
    assert why


def test_an_unknown_load_counts_as_idle():
    assert threads.choose(0, 4, 1, None)[0] == 4


def test_oversubscription_is_warned_about_only_when_other_jobs_fill_every_core():
    assert threads.oversubscribed(2, 1, 1.5) is None
    msg = threads.oversubscribed(2, 1, 27.0)
    assert msg and "oversubscribed" in msg and "load 27.0 on 2 core(s)" in msg


def test_a_cpu_cell_gets_its_threads_as_it_starts(jobs, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads, "load_average", lambda: 2.0)
    ex = LocalExecutor(workers=1, gpus=[])
    job = jobs[0]
    ex.assign_threads(job)
    assert job.threads == 1 and "chosen" in job.threads_note and "load 2.0" in job.threads_note
    seen = _fake_worker(monkeypatch)[1]
    ex.use_zygote = False
    job.run_dir.mkdir(parents=True)
    ex.launch(job)
    assert seen["env"]["OMP_NUM_THREADS"] == "1"


def test_a_users_omp_num_threads_stands_unless_train_threads_is_set(jobs, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    ex = LocalExecutor(workers=1, gpus=[])
    ex.assign_threads(jobs[0])
    assert jobs[0].threads == 3 and "OMP_NUM_THREADS" in jobs[0].threads_note
    jobs[1].cell.train.threads = 2
    ex.assign_threads(jobs[1])
    assert jobs[1].threads == 2


def test_the_whole_grid_eta_from_the_store_then_from_the_speed_measured(jobs, registry):
    est = GridEstimate(jobs, registry, slots=1)
    assert est.unit == "flops" and est.total() > 0
    assert est.eta([]) == (None, "after the first steps")
    assert "ETA after the first steps" in est.start_line()

    per_cell = est.total() / 3
    prior = GridEstimate(jobs, registry, slots=1, prior={"flops": [per_cell / 10.0]})  # 10 s a cell before
    eta, source = prior.eta([])
    assert eta == pytest.approx(30.0) and "1 earlier run" in source

    now = time.time()
    first = jobs[0]
    first.started, first.step = now - 20.0, 100
    est.finish(first, 20.0)  # one cell in 20 s
    second = jobs[1]
    second.started, second.step = now - 10.0, 50  # half of one in 10 s: the same speed
    eta, source = est.eta([second], now=now)
    assert source == "measured so far"
    assert eta == pytest.approx(10.0 + 20.0)  # the rest of the second cell and the whole third


def test_the_whole_grid_eta_is_never_below_a_running_cells_own(jobs, registry):
    """abl selftest --quick showed 'whole grid: ETA 12s' while its slow Triton cell said 'ETA 1m01s': the
    pooled speed of fast cells hid the slow one."""
    est = GridEstimate(jobs, registry, slots=2)
    now = time.time()
    fast, slow = jobs[0], jobs[1]
    fast.started, fast.step = now - 1.0, 100
    est.finish(fast, 1.0)  # a whole cell in 1 s
    slow.started, slow.step = now - 30.0, 10  # 10 of 100 steps in 30 s: 270 s to go at its own rate
    eta, _ = est.eta([slow], now=now)
    assert eta == pytest.approx(270.0)


def test_every_heartbeat_shows_the_whole_grid_eta(jobs, registry):
    out = io.StringIO()
    est = GridEstimate(jobs, registry, slots=1, prior={"flops": [1.0]})
    lines = LineProgress(Console(file=out, width=200), 3, 30.0, est)
    jobs[0].threads_note = "1 thread(s) (chosen: 2 core(s), 1 at once, load 2.0)"
    lines.update(jobs[0])
    lines.heartbeat()
    text = out.getvalue()
    assert "100 steps, 1 thread(s) (chosen" in text
    assert "whole grid: ETA" in text and "earlier run" in text


def test_a_gpu_cell_gets_host_threads_shared_with_the_other_gpu_cells(jobs, monkeypatch):
    """GPU cells used to get torch's default (every core each): two GPU workers on an 8-core host
    then ran 16 threads. Each gets its share, and a multi-device cell divides it by its processes."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 8)
    monkeypatch.setattr(threads, "load_average", lambda: 0.0)
    ex = LocalExecutor(gpus=[0, 1])
    assert ex.use_gpus and ex.slots == 2
    ex.assign_threads(jobs[0])
    assert jobs[0].threads == 4 and "chosen" in jobs[0].threads_note
    seen = _fake_worker(monkeypatch)[1]
    ex.use_zygote = False
    jobs[0].run_dir.mkdir(parents=True)
    ex.launch(jobs[0])
    assert seen["env"]["OMP_NUM_THREADS"] == "4" and seen["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    jobs[1].cell.train.devices = 2  # one cell over both GPUs: two processes share its four threads
    ex2 = LocalExecutor(gpus=[0, 1])
    ex2.assign_threads(jobs[1])
    assert jobs[1].threads == 2


def _fake_worker(monkeypatch):
    from abl.run import executors

    seen = {}

    class FakePopen:  # records the environment a worker would start with; the worker "exits" at once
        def __init__(self, cmd, env=None, **kw):
            seen["env"] = env
            self.pid = 1

        def wait(self):
            return 0

    monkeypatch.setattr(executors.subprocess, "Popen", FakePopen)
    return executors, seen


@pytest.mark.parametrize("slurm_cpus,omp,train_threads,want", [
    ("4", None, 0, "4"),      # a Slurm job with 4 CPUs on a 32-core node: 4, not 32
    (None, None, 0, "32"),    # no scheduler limit: the node's cores (idle)
    (None, "2", 0, "2"),      # Ray (or the user) set OMP_NUM_THREADS: it stands
    ("4", None, 3, None),     # train.threads = 3: the worker sets it itself (abl.train.loop)
    ("4", None, -1, None),    # train.threads = -1: torch's default
])
def test_a_remote_cell_chooses_its_threads_on_the_node_that_runs_it(
        jobs, monkeypatch, slurm_cpus, omp, train_threads, want):
    """Slurm and Ray cells run run_worker_process on their node: the rule runs there, from the CPUs the
    scheduler gave the cell and that node's load, not from the submitting machine's."""
    import dataclasses

    from abl.store import rundir

    executors, seen = _fake_worker(monkeypatch)
    for key, value in (("SLURM_CPUS_PER_TASK", slurm_cpus), ("OMP_NUM_THREADS", omp)):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    monkeypatch.setattr(threads, "usable_cores", lambda: 32)
    monkeypatch.setattr(threads, "load_average", lambda: 0.0)
    job = jobs[0]
    job.run_dir.mkdir(parents=True)
    cell = job.cell
    rundir.write_json(job.run_dir / rundir.CONFIG,
                      {"train": {**dataclasses.asdict(cell.train), "threads": train_threads}})
    assert executors.run_worker_process(str(job.run_dir)) == 0
    got = seen["env"].get("OMP_NUM_THREADS")
    assert got == want
    if want is not None and omp is None:
        assert "thread(s)" in (job.run_dir / rundir.LOG).read_text()


def test_own_load_follows_the_damped_one_minute_average():
    assert threads.own_load([], 100.0, 2) == 0.0
    # two threads running for ten minutes: the average has caught up with them
    assert threads.own_load([(0.0, None, 2)], 600.0, 2) == pytest.approx(2.0, abs=0.01)
    # just started: not yet in the average
    assert threads.own_load([(99.0, None, 2)], 100.0, 2) < 0.05
    # 30 s at two threads, finished 60 s ago
    want = 2 * (math.exp(-1) - math.exp(-1.5))
    assert threads.own_load([(10.0, 40.0, 2)], 100.0, 8) == pytest.approx(want)
    # against the kernel's own recurrence (every 5 s: load = load * e + n * (1 - e))
    e, load = math.exp(-5 / 60), 0.0
    for t in range(5, 101, 5):
        load = load * e + (2 if 10 < t <= 40 else 0) * (1 - e)
    assert threads.own_load([(10.0, 40.0, 2)], 100.0, 8) == pytest.approx(load, rel=0.1)
    # torch's default threads (None): one per core
    assert threads.own_load([(0.0, None, None)], 600.0, 4) == pytest.approx(4.0, abs=0.02)


def test_a_later_cell_is_not_slowed_by_its_own_grids_earlier_cells(jobs, monkeypatch):
    """The 1-minute load average still holds the cell that just finished; on an otherwise idle
    2-core machine the next cell gets both cores, as the first did, not one."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    now = time.time()
    ex = LocalExecutor(workers=1, gpus=[])
    ex.finished.append((now - 41.0, now - 1.0, 2))  # the first cell: 40 s on 2 threads
    idle = 0.05
    monkeypatch.setattr(threads, "load_average", lambda: idle + threads.own_load(ex.finished, now, 2))
    assert threads.load_average() > 1.0  # what the rule used to read as another job
    ex.assign_threads(jobs[1])
    assert jobs[1].threads == 2, jobs[1].threads_note
    assert "this run's own" in jobs[1].threads_note
    # another job that really keeps a core busy still counts
    monkeypatch.setattr(threads, "load_average", lambda: 1.0 + threads.own_load(ex.finished, now, 2))
    ex.assign_threads(jobs[2])
    assert jobs[2].threads == 1, jobs[2].threads_note


def test_the_executor_remembers_each_finished_cell_with_its_threads(jobs, monkeypatch):
    ex = LocalExecutor(workers=1, gpus=[])
    monkeypatch.setattr(ex, "launch", lambda job: setattr(job, "started", time.time() - 5))
    monkeypatch.setattr(ex, "poll", lambda job: 0)
    monkeypatch.setattr(ex, "assign_threads", lambda job: setattr(job, "threads", 2))
    ex.run(jobs[:2], on_progress=lambda j: None, on_done=lambda j: None, poll_s=0.0)
    assert [n for _, _, n in ex.finished] == [2, 2]
    assert all(b - a >= 5 for a, b, _ in ex.finished)


def test_cells_long_finished_drop_out_of_the_executors_memory(jobs, monkeypatch):
    """A grid of thousands of cells must not sum every finished cell at each start: one that ended
    ten time constants ago weighs nothing in the load average, and is forgotten."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads, "load_average", lambda: 0.0)
    now = time.time()
    ex = LocalExecutor(workers=1, gpus=[])
    ex.finished = [(now - 2000.0, now - 1900.0, 2)] * 5000 + [(now - 31.0, now - 1.0, 2)]
    ex.assign_threads(jobs[0])
    assert ex.finished == [(now - 31.0, now - 1.0, 2)]
