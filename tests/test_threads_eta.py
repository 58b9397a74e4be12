"""Issue 27, 1: threads chosen per cell from cores, workers and load; the whole grid's ETA; a warning
when the machine is oversubscribed."""

import io
import time

import pytest
from rich.console import Console

from abl.run import threads
from abl.run.estimate import GridEstimate
from abl.run.executors import Job, LocalExecutor
from abl.run.progress import LineProgress

GRID = """[experiment]
name = "eta"
seeds = [0]
[model]
d_model = 32
n_layers = 2
n_heads = 4
context = 32
[train]
steps = 100
batch_size = 4
[grid]
"model.norm" = ["rmsnorm", "layernorm", "none"]
"""


@pytest.fixture
def jobs(registry, tmp_path):
    from abl.grid.gridfile import expand, parse_toml_text

    cells = expand(parse_toml_text(GRID, "g"), registry).cells
    return [Job(cell=c, run_dir=tmp_path / c.run_id, index=i) for i, c in enumerate(cells)]


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
    seen = {}

    class FakePopen:
        def __init__(self, cmd, env=None, **kw):
            seen["env"] = env
            self.pid = 1

    from abl.run import executors

    monkeypatch.setattr(executors.subprocess, "Popen", FakePopen)
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
