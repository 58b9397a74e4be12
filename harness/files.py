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

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


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
    """Replace ``path`` with ``text`` atomically (see ``replacing``)."""
    with replacing(path, fsync=fsync) as tmp:
        tmp.write_text(text)


def write_json(path: Path, obj: Any, indent: int | None = 1, fsync: bool = False) -> None:
    """Replace ``path`` with ``obj`` as JSON (sorted keys) atomically (see ``replacing``)."""
    write_text(path, json.dumps(obj, indent=indent, sort_keys=True), fsync=fsync)
