"""Executors: where cells run. Every cell runs in a worker process (a warm one may run several in turn).

All executors share one shape: the parent launches a worker per cell
(``python -m abl.run.worker RUN_DIR``, or torchrun around it for a multi-device
cell; the local executor may hand it to a warm worker, abl.run.warm), watches
the run folder's ``metrics.jsonl`` for progress, and calls ``on_done`` when the
cell's worker ends; the parent then ingests the folder (it is
the only database writer). Scale-out goes to existing engines:

- ``local``: up to ``workers`` cells at once on this machine; on CUDA each
  cell gets the GPU it is placed on (``CUDA_VISIBLE_DEVICES``), several cells
  per GPU while their predicted memory fits it (abl.run.admission.Placement,
  ``--cells-per-gpu``);
- ``slurm`` and ``ray`` (abl.plugins.executors): one Slurm job (submitit) or
  one Ray task per cell.

Every executor, the built-in ones too, is registered by a plugin through the
hook ``register_executors`` (``registered``, ``make_executor`` below);
``abl run --executor NAME`` chooses among them.

Run folders must be on a file system the workers and the parent share.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..contracts.config import Cell
from ..contracts.status import FAILED, KILLED, OOM
from ..files import scrub_paths
from ..pyexec import child_env, python
from ..store import rundir
from .warm import Launchers, warm_choice, zygote_enabled  # noqa: F401 - zygote_enabled: its old home


@dataclass(frozen=True)
class EngineEnd:
    """How an engine (a scheduler) says a job ended, where its worker's exit status says nothing: ``why``,
    one of ``Executor.TIME_LIMIT``, ``STOPPED``, ``OUT_OF_MEMORY``, ``ERROR``; ``words``, the engine's own
    (its job state, its exception's first line); ``limit``, which time limit ran out."""

    why: str
    words: str
    limit: str = ""

    def status(self) -> tuple[str, str]:
        """The cell's status and reason: a time limit is ``failed`` (it would run out again), a stop from
        outside (a lost or preempted node, a cancel) ``killed``, an out-of-memory kill ``oom``."""
        if self.why == Executor.TIME_LIMIT:
            return FAILED, (f"timed out: {self.limit or 'the engine time limit'} ended the job ({self.words}); "
                            f"a plain abl run does not retry it (give it a longer time limit and run abl run "
                            f"--retry failed)")
        if self.why == Executor.OUT_OF_MEMORY:
            return OOM, f"out of memory: {self.words}"
        if self.why == Executor.STOPPED:
            return KILLED, f"stopped from outside: {self.words}; a plain abl run restarts it"
        return FAILED, self.words


@dataclass
class Job:
    cell: Cell
    run_dir: Path
    index: int
    handle: Any = None  # Popen, submitit job or Ray ObjectRef
    offset: int = 0  # bytes of metrics.jsonl already read
    step: int = 0
    train_loss: float | None = None
    val_loss: float | None = None
    returncode: int | None = None
    killed: bool = False
    gpus: list[int] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    threads: int | None = None  # CPU threads chosen for its worker (None: torch's default; abl.run.threads)
    threads_note: str = ""  # how they were chosen, for its start line
    packed: int = 1  # the most cells of the grid on its GPU at once while it ran, itself included
    ended: float | None = None  # when the parent saw its worker end
    end: EngineEnd | None = None  # set by the executor's poll when its engine said how the job ended
    log_offset: int = 0  # the size of its worker.log as it was launched: what follows is this attempt's

    @property
    def torchrun(self) -> bool:
        """Its worker runs under torchrun (``worker_command``: a cell over several processes); a cell
        without train settings (a stand-in) runs one."""
        return getattr(getattr(self.cell, "train", None), "devices", 1) > 1


def tail(job: Job) -> bool:
    """Read new complete lines of the job's metrics file; True if the progress changed."""
    job.offset, objs = rundir.tail_metrics(job.run_dir / rundir.METRICS, job.offset)
    changed = False
    for obj in objs:
        if "train_loss" in obj:
            job.step, job.train_loss, changed = int(obj["step"]), obj["train_loss"], True
        if "val_loss" in obj:
            job.val_loss = obj["val_loss"]
    return changed


def worker_command(run_dir: Path, devices: int) -> list[str]:
    """The command that trains one cell: the worker, under torchrun if it spans devices."""
    if devices <= 1:
        return python("-m", "abl.run.worker", str(run_dir))
    return [*python("-m", "torch.distributed.run"), "--standalone", f"--nproc_per_node={devices}",
            "-m", "abl.run.worker", str(run_dir)]


def run_worker_process(run_dir: str, devices: int = 1, env: dict[str, str] | None = None) -> int:
    """Run one cell's worker to the end in a child process; returns its exit status.

    This is what remote executors (submitit, Ray) execute: the extra process
    keeps a crashing cell from taking the engine's own worker down.
    """
    path = Path(run_dir)
    env = {**os.environ, **(env or {})}
    with open(path / rundir.LOG, "ab") as log:
        chosen = node_threads(path, devices, env)
        if chosen is not None:
            env["OMP_NUM_THREADS"] = str(chosen[0])
            log.write(f"threads: {chosen[1]}\n".encode())
            log.flush()
        proc = subprocess.Popen(worker_command(path, devices), stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, env=child_env(env))
        try:
            return proc.wait()
        except BaseException:
            proc.terminate()
            proc.wait()
            raise


def node_threads(run_dir: Path, devices: int, env: dict[str, str]) -> tuple[int, str] | None:
    """abl.run.threads' rule on the node that runs a remote (Slurm, Ray) cell: from the CPUs the
    scheduler gave it (this process's affinity, and ``SLURM_CPUS_PER_TASK`` where set) and that
    node's load, shared by the cell's processes. None where the thread count is decided elsewhere:
    ``OMP_NUM_THREADS`` already set (Ray sets it from a task's ``num_cpus``; or the user),
    ``train.threads`` > 0 (the worker sets it) or -1 (torch's default)."""
    from . import threads

    if env.get("OMP_NUM_THREADS", "").strip():
        return None
    try:
        requested = int(rundir.read_json(run_dir / rundir.CONFIG)["train"]["threads"])
    except (OSError, ValueError, KeyError, TypeError):
        requested = 0
    if requested != 0:
        return None
    cores = threads.usable_cores()
    slurm = env.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        cores = min(cores, int(slurm))
    n, why = threads.choose(0, cores, max(1, devices), threads.load_average())
    if n is None:  # only for train.threads = -1, returned above
        return None
    return n, why.replace("chosen:", "chosen on this node:")


class Executor:
    """Base: subclasses implement launch / poll / stop for one job, and declare what they can do.

    The runner and the memory admission read these declarations; they never probe an executor's type:

    - ``local``: its cells run on this machine, so its memory is checked before they start
      (abl.run.admission), their CPU threads are chosen here and a compiled cell's payback is foreseen
      from this machine's stored step times (abl.train.compiled);
    - ``slots``: how many cells run at once;
    - ``use_gpus`` / ``free_gpus``: it places cells on this machine's GPUs, and which are free.
    """

    name = "base"
    local = False
    slots = 1
    use_gpus = False
    free_gpus: list[int] = []
    # the whole grid's figure once its cells have ended (abl.run.busy.GridFigure.as_dict; set by the runner)
    grid_figure: dict[str, Any] | None = None

    def prestart(self) -> None:
        """Start anything slow before the cells are ready (the local executor's zygote); optional."""

    def close(self) -> None:
        """No more cells: release what ``prestart`` or the cells started; optional."""

    def __init__(self) -> None:
        self.running: list[Job] = []
        # (start, end, threads; None: torch's default) of this run's finished cells: their part of
        # the load average is this run's own, not another job's (abl.run.threads.own_load)
        self.finished: list[tuple[float, float, int | None]] = []

    def launch(self, job: Job) -> None:
        raise NotImplementedError

    # why an engine ended a job (``ended``): the runner stores each as its status (``EngineEnd.status``)
    TIME_LIMIT, STOPPED, OUT_OF_MEMORY, ERROR = "time limit", "stopped from outside", "out of memory", "error"

    def poll(self, job: Job) -> int | None:
        """The worker's exit status once it has ended, else None. An engine that says why a job ended
        without its worker's status (a scheduler's time limit, a lost node, an out-of-memory kill) says
        so with ``ended`` before returning."""
        raise NotImplementedError

    def ended(self, job: Job, why: str, words: str, limit: str = "") -> None:
        """Record how the engine ended ``job`` (an ``EngineEnd``; its words stored without this machine's
        paths, abl.files.scrub_paths)."""
        job.end = EngineEnd(why, scrub_paths(" ".join(words.split()))[:500], limit)

    def stop(self, job: Job) -> None:
        raise NotImplementedError

    def kill(self, job: Job) -> None:
        """Stop a job that ``stop`` did not end (it ignored the signal, or hangs in native code); by default
        ``stop`` again."""
        self.stop(job)

    def can_launch(self, job: Job) -> bool:
        return len(self.running) < self.slots

    def never_fits(self, cell: Cell) -> str | None:
        """Why ``cell`` can never start here, whatever ends (None: it can); ``run`` stores it failed unstarted."""
        return None

    def plan_devices(self, needs: list[Any], free_by_gpu: dict[int, int] | None) -> None:
        """The memory admission's GPU figures (abl.run.admission.admit's ``plan``): the GPU cells'
        needs and each GPU's free bytes (None: unknown). An executor that places cells on this
        machine's GPUs places them by these; optional."""

    def release(self, job: Job) -> None:
        pass

    def assign_threads(self, job: Job) -> None:
        """Choose the job's CPU threads as it starts (local cells only: a cluster node is not this one)."""

    def stop_all(self) -> None:
        for job in self.running:
            if job.returncode is None:
                job.killed = True
                self.stop(job)

    def run(self, jobs: list[Job], on_progress: Callable[[Job], None], on_done: Callable[[Job], None],
            poll_s: float = 0.2, on_launch: Callable[[Job], None] | None = None,
            watch: Callable[[Job], None] | None = None) -> None:
        """Launch every job as a slot frees up; ``on_launch`` runs just before each launch, ``watch`` on each
        running job at every poll (the runner's time limit and stall warning)."""
        pending, starting = list(jobs), on_launch or (lambda job: None)
        while pending or self.running:
            while pending and (self.never_fits(pending[0].cell) or self.can_launch(pending[0])):
                job = pending.pop(0)
                if why := self.never_fits(job.cell):  # its folder set up as for a start, then stored failed
                    starting(job)
                    self.ended(job, self.ERROR, why)
                    job.returncode, job.ended = 1, time.time()
                    on_done(job)
                    continue
                self.assign_threads(job)
                starting(job)
                self.launch(job)
                self.running.append(job)
                on_progress(job)
            time.sleep(poll_s)
            for job in list(self.running):
                if tail(job):
                    on_progress(job)
                code = self.poll(job)
                if code is None and watch is not None:
                    watch(job)
                if code is not None:
                    tail(job)
                    job.returncode, job.ended = code, time.time()
                    self.running.remove(job)
                    self.finished.append((job.started, time.time(), job.threads))
                    self.release(job)
                    on_done(job)


class LocalExecutor(Launchers, Executor):
    """Cells as worker processes on this machine: ``workers`` at once, or on CUDA as many as the GPUs hold.

    On CUDA the cells are placed per GPU by their predicted memory, up to
    ``cells_per_gpu`` on one (abl.run.admission.Placement); one that shared its
    GPU is marked ``contended`` (abl.run.speedpass.mark_packed). While they
    run, NVML samples the GPUs' utilisation where it is installed (abl.run.busy).

    A one-process cell's worker is forked from a zygote that has torch and the
    plugins imported already (abl.run.zygote), so a cell does not pay seconds of
    imports; a multi-device cell runs under torchrun as its own process tree.
    If the zygote cannot start or fork, workers are spawned as fresh
    processes (and ``ABL_ZYGOTE=0`` asks for that). With warm workers
    (abl.run.warm; ``--warm-workers``, by default where the cells run on CUDA)
    a worker process per slot trains cell after cell instead.
    """

    name = "local"
    local = True

    def __init__(self, workers: int | None = None, gpus: list[int] | None = None,
                 cells_per_gpu: int | None = None, speed_pass: str = "auto"):
        super().__init__()
        from .admission import Placement, visible_gpus

        if gpus is None:
            gpus = visible_gpus()
        self.gpus = list(gpus)
        self.free_gpus = list(gpus)
        self.use_gpus = bool(gpus)
        self.workers, self.cells_per_gpu, self.speed_pass = workers, cells_per_gpu, speed_pass
        # until the memory admission says more (plan_devices): --cells-per-gpu, else one cell per GPU
        self.placement = Placement(self.gpus, cap=cells_per_gpu or 1, free=None)
        self.slots = max(1, workers if workers else (len(gpus) * self.placement.cap or 1))
        self.placement_note = ""
        self.sampler: Any = None  # abl.run.busy.Sampler while the cells run
        self.zygote: Any = None
        self.use_zygote, self.warm_choice = zygote_enabled(), warm_choice()
        self.zygote_note = ""

    def run(self, jobs: list[Job], on_progress: Callable[[Job], None], on_done: Callable[[Job], None],
            poll_s: float = 0.2, on_launch: Callable[[Job], None] | None = None,
            watch: Callable[[Job], None] | None = None) -> None:
        from .busy import Sampler

        self.sampler = Sampler.start(self.gpus) if self.use_gpus and jobs else None
        try:
            super().run(jobs, on_progress, on_done, poll_s, on_launch, watch)
        finally:
            if self.sampler is not None:
                self.sampler.stop()
            self.close()

    def plan_devices(self, needs: list[Any], free_by_gpu: dict[int, int] | None) -> None:
        """Place the cells by their needs (abl.run.admission.placement_for); without ``workers``, as many
        run at once as the GPUs hold."""
        from .admission import placement_for

        if self.use_gpus:  # the cells that take GPUs (a cell asking for the CPU is checked against RAM)
            needs = [n for n in needs if n.device != "cpu"]
            self.placement, self.placement_note = placement_for(self.gpus, self.cells_per_gpu, needs, free_by_gpu)
            if not self.workers:
                self.slots = self.placement.at_once

    def on_gpus(self, cell: Cell) -> bool:
        """Whether the cell takes GPUs: this machine has some and the cell does not ask for the CPU."""
        return self.use_gpus and getattr(cell.train, "device", "auto") != "cpu"

    def never_fits(self, cell: Cell) -> str | None:
        """A cell of more processes than there are GPUs (abl.run.admission.too_many_devices)."""
        from .admission import too_many_devices
        return too_many_devices(cell, self.gpus) if self.on_gpus(cell) else None

    def can_launch(self, job: Job) -> bool:
        if len(self.running) >= self.slots:
            return False
        return not self.on_gpus(job.cell) or self.placement.choose(job.cell.run_id, job.cell.train.devices) is not None

    def _place(self, job: Job) -> None:
        """Take the job's GPUs (a direct launch that can_launch did not clear: the emptiest), and count the
        cells sharing a GPU with it and with the ones it joins."""
        gpus = self.placement.choose(job.cell.run_id, job.cell.train.devices) or sorted(
            self.gpus, key=lambda g: len(self.placement.on[g]))[:job.cell.train.devices]
        self.placement.take(job.cell.run_id, gpus)
        job.gpus = gpus
        self.free_gpus = [g for g in self.gpus if not self.placement.on[g]]
        for other in [*self.running, job]:
            if set(other.gpus) & set(gpus):
                other.packed = max(other.packed, self.placement.sharing(other.gpus))

    def launch(self, job: Job) -> None:
        env = dict(os.environ)
        if self.on_gpus(job.cell):
            self._place(job)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, job.gpus))
        if job.threads is not None:
            env["OMP_NUM_THREADS"] = str(job.threads)
        job.handle = self.start_one_process(job.run_dir, env) if job.cell.train.devices <= 1 else None
        if job.handle is not None:
            job.started = time.time()
            return
        log = open(job.run_dir / rundir.LOG, "ab")
        job.handle = subprocess.Popen(
            worker_command(job.run_dir, job.cell.train.devices), stdout=log, stderr=log,
            stdin=subprocess.DEVNULL, env=child_env(env),
            start_new_session=True,  # Ctrl-C reaches the parent only; it stops the workers
        )
        log.close()
        job.started = time.time()

    def poll(self, job: Job) -> int | None:
        return job.handle.poll()

    def release(self, job: Job) -> None:
        """Free the job's place on its GPUs; a cell that shared its GPU is marked contended in its folder
        before the parent stores it (abl.run.speedpass.mark_packed)."""
        if not self.on_gpus(job.cell):
            return
        self.placement.release(job.cell.run_id)
        self.free_gpus = [g for g in self.gpus if not self.placement.on[g]]
        if job.packed > 1:
            from .speedpass import mark_packed

            mark_packed(job.run_dir, job.packed)

    def assign_threads(self, job: Job) -> None:
        """abl.run.threads' rule for a cell; a user's OMP_NUM_THREADS stands unless train.threads is set.

        A GPU cell gets host threads the same way (its share of the cores among the cells run at
        once, not every core each), divided among the processes of a multi-device cell."""
        from . import threads

        requested = job.cell.train.threads
        now = time.time()
        self.finished = [c for c in self.finished if now - c[1] < threads.LOAD_MEMORY_S]  # long gone
        cells = self.finished + [(j.started, None, j.threads) for j in self.running]
        ours = threads.own_load(cells, now, threads.usable_cores())
        job.threads, job.threads_note = threads.for_cell(requested, self.slots, ours)
        if job.threads_note.endswith("(OMP_NUM_THREADS)"):
            return
        procs = max(1, job.cell.train.devices) if self.on_gpus(job.cell) else 1
        if job.threads is not None and procs > 1 and requested == 0:
            job.threads = max(1, job.threads // procs)
            job.threads_note += f", {job.threads} for each of its {procs} processes"

    def stop(self, job: Job) -> None:
        try:
            os.killpg(job.handle.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def kill(self, job: Job) -> None:
        try:
            os.killpg(job.handle.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stop_all(self) -> None:
        super().stop_all()
        deadline = time.time() + 10
        for job in self.running:
            try:
                job.returncode = job.handle.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(job.handle.pid, signal.SIGKILL)
                job.returncode = job.handle.wait()


# ---------------------------------------------------------------- the registry (hook register_executors)


@dataclass(frozen=True)
class ExecutorOptions:
    """What ``abl run`` hands an executor's factory: its command-line options."""

    workers: int | None = None  # local: cells at once (None: as many as the GPUs hold, else 1)
    cells_per_gpu: int | None = None  # local: most cells on one GPU (None: chosen from the cells' sizes)
    speed_pass: str = "auto"  # local: time each packed shape alone after the grid (auto), always, never
    runs_dir: Path = Path("runs")  # the run folders (a cluster executor keeps its own files beside them)
    slurm_partition: str | None = None
    slurm_time: int = 60  # minutes per cell
    slurm_cluster: str = "slurm"  # "local": submitit's path on this machine
    gpus_per_cell: int = 0  # slurm/ray: GPUs reserved per cell
    ray_address: str | None = None


ExecutorFactory = Callable[[ExecutorOptions], Executor]


@dataclass(frozen=True)
class ExecutorEntry:
    """A registered executor and the plugin it came from."""

    name: str
    factory: ExecutorFactory
    doc: str = ""
    plugin: str = ""
    package: str = ""
    version: str = ""


def registered() -> dict[str, ExecutorEntry]:
    """Every executor the plugins register (hook ``register_executors``), in load order: the built-ins
    (plugins/executors.py: local, slurm, ray) first. A name registered twice is an error naming both."""
    from ..contracts.named_hooks import collect_named

    return collect_named("register_executors", "executors", "executor", "factory", _entry)


def _entry(name: str, factory: ExecutorFactory, doc: str = "", *, plugin: str, package: str,
           version: str) -> ExecutorEntry:
    """A plugin's ``register(name, factory, doc="")`` as an ExecutorEntry."""
    from ..contracts.named_hooks import first_line

    return ExecutorEntry(name, factory, first_line(doc or factory.__doc__), plugin, package, version)


def make_executor(name: str, options: ExecutorOptions) -> Executor:
    """The executor registered as ``name``, built from ``options`` (a PluginLoadError names the registered ones,
    or the plugin whose factory returned something that is not an ``Executor``)."""
    from ..contracts.plugin_manager import PluginLoadError

    entries = registered()
    if name not in entries:
        raise PluginLoadError(f"unknown executor {name!r}; registered: {', '.join(entries)}")
    engine = entries[name].factory(options)
    if not isinstance(engine, Executor):
        raise PluginLoadError(f"executor {name!r} (plugin {entries[name].plugin!r}) built a "
                              f"{type(engine).__name__}, not an abl.run.executors.Executor")
    return engine
