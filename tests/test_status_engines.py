"""A Slurm job or Ray task that the engine ended is stored with the engine's reason (issue 39).

A scheduler's time limit is ``failed`` ("timed out: Slurm's time limit (--slurm-time N min)"), a lost,
preempted or cancelled job ``killed``, an out-of-memory kill ``oom``: each with the engine's own words,
whatever the worker wrote as the engine stopped it (killed, by the SIGTERM the time limit sends). submitit
and Ray are replaced by fakes with the same API (submitit.AutoExecutor, job.done/result/state; ray.remote,
ray.wait, ray.get raising ray.exceptions.*).
"""

import sys
import types

import pytest

from abl.contracts.status import COMPLETED, FAILED, KILLED, OOM


class FakeSubmititJob:
    def __init__(self, state: str, error: BaseException | None, result: int = 0):
        self.state, self.error, self.value, self.job_id = state, error, result, "4242"

    def done(self) -> bool:
        return True

    def result(self) -> int:
        if self.error is not None:
            raise self.error
        return self.value

    def cancel(self, check: bool = False) -> None:
        pass


def fake_submitit(monkeypatch, job: FakeSubmititJob):
    class UncompletedJobError(RuntimeError):
        pass

    class AutoExecutor:
        def __init__(self, folder, cluster=None):
            self.folder, self.cluster = folder, cluster

        def update_parameters(self, **kwargs):
            self.parameters = kwargs

        def submit(self, fn):
            return job

    module = types.ModuleType("submitit")
    module.AutoExecutor = AutoExecutor
    module.UncompletedJobError = UncompletedJobError
    monkeypatch.setitem(sys.modules, "submitit", module)
    return module


def fake_ray(monkeypatch, error: BaseException | None):
    exceptions = types.ModuleType("ray.exceptions")
    for name in ("RayError",):
        setattr(exceptions, name, type(name, (Exception,), {}))
    for name in ("TaskCancelledError", "WorkerCrashedError", "OutOfMemoryError", "NodeDiedError", "RayTaskError"):
        setattr(exceptions, name, type(name, (exceptions.RayError,), {}))
    module = types.ModuleType("ray")
    module.exceptions = exceptions
    module.is_initialized = lambda: True
    module.remote = lambda **kw: (lambda fn: types.SimpleNamespace(remote=lambda *a: "ref"))
    module.wait = lambda refs, timeout=0: (refs, [])

    def get(ref):
        if error is not None:
            raise error
        return 0

    module.get = get
    monkeypatch.setitem(sys.modules, "ray", module)
    monkeypatch.setitem(sys.modules, "ray.exceptions", exceptions)
    return module


def _job(tmp_path):
    from abl.run.executors import Job

    run_dir = tmp_path / "runs" / "abc"
    run_dir.mkdir(parents=True)
    cell = type("C", (), {"run_id": "abc", "label": "x", "seed": 0, "train": type("T", (), {"devices": 1})()})()
    return Job(cell=cell, run_dir=run_dir, index=0)


def _settle(tmp_path, job, worker_wrote: dict | None):
    """The runner's on_done branch for an engine's end; the status and error stored in the folder."""
    from abl.run.runner import CellEvents
    from abl.store import rundir

    if worker_wrote is not None:
        rundir.write_status(job.run_dir, worker_wrote)
    events = CellEvents(tmp_path / "x.duckdb", tmp_path / "runs", {}, {}, None)
    assert job.end is not None
    events.settle_engine_end(job, rundir.read_status(job.run_dir) or {})
    st = rundir.read_status(job.run_dir)
    return st["status"], st["error"]


SLURM_TIMEOUT = ("Job 4242 (task: 0) with path /home/someone/results/runs/_slurm/4242_0_result.pkl\n"
                 "has not produced any output (state: TIMEOUT)\nError stream produced:\n----\n"
                 "slurmstepd: error: *** JOB 4242 ON node7 CANCELLED AT 2026-11-28T11:00:00 DUE TO TIME LIMIT ***")


@pytest.mark.parametrize("state, message, expected, words", [
    ("TIMEOUT", SLURM_TIMEOUT, FAILED, "DUE TO TIME LIMIT"),
    ("NODE_FAIL", "has not produced any output (state: NODE_FAIL)", KILLED, "NODE_FAIL"),
    ("PREEMPTED", "has not produced any output (state: PREEMPTED)", KILLED, "PREEMPTED"),
    ("CANCELLED by 0", "has not produced any output (state: CANCELLED by 0)", KILLED, "CANCELLED"),
    ("OUT_OF_MEMORY", "has not produced any output (state: OUT_OF_MEMORY)", OOM, "OUT_OF_MEMORY"),
    ("FAILED", "Job (task=0) failed during processing with trace:", FAILED, "failed during processing"),
])
def test_a_slurm_job_the_scheduler_ended_is_stored_with_its_reason(monkeypatch, tmp_path, state, message,
                                                                   expected, words):
    submitit = fake_submitit(monkeypatch, FakeSubmititJob(state, None))
    from abl.plugins.executors import SlurmExecutor

    job = _job(tmp_path)
    executor = SlurmExecutor(tmp_path / "_slurm", time_min=30, cluster="slurm")
    executor.launch(job)
    job.handle.error = submitit.UncompletedJobError(message)
    assert executor.poll(job) == 1
    # the worker wrote killed: the SIGTERM Slurm sends at its time limit reached it
    status, error = _settle(tmp_path, job, {"status": KILLED, "error": "stopped by signal SIGTERM"})
    assert status == expected and words in error, error
    if state == "TIMEOUT":
        assert error.startswith("timed out: Slurm's time limit (--slurm-time 30 min)"), error
        assert "/home/someone" not in error and "stopped by signal SIGTERM" in error, error


def test_a_slurm_job_that_returned_its_workers_status_has_no_engine_end(monkeypatch, tmp_path):
    fake_submitit(monkeypatch, FakeSubmititJob("COMPLETED", None, result=3))
    from abl.plugins.executors import SlurmExecutor

    job = _job(tmp_path)
    executor = SlurmExecutor(tmp_path / "_slurm", cluster="slurm")
    executor.launch(job)
    assert executor.poll(job) == 3 and job.end is None


@pytest.mark.parametrize("error, expected", [
    ("OutOfMemoryError", OOM), ("WorkerCrashedError", KILLED), ("NodeDiedError", KILLED),
    ("TaskCancelledError", KILLED), ("RayTaskError", FAILED),
])
def test_a_ray_task_that_ray_ended_is_stored_with_its_reason(monkeypatch, tmp_path, error, expected):
    ray = fake_ray(monkeypatch, None)
    from abl.plugins.executors import RayExecutor

    job = _job(tmp_path)
    executor = RayExecutor()
    executor.launch(job)
    raised = getattr(ray.exceptions, error)(f"Ray says: {error} on node 10.0.0.7\nmore details")
    executor.ray.get = lambda ref: (_ for _ in ()).throw(raised)
    assert executor.poll(job) == 1
    status, stored = _settle(tmp_path, job, None)
    assert status == expected and f"{error}: Ray says" in stored, stored
    assert "more details" not in stored.splitlines()[-1]


@pytest.mark.parametrize("worker_wrote, expected", [
    ({"status": KILLED, "error": "stopped by signal SIGTERM"}, FAILED), ({"status": "running"}, FAILED),
    (None, FAILED), ({"status": COMPLETED}, COMPLETED), ({"status": OOM, "error": "CUDA out of memory"}, OOM),
])
def test_on_done_stores_the_engines_end_unless_the_cell_gave_its_own_verdict(monkeypatch, tmp_path,
                                                                             worker_wrote, expected):
    """CellEvents.on_done: an engine's end wins over what the worker wrote as the engine stopped it, not over
    the cell's own verdict (completed, diverged, oom)."""
    from abl.run import runner
    from abl.run.executors import EngineEnd, Executor
    from abl.store import rundir

    class Display:
        def finish(self, *args):
            pass

        def print(self, text):
            pass

    stored = []
    monkeypatch.setattr(runner, "_ingest", lambda db, run_dir, override: stored.append(
        override or rundir.read_status(run_dir)["status"]) or stored[-1])
    monkeypatch.setattr(runner, "canonical_config", lambda config: config)
    job = _job(tmp_path)
    job.cell.config = {}
    job.returncode = 1
    job.end = EngineEnd(Executor.TIME_LIMIT, "Slurm job state TIMEOUT", "Slurm's time limit (--slurm-time 5 min)")
    if worker_wrote is not None:
        rundir.write_status(job.run_dir, worker_wrote)
    runner.CellEvents(tmp_path / "x.duckdb", tmp_path / "runs", {}, {}, Display()).on_done(job)
    st = rundir.read_status(job.run_dir)
    assert stored == [expected] and st["status"] == expected, (stored, st)
    if expected == FAILED:
        assert st["error"].splitlines()[-1].startswith("timed out: Slurm's time limit (--slurm-time 5 min)"), st
