"""A workspace: one store's folders, resolved once per command.

A store is a DuckDB file and the folders beside it: ``runs/`` (a run folder
per cell, abl.store.rundir), ``tokens/`` (the token store, abl.data.tokenstore),
``shapes/`` (measured model shapes and step times, abl.model.shapecache),
``reports/`` (``abl report``) and ``selftest/`` (``abl selftest``'s JSON
files). ``Workspace.resolve`` applies the one rule for which store a command
uses: ``--db``, else the grid's ``experiment.db``, else ``DEFAULT_DB``; every
folder is derived from it here and nowhere else (``--runs-dir`` moves the run
folders only).

A worker finds its workspace through its run folder (``of_run_dir``): the
parent records where the store is, relative to the run folder, in meta.json
(``record``), as the token store's link is recorded (abl.data.tokenstore.link_run).
Plain paths only: nothing here opens the store.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import rundir

DEFAULT_DB = "results/abl.duckdb"
RUNS_DIR = "runs"
TOKENS_DIR = "tokens"  # abl.data.tokenstore.TOKENS_DIR, not imported: ``abl --help`` stays light (numpy unloaded)
REPORTS_DIR = "reports"
SELFTEST_DIR = "selftest"
SHAPES_DIR = rundir.SHAPES_DIR
META_KEY = "store"  # meta.json: the database, relative to the run folder (absolute across drives)
OLD_META_KEY = "shape_cache"  # meta.json of run folders written before the workspace: the shapes folder, absolute


@dataclass(frozen=True)
class Workspace:
    """A store's database and its folders (paths as given, not resolved: messages name them as typed)."""

    db: Path
    runs: Path
    tokens: Path
    shapes: Path
    reports: Path
    selftest: Path

    @classmethod
    def at(cls, db: str | os.PathLike[str], runs: str | os.PathLike[str] | None = None) -> Workspace:
        """The workspace of the database ``db``; ``runs`` (``--runs-dir``) moves the run folders only."""
        db = Path(db)
        home = db.parent
        return cls(db=db, runs=Path(runs) if runs else home / RUNS_DIR, tokens=home / TOKENS_DIR,
                   shapes=home / SHAPES_DIR, reports=home / REPORTS_DIR, selftest=home / SELFTEST_DIR)

    @classmethod
    def resolve(cls, db_option: str | os.PathLike[str] | None, grid: Any = None,
                runs_option: str | os.PathLike[str] | None = None) -> Workspace:
        """The rule, once: ``--db`` (``db_option``), else the grid's ``experiment.db``, else ``DEFAULT_DB``."""
        return cls.at(db_option or experiment_db(grid) or DEFAULT_DB, runs_option)

    def record(self, run_dir: Path) -> dict[str, str]:
        """What meta.json of ``run_dir`` holds so that its worker finds this workspace (``of_run_dir``):
        the database's path relative to the run folder, so a store moved whole keeps working."""
        db = self.db.resolve()
        try:
            where = os.path.relpath(db, run_dir.resolve())
        except ValueError:  # another drive
            where = str(db)
        return {META_KEY: where}

    @classmethod
    def of_run_dir(cls, run_dir: Path, meta: dict[str, Any] | None = None) -> Workspace | None:
        """The workspace whose run folder ``run_dir`` is, from its meta.json (``record``); None when the
        folder does not say (a folder made by hand, a damaged meta.json). An older folder that named
        only its absolute shape cache gets a workspace around that folder."""
        if meta is None:
            meta = rundir.read_json(run_dir / rundir.META, {})
        if not isinstance(meta, dict):
            return None
        where = meta.get(META_KEY)
        if isinstance(where, str) and where:
            return cls.at((run_dir / where).resolve(), run_dir.resolve().parent)
        old = meta.get(OLD_META_KEY)
        if isinstance(old, str) and old:  # only the shapes folder is known: the database's name is a guess
            return replace(cls.at(Path(old).parent / Path(DEFAULT_DB).name, run_dir.resolve().parent),
                           shapes=Path(old))
        return None


def experiment_db(grid: Any) -> str:
    """The grid's ``experiment.db`` ("" when it names none, or there is no grid)."""
    cells = getattr(grid, "cells", None) or []
    return (getattr(cells[0].experiment, "db", "") or "") if cells else ""
