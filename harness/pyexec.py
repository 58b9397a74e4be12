"""The Python processes abl starts (workers, the zygote, a GPU probe, the dashboard's server) import abl as installed.

``python -m`` and ``python -c`` put the working directory first on the import path, so a plain
``abl/`` folder there (the parent of a clone named abl is the obvious case) would shadow the
installed package in every worker. Each child is started with ``-P`` (Python 3.11: no unsafe
path first) and ``PYTHONSAFEPATH=1`` in its environment, which also reaches the processes
it starts in turn (torchrun's ranks). ``PYTHONPATH`` still works. The ground floor: only
the standard library.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping


def python(*args: str) -> list[str]:
    """The command line of a child Python running ``args`` (e.g. ``"-m", "abl.run.worker", ...``)."""
    return [sys.executable, "-P", *args]


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with ``PYTHONSAFEPATH=1``."""
    out = dict(os.environ if env is None else env)
    out["PYTHONSAFEPATH"] = "1"
    return out
