"""Grid files: a path -> TOML -> overrides -> expansion into validated cells with stable run ids.

The schema of a grid file (its tables and the typed configs) is abl.contracts.config; the text and
``--set`` overrides are abl.grid.parsing; the checks and the resolution of one cell are
abl.grid.validation.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

from ..contracts.config import SECTIONS, Cell, ConfigError, Grid, canonical_json, section_params
from ..contracts.registry import AXES, Registry, RegistryError
from .labels import SEP, grid_label, show
from .ladder import budget_steps, parse_ladder, size_values
from .parsing import apply_override, parse_overrides, read_toml
from .recipes import apply_recipe
from .validation import (
    build_section,
    check_structure,
    parse_grid,
    check_output_path,
    one_per_problem,
    known_path,
    resolve_cell,
)


def matches_exclude(varied: dict[str, Any], exclude: dict[str, Any], raw: dict) -> bool:
    for path, value in exclude.items():
        if path in varied:
            if varied[path] != value:
                return False
        else:
            node: Any = raw
            for part in path.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            if node != value:
                return False
    return True


def count_points(axes: dict[str, list], excludes: list[dict], raw: dict,
                 stop_above: int | None = None) -> tuple[int, bool]:
    """(how many grid points the ``[grid]`` axes give once ``exclude`` has removed its matches, whether that
    count is exact), found without resolving or copying anything: the axes that no exclude names only
    multiply the count, so only the combinations of the named ones are walked. With ``stop_above`` the walk
    stops once the count passes it, and the count returned (not exact) is only known to be larger."""
    named = [p for p in axes if any(p in ex for ex in excludes)]
    free = 1
    for p, values in axes.items():
        if p not in named:
            free *= len(values)
    if not named:  # no exclude, or one on fixed settings only: it removes every point or none
        return (0 if any(matches_exclude({}, ex, raw) for ex in excludes) else free), True
    count = 0
    for combo in itertools.product(*(axes[p] for p in named)):
        varied = dict(zip(named, combo))
        if not any(matches_exclude(varied, ex, raw) for ex in excludes):
            count += free
            if stop_above is not None and count > stop_above:
                return count, False
    return count, True


def check_max_runs(axes: dict[str, list], excludes: list[dict], raw: dict, seeds: list[int], max_cells: int,
                   source: str) -> None:
    """``--max-cells``, before any cell is resolved: the runs are the grid points times the seeds (points
    that resolve to the same run count once each). Raises ConfigError."""
    # the count is exact up to 100,000 points (a fraction of a second); a larger one stops there
    points, exact = count_points(axes, excludes, raw, stop_above=max(max_cells // len(seeds), 100_000))
    runs = points * len(seeds)
    if runs > max_cells:
        seeds_text = f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''}"
        many = f"{'' if exact else 'at least '}{runs:,} runs ({points:,} grid points x {seeds_text})"
        raise ConfigError(f"{source}: the grid has {many}, more than --max-cells={max_cells}")


def with_values(base: dict, varied: dict[str, Any]) -> dict:
    """``base`` (the grid file's tables) with one point's ``[grid]`` values set: the tables on each
    value's path are copied, the others shared with ``base`` (nothing downstream writes into them; a
    value itself is copied, as a cell may hold it), so a point costs no deep copy of the whole file."""
    out = dict(base)
    for path, value in varied.items():
        parts = path.split(".")
        node = out
        for part in parts[:-1]:
            inner = node.get(part)
            if inner is not None and not isinstance(inner, dict):
                raise ConfigError(f"--set {path}: {part!r} is not a table")
            node[part] = dict(inner) if inner is not None else {}
            node = node[part]
        node[parts[-1]] = copy.deepcopy(value) if isinstance(value, (list, dict)) else value
    return out


def packaged_grids() -> dict[str, Path]:
    """The grid files shipped inside the ``abl`` distribution, by name (``norms``, ...)."""
    from importlib.resources import files

    folder = Path(str(files("abl.ablations")))
    return {p.stem: p for p in sorted(folder.glob("*.toml"))}


def names_grid_file(source: str) -> bool:
    """Does ``source`` (a grid file or an experiment name, as ``abl report``/``compare`` take) name a grid
    file? A name no file system takes (a component over 255 bytes) is not one."""
    try:
        return Path(source).is_file() or (source.endswith(".toml") and resolve_grid_path(source).is_file())
    except (OSError, ValueError):
        return False


def resolve_grid_path(path: str | Path) -> Path:
    """A grid file by path; where none exists, a shipped grid of that name.

    ``norms``, ``norms.toml`` and ``ablations/norms.toml`` all name the packaged
    ``norms`` grid when the working folder has no such file, so the shipped
    grids work from a non-editable install too.
    """
    p = Path(path)
    if p.exists() or p.parent not in (Path("."), Path("ablations")):
        return p
    shipped = packaged_grids().get(p.name[:-5] if p.name.endswith(".toml") else p.name)
    return shipped if shipped is not None else p


def missing_grid_message(path: str | Path) -> str:
    """``PATH: no such file``, with the closest shipped grid name (``nrms`` -> ``norms``) or file
    beside it, and the names of the shipped grids."""
    import difflib

    p = Path(path)
    shipped = packaged_grids()
    stem = p.name.removesuffix(".toml")
    close = difflib.get_close_matches(stem, list(shipped), n=1, cutoff=0.6)
    hint = ""
    if close and p.parent in (Path("."), Path("ablations")):
        hint = f"; did you mean {close[0]!r} (the shipped grid {close[0]})?"
    elif p.parent.is_dir():  # stems compared: a shared ".toml" made mygrid.toml look close to typo.toml
        beside = {q.name.removesuffix(".toml"): q.name for q in sorted(p.parent.glob("*.toml"))}
        near = difflib.get_close_matches(stem, list(beside), n=1, cutoff=0.7)
        if near:
            hint = f"; did you mean {str(p.parent / beside[near[0]])!r}?"
    return f"{p}: no such file{hint} (the shipped grids, usable by name: {', '.join(shipped)})"


def load_grid(
    path: str | Path,
    registry: Registry,
    overrides: list[str] | None = None,
    max_cells: int | None = None,
) -> Grid:
    """Read, override, expand and validate a grid file. Raises ConfigError."""
    path = resolve_grid_path(path)
    if not path.exists() and not path.is_symlink():  # a dangling or looping link: read_toml says which
        raise ConfigError(missing_grid_message(path))
    raw = read_toml(path)
    if not raw:
        raise ConfigError(f"{path}: the grid file is empty; it needs at least an [experiment] or [model] "
                          "table (see ablations/*.toml)")
    parsed = parse_overrides(overrides or [])
    errs = swept_override_errors(raw, parsed, registry)
    if errs:
        raise ConfigError([f"{path}: {m}" for m in errs])
    for key, value in parsed:
        apply_override(raw, key, value)
    grid = _expand(raw, registry, path, max_cells)
    if is_shipped(path) and "experiment.name" not in {k for k, _ in parsed}:
        foreign = plugin_components(grid.cells, registry)
        if foreign:  # a plugin's cells never join the shipped experiment unless told to
            shipped_name = grid.cells[0].experiment.name
            raw.setdefault("experiment", {})["name"] = f"{shipped_name}+{'+'.join(sorted(set(foreign.values())))}"
            grid = _expand(raw, registry, path, max_cells)
            grid.notes.append(
                f"{', '.join(sorted(foreign))} come(s) from a plugin, not from abl: this grid's runs are stored as "
                f"experiment {grid.cells[0].experiment.name!r}, apart from the shipped {shipped_name!r} "
                f"(--set experiment.name=... chooses the name)")
    return grid


def is_shipped(path: str | Path) -> bool:
    """Is ``path`` one of the grid files shipped with abl (abl.ablations)?"""
    try:
        return Path(path).resolve() in {p.resolve() for p in packaged_grids().values()}
    except OSError:
        return False


def plugin_components(cells: list[Cell], registry: Registry) -> dict[str, str]:
    """``{"norm 'dyt' (abl-dyt)": "dyt"}``: every component of ``cells`` that a plugin, not abl, registered."""
    from ..contracts.plugin_manager import SELF_DIST

    out: dict[str, str] = {}
    for cell in cells:
        specs = [(axis, spec) for axis, spec in cell.components.items() if axis != "layer_mixers"]
        specs += [("mixer", spec) for spec in cell.components.get("layer_mixers") or []]
        for axis, spec in specs:
            if not isinstance(spec, dict) or "name" not in spec:
                continue
            try:
                comp = registry.get(axis, spec["name"])
            except RegistryError:
                continue
            if comp.package != SELF_DIST:
                out[f"{axis} {comp.name!r} ({comp.package})"] = comp.name
    return out


def _expand(raw: dict, registry: Registry, path: Path, max_cells: int | None) -> Grid:
    try:
        return expand(raw, registry, source=str(path), max_cells=max_cells)
    except RecursionError:  # values nested deeper than the checks' recursion (tomllib took them)
        raise ConfigError(f"{path}: values nested too deeply (lists or tables inside each other hundreds "
                          "of levels down); a grid file needs a few levels at most") from None


def expand(raw: dict, registry: Registry, source: str = "<grid>", max_cells: int | None = None) -> Grid:
    errs = check_structure(raw, registry)
    axes, excludes, gerrs = parse_grid(raw, registry)
    errs += gerrs
    ladder, lerrs = parse_ladder(raw, registry)
    errs += lerrs
    exp_raw = raw.get("experiment", {}) if isinstance(raw.get("experiment"), dict) else {}
    exp, e = build_section("experiment", exp_raw)
    errs += e
    if exp is not None and exp.db:
        errs += check_output_path("experiment.db", exp.db)
    if errs:
        raise ConfigError([f"{source}: {m}" for m in errs])
    assert exp is not None
    if max_cells is not None:  # refused before any cell is resolved
        sized = {**axes, "ladder.size": list(range(len(ladder.sizes)))} if ladder else axes
        check_max_runs(sized, excludes, raw, exp.seeds, max_cells, source)
    base = copy.deepcopy({k: v for k, v in raw.items() if k not in ("grid", "ladder")})
    memo: dict = {}  # what the cells share, resolved once (abl.grid.validation.resolve_cell)
    cells: list[Cell] = []
    seen: set[str] = set()
    paths = list(axes)
    n_points = 0
    # each value's part of the labels, shown once (abl.grid.labels.grid_label joins the same parts)
    parts = [[f"{p.split('.')[-1]}={show(v)}" for v in axes[p]] for p in paths]
    # a ladder's sizes are a tied outer axis: every point of the other axes at every size (abl.grid.ladder)
    sizes: list[dict[str, Any]] = [size_values(ladder, i) for i in range(len(ladder.sizes))] if ladder else [{}]
    points = [(size, picks) for size in sizes
              for picks in itertools.product(*(range(len(axes[p])) for p in paths))]
    for index, (size, picks) in enumerate(points):
        varied = {**size, **{p: axes[p][i] for p, i in zip(paths, picks)}}
        if any(matches_exclude(varied, ex, raw) for ex in excludes):
            continue
        label = SEP.join([f"{p.split('.')[-1]}={show(v)}" for p, v in size.items()] +
                         [parts[n][i] for n, i in enumerate(picks)]) or "base"
        n_points += 1
        cell_raw = with_values(base, varied)
        if ladder and ladder.lr == "per-size":
            cell_raw["train"] = {**(cell_raw.get("train") or {}), "lr": ladder.lrs[sizes.index(size)]}
        cell_raw, e = apply_recipe(cell_raw, registry)
        if e:
            errs += [f"{source}: cell [{grid_label(varied)}]: {m}" for m in e]
            continue
        if ladder and ladder.tokens_per_param:  # the size's token budget, from its non-embedding parameters
            probe, e = resolve_cell(cell_raw, exp.seeds[0], varied, registry, memo, label)
            if e or probe is None:
                errs += [f"{source}: cell [{grid_label(varied)}]: {m}" for m in e]
                continue
            steps = budget_steps(probe, registry, ladder.tokens_per_param)
            cell_raw["train"] = {**(cell_raw.get("train") or {}), "steps": steps}
        for seed in exp.seeds:
            cell, e = resolve_cell(cell_raw, seed, varied, registry, memo, label)
            if e:
                errs += [f"{source}: cell [{grid_label(varied)}]: {m}" for m in e]
                break
            assert cell is not None
            cell.grid_paths, cell.grid_index = ([ladder.axis] if ladder else []) + list(paths), index
            if cell.run_id in seen:  # two grid points resolving to the same run
                continue
            seen.add(cell.run_id)
            cells.append(cell)
    if not errs and cells and cells[0].train.lr_sweep:
        errs += [f"{source}: {m}" for m in check_lr_sweep(cells[0].train.lr_sweep, exp.seeds, paths,
                                                                  cells[0].train.lr_tuning_seeds)]
    if not errs and cells and cells[0].train.match != "none":
        from ..model.matching import match_cells

        errs += [f"{source}: {m}" for m in match_cells(cells, registry)]
        # cells that became identical once resized are one run
        cells = list({c.run_id: c for c in cells}.values())
    if errs:
        # one message per distinct problem, however many cells share it
        raise ConfigError(one_per_problem(errs, n_cells=n_points))
    if not cells:
        raise ConfigError(f"{source}: the grid is empty (every cell was excluded)")
    if max_cells is not None and len(cells) > max_cells:
        raise ConfigError(f"{source}: the grid has {len(cells)} runs, more than --max-cells={max_cells}")
    grid = Grid(path=source, raw=raw, cells=cells, grid_paths=([ladder.axis] if ladder else []) + paths)
    if ladder:
        grid.notes.append(f"ladder: {ladder.rule()}")
    return grid


def check_lr_sweep(values: Any, seeds: list, grid_paths: list[str], tuning_seeds: int = 1) -> list[str]:
    """Problems with ``train.lr_sweep`` in a grid (abl.run.lr_sweep runs it)."""
    errs = []
    if not isinstance(values, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                               and 0 < v < float("inf") for v in values):
        errs.append(f"train.lr_sweep must be a list of positive learning rates, got {values!r}")
    elif len(set(values)) != len(values):
        errs.append(f"train.lr_sweep has duplicates: {values!r}")
    if len(seeds) < tuning_seeds + 1:
        first = "the first tunes" if tuning_seeds == 1 else f"train.lr_tuning_seeds = {tuning_seeds}: the first " \
                                                             f"{tuning_seeds} tune"
        errs.append(f"train.lr_sweep needs at least {tuning_seeds + 1} seeds ({first}, the others compare); "
                    f"experiment.seeds = {seeds!r}")
    if "train.lr" in grid_paths:
        errs.append("train.lr is both a grid axis and swept by train.lr_sweep; use one of them")
    if "train.lr_tuning_seeds" in grid_paths:
        errs.append("train.lr_tuning_seeds cannot be a grid axis: it sets how the whole sweep tunes")
    return errs


def value_errors(path: str, value: Any, registry: Registry) -> list[str]:
    """Why ``value`` cannot be set at the dotted ``path`` (empty when it can)."""
    msg = known_path(path, registry)
    if msg:
        return [msg]
    head, *rest = path.split(".")
    if head in SECTIONS:
        if path == "experiment.seeds":
            ok = isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool)
                                                           for v in value)
            return [] if ok else [f"experiment.seeds must be a non-empty list of integers, got {value!r}"]
        errs = [f"{head}.{m}" for m in section_params(SECTIONS[head])[rest[0]].check(rest[0], value)]
        axis = next((a for a, (sel, _) in AXES.items() if sel == path), None)
        if axis is not None and not errs:
            try:
                registry.get(axis, value)
            except RegistryError as exc:
                errs.append(f"{path}: {exc}")
        return errs
    comp = registry.get(head, rest[0])
    return [f"{path}: {m}" for m in comp.params[rest[1]].check(rest[1], value)]


def swept_override_errors(raw: dict, overrides: list[tuple[str, Any]], registry: Registry) -> list[str]:
    """A ``--set`` on a key the grid sweeps would be overwritten by every cell: refuse it,
    say how to override the sweep, and check the value anyway."""
    grid = raw.get("grid")
    swept: dict[str, Any] = grid if isinstance(grid, dict) else {}
    errs: list[str] = []
    for key, value in overrides:
        if key == "grid" or key.startswith("grid.") or key not in swept:
            continue
        example = canonical_json([value]).replace(",", ", ")
        errs.append(f"--set {key}={value!r}: the grid sweeps {key} over {swept[key]!r}, so this would be "
                    f"ignored; to replace the sweep, --set 'grid.{key}={example}'")
        errs += value_errors(key, value, registry)
    return errs
