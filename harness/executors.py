"""Executors: where cells run. Each cell is its own worker process.

``LocalExecutor`` runs up to ``workers`` worker processes at once on this
machine. The parent only launches, watches and reaps; the worker writes its
run folder and the parent ingests it (the single database writer). Slurm
(submitit) and Ray executors plug in behind the same ``run`` interface.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .config import Cell


@dataclass
class Job:
    cell: Cell
    run_dir: Path
    index: int
    proc: subprocess.Popen | None = None
    offset: int = 0  # bytes of metrics.jsonl already read
    step: int = 0
    train_loss: float | None = None
    val_loss: float | None = None
    returncode: int | None = None
    killed: bool = False
    started: float = field(default_factory=time.time)


def _tail(job: Job) -> bool:
    """Read new complete lines of the job's metrics file; True if anything changed."""
    import json

    path = job.run_dir / "metrics.jsonl"
    try:
        with open(path, "rb") as f:
            f.seek(job.offset)
            chunk = f.read()
    except FileNotFoundError:
        return False
    end = chunk.rfind(b"\n")
    if end < 0:
        return False
    job.offset += end + 1
    changed = False
    for line in chunk[: end + 1].splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if "train_loss" in obj:
            job.step, job.train_loss, changed = int(obj["step"]), obj["train_loss"], True
        if "val_loss" in obj:
            job.val_loss = obj["val_loss"]
    return changed


class LocalExecutor:
    name = "local"

    def __init__(self, workers: int = 1, poll_s: float = 0.2):
        self.workers = max(1, workers)
        self.poll_s = poll_s
        self.running: list[Job] = []

    def _launch(self, job: Job) -> None:
        stderr = open(job.run_dir / "worker.log", "ab")
        env = dict(os.environ)
        if self.workers > 1 and "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // self.workers))
        job.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.worker", str(job.run_dir)],
            stdout=stderr, stderr=stderr, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,  # Ctrl-C reaches the parent only; it stops the workers
        )
        stderr.close()
        job.started = time.time()

    def stop_all(self) -> None:
        """Stop every running worker (SIGTERM, then SIGKILL after 5 s)."""
        for job in self.running:
            if job.proc and job.proc.poll() is None:
                job.killed = True
                job.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 5
        for job in self.running:
            if job.proc is None:
                continue
            try:
                job.proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                job.proc.kill()
                job.proc.wait()
            job.returncode = job.proc.returncode

    def run(self, jobs: list[Job], on_progress: Callable[[Job], None],
            on_done: Callable[[Job], None]) -> None:
        pending = list(jobs)
        while pending or self.running:
            while pending and len(self.running) < self.workers:
                job = pending.pop(0)
                self._launch(job)
                self.running.append(job)
                on_progress(job)
            time.sleep(self.poll_s)
            for job in list(self.running):
                if _tail(job):
                    on_progress(job)
                assert job.proc is not None
                if job.proc.poll() is not None:
                    _tail(job)
                    job.returncode = job.proc.returncode
                    self.running.remove(job)
                    on_done(job)
