"""One writer per store: a lock file beside the database.

``abl run`` and ``abl ingest`` hold ``<database>.lock`` (e.g.
``results/abl.duckdb.lock``) from before they first touch the store until they
exit. A second writer is refused at once with the holder's PID and command
(``StoreBusy``), or, with ``wait=True`` (``--wait``), queues until the holder
is done.

The lock is the kernel's (``fcntl.flock`` on the open lock file), so it ends
with the process that holds it, however that process ends: a lock file left
behind by a killed ``abl run`` names a dead PID and is simply taken over, and
two processes taking it over at once cannot both get it. The file's content
(holder PID, command line, host, start time) is only what the refusal message
shows. The holder deletes the file when it releases the lock (no empty lock
file stays beside the store, issue 27): a process that opened the old file and
waited on it finds, once it has the lock, that the path no longer names the
file it locked, and starts again on the new one, so two processes never both
hold "the" lock.

The run folders' workers never take the lock: they never open the database
(harness/store/rundir.py), and they are children of the holder, which does not
hand the lock's descriptor down (Python opens files non-inheritable).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

from .. import files
from .rundir import pid_alive

try:
    import fcntl
except ImportError:  # not POSIX: no kernel lock, the single-writer guarantee is off
    fcntl = None  # type: ignore[assignment]


class StoreBusy(Exception):
    """Another process writes this store (a user error: exit status 2)."""


def lock_path(db_path: str | Path) -> Path:
    p = Path(db_path)
    return p.with_name(p.name + ".lock")


def read_holder(path: Path) -> dict[str, Any]:
    """What the lock file says about its holder ({} if unreadable)."""
    obj = files.read_json(path, {})  # a FIFO or folder there never blocks
    return obj if isinstance(obj, dict) else {}


def describe(holder: dict[str, Any]) -> str:
    if not holder or (holder.get("host") == socket.gethostname() and not pid_alive(holder.get("pid"))):
        return "another process (it is starting and has not written its name yet)"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"])) \
        if isinstance(holder.get("started"), (int, float)) else "?"
    host = holder.get("host")
    where = f" on {host}" if host and host != socket.gethostname() else ""
    return f"PID {holder.get('pid', '?')}{where} ({holder.get('command', '?')}; since {since})"


class StoreLock:
    """The single-writer lock of one database; a context manager."""

    def __init__(self, db_path: str | Path, command: str | None = None):
        self.db_path = Path(db_path)
        self.path = lock_path(db_path)
        self.command = command or " ".join(["abl", *sys.argv[1:]])
        self._fd: int | None = None
        # the holder a lock file still named when this process took it, if that process was gone
        self.took_over: dict[str, Any] | None = None

    def _try(self) -> bool:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if fcntl is None:
                self._fd = fd
                return True
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            except OSError:
                # a file system without flock (some network mounts): say so rather than pretend
                os.close(fd)
                raise StoreBusy(f"cannot lock {self.path}: its file system does not support locks; "
                                "put the database on a local disk") from None
            if self._still_named(fd):
                self._fd = fd
                return True
            os.close(fd)  # its holder deleted it on release after this process opened it: take the new one

    def _still_named(self, fd: int) -> bool:
        """Whether the lock file's path still names the file open as ``fd``."""
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path))
        except FileNotFoundError:
            return False

    def acquire(self, wait: bool = False, poll_s: float = 0.5,
                on_wait: Callable[[str], None] | None = None) -> "StoreLock":
        """Take the lock; ``StoreBusy`` if another process has it (unless ``wait``)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            got = self._try()
        except OSError as exc:
            raise StoreBusy(f"cannot create the lock file {self.path}: {exc.strerror or exc}") from None
        told = False
        while not got:
            holder = read_holder(self.path)
            if not wait:
                raise StoreBusy(
                    f"{self.db_path} is being written by {describe(holder)}; one writer per store. "
                    "Wait for it to finish, pass --wait to queue behind it, or use another --db")
            if not told and on_wait is not None:
                on_wait(f"waiting for {describe(holder)} to finish writing {self.db_path} ...")
                told = True
            time.sleep(poll_s)
            got = self._try()
        previous = read_holder(self.path)
        self._write({"pid": os.getpid(), "command": self.command, "host": socket.gethostname(),
                     "started": time.time(), "db": str(self.db_path)})
        self.took_over = previous if previous.get("pid") not in (None, os.getpid()) and \
            not pid_alive(previous.get("pid")) else None
        return self

    def _write(self, holder: dict[str, Any]) -> None:
        assert self._fd is not None
        data = json.dumps(holder).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            if fcntl is not None:  # deleted while held: whoever waits on it takes the next file
                self.path.unlink(missing_ok=True)
            else:
                os.ftruncate(self._fd, 0)
        finally:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> "StoreLock":
        if self._fd is None:
            self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
