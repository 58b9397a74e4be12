"""What every command of the ``abl`` command line shares: ``--plugins-dir``, user errors, the store's lock.

A user error (bad input, a busy store) is a clear message and exit status 2,
never a traceback. Imports stay lazy, so ``abl --help`` does not load torch.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import click


def _add_plugins_dirs(ctx, param, value):
    """``--plugins-dir``, before or after the command: each folder joins ``ABL_PLUGINS_DIR``
    (abl.contracts.plugin_manager loads every *.py file in it) before any plugin loads. Kept as typed (relative
    if it was relative, to this folder, which the workers share): runs record the folder as the user gave it."""
    if value:
        existing = [p for p in os.environ.get("ABL_PLUGINS_DIR", "").split(os.pathsep) if p]
        added = [str(d) for d in value]
        os.environ["ABL_PLUGINS_DIR"] = os.pathsep.join(existing + [d for d in added if d not in existing])
    return value


def plugins_dir_option(f):
    """The ``--plugins-dir`` option: on the group (``abl --plugins-dir D run ...``) and on every command
    that loads plugins (``abl run ... --plugins-dir D``)."""
    return click.option("--plugins-dir", type=click.Path(file_okay=False), multiple=True, expose_value=False,
                        is_eager=True, callback=_add_plugins_dirs,
                        help="Also load every *.py file in this folder as a plugin (repeatable).")(f)


def read_db_option(f):
    """The ``--db`` option of the commands that read a store (compare, report, ladder)."""
    from ..store.workspace import DEFAULT_DB

    return click.option("--db", "db_path", default=None,
                        help=f"DuckDB file to read (default: experiment.db of the grid, else {DEFAULT_DB}).")(f)


def fail(message: str) -> None:
    """A user error: a clear message, exit status 2, no traceback. The same problem found in
    several cells (``cell [LABEL]: ...`` lines) is one line naming them (abl.grid.validation)."""
    if "cell [" in message:
        from ..grid.validation import one_per_problem

        message = "\n".join(one_per_problem(message.split("\n")))
    ctx = click.get_current_context(silent=True)
    if ctx is not None:  # an unknown component: which plugin the command's store recorded for it, how to load it
        from ..store.provenance import plugin_hint

        params = ctx.params
        message = plugin_hint(message, params.get("db_path"), params.get("source") or params.get("grid_file"))
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def user_errors():
    """The exceptions that mean bad input or a busy store: each command turns them into ``fail``."""
    from ..contracts.config import ConfigError
    from ..files import PathRefused
    from ..contracts.plugin_manager import PluginLoadError
    from ..contracts.registry import RegistryError
    from ..data.corpus import DataError
    from ..run.admission import AdmissionError
    from ..store.database import StoreError
    from ..store.lock import StoreBusy

    return (ConfigError, RegistryError, PluginLoadError, DataError, StoreError, StoreBusy, AdmissionError, PathRefused)


def note_new_store(db: Path) -> bool:
    """Say so when a command that writes is about to start a new store: a misspelt ``--db`` folder
    would otherwise quietly split the results in two. The folder is created (docs/store.md).
    True when the note was printed (a command that then refuses its input says no store was made)."""
    if db.exists():
        return False
    missing = next((p for p in reversed([db.parent, *db.parent.parents]) if not p.exists()), None)
    created = f"; creating the folder {missing}" if missing is not None else ""
    click.echo(f"note: new store at {db} (no database there yet{created})", err=True)
    return True


def exit_now(code: int) -> None:
    """Exit at once, skipping the interpreter's finalisation, once everything is stored and the store's
    lock released. After Ctrl-C or SIGTERM that finalisation was most of the wait: tearing down torch
    alone takes 2 s on a busy machine, and the whole exit took 8.8-14.3 s under load (issue 27)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# a write the machine refused: full disk or quota, read-only or failing storage, a file too large
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EIO})


def storage_fault(exc: OSError, resume: str) -> None:
    """A fault mid-run, not bad input: a clear message (what could not be written, and why), exit 1.
    Re-raises any other OSError (a bug must keep its traceback)."""
    if exc.errno not in STORAGE_ERRNOS:
        raise exc
    where = f" writing {exc.filename}" if exc.filename else ""
    click.echo(f"error: {exc.strerror or exc}{where}. Nothing half-written was kept; {resume}", err=True)
    sys.exit(1)


def take_store_lock(db: Path, wait: bool):
    """Take the store's single-writer lock (abl.store.lock), or exit 2 naming its holder."""
    from ..store.lock import StoreBusy, StoreLock

    try:
        return StoreLock(db).acquire(wait=wait, on_wait=lambda msg: click.echo(msg, err=True))
    except StoreBusy as exc:
        fail(str(exc))


def remove_if_untouched(db: Path, lock_file: Path, fresh: list[Path]) -> None:
    """After bad input refused before anything was stored: remove the lock file (when the store
    does not exist) and the folders created for it (only while they are empty)."""
    if db.exists():
        return
    lock_file.unlink(missing_ok=True)
    for folder in fresh:  # innermost first
        try:
            folder.rmdir()
        except OSError:
            return


def load_registry():
    """Every component of every loaded plugin, or exit 2 with why a plugin did not load."""
    from ..contracts.plugin_manager import get_registry

    try:
        return get_registry()
    except user_errors() as exc:
        fail(str(exc))
