"""Memory admission: refuse a grid that cannot fit before any cell starts allocating.

For every cell to run, the cost model's predicted training peak
(``costmodel.predict``'s ``train_peak_bytes``: weights, gradients, AdamW
moments, autocast copies, saved activations and the largest backward
transient) is taken at the top of its calibrated band (``MEMORY_BAND``: the
measured peak lies within 0.9-1.25x the prediction), plus what a worker
process holds that the model does not count (``PROCESS_BYTES``). That need is
compared with the free memory of the device the cell will use. A cell with a
component that declares no cost function (``cost=`` is optional for a plugin)
has no prediction: its peak is measured instead, once per shape, as ``abl
cost`` measures it (``predict(..., measure_missing=True)``,
abl.model.measuredcost: the live tensor peak of one training step, on fake
tensors, so measuring a cell too large for the machine allocates nothing of
it). That figure is what the run's step holds, so it is taken as it is, not at
the top of a band, and the messages say "measured peak":

- CPU: the machine's available RAM (``MemAvailable``, and the cgroup's limit
  when one is set); the cells that run at once (``--workers N``, and every
  process of a multi-process cell) share it, so the N largest needs must fit
  together;
- CUDA: ``torch.cuda.mem_get_info`` of each GPU the cells may get, asked in a
  child process so the ``abl run`` parent never holds a CUDA context of its
  own. A cell that fits no GPU alone (a cell of k processes: no k GPUs that
  each hold one) is refused here; the cells that do are then placed per device
  as they start (``Placement``), only on a GPU whose free memory holds them: a
  cell joins a GPU while the needs of the cells on it, its own and
  ``GPU_RESERVE_BYTES`` fit that GPU's free memory, up to ``cells_per_gpu``
  cells (``--cells-per-gpu``; default ``default_cells_per_gpu``). An empty GPU
  whose free memory holds an admitted cell takes it, so a cell that fits alone
  always runs.

A grid that does not fit is refused (``AdmissionError``, exit status 2) with
each cell that does not fit and its predicted peak; ``--force`` runs it anyway.
A cell the executor can never start, whatever its memory (one of more
processes than there are GPUs: ``too_many_devices``), is refused so too, and
``--force`` does not let it through (it would wait for GPUs for ever).
Memory that does run out is recorded as ``oom``: the worker classifies its
allocation errors (harness/run/worker.py), and ``oom_kills`` tells the parent when
the kernel's OOM killer ended a worker.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..analysis.formats import fmt_bytes
from ..contracts.config import Cell
from ..contracts.registry import Registry, RegistryError
from ..data.corpus import DataError
from ..model.costmodel import MEMORY_BAND, missing_costs, predict

MiB = 1024**2
GiB = 1024**3

# What one worker process holds besides the model's tensors. CPU: the Python
# interpreter, torch's libraries and the dataset; measured as baseline_rss_bytes
# (the worker's RSS just before the model is built) at 369 MiB on torch 2.13 CPU
# with the default dataset, rounded up. CUDA: the device memory of a CUDA context
# and its library workspaces, which the cost model does not see; an estimate
# (typically 0.3-0.6 GiB on CUDA 12 with lazy module loading), rounded up.
PROCESS_BYTES = {"cpu": 512 * MiB, "cuda": 1 * GiB}


# kept free on every GPU that holds several cells: the caching allocator's fragmentation and the growth
# of what the cost model does not see (cuBLAS/cuDNN workspaces, autotuning) in each of them
GPU_RESERVE_BYTES = 1 * GiB
# the most cells ``default_cells_per_gpu`` puts on one GPU: beyond it the cells of a small grid mostly
# queue on the device's streams (one GPU runs one kernel of one process at a time without MPS)
MAX_DEFAULT_CELLS_PER_GPU = 8


class AdmissionError(Exception):
    """The grid's predicted memory does not fit the free memory (a user error)."""


@dataclass
class Need:
    cell: Cell
    predicted: float  # train_peak_bytes of one process of the cell (the cost model's, or measured)
    processes: int  # processes of the cell (train.devices)
    device: str  # "cpu" or "cuda"
    source: str = "predicted"  # "measured": a component declares no cost function (abl.model.measuredcost)
    missing: tuple[str, ...] = ()  # the components without a cost function ("norm 'x'"), when measured

    @property
    def band(self) -> float:
        """The factor on ``predicted``: the top of the calibrated band for a prediction; 1 for a measurement
        (it is the peak the run's step holds)."""
        return MEMORY_BAND[1] if self.source == "predicted" else 1.0

    @property
    def per_process(self) -> float:
        """Bytes one process may reach: the peak (a prediction at the top of its band), plus its overhead."""
        return self.predicted * self.band + PROCESS_BYTES[self.device]

    @property
    def host_bytes(self) -> float:
        """What the cell needs of the machine's RAM (every process of a CPU cell)."""
        return self.per_process * self.processes if self.device == "cpu" else 0.0


def fmt(n: float) -> str:
    return fmt_bytes(n)


def cell_device(cell: Cell, gpus: list[int]) -> str:
    dev = cell.train.device
    if dev == "cpu" or not gpus:
        return "cpu"
    return "cuda"


def cell_need(cell: Cell, registry: Registry, gpus: list[int]) -> Need | None:
    """The cell's per-process peak, predicted, or measured where a component declares no cost function;
    None when neither can be had (its dataset cannot be read, or measuring its model failed)."""
    per_rank = cell
    if cell.train.devices > 1:  # each process trains batch_size / devices sequences
        per_rank = dataclasses.replace(cell, train=dataclasses.replace(
            cell.train, batch_size=max(1, cell.train.batch_size // cell.train.devices)))
    try:
        pred = predict(per_rank, registry, measure_missing=True)
    except RegistryError:
        return None  # measuring a model without a cost function failed: abl cost names why
    except (DataError, OSError):
        # the dataset (read for its vocabulary size) cannot be loaded: the dataset checks
        # report that; memory admission has nothing to go on for this cell
        return None
    if pred.get("train_peak_bytes") is None:
        return None  # measured, but torch's MemTracker is unavailable: no peak to admit on
    source = pred.get("cost_source", "predicted")
    return Need(cell=cell, predicted=float(pred["train_peak_bytes"]), processes=cell.train.devices,
                device=cell_device(cell, gpus), source=source,
                missing=tuple(missing_costs(cell.components, registry)) if source == "measured" else ())


# ---------------------------------------------------------------- free memory


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def cgroup_free_bytes() -> int | None:
    """Room left under this process's cgroup memory limit (v2, else v1); None without a limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < 2**60:  # v1 says "no limit" as ~2**63
            return max(0, limit - usage)
    return None


def ram_free_bytes() -> int | None:
    """Available RAM: /proc/meminfo's MemAvailable (Linux) or free pages, capped by the cgroup limit."""
    free: int | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            free = None
    cg = cgroup_free_bytes()
    if cg is not None:
        free = cg if free is None else min(free, cg)
    return free


def cuda_free_bytes(indices: list[int]) -> dict[int, int]:
    """Free bytes of each GPU, as ``torch.cuda.mem_get_info`` reports it (creates a CUDA context:
    run it in a child process, ``gpu_free_bytes``)."""
    import torch

    return {i: int(torch.cuda.mem_get_info(i)[0]) for i in indices}


def visible_gpus() -> list[int]:
    """GPU indices this process may use, without importing torch when there is no GPU runtime."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return [i for i, v in enumerate(vis.split(",")) if v.strip() and v.strip() != "-1"]
    try:
        import torch

        return list(range(torch.cuda.device_count()))
    except Exception:  # noqa: BLE001
        return []


def gpu_free_bytes(indices: list[int]) -> dict[int, int] | None:
    """``cuda_free_bytes`` of the visible GPUs ``indices``, asked in a child process; None if it fails."""
    code = "import json, sys; from abl.run.admission import cuda_free_bytes; " \
           "print(json.dumps(cuda_free_bytes(json.loads(sys.argv[1]))))"
    try:
        from ..pyexec import child_env, python

        out = subprocess.run(python("-c", code, json.dumps(indices)), capture_output=True,
                             text=True, timeout=120, stdin=subprocess.DEVNULL, env=child_env())
        return {int(k): int(v) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


# ---------------------------------------------------------------- admission


def admit(cells: list[Cell], registry: Registry, *, slots: int, gpus: list[int],
          ram_free: Callable[[], int | None] | None = None,
          gpu_free: Callable[[list[int]], dict[int, int] | None] | None = None,
          plan: Callable[[list[Need], dict[int, int] | None], None] | None = None) -> list[str]:
    """Messages for a set of cells that cannot fit (empty when they fit).

    ``slots``: cells the executor runs at once; ``gpus``: the GPU indices it
    hands out (empty: CPU). ``plan``: given the GPU cells' needs and each GPU's
    free bytes (None: unknown), once they are known (the local executor places
    its cells by them: ``Placement``). Raises nothing; the caller refuses or,
    with ``--force``, warns.
    """
    ram_free = ram_free or ram_free_bytes
    gpu_free = gpu_free or gpu_free_bytes
    needs = [n for c in cells if (n := cell_need(c, registry, gpus)) is not None]
    problems: list[str] = []
    cpu = sorted((n for n in needs if n.device == "cpu"), key=lambda n: -n.host_bytes)
    if cpu:
        free = ram_free()
        if free is not None:
            at_once = cpu[:max(1, slots)]
            total = sum(n.host_bytes for n in at_once)
            alone = [n for n in cpu if n.host_bytes > free]
            if alone:
                problems.append(f"{len(alone)} cell(s) need more memory than this machine has free "
                                f"({fmt(free)} RAM available):")
                problems += [_line(n) for n in alone[:10]]
                if len(alone) > 10:
                    problems.append(f"  ... and {len(alone) - 10} more")
            elif total > free and len(at_once) > 1:
                problems.append(f"{len(at_once)} cells at once (--workers {slots}) need {fmt(total)}, more than "
                                f"the {fmt(free)} RAM available; the largest:")
                problems += [_line(n) for n in at_once[:10]]
                problems.append("  pass a smaller --workers (each cell alone fits)")
    gpu_needs = sorted((n for n in needs if n.device == "cuda"), key=lambda n: -n.per_process)
    if gpu_needs:
        free_by_gpu = gpu_free(gpus)
        if plan is not None:
            plan(gpu_needs, free_by_gpu)
        if free_by_gpu:
            # a cell of k processes needs k GPUs that each hold one (Placement puts it only there)
            over = [n for n in gpu_needs
                    if sum(n.per_process <= b for b in free_by_gpu.values()) < max(1, n.processes)]
            if over:
                where = ", ".join(f"GPU {i}: {fmt(b)}" for i, b in sorted(free_by_gpu.items()))
                several = " (a cell of k processes needs k GPUs that each hold one)" \
                    if any(n.processes > 1 for n in over) else ""
                problems.append(f"{len(over)} cell(s) need more GPU memory than is free ({where}){several}:")
                problems += [_line(n) for n in over[:10]]
                if len(over) > 10:
                    problems.append(f"  ... and {len(over) - 10} more")
    if problems:
        problems.append(_footnote(needs))
    return problems


def _footnote(needs: list[Need]) -> str:
    """How the needs were made up, and what to do about them."""
    measured = sorted({m for n in needs if n.source == "measured" for m in n.missing})
    how = (f"predicted peak: abl cost's est. peak, times {MEMORY_BAND[1]} for the top of its calibrated band"
           if any(n.source == "predicted" for n in needs) else "")
    if measured:
        how += ("; " if how else "") + (
            f"measured peak: {', '.join(measured)} declare(s) no cost function, so the peak is the live tensor "
            "memory of one training step of the cell's shape, measured as abl cost measures it "
            "(abl.model.measuredcost), taken as it is")
    return (f"({how}; plus {fmt(PROCESS_BYTES['cpu'])} per CPU process or {fmt(PROCESS_BYTES['cuda'])} per "
            f"CUDA context; make the cells smaller (train.batch_size, model.context, model size) or pass "
            f"--force to run anyway)")


def _line(n: Need) -> str:
    c = n.cell
    procs = f" x {n.processes} processes" if n.processes > 1 else ""
    why = f" ({', '.join(n.missing)} declares no cost function)" if n.source == "measured" else ""
    return (f"  {c.label} seed={c.seed} (run {c.run_id}): {n.source} peak {fmt(n.predicted)}{why}, up to "
            f"{fmt(n.per_process)} per process{procs} on {n.device}")


# ---------------------------------------------------------------- memory that ran out


def oom_kills() -> int | None:
    """How many times the kernel's OOM killer has struck in this process's cgroup (None if unknown)."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def check_run(cells: list[Cell], registry: Registry, runs_dir: Path, executor, retry_failed: bool) -> list[str]:
    """``admit`` for the cells ``abl run`` will start (their folders say they run again) on a
    local executor (one that declares ``local``). Cells sent to Slurm or Ray run on other machines, whose
    memory abl cannot see. Raises ``AdmissionError`` for a cell the executor can never start
    (``Executor.never_fits``: more devices than GPUs), which ``--force`` does not override."""
    from ..contracts.status import runs_again
    from ..store import rundir

    if not executor.local:  # declared by the executor (abl.run.executors.Executor)
        return []
    todo = [c for c in cells
            if runs_again((rundir.read_status(runs_dir / c.run_id) or {}).get("status"), retry_failed)]
    never = [why for c in todo if (why := executor.never_fits(c))]  # whatever the memory, even with --force
    if never:
        raise AdmissionError("cell(s) that can never start on this machine:\n" + "\n".join(f"  {w}" for w in never))
    gpus = list(executor.free_gpus) if executor.use_gpus else []
    return admit(todo, registry, slots=int(executor.slots), gpus=gpus, plan=executor.plan_devices)


def too_many_devices(cell: Cell, gpus: list[int]) -> str | None:
    """Why ``cell`` can never be placed on ``gpus`` (one GPU per process): more processes than GPUs; None when
    it can. ``--force`` overrides the memory check, not this: such a cell would wait for GPUs for ever."""
    k = cell.train.devices
    if k <= len(gpus):
        return None
    return (f"{cell.label} seed={cell.seed} (run {cell.run_id}): train.devices = {k} (one GPU per process), but "
            f"{len(gpus)} GPU(s) ({', '.join(f'GPU {g}' for g in gpus)}) are there to place it on; set "
            f"train.devices to at most {len(gpus)} (--force overrides the memory check, not the GPU count)")


# ---------------------------------------------------------------- several cells per GPU


def default_cells_per_gpu(needs: list[Need], free_by_gpu: dict[int, int] | None) -> int:
    """The rule of ``--cells-per-gpu``'s default: as many of the grid's largest cell (its need at the top
    of the band, plus a CUDA context) as fit the GPU with the most free memory less
    ``GPU_RESERVE_BYTES``, at least 1 and at most ``MAX_DEFAULT_CELLS_PER_GPU``; 1 when the free memory or
    a cell's need is unknown (one cell per GPU, as before). A GPU with less free memory takes fewer: the
    placement checks each GPU's own (``Placement.fits``), so a GPU mostly taken by another job does not
    make the others run one cell at a time."""
    if not free_by_gpu or not needs:
        return 1
    return _how_many(max(n.per_process for n in needs), max(free_by_gpu.values()))


def _how_many(largest: float, free: float) -> int:
    """How many cells of need ``largest`` fit ``free`` bytes less the reserve: 1 to the default's most."""
    room = free - GPU_RESERVE_BYTES
    if largest <= 0 or room <= largest:
        return 1
    return int(max(1, min(MAX_DEFAULT_CELLS_PER_GPU, room // largest)))


def placement_for(gpus: list[int], cells_per_gpu: int | None, needs: list[Need],
                  free_by_gpu: dict[int, int] | None) -> tuple["Placement", str]:
    """The local executor's placement of cells on ``gpus`` by their needs, up to ``cells_per_gpu`` per GPU
    (None: ``default_cells_per_gpu``), and a sentence saying so. Its ``at_once`` (the executor's slots):
    the cap on every GPU with ``--cells-per-gpu``; by default, per GPU, as many of the largest cell as fit
    that GPU's free memory (a GPU with less free memory adds fewer)."""
    cap = cells_per_gpu or default_cells_per_gpu(needs, free_by_gpu)
    at_once = len(gpus) * cap
    if not cells_per_gpu and free_by_gpu and needs:
        largest = max(n.per_process for n in needs)
        at_once = sum(min(cap, _how_many(largest, free_by_gpu.get(g, 0))) for g in gpus)
    how = "--cells-per-gpu" if cells_per_gpu else "chosen from the cells' predicted peaks"
    note = (f"up to {cap} cell(s) per GPU ({how}), while their predicted peaks and {fmt(GPU_RESERVE_BYTES)} kept "
            f"free fit each GPU's free memory" if free_by_gpu else
            f"up to {cap} cell(s) per GPU ({how}; free memory unknown)")
    return Placement(gpus, cap=cap, free=free_by_gpu, needs={n.cell.run_id: n.per_process for n in needs},
                     at_once=at_once), note


class Placement:
    """Which GPU each starting cell goes to: per device, by the cells' predicted needs.

    A cell goes to a GPU with no cell on it whose free memory (as measured before the grid started) holds
    its need, or to one holding fewer than ``cap`` cells whose needs, plus the new cell's and ``reserve``,
    fit that GPU's free memory; among those, the one with the fewest cells, then the most room. A cell
    whose need is unknown (no prediction, or no free-memory figure) counts as filling its GPU unless
    ``free`` is None, when only the cap counts. A multi-device cell takes that many GPUs, each placed by
    the same rule. A cell that no GPU (no set of as many GPUs as it has processes) holds alone was let
    through by ``--force``: it takes an empty GPU, the one with the most free memory, rather than waiting
    for ever. A cell of more processes than there are GPUs is never placed (``too_many_devices``: refused
    before the grid starts, stored failed by the executor if it comes anyway).
    """

    def __init__(self, gpus: list[int], cap: int = 1, free: dict[int, int] | None = None,
                 needs: dict[str, float] | None = None, reserve: int = GPU_RESERVE_BYTES,
                 at_once: int | None = None) -> None:
        self.gpus, self.cap, self.free, self.reserve = list(gpus), max(1, int(cap)), free, reserve
        # the cells it holds at once (the executor's slots): the cap on every GPU unless placement_for knew more
        self.at_once = max(1, at_once if at_once is not None else len(self.gpus) * self.cap)
        self.needs = dict(needs or {})
        self.on: dict[int, dict[str, float]] = {g: {} for g in self.gpus}  # gpu -> run id -> its need

    def need(self, run_id: str) -> float | None:
        return self.needs.get(run_id)

    def fits_alone(self, gpu: int, run_id: str) -> bool:
        """Whether the cell fits the GPU with nothing else on it (True when its need or the free memory is
        unknown: admission had nothing to refuse it on)."""
        need = self.need(run_id)
        if self.free is None or need is None:
            return True
        return need <= self.free.get(gpu, 0)

    def fits_somewhere(self, run_id: str, devices: int = 1) -> bool:
        """Whether ``devices`` GPUs each hold the cell alone (admission refused the cells that fit no such
        set, unless ``--force``)."""
        return sum(self.fits_alone(g, run_id) for g in self.gpus) >= max(1, devices)

    def fits(self, gpu: int, run_id: str, devices: int = 1) -> bool:
        cells = self.on[gpu]
        if not cells:
            # alone: where it fits; a cell that fits nowhere (--force said run anyway) on any empty GPU
            return self.fits_alone(gpu, run_id) or not self.fits_somewhere(run_id, devices)
        if len(cells) >= self.cap:
            return False
        if self.free is None:
            return True  # no free-memory figure: the cap alone decides
        need = self.need(run_id)
        if need is None or any(math.isinf(v) for v in cells.values()):
            return False  # an unknown need shares with nothing
        return sum(cells.values()) + need + self.reserve <= self.free.get(gpu, 0)

    def choose(self, run_id: str, devices: int = 1) -> list[int] | None:
        """The GPUs the cell would get now, or None when it must wait (nothing is taken: ``take``)."""
        ok = [g for g in self.gpus if self.fits(g, run_id, devices)]
        if len(ok) < devices:
            return None
        ok.sort(key=lambda g: (len(self.on[g]), -self.room(g), g))
        return sorted(ok[:devices])

    def take(self, run_id: str, gpus: list[int]) -> None:
        need = self.need(run_id)
        for g in gpus:
            self.on[g][run_id] = need if need is not None else math.inf

    def room(self, gpu: int) -> float:
        if self.free is None:
            return 0.0
        used = sum(self.on[gpu].values())
        return self.free.get(gpu, 0) - used

    def release(self, run_id: str) -> None:
        for cells in self.on.values():
            cells.pop(run_id, None)

    def sharing(self, gpus: list[int]) -> int:
        """The most cells on any of ``gpus`` now."""
        return max((len(self.on.get(g, {})) for g in gpus), default=0)
