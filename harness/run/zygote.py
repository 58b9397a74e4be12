"""A pre-imported process that forks one worker per cell: ``python -m abl.run.zygote``.

Every cell runs in its own process (a crash, a leak or an OOM in one cell
never touches another), but importing torch and loading the plugins costs
seconds per process. The zygote pays that once per ``abl run``: it imports
the trainer and loads the plugin registry, and then, for each cell the parent
asks for, forks a child that becomes the cell's worker (``abl.run.worker.run``)
with the imports already done.

The child is what a spawned worker would be: its own session (so the parent
stops it with ``killpg``), stdout and stderr appended to the run's
``worker.log``, the environment the parent gives it (``OMP_NUM_THREADS`` is
applied with ``torch.set_num_threads``, since torch read it at import), and
the default signal handlers. The zygote never runs a tensor op, never
initialises CUDA (it exits at start-up if a preload did) and starts no
thread, so forking it is safe. The parent starts it with
``TRITON_INTERPRET=1`` on a machine without a GPU, the only way Triton
kernels run there (Triton decides at import).

Protocol (one JSON object per line): the parent writes
``{"id": N, "run_dir": ..., "env": {...}}``; the zygote answers
``{"id": N, "pid": P}`` (or ``{"id": N, "error": ...}``) and, when a child
ends, ``{"exited": P, "code": C}`` (C as ``subprocess`` reports it: negative
for a signal). The zygote dies with its parent (``PR_SET_PDEATHSIG``) and
its children with it.
"""

from __future__ import annotations

import collections
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from ..pyexec import child_env, python
from ..store import rundir

READY = {"ready": True}


# ---------------------------------------------------------------- the zygote process


def _write(out: TextIO, obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def _child(run_dir: Path, env: dict[str, str], replies: int, requests: int) -> None:
    """In the forked child: become the cell's worker; never returns."""
    code = 1
    try:
        os.setsid()
        log = os.open(run_dir / rundir.LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # replaces the zygote's request pipe
        os.dup2(log, 1)  # and its reply pipe
        os.dup2(log, 2)
        for fd in {log, devnull, replies, requests} - {0, 1, 2}:
            os.close(fd)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        interpret = os.environ.get("TRITON_INTERPRET")
        os.environ.clear()
        os.environ.update(env)
        if interpret is not None:  # triton was imported under it; the child must say the same
            os.environ["TRITON_INTERPRET"] = interpret
        os.environ["ABL_WORKER_ORIGIN"] = "zygote"
        import torch

        threads = env.get("OMP_NUM_THREADS")
        if threads and threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))
        from .worker import run

        code = run(run_dir)
    except BaseException:  # noqa: BLE001 - whatever happens, the child must not return into the zygote
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


# what a worker imports on its way to step 1 besides the trainer: the cost model, the FLOP
# counter and the memory tracker (they pull in sympy through torch), the optimizer's dynamo checks
PRELOAD = ("abl.contracts.config", "abl.store.database", "abl.train.loop", "abl.run.worker", "abl.model.costmodel", "abl.model.flops", "abl.model.memory",
           "abl.store.cpupeak", "abl.analysis.health", "abl.model.shapecache", "abl.data.tokenstore", "abl.train.evaluations", "abl.model.decode",
           "torch.optim", "torch.utils.flop_counter", "torch._dynamo",
           "torch.distributed._tools.mem_tracker")


def preload() -> None:
    """What every worker would import: the trainer and what it reaches, the store, the plugins.
    Imports only: no tensor op runs and no thread starts before the zygote forks."""
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional part (no torch.distributed): the worker imports it
            pass
    from ..contracts.plugin_manager import get_registry

    get_registry()


def fork_unsafe() -> str | None:
    """Why this process must not fork workers (None: it may). A child of a process that
    initialised CUDA cannot use CUDA; a thread does not survive fork and its locks could
    stay held forever."""
    import torch

    if torch.cuda.is_initialized():
        return "CUDA was initialised while preloading; forking would break it"
    if threading.active_count() > 1:
        return "a thread started while preloading; forking would be unsafe"
    return None


def serve() -> int:
    from .worker import die_with_parent

    die_with_parent()
    # a Ctrl-C in the terminal reaches the whole foreground group: the parent stops the cells
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    preload()
    why = fork_unsafe()
    if why:  # the parent then spawns every worker fresh
        print(why, file=sys.stderr)
        return 3
    out = sys.stdout
    requests = sys.stdin.fileno()
    _write(out, READY)
    buf = b""
    children: set[int] = set()
    closing = False
    while not closing or children:
        if not closing:
            ready, _, _ = select.select([requests], [], [], 0.05)
            if ready:
                chunk = os.read(requests, 65536)
                if not chunk:
                    closing = True  # the parent is done: finish the running children, then exit
                buf += chunk
        else:
            time.sleep(0.05)
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                req = json.loads(line)
                run_dir, env = Path(req["run_dir"]), {str(k): str(v) for k, v in req["env"].items()}
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                _write(out, {"id": None, "error": f"bad request: {exc}"})
                continue
            out.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError as exc:
                _write(out, {"id": req.get("id"), "error": f"fork failed: {exc}"})
                continue
            if pid == 0:
                _child(run_dir, env, out.fileno(), requests)
            children.add(pid)
            _write(out, {"id": req.get("id"), "pid": pid})
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            children.discard(pid)
            _write(out, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})
    return 0


# ---------------------------------------------------------------- the parent's side


class ZygoteError(Exception):
    """The zygote could not start or could not fork a worker (the caller spawns one instead)."""


class Polled:
    """The part of ``subprocess.Popen`` the executor uses (``pid``, ``returncode``, ``poll``, ``wait``), for a
    cell whose exit code arrives as a message: ``_exit_code`` reads it (None while the cell runs)."""

    pid: int
    returncode: int | None = None

    def _exit_code(self) -> int | None:
        raise NotImplementedError

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._exit_code()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode


class Child(Polled):
    """A worker forked by the zygote."""

    def __init__(self, zygote: Zygote, pid: int):
        self.zygote, self.pid = zygote, pid
        self.returncode = None

    def _exit_code(self) -> int | None:
        return self.zygote.exit_code(self.pid)


class Zygote:
    """Starts ``python -m abl.run.zygote`` and forks workers through it."""

    def __init__(self, env: dict[str, str] | None = None, start_timeout: float = 300.0, wait: bool = True):
        """Start the zygote; with ``wait`` (the default) return once it is ready, else at once (its imports
        then overlap the caller's own start-up; ``ready()`` waits for them before the first fork)."""
        self.proc = subprocess.Popen(python("-m", "abl.run.zygote"), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(env), text=True,
                                     bufsize=1)
        self._lock = threading.Condition()
        self._replies: dict[int, dict[str, Any]] = {}
        self._exits: dict[int, int] = {}
        self._ready = False
        self._next = 0
        self._stderr: collections.deque[str] = collections.deque(maxlen=50)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.start_timeout = start_timeout
        self.started_at = time.monotonic()
        if wait:
            self.ready()

    @property
    def is_ready(self) -> bool:
        return self._ready

    def ready(self) -> None:
        """Wait until the zygote has preloaded (ZygoteError if it does not start)."""
        if self._ready:
            return
        deadline = self.started_at + self.start_timeout
        start_timeout = self.start_timeout
        with self._lock:
            while not (self._ready or self.proc.poll() is not None):
                if time.monotonic() > deadline:
                    self.kill()
                    raise ZygoteError(f"the zygote did not start within {start_timeout:g} s")
                self._lock.wait(0.2)
        if not self._ready:
            self.proc.wait()
            time.sleep(0.1)  # the stderr reader's last lines
            raise ZygoteError("the zygote exited at start-up: " + " | ".join(list(self._stderr)[-3:]))

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                if msg.get("ready"):
                    self._ready = True
                elif "exited" in msg:
                    self._exits[int(msg["exited"])] = int(msg["code"])
                elif msg.get("id") is not None:
                    self._replies[int(msg["id"])] = msg
                self._lock.notify_all()
        with self._lock:
            self._lock.notify_all()

    def _read_stderr(self) -> None:
        """Drain the zygote's own stderr (import warnings) so it can never block on a full pipe."""
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line.rstrip())

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, run_dir: Path, env: dict[str, str], timeout: float = 60.0) -> Child:
        with self._lock:
            if not self.alive:
                raise ZygoteError("the zygote is not running")
            self._next += 1
            rid = self._next
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(json.dumps({"id": rid, "run_dir": str(run_dir), "env": env}) + "\n")
                self.proc.stdin.flush()
            except OSError as exc:
                raise ZygoteError(f"the zygote is gone: {exc}") from None
            deadline = time.monotonic() + timeout
            while not (rid in self._replies or not self.alive):
                if time.monotonic() > deadline:  # a late fork must not become a second writer
                    self.proc.kill()
                    raise ZygoteError(f"the zygote did not fork within {timeout:g} s")
                self._lock.wait(0.2)
            reply = self._replies.pop(rid, None)
        if reply is None or "pid" not in reply:
            raise ZygoteError((reply or {}).get("error", "the zygote died"))
        return Child(self, int(reply["pid"]))

    def exit_code(self, pid: int) -> int | None:
        with self._lock:
            if pid in self._exits:
                return self._exits[pid]
        if not self.alive:
            # the zygote is gone, so its children got SIGTERM (PR_SET_PDEATHSIG): once this pid
            # no longer exists, it ended as if terminated
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return -signal.SIGTERM
            except PermissionError:
                pass
        return None

    def close(self) -> None:
        """No more cells: the zygote exits after its running children end."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass

    def kill(self) -> None:
        if self.alive:
            self.proc.kill()
        self.proc.wait()


def main() -> None:
    sys.exit(serve())


if __name__ == "__main__":
    main()
