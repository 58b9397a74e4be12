"""Warm workers: one process per slot trains cell after cell (``python -m abl.run.warm``; issue 37, 2).

A spawned or forked worker pays, per cell, a CUDA context, the kernels' and
the token store's loading; on a GPU that is most of a small cell's time. A
warm worker pays them once: it imports torch and the plugins, then reads
requests ``{"id": N, "run_dir": ..., "env": {...}}`` (one JSON line each)
and runs each cell in-process through the one-process worker's own code
(``abl.run.worker.run``), answering ``{"id": N, "code": C}`` with the exit
status that worker would have had.

Isolation is kept where it matters:

- each cell's stdout and stderr go to its own ``worker.log`` (fd 1 and 2 are
  pointed there for the cell; the replies travel on a private descriptor);
- before each cell the process-wide state a fresh process would have is put
  back (``reset_state``): the environment, torch's thread count (from
  ``OMP_NUM_THREADS``), the global flags (TF32, deterministic algorithms,
  default dtype, matmul precision, cuDNN), the RNG states (torch, CUDA,
  ``random``, numpy) as they were at start-up, the compile caches
  (``torch._dynamo.reset``), the peak-memory figures (CUDA's allocator
  statistics; on a CPU the process's peak RSS, through
  ``/proc/self/clear_refs``);
- a cell that ends in anything but completed or diverged (failed, oom,
  killed), or that a signal reached, is its worker's last: the process exits
  with the cell's status and the next cell gets a fresh one. A crash (a
  signal, ``os._exit``) ends the process, and the cell's status is the
  process's, exactly as for a one-process cell. The process leads its own
  session, so ``killpg`` (stop, the time limit, Ctrl-C) reaches it as before.

``CUDA_VISIBLE_DEVICES`` cannot change once CUDA is initialised, so a warm
worker serves only cells placed on the device set it started with
(``WarmPool``). Multi-device cells (torchrun) never run warm.
"""

from __future__ import annotations

import gc
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contracts.status import COMPLETED, DIVERGED, EXIT_CODES
from ..pyexec import child_env, python
from ..store import rundir
from .zygote import Polled

MODES = ("auto", "on", "off")
MODE_ENV = "ABL_WARM_WORKERS"
# the statuses after which a warm worker takes another cell; any other ends it
KEEP = (EXIT_CODES[COMPLETED], EXIT_CODES[DIVERGED])


def warm_mode() -> str:
    """``ABL_WARM_WORKERS`` (``abl run --warm-workers``): auto (default), on or off."""
    mode = os.environ.get(MODE_ENV, "auto").strip().lower()
    return mode if mode in MODES else "auto"


def warm_choice() -> bool | None:
    """The mode as the executor reads it: on True, off False, auto None (``Launchers.use_warm`` decides)."""
    return {"on": True, "off": False}.get(warm_mode())


# ---------------------------------------------------------------- the warm worker's side


@dataclass
class Baseline:
    """Process-wide state as it was before the first cell: what each cell starts from."""

    threads: int
    flags: dict[str, Any]
    torch_rng: Any
    py_rng: Any
    np_rng: Any
    seed: int
    cwd: str
    interpret: str | None


def _flags() -> dict[str, Any]:
    import torch

    return {"tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32,
            "cudnn_deterministic": torch.backends.cudnn.deterministic, "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "default_dtype": torch.get_default_dtype(), "matmul_precision": torch.get_float32_matmul_precision()}


def _set_flags(flags: dict[str, Any]) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = flags["tf32_matmul"]
    torch.backends.cudnn.allow_tf32 = flags["tf32_cudnn"]
    torch.backends.cudnn.deterministic = flags["cudnn_deterministic"]
    torch.backends.cudnn.benchmark = flags["cudnn_benchmark"]
    torch.use_deterministic_algorithms(flags["deterministic"], warn_only=flags["deterministic_warn_only"])
    torch.set_default_dtype(flags["default_dtype"])
    torch.set_float32_matmul_precision(flags["matmul_precision"])


def capture() -> Baseline:
    import numpy as np
    import torch

    return Baseline(torch.get_num_threads(), _flags(), torch.get_rng_state(), random.getstate(),
                    np.random.get_state(), torch.initial_seed(), os.getcwd(), os.environ.get("TRITON_INTERPRET"))


def reset_peak_rss() -> bool:
    """Linux: make the process's peak RSS (``ru_maxrss``, VmHWM) its current RSS, so a cell's peak is its own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def reset_cuda(seed: int) -> None:
    """CUDA's part of a cell's fresh start, where this process initialised CUDA: no cached blocks, the
    peak statistics zeroed on every device, the generators reseeded as at start-up."""
    import torch

    if not torch.cuda.is_initialized():
        return
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    for i in range(torch.cuda.device_count()):
        torch.cuda.reset_peak_memory_stats(i)
    torch.cuda.manual_seed_all(seed)


def reset_state(env: dict[str, str], base: Baseline) -> None:
    """Before a cell: what a fresh worker process would start from (see the module's docstring)."""
    import numpy as np
    import torch

    from . import worker

    worker.reset_globals()
    os.environ.clear()
    os.environ.update(env)
    if base.interpret is not None:  # triton was imported under it; the cell must say the same
        os.environ["TRITON_INTERPRET"] = base.interpret
    os.environ["ABL_WORKER_ORIGIN"] = "warm"
    os.chdir(base.cwd)
    threads = env.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else base.threads)
    _set_flags(base.flags)
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()
    gc.collect()
    torch.set_rng_state(base.torch_rng)
    random.setstate(base.py_rng)
    np.random.set_state(base.np_rng)
    reset_cuda(base.seed)
    reset_peak_rss()


def run_cell(run_dir: Path, env: dict[str, str], base: Baseline) -> int:
    """Train one cell in this process with fd 1 and 2 on its ``worker.log``; its exit status."""
    from . import worker

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    log = os.open(run_dir / rundir.LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    code = EXIT_CODES["failed"]
    try:
        reset_state(env, base)
        code = worker.run(run_dir)
    except BaseException:  # noqa: BLE001 - recorded in the cell's log; the worker then ends
        import traceback

        traceback.print_exc()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # between cells a signal ends the worker
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
    return code


def serve() -> int:
    from . import worker
    from .zygote import preload

    worker.die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the parent; it stops the cells
    replies = os.fdopen(os.dup(1), "w", buffering=1)  # private (not inherited): fd 1 becomes each cell's log
    requests = os.fdopen(os.dup(0), "r")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    preload()
    base = capture()
    for line in requests:
        try:
            req = json.loads(line)
            run_dir, env = Path(req["run_dir"]), {str(k): str(v) for k, v in req["env"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            replies.write(json.dumps({"id": None, "error": f"bad request: {exc}"}) + "\n")
            return 2
        code = run_cell(run_dir, env, base)
        os.dup2(devnull, 2)  # its start-up messages went to the first cell's log; nothing more goes there
        replies.write(json.dumps({"id": req.get("id"), "code": code}) + "\n")
        if code not in KEEP or worker.signalled() is not None:
            return code
    return 0


# ---------------------------------------------------------------- the parent's side


class WarmCell(Polled):
    """A cell running in a warm worker: ``pid`` is the worker's (it leads its own session, so ``killpg`` stops
    the cell)."""

    def __init__(self, worker: WarmWorker, rid: int):
        self.worker, self.rid, self.pid = worker, rid, worker.proc.pid
        self.returncode = None

    def _exit_code(self) -> int | None:
        return self.worker.code(self.rid)


class WarmWorker:
    """Starts ``python -m abl.run.warm`` for the devices in ``env`` and hands it cells one at a time."""

    def __init__(self, env: dict[str, str], log: Path):
        self.key = env.get("CUDA_VISIBLE_DEVICES", "")
        with open(log, "ab") as err:  # its start-up messages (imports) go to its first cell's log
            self.proc = subprocess.Popen(python("-m", "abl.run.warm"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, env=child_env(env), text=True, bufsize=1, start_new_session=True)
        self._codes: dict[int, int] = {}
        self._next = 0
        self.current: WarmCell | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
                self._codes[int(msg["id"])] = int(msg["code"])
            except (ValueError, KeyError, TypeError):
                continue

    def submit(self, run_dir: Path, env: dict[str, str]) -> WarmCell:
        self._next += 1
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"id": self._next, "run_dir": str(run_dir), "env": env}) + "\n")
        self.proc.stdin.flush()
        self.current = WarmCell(self, self._next)
        return self.current

    def code(self, rid: int) -> int | None:
        """The cell's exit status once it ended: the worker's answer, or the process's own status if it
        ended first (a crash, a signal)."""
        if rid in self._codes:
            return self._codes[rid]
        if self.proc.poll() is None:
            return None
        self._reader.join(timeout=2.0)  # an answer written just before the process ended
        return self._codes.get(rid, self.proc.returncode)

    @property
    def idle(self) -> bool:
        """Alive, and its last cell ended in a status after which it takes another."""
        cell = self.current
        if self.proc.poll() is not None:
            return False
        return cell is None or (cell.poll() is not None and cell.returncode in KEEP)

    def close(self) -> None:
        """No more cells: the worker exits after the one it runs (stdin closed)."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass


class WarmPool:
    """The warm workers of one ``abl run``: at most ``slots`` alive, each pinned to one device set."""

    def __init__(self, slots: int):
        self.slots = slots
        self.workers: list[WarmWorker] = []
        self.started = 0  # workers started so far

    def start(self, run_dir: Path, env: dict[str, str]) -> WarmCell:
        key = env.get("CUDA_VISIBLE_DEVICES", "")
        self.workers = [w for w in self.workers if w.proc.poll() is None]
        for w in self.workers:
            if w.idle and w.key == key:
                return w.submit(run_dir, env)
        for w in [w for w in self.workers if w.idle][:max(0, len(self.workers) - self.slots + 1)]:
            w.close()  # idle on another device set: make room
            self.workers.remove(w)
        w = WarmWorker(env, run_dir / rundir.LOG)
        self.started += 1
        self.workers.append(w)
        return w.submit(run_dir, env)

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.workers = []


# ---------------------------------------------------------------- the local executor's launchers


def zygote_enabled() -> bool:
    """Workers fork from a pre-imported zygote (abl.run.zygote) unless ``ABL_ZYGOTE=0``."""
    return os.environ.get("ABL_ZYGOTE", "1").strip().lower() not in ("0", "false", "no", "off")


class Launchers:
    """The local executor's ways to start a one-process cell, besides spawning it: a warm worker (``use_warm``,
    abl.run.executors.LocalExecutor sets it) or a fork of the zygote. Mixed into that executor."""

    use_gpus: bool
    slots: int
    zygote: Any = None
    use_zygote = True
    zygote_note = ""
    warm_choice: bool | None = False  # --warm-workers on, off, auto (None)
    warm_failed = False  # a warm worker could not start: the rest are spawned
    warm: WarmPool | None = None

    @property
    def use_warm(self) -> bool:
        """Warm workers: ``on``; or ``auto`` where the cells run on CUDA (one context per worker, not per
        cell), unless a fresh process per cell is asked for (``ABL_ZYGOTE=0`` turns ``use_zygote`` off). On a
        CPU the zygote's fork per cell is as fast and isolates more."""
        if self.warm_failed:
            return False
        return self.warm_choice if self.warm_choice is not None else self.use_gpus and self.use_zygote

    def _zygote_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if not self.use_gpus:  # Triton decides at import whether it interprets; on a CPU it must
            env.setdefault("TRITON_INTERPRET", "1")
        return env

    def prestart(self) -> None:
        """Start the zygote now without waiting for it: its imports (torch, the plugins) overlap the
        parent's own start-up (the memory check, the token store) instead of following it (issue 27, 3).
        With warm workers there is no zygote: each worker imports once, as its first cell starts."""
        if not self.use_zygote or self.zygote is not None or self.use_warm:
            return
        from .zygote import Zygote

        try:
            self.zygote = Zygote(self._zygote_env(), wait=False)
        except OSError as exc:
            self.use_zygote, self.zygote_note = False, f"workers spawned fresh: {exc}"

    def close(self) -> None:
        """No more cells: a zygote still importing is stopped, a ready one exits after its children; warm
        workers exit after their cells."""
        if self.warm is not None:
            self.warm.close()
        if self.zygote is None:
            return
        if self.zygote.is_ready:
            self.zygote.close()
        else:
            self.zygote.kill()
        self.zygote = None

    def _zygote(self):
        """The running zygote (started early by ``prestart``, else on first use), ready to fork;
        None when workers must be spawned."""
        if not self.use_zygote:
            return None
        from .zygote import Zygote, ZygoteError

        try:
            if self.zygote is not None:
                self.zygote.ready()
                if self.zygote.alive:
                    return self.zygote
            self.zygote = Zygote(self._zygote_env())
        except (ZygoteError, OSError) as exc:
            self.use_zygote, self.zygote_note = False, f"workers spawned fresh: {exc}"
            return None
        return self.zygote

    def start_one_process(self, run_dir: Path, env: dict[str, str]) -> Any:
        """A one-process cell started warm or forked (a Popen-like handle), or None: spawn it."""
        if self.use_warm:
            if self.warm is None:
                self.warm = WarmPool(self.slots)
            if not self.use_gpus:
                env = {**self._zygote_env(), **env}
            try:
                return self.warm.start(run_dir, env)
            except OSError as exc:  # spawn this one and the rest
                self.warm_failed, self.zygote_note = True, f"workers spawned fresh: {exc}"
                return None
        zygote = self._zygote()
        if zygote is None:
            return None
        from .zygote import ZygoteError

        try:
            return zygote.spawn(run_dir, env)
        except ZygoteError as exc:  # spawn this one and the rest
            self.use_zygote, self.zygote_note = False, f"workers spawned fresh: {exc}"
            return None


def main() -> None:
    sys.exit(serve())


if __name__ == "__main__":
    main()
