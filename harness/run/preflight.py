"""Checks ``abl run`` makes in the parent, after the grid is expanded and before the store is touched.

``config.load_grid`` already refuses what one cell's config can show wrong
(types, ranges, finite numbers, names, cross-axis checks). These checks need
the whole grid or the file system:

- ``grid_problems``: values the store's columns cannot hold (seeds, steps), and
  sweeps that change nothing (a grid over a parameter of a component no cell
  selects collapses to fewer runs than it names);
- ``db_problems``: a ``--db`` that cannot be a database (its folder is a file,
  it is a folder, it is some other file, it is not writable, its blocks are damaged).

Each returns one message per problem; ``check`` raises them together as a
``ConfigError`` (exit status 2, nothing written). ``warnings`` lists what
does not stop a run but must be said before it starts (``abl run
--dry-run`` prints them): an lr sweep whose remaining seeds cannot give a
verdict (abl.run.lr_sweep.seed_warnings).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

from .. import files
from ..contracts.config import ConfigError, Grid, canonical_json
from ..contracts.registry import AXES, Registry
from ..grid.gridfile import matches_exclude

# the store's INTEGER columns (runs.seed, metrics.step) are 32-bit
INT32_MAX = 2**31 - 1


def grid_problems(grid: Grid, registry: Registry) -> list[str]:
    out: list[str] = []
    seeds = sorted({c.seed for c in grid.cells})
    bad = [s for s in seeds if not -INT32_MAX - 1 <= s <= INT32_MAX]
    if bad:
        out.append(f"experiment.seeds: {bad[0]} is outside the store's 32-bit range "
                   f"(-2**31 .. 2**31-1); use a smaller seed")
    steps = max(c.train.steps for c in grid.cells)
    if steps > INT32_MAX:
        out.append(f"train.steps = {steps} (from train.steps or train.tokens) is more than the store's step "
                   f"column holds ({INT32_MAX})")
    out += ineffective_sweeps(grid)
    return [f"{grid.path}: {m}" for m in out]


def ineffective_sweeps(grid: Grid) -> list[str]:
    """Grid keys whose values all resolve to the same runs, so the grid silently has fewer runs.

    A sweep over a component's parameter that only some cells select is fine
    (docs/grids.md: such parameters apply only where the component is selected); one
    that no surviving cell feels is an error. A key whose other values were
    all excluded by ``grid.exclude`` was narrowed on purpose and is left alone.
    """
    axes = {p: v for p, v in _grid_axes(grid.raw).items() if len({canonical_json(x) for x in v}) > 1}
    out: list[str] = []
    excludes = grid.raw.get("grid", {}).get("exclude", []) if isinstance(grid.raw.get("grid"), dict) else []
    paths = list(_grid_axes(grid.raw))
    for path, values in axes.items():
        kept = {canonical_json(c.varied.get(path)) for c in grid.cells}
        if len(kept) > 1:
            continue
        wanted = {canonical_json(combo[paths.index(path)])
                  for combo in itertools.product(*(_grid_axes(grid.raw)[p] for p in paths))
                  if not any(matches_exclude(dict(zip(paths, combo)), ex, grid.raw) for ex in excludes)}
        if len(wanted) <= 1:
            continue  # the other values were excluded on purpose
        out.append(_collapse_message(grid, path, values))
    return out


def _grid_axes(raw: dict[str, Any]) -> dict[str, list]:
    g = raw.get("grid")
    if not isinstance(g, dict):
        return {}
    return {k: v for k, v in g.items() if k != "exclude" and isinstance(v, list)}


def _collapse_message(grid: Grid, path: str, values: list) -> str:
    head, *rest = path.split(".")
    n = len(grid.cells)
    if head in AXES and len(rest) == 2:
        name = rest[0]
        selector = AXES[head][0]
        chosen = sorted({_selected(c.components, head) for c in grid.cells} - {None}, key=str)
        chosen_s = ", ".join(repr(x) for x in chosen)
        return (f"grid sweeps {path} over {values!r}, but no cell selects {head} {name!r} ({selector} is "
                f"{chosen_s} in every cell), so every value gives the same run and the grid has {n} run(s); "
                f"select it ({selector} = \"{name}\", or sweep \"{selector}\") or drop the sweep")
    return (f"grid sweeps {path} over {values!r}, but every value resolves to the same run (another setting "
            f"overrides it, e.g. model.scale or train.match), so the grid has {n} run(s); drop the sweep or "
            f"the setting that overrides it")


def _selected(components: dict[str, Any], axis: str) -> Any:
    spec = components.get(axis)
    return spec["name"] if isinstance(spec, dict) else None


def db_problems(db_path: Path) -> list[str]:
    """Why ``db_path`` cannot be opened for writing as a DuckDB file (empty when it can)."""
    db = Path(db_path)
    try:
        files.confined(Path.cwd(), str(db), "--db", user_path=True)
    except files.PathRefused as exc:
        return [str(exc)]
    if db.is_dir():
        return [f"--db {db}: is a folder; give a database file, e.g. {db / 'abl.duckdb'}"]
    ancestor = db.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if ancestor.exists() and not ancestor.is_dir():
        return [f"--db {db}: {ancestor} is a file, not a folder"]
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return [f"--db {db}: cannot write in {ancestor} (permission denied)"]
    if db.exists():
        if not db.is_file():
            return [f"--db {db}: is not a regular file"]
        if not os.access(db, os.R_OK | os.W_OK):
            return [f"--db {db}: cannot read and write it (permission denied)"]
        if not _is_duckdb(db):
            what = "an empty file" if db.stat().st_size == 0 else "not a DuckDB database"
            return [f"--db {db}: exists but is {what}; give another path"]
        from ..store.database import StoreError, verify_store

        try:
            verify_store(db)
        except StoreError as exc:
            return [str(exc)]
    lock = db.with_name(db.name + ".lock")
    if lock.exists() and not lock.is_file():
        return [f"--db {db}: its lock file {lock} is not a file"]
    return []


def runs_dir_problems(runs_dir: Path, option: str = "--runs-dir") -> list[str]:
    """Why ``runs_dir`` cannot hold run folders (empty when it can): a name no file system takes,
    a regular file (or a file where one of its folders should be)."""
    try:
        files.confined(Path.cwd(), str(runs_dir), option, user_path=True)
    except files.PathRefused as exc:
        return [str(exc)]
    ancestor = Path(runs_dir)
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if ancestor.exists() and not ancestor.is_dir():
        what = "is a file" if ancestor == Path(runs_dir) else f"is inside {ancestor}, a file"
        return [f"{option} {runs_dir}: {what}, not a folder; give the folder of the run folders"]
    return []


def _is_duckdb(path: Path) -> bool:
    """DuckDB's main header carries the magic bytes ``DUCK`` at offset 8."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError:
        return False
    return head[8:12] == b"DUCK"


def warnings(grid: Grid) -> list[str]:
    """What the user should know before the grid runs (empty when nothing)."""
    from .lr_sweep import seed_warnings

    return seed_warnings(grid) + run_warnings(grid)


def run_warnings(grid: Grid) -> list[str]:
    """The warnings ``abl run`` prints itself (an lr sweep prints its seed warnings as it starts)."""
    return schedule_warnings(grid) + unused_tuning_seeds(grid)


def unused_tuning_seeds(grid: Grid) -> list[str]:
    """train.lr_tuning_seeds set without train.lr_sweep: nothing is tuned, so it changes nothing."""
    if not grid.cells or grid.cells[0].train.lr_sweep or grid.cells[0].train.lr_tuning_seeds == 1:
        return []
    return [f"train.lr_tuning_seeds = {grid.cells[0].train.lr_tuning_seeds} has no effect without train.lr_sweep: "
            "every cell trains at train.lr on every seed"]


def schedule_warnings(grid: Grid) -> list[str]:
    """A warm-up the grid asks for (train.warmup_steps given, swept or set) longer than the run: the
    learning rate never reaches train.lr. A warning, not a refusal, and none under the default warm-up:
    a few-step smoke test is common (docs/robustness.md)."""
    train, sweep = grid.raw.get("train"), grid.raw.get("grid")
    given = (isinstance(train, dict) and "warmup_steps" in train) or \
        (isinstance(sweep, dict) and "train.warmup_steps" in sweep)
    if not given:
        return []
    short = sorted({(c.train.steps, c.train.warmup_steps) for c in grid.cells
                    if c.train.warmup_steps > c.train.steps})
    if not short:
        return []
    steps, warm = short[0]
    more = f" (and {len(short) - 1} other steps/warm-up pair(s))" if len(short) > 1 else ""
    return [(f"train.warmup_steps={warm} is more than train.steps={steps}{more}: the learning rate never "
             f"reaches train.lr (it ends at {steps / warm:.2g} of it) and the cosine decay never starts")]


def check(grid: Grid, registry: Registry, db_path: Path | None = None) -> None:
    """Raise every problem of the grid (and of ``db_path``) together as a ConfigError."""
    errs = grid_problems(grid, registry)
    if db_path is not None:
        errs += db_problems(db_path)
    if errs:
        raise ConfigError(errs)
