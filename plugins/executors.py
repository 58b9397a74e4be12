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

        self.slots = max_jobs
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
        except Exception:  # noqa: BLE001 - the job itself failed (node loss, timeout...)
            return 1

    def stop(self, job: Job) -> None:
        job.handle.cancel(check=False)


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
        except Exception:  # noqa: BLE001 - the task itself failed
            return 1

    def stop(self, job: Job) -> None:
        self.ray.cancel(job.handle, force=True)


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
