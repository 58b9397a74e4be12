"""The per-cell worker process: ``python -m abl.run.worker RUN_DIR``.

Reads ``RUN_DIR/config.json`` (a resolved cell config), trains, and writes
only files in RUN_DIR (the protocol is harness/store/rundir.py); it never opens the
database:

- ``metrics.jsonl``: appended and flushed per line;
- ``info.json``: the environment and data facts of the run;
- ``status.json``: running, then completed, diverged, oom, failed or killed,
  with ``error`` for the last four.

Exit status: ``abl.contracts.status.EXIT_CODES`` (0 completed, 1 failed, 3 diverged, 4 oom,
5 killed).

Statuses tell the truth about signals and start-up:

- once SIGTERM or SIGINT has reached the worker (from ``abl run``, or as the
  parent-death signal when ``abl run`` itself was killed), whatever error
  follows is recorded as ``killed``: an exception raised in the middle of an
  import leaves odd errors behind (a RecursionError in numpy.linalg), and a
  plain re-run restarts a killed cell where a failed one would be skipped;
- a failure before training starts (importing torch, loading plugins or data,
  building the model), with no signal, is retried once in a fresh process
  (``os.execv``, same PID) before it is recorded as ``failed``; bad input that
  the parent validates (``ConfigError``, ``RegistryError``) is not retried.

A cell with ``train.checkpoint_every`` keeps ``checkpoint.pt`` until it
completes; a restarted worker resumes from it, keeping the metric rows up to
the checkpoint's step and writing the later ones again.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .. import files
from ..files import scrub_paths, short_path
from ..contracts.status import COMPLETED, DIVERGED, EXIT_CODES, FAILED, KILLED, OOM, RUNNING
from ..store import rundir


class Killed(BaseException):
    """SIGTERM / SIGINT reached the worker (or its parent died)."""


class _NotImported(Exception):
    """Never raised: stands for train.Diverged until train imports, so a failing import is recorded."""


# the name of the first signal that reached the worker (None: none did)
_signalled: str | None = None
# a fresh process retries a failed start-up once; this tells it that it is the retry
STARTUP_RETRY_ENV = "ABL_WORKER_STARTUP_RETRY"


# While the worker starts (imports torch and the plugins, builds the cell), a signal must not unwind
# the stack: an exception raised inside a half-imported C extension can end in std::terminate
# (SIGABRT, exit -6, status lost; seen under load). So during start-up the handler records the
# killed status itself and leaves at once with os._exit; once the cell is built, the signal is an
# exception again, which the training loop's clean-up needs. (run folder, status so far) or None.
_startup: tuple[Path, dict[str, Any]] | None = None


def _on_signal(signum, frame):
    global _signalled
    name = signal.Signals(signum).name
    _signalled = _signalled or name
    if _startup is not None:
        run_dir, status = _startup
        try:
            files.temporary_beside(run_dir / rundir.METRICS).unlink(missing_ok=True)  # a truncation cut short
            rundir.write_status(run_dir, {**status, "status": KILLED, "finished": time.time(),
                                          "error": f"stopped by signal {name} (during start-up)"})
        finally:
            os._exit(EXIT_CODES[KILLED])
    raise Killed(f"stopped by signal {name}")


def reset_globals() -> None:
    """Forget the last cell's signal and start-up state: a warm worker (abl.run.warm) runs the next one."""
    global _signalled, _startup
    _signalled, _startup = None, None


def signalled() -> str | None:
    """The name of the first signal that reached this worker's cell, if any."""
    return _signalled


class _Started:
    """Wraps the metrics sink: the first row written marks the end of start-up."""

    def __init__(self, sink: Any):
        self.sink, self.started = sink, False

    def log(self, step: int, metrics: dict) -> None:
        self.started = True
        self.sink.log(step, metrics)

    def close(self) -> None:
        self.sink.close()


def _retry_startup(run_dir: Path, error: str) -> None:
    """Run the worker again in a fresh process (same PID, so the parent keeps watching it)."""
    os.environ[STARTUP_RETRY_ENV] = error[-2000:]
    sys.stdout.flush()
    sys.stderr.flush()
    print(f"abl worker: start-up failed, retrying once in a fresh process:\n{error}", file=sys.stderr, flush=True)
    from ..pyexec import python

    os.environ["PYTHONSAFEPATH"] = "1"
    os.execv(sys.executable, python("-m", "abl.run.worker", str(run_dir)))


def die_with_parent() -> None:
    """Linux: have the kernel send SIGTERM to this worker when the parent dies.

    A worker must not outlive an ``abl run`` that was killed with SIGKILL,
    otherwise a resumed grid would have two writers on one run folder.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() == 1:  # the parent is already gone
        os.kill(os.getpid(), signal.SIGTERM)


def prepare_kernels(run_dir: Path) -> None:
    """Switch the Triton interpreter on for a CPU cell with ``train.kernels = "triton"``.

    Triton decides at import whether it interprets, and loading the plugins
    imports it, so this runs first, from the cell's config.json.
    """
    try:
        tc = json.loads((run_dir / rundir.CONFIG).read_text()).get("train", {})
    except (OSError, ValueError):
        return  # train() reports a broken config
    if tc.get("kernels") != "triton":
        return
    from ..kernels import resolve
    from ..train.loop import resolve_device

    try:  # resolving triton on a CPU switches the interpreter on
        resolve("triton", resolve_device(str(tc.get("device", "auto"))))
    except (RuntimeError, ValueError):
        return  # train() reports an unusable device or a too-late interpreter


def run_rank(run_dir: Path) -> int:
    """A non-zero rank of a torchrun cell: train, write nothing; rank 0 owns the folder."""
    from ..contracts.plugin_manager import get_registry
    from ..contracts.config import cell_from_config
    from ..train.loop import train

    registry = get_registry()
    cell = cell_from_config(json.loads((run_dir / rundir.CONFIG).read_text()), registry)
    checkpoint = run_dir / rundir.CHECKPOINT
    train(cell, registry, rundir.NullSink(), checkpoint_path=checkpoint if cell.train.checkpoint_every else None)
    return 0


def run(run_dir: Path) -> int:
    die_with_parent()
    from ..data.tokenstore import bind

    bind(run_dir)  # the token store entry the parent prepared for this cell (every rank)
    if int(os.environ.get("RANK", "0")) != 0:
        prepare_kernels(run_dir)
        return run_rank(run_dir)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    started = time.time()
    status: dict[str, Any] = {"status": RUNNING, "pid": os.getpid(), "host": socket.gethostname(), "started": started,
                              "origin": os.environ.get("ABL_WORKER_ORIGIN", "spawned")}
    first_try = os.environ.pop(STARTUP_RETRY_ENV, None)
    if first_try is not None:
        status["startup_retried"] = first_try
    rundir.write_status(run_dir, status)
    global _startup
    _startup = (run_dir, status)
    metrics_path = run_dir / rundir.METRICS
    checkpoint = run_dir / rundir.CHECKPOINT
    sink: _Started | None = None
    diverged: type[Exception] = _NotImported
    user_errors: tuple[type[Exception], ...] = ()
    retryable = True
    try:
        prepare_kernels(run_dir)
        from ..contracts.config import ConfigError
        from ..contracts.plugin_manager import get_registry
        from ..contracts.registry import RegistryError
        from ..contracts.config import cell_from_config
        from ..train.checkpoint import checkpoint_step
        from ..train.loop import train
        from ..train.state import Diverged

        diverged = Diverged
        user_errors = (ConfigError, RegistryError)

        # a restarted cell keeps the rows up to its checkpoint and writes the rest again
        resume_step = checkpoint_step(checkpoint)
        if resume_step is None:
            checkpoint.unlink(missing_ok=True)
        else:
            status["resumed_from_step"] = resume_step
            rundir.write_status(run_dir, status)
        rundir.truncate_metrics(metrics_path, resume_step)
        sink = _Started(rundir.JsonlSink(metrics_path))
        registry = get_registry()
        retryable = False  # a config.json that does not make a cell reads the same the second time
        config = json.loads((run_dir / rundir.CONFIG).read_text())
        cell = cell_from_config(config, registry)
        retryable = True
        _startup = None  # from here a signal is the Killed exception (the loop closes its files)
        summary = train(cell, registry, sink,
                        on_info=lambda info: rundir.write_json(run_dir / rundir.INFO, info),
                        checkpoint_path=checkpoint if cell.train.checkpoint_every else None,
                        shape_cache=_shape_cache(run_dir))
        status.update(status=COMPLETED)
        checkpoint.unlink(missing_ok=True)
        if summary.get("notes"):
            status["notes"] = "; ".join(summary["notes"])
    except Killed as exc:
        status.update(status=KILLED, error=str(exc))
    except diverged as exc:
        status.update(status=DIVERGED, error=str(exc))
    except Exception as exc:  # noqa: BLE001 - any failure is recorded, never lost
        tail = error_tail(exc)
        if _signalled is not None:  # the signal broke something on its way in: the cell was stopped
            status.update(status=KILLED, error=f"stopped by signal {_signalled} (then: {tail.splitlines()[-1]})")
        elif _is_oom(exc):
            status.update(status=OOM, error=oom_error(exc))
        else:
            status.update(status=FAILED, error=tail)
            in_startup = sink is None or not sink.started
            if in_startup and retryable and first_try is None and not isinstance(exc, user_errors) \
                    and int(os.environ.get("WORLD_SIZE", "1")) == 1:
                if sink is not None:
                    sink.close()
                _retry_startup(run_dir, tail)
    finally:
        if sink is not None and not sink.sink.f.closed:
            sink.close()
    status["finished"] = time.time()
    rundir.write_status(run_dir, status)
    return EXIT_CODES[status["status"]]


def _shape_cache(run_dir: Path) -> Path | None:
    """The shapes folder of the workspace this run folder belongs to (abl.store.workspace: meta.json
    says where the store is); None, when the folder does not say: measure everything."""
    from ..store.workspace import Workspace

    ws = Workspace.of_run_dir(run_dir)
    return ws.shapes if ws is not None else None


def error_tail(exc: BaseException, lines: int = 12) -> str:
    """The last ``lines`` lines of ``exc``'s traceback, each path in it shortened (abl.files.short_path)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).strip()
    return "\n".join(scrub_paths(text).splitlines()[-lines:])


def oom_error(exc: BaseException) -> str:
    """An allocation failure as stored: the error itself (what ran out, how much) and where it was raised,
    not a traceback's tail."""
    message = (str(exc).strip().splitlines() or [""])[0]
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (raised in {frames[-1].name}, {short_path(frames[-1].filename)}, line {frames[-1].lineno})" \
        if frames else ""
    return f"{type(exc).__name__}: {message}{where}"


def _is_oom(exc: BaseException) -> bool:
    """An allocation failure: MemoryError, torch's OutOfMemoryError (CUDA), or the RuntimeError
    torch's CPU allocator raises ("DefaultCPUAllocator: can't allocate memory")."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())


def main() -> None:
    if len(sys.argv) != 2:
        print("usage: python -m abl.run.worker RUN_DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(Path(sys.argv[1])))


if __name__ == "__main__":
    main()
