"""Files a reader may open at any moment: written whole or not at all.

Every file abl writes for another process to read (a run folder's JSON and metrics,
a checkpoint, the per-store caches, the token store's tokenizers) goes through
``replacing``: the data is written to a temporary file beside the target and moved
over it with one ``os.replace``, so a reader sees the old file or the new one, never
half of one. When the writing fails (a full disk, a kill between the two steps is
the only exception), the temporary file is removed, so a failure leaves nothing
behind. This module is the ground floor: it imports only the standard library.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# the folder that holds the abl package's source (the repository of an editable install)
_SOURCE_ROOT = str(Path(__file__).resolve().parent.parent)


def temporary_beside(path: Path) -> Path:
    """A temporary name in ``path``'s folder, unique to this process (two writers never share one)."""
    return path.with_name(f"{path.name}.{os.getpid()}.tmp")


@contextmanager
def replacing(path: Path, fsync: bool = False) -> Iterator[Path]:
    """Yield a temporary path to write; on leaving the block it replaces ``path`` atomically.

    ``fsync``: flush the file to the disk before the replace, for files whose loss after a
    power cut would lose results (run status, metrics). If the block raises, the temporary
    file is removed and the exception goes on; ``path`` is untouched.
    """
    tmp = temporary_beside(path)
    try:
        yield tmp
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str, fsync: bool = False) -> None:
    """Replace ``path`` with ``text`` atomically (see ``replacing``); a short write raises (``write_sized``)."""
    size = len(text.encode())
    with replacing(path, fsync=fsync) as tmp:
        write_sized(tmp, size, lambda p: p.write_text(text, encoding="utf-8"))


def write_sized(path: Path, nbytes: int, write: Callable[[Path], object]) -> None:
    """Run ``write(path)``, which should leave ``nbytes`` bytes at ``path``, and check that it did.

    A write the storage refused is an OSError with its error number (ENOSPC, EIO ...), which abl's
    commands report as a full disk (abl.cli.common.storage_fault). Some writers report a short write
    without one (numpy's ``tofile``: an OSError with no errno, or a ValueError), or not at all: a file
    left short is that same storage error, OSError(ENOSPC when the disk is nearly full, else EIO)
    naming ``path``. An error that left the file whole is not the storage's: it goes on as it is."""
    try:
        write(path)
    except OSError as exc:
        if exc.errno is not None or _size(path) == nbytes:
            raise
        raise short_write(path, nbytes, str(exc)) from None
    except ValueError as exc:
        if _size(path) == nbytes:
            raise
        raise short_write(path, nbytes, str(exc)) from None
    if _size(path) != nbytes:
        raise short_write(path, nbytes, "no error was reported")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def short_write(path: Path, nbytes: int, why: str) -> OSError:
    """The OSError of a write that left ``path`` shorter (or longer) than ``nbytes`` bytes."""
    size = max(_size(path), 0)
    try:
        full = shutil.disk_usage(path.parent).free < max(nbytes - size, 0) + 2**20
    except OSError:
        full = False
    code = errno.ENOSPC if full else errno.EIO
    return OSError(code, f"short write, {size:,} of {nbytes:,} bytes written ({why or os.strerror(code)}); "
                         f"{'the disk is full' if full else 'the storage may be failing or full'}", str(path))


def write_json(path: Path, obj: Any, indent: int | None = 1, fsync: bool = False) -> None:
    """Replace ``path`` with ``obj`` as JSON (sorted keys) atomically (see ``replacing``)."""
    write_text(path, json.dumps(obj, indent=indent, sort_keys=True), fsync=fsync)


# ---------------------------------------------------------------- names that become paths

# the longest file or folder name most file systems take (ext4, APFS, NTFS: 255 bytes or units)
NAME_MAX = 255


class PathRefused(ValueError):
    """A user-supplied name cannot become a path where abl would put it (reported to the user, exit 2)."""


def confined(base: Path, name: str, what: str, *, user_path: bool = False) -> Path:
    """``base / name``, checked before anything is written there: the one way a user-supplied string
    becomes a path.

    A name from a file (an experiment name, a grid's ``db``, a plugin's key) must stay inside ``base``:
    an absolute name, ``..`` that climbs out, or a symbolic link that leads out is refused. A path the
    user typed on the command line (``user_path``: ``--out``, ``--runs-dir``) may point anywhere; it is
    only checked for what no file system takes. Either way an empty name, a NUL or a component over
    ``NAME_MAX`` bytes is refused. ``what`` names the setting in the message (``experiment.name``).
    Raises ``PathRefused``; returns the joined path (not resolved, as the user would read it).
    """
    if not isinstance(name, str) or not name.strip():
        raise PathRefused(f"{what} is empty; give a name")
    if "\0" in name:
        raise PathRefused(f"{what} holds a NUL character")
    long = [part for part in Path(name).parts if len(os.fsencode(part)) > NAME_MAX]
    if long:
        raise PathRefused(f"{what}: {long[0][:40]!r}... is {len(os.fsencode(long[0]))} bytes long, more than a "
                          f"file name may be ({NAME_MAX}); use a shorter one")
    path = Path(name) if user_path and Path(name).is_absolute() else Path(base) / name
    if user_path:
        return path
    inside = path.resolve().is_relative_to(Path(base).resolve()) and path.resolve() != Path(base).resolve()
    if Path(name).is_absolute() or not inside:
        raise PathRefused(f"{what} = {name!r} points outside {_shown(base)}; use a relative name inside it, "
                          "without '..'")
    return path


def _shown(base: Path) -> str:
    """A folder as a message names it: "the working directory", else as given."""
    if Path(base).resolve() == Path.cwd().resolve():
        return "the working directory"
    return f"{base}{os.sep}"


# ---------------------------------------------------------------- reading what others wrote


class NotRegularFile(OSError):
    """A path that is a FIFO, a device or a folder where a file was expected (never opened blocking)."""


def read_bytes(path: Path) -> bytes:
    """The bytes of the regular file at ``path``. Opened without blocking and checked before reading,
    so a FIFO (which would wait for a writer for ever), a device or a folder raises ``NotRegularFile``;
    any other failure is the OSError it is."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", str(path))
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


def read_json(path: Path, default: Any = None) -> Any:
    """The JSON in the file at ``path``, or ``default`` when it cannot be read as JSON for any reason:
    missing, a folder or FIFO, no permission, bytes that are not UTF-8, damaged or absurdly nested JSON.
    Run folders, caches and lock files are data another process (or person) wrote: never trusted whole."""
    try:
        return json.loads(read_bytes(path))
    except (OSError, ValueError, RecursionError):  # ValueError: JSONDecodeError, UnicodeDecodeError
        return default


# ---------------------------------------------------------------- paths in stored text


def short_path(path: str, roots: tuple[str, ...] = ()) -> str:
    """``path`` without the folders of the machine that ran it: relative to the import root that holds
    it (site-packages, the standard library, the working directory, abl's source folder, any of
    ``roots``), else under ``~``, else its name. A stored error travels with the store and its run
    folders (shared, copied, reported)."""
    full = os.path.abspath(path)
    found = {os.path.abspath(r) for r in (*sys.path, *roots) if r}
    found |= {os.getcwd(), os.path.dirname(os.__file__), _SOURCE_ROOT}
    for root in sorted((r for r in found if len(r) > 1), key=len, reverse=True):
        if full.startswith(root.rstrip(os.sep) + os.sep):
            return os.path.relpath(full, root)
    home = os.path.expanduser("~")
    if len(home) > 1 and full.startswith(home + os.sep):
        return "~" + full[len(home):]
    return os.path.basename(full)


# a traceback's or faulthandler's ``File "..."`` (a path may hold spaces there), then any bare absolute path:
# a slash not inside a word, a relative path, a URL (``https://host/...``) or ``~/``
_QUOTED_FILE = re.compile(r'File "([^"]+)"')
_BARE_PATH = re.compile(r"(?<![\w.~/:%+@=-])(?:/[\w.+@%=-]+)+")


def scrub_paths(text: str, roots: tuple[str, ...] = ()) -> str:
    """``text`` (a traceback, a log's last lines) with every absolute path shortened by ``short_path``."""
    text = _QUOTED_FILE.sub(lambda m: f'File "{short_path(m.group(1), roots)}"' if os.path.isabs(m.group(1))
                            else m.group(0), text)
    return _BARE_PATH.sub(lambda m: short_path(m.group(0), roots), text)
