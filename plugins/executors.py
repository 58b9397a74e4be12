"""Built-in executors, registered through the hook ``register_executors`` like any plugin's:

- ``local``: cells as worker processes on this machine (abl.run.executors.LocalExecutor);
- ``slurm``: one Slurm job per cell through submitit (a requeued job resumes from the cell's
  checkpoint); ``--slurm-cluster local`` runs submitit's path on this machine without Slurm;
- ``ray``: one Ray task per cell (``--gpus-per-cell`` GPUs each) on an existing cluster
  (``--ray-address``) or a local one.

submitit and Ray are the extra ``abl[distributed]``; they are imported as an executor is built.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from abl import Executor, ExecutorOptions, Job, LocalExecutor, hookimpl, run_worker_process


class _SubmititCell:
    """What a Slurm job executes; checkpointable so a preempted job requeues and resumes."""

    def __init__(self, run_dir: str, devices: int):
        self.run_dir, self.devices = run_dir, devices

    def __call__(self) -> int:
        return run_worker_process(self.run_dir, self.devices)

    def checkpoint(self, *args, **kwargs):
        # The worker checkpoints itself (train.checkpoint_every); requeueing
        # the same call makes the new worker resume from that checkpoint.
        import submitit

        return submitit.helpers.DelayedSubmission(_SubmititCell(self.run_dir, self.devices))


class SlurmExecutor(Executor):
    """One Slurm job per cell through submitit (``cluster="local"`` runs it without Slurm)."""

    name = "slurm"

    def __init__(self, folder: Path, partition: str | None = None, time_min: int = 60,
                 gpus_per_cell: int = 0, cpus_per_cell: int | None = None, max_jobs: int = 64,
                 cluster: str | None = None):
        super().__init__()
        import submitit

        self.slots, self.time_min = max_jobs, time_min
        self.executor = submitit.AutoExecutor(folder=str(folder), cluster=cluster)
        params: dict[str, Any] = {"timeout_min": time_min}
        if cluster != "local":
            params["slurm_partition"] = partition
            if gpus_per_cell:
                params["gpus_per_node"] = gpus_per_cell
            if cpus_per_cell:
                params["cpus_per_task"] = cpus_per_cell
        self.executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
        if cluster == "local":
            self.name = "slurm-local"

    def launch(self, job: Job) -> None:
        job.handle = self.executor.submit(_SubmititCell(str(job.run_dir), job.cell.train.devices))

    def poll(self, job: Job) -> int | None:
        if not job.handle.done():
            return None
        try:
            return int(job.handle.result())
        except Exception as exc:  # noqa: BLE001 - Slurm ended the job (its time limit, a lost node...)
            state = str(getattr(job.handle, "state", "") or "UNKNOWN")
            self.ended(job, *slurm_end(state, exc, self.time_min))
            return 1

    def stop(self, job: Job) -> None:
        job.handle.cancel(check=False)


# Slurm's job states (sacct; submitit's local path: INTERRUPTED) for a job that left no result: its time
# limit is the cell's own failure (it would run out again); a lost, preempted or cancelled job a stop from
# outside (a plain re-run restarts it); OUT_OF_MEMORY the cgroup's memory limit.
_SLURM_STOPPED = ("NODE_FAIL", "PREEMPTED", "CANCELLED", "BOOT_FAIL", "REVOKED", "INTERRUPTED")


def slurm_end(state: str, exc: BaseException, time_min: int) -> tuple[str, str, str]:
    """(why, Slurm's words, the limit) for ``Executor.ended``, from the job's state and the exception
    submitit raised for it; Slurm's own line (``slurmstepd: error: *** JOB 12 ... DUE TO TIME LIMIT ***``)
    where its error stream has one."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = ([line for line in lines if "slurmstepd" in line or "***" in line]
            or [line for line in lines if "state:" in line] or lines[:1])
    words = f"Slurm job state {state}" + (f": {said[-1]}" if said else "")
    kind = (state.split() or ["UNKNOWN"])[0].upper()
    if kind in ("TIMEOUT", "DEADLINE"):
        return Executor.TIME_LIMIT, words, f"Slurm's time limit (--slurm-time {time_min} min)"
    if kind == "OUT_OF_MEMORY":
        return Executor.OUT_OF_MEMORY, words, ""
    return (Executor.STOPPED if kind in _SLURM_STOPPED else Executor.ERROR), words, ""


class RayExecutor(Executor):
    """One Ray task per cell, ``gpus_per_cell`` GPUs each, on ``address`` or a local Ray."""

    name = "ray"

    def __init__(self, address: str | None = None, gpus_per_cell: float = 0, cpus_per_cell: float = 1,
                 max_tasks: int = 64):
        super().__init__()
        import ray

        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {k: v for k, v in os.environ.items()
                                               if k.startswith("ABL_")}})
        self.remote = ray.remote(num_gpus=gpus_per_cell, num_cpus=cpus_per_cell, max_retries=0)(
            run_worker_process)
        self.slots = max_tasks

    def launch(self, job: Job) -> None:
        job.handle = self.remote.remote(str(job.run_dir), job.cell.train.devices)  # type: ignore[call-arg]

    def poll(self, job: Job) -> int | None:
        ready, _ = self.ray.wait([job.handle], timeout=0)
        if not ready:
            return None
        try:
            return int(self.ray.get(job.handle))
        except Exception as exc:  # noqa: BLE001 - Ray ended the task (cancelled, its node lost, out of memory...)
            self.ended(job, ray_end(exc), f"Ray: {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}")
            return 1

    def stop(self, job: Job) -> None:
        self.ray.cancel(job.handle, force=True)


# ray.exceptions that end a task from outside: the Ray worker only waits for the cell's own process
# (run_worker_process), so its crash, a lost node or raylet, a lost result or a cancel says nothing about
# the cell (a plain re-run restarts it); Ray's memory monitor killing it is out of memory; any other (a
# RayTaskError: the task raised) is an error
_RAY_ENDS = {"OutOfMemoryError": Executor.OUT_OF_MEMORY, "TaskCancelledError": Executor.STOPPED,
             "WorkerCrashedError": Executor.STOPPED, "NodeDiedError": Executor.STOPPED,
             "LocalRayletDiedError": Executor.STOPPED, "ObjectLostError": Executor.STOPPED,
             "RayActorError": Executor.STOPPED}


def ray_end(exc: BaseException) -> str:
    """Why Ray ended a task, from the exception ``ray.get`` raised (by its class or a base's name)."""
    return next((_RAY_ENDS[c.__name__] for c in type(exc).__mro__ if c.__name__ in _RAY_ENDS), Executor.ERROR)


def _local(options: ExecutorOptions) -> Executor:
    """this machine: --workers cells at once, or as many per GPU as their predicted memory fits (--cells-per-gpu)"""
    return LocalExecutor(workers=options.workers, cells_per_gpu=options.cells_per_gpu, speed_pass=options.speed_pass)


def _slurm(options: ExecutorOptions) -> Executor:
    """one Slurm job per cell through submitit (--slurm-cluster local: without Slurm)"""
    return SlurmExecutor(options.runs_dir / "_slurm", partition=options.slurm_partition, time_min=options.slurm_time,
                         gpus_per_cell=options.gpus_per_cell, cluster=options.slurm_cluster)


def _ray(options: ExecutorOptions) -> Executor:
    """one Ray task per cell on --ray-address or a local Ray"""
    return RayExecutor(address=options.ray_address, gpus_per_cell=options.gpus_per_cell)


@hookimpl
def register_executors(register):
    register("local", _local)
    register("slurm", _slurm)
    register("ray", _ray)
