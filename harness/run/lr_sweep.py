"""Fair learning rates: every variant compared at its own best learning rate.

A comparison at one shared learning rate favours the variants that happen to
like it; published ablations that skip tuning are a known source of false
wins. With ``train.lr_sweep = [1e-3, 3e-3, 1e-2]`` a grid runs in two phases:

1. tuning: every cell of the grid at every learning rate of the sweep, on the
   first seed only, in the experiment ``<name>.lr_tuning``;
2. comparison: each variant (a cell of the grid) at the learning rate that
   gave its lowest final ``val_loss`` in phase 1, on the remaining seeds, in
   the experiment ``<name>``. A learning rate whose run did not complete, or
   did not learn (abl.analysis.health), is never chosen while another
   learned. A variant that learned at no learning rate of the sweep (on a
   task, a mixer that never leaves the no-recall baseline) still goes to
   phase 2, at the completed run's lowest final ``val_loss``, with a warning:
   its phase-2 runs are flagged "did not learn" there, which is the finding
   (leaving it out would hide it). A variant with no completed tuning run is
   left out of phase 2.

The tuning seed is kept out of phase 2, so picking the best learning rate on
it does not bias the comparison (the selection and the test use different
seeds). Each phase-2 run records what was swept and which learning rate won
under ``config["lr_tuned"]`` (so in its run id), and its label ends with
``lr=<chosen>``: every summary and report says which learning rate each
variant got. ``abl compare <name>`` compares the phase-2 runs.

Two warnings (printed by ``abl run``, ``--dry-run`` included, and by the
sweep itself): ``seed_warnings`` when the seeds left after the tuning seed
are fewer than the statistics need for a verdict (abl.analysis.stats'
``MIN_SEEDS``; below it every comparison ends "too few seeds to decide"),
and ``edge_warnings`` after phase 1 when a variant's best learning rate is
the lowest or the highest of the sweep, so its best may lie outside it.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any, Hashable

from ..contracts.config import Cell, Grid, run_id_of
from ..grid.gridfile import expand

TUNING_SUFFIX = ".lr_tuning"


def _raw(grid: Grid) -> dict:
    raw = copy.deepcopy(grid.raw)
    raw.setdefault("train", {})["lr_sweep"] = []
    raw.setdefault("grid", {})["train.lr"] = [float(v) for v in grid.cells[0].train.lr_sweep]
    return raw


def variant(cell: Cell) -> str:
    """The grid cell a run belongs to, whatever its learning rate."""
    return json.dumps({k: v for k, v in cell.varied.items() if k != "train.lr"}, sort_keys=True, default=str)


def tuning_grid(grid: Grid, registry) -> Grid:
    """Phase 1: every cell at every swept learning rate, first seed, experiment ``<name>.lr_tuning``."""
    raw = _raw(grid)
    exp = raw.setdefault("experiment", {})
    exp["name"] = grid.cells[0].experiment.name + TUNING_SUFFIX
    exp["seeds"] = [grid.cells[0].experiment.seeds[0]]
    return expand(raw, registry, source=grid.path)


def final_grid(grid: Grid, registry, best: dict[str, float]) -> Grid:
    """Phase 2: each variant at its best learning rate (``best``: variant -> lr), on the other seeds."""
    raw = _raw(grid)
    raw.setdefault("experiment", {})["seeds"] = list(grid.cells[0].experiment.seeds[1:])
    full = expand(raw, registry, source=grid.path)
    swept = [float(v) for v in grid.cells[0].train.lr_sweep]
    cells = []
    for c in full.cells:
        v = variant(c)
        if v in best and math.isclose(c.train.lr, best[v]):
            c.config["lr_tuned"] = {"lr_sweep": swept, "chosen": best[v],
                                    "tuning_experiment": grid.cells[0].experiment.name + TUNING_SUFFIX,
                                    "tuning_seed": grid.cells[0].experiment.seeds[0]}
            c.run_id = run_id_of(c.config)  # the canonical shape, as every run id (abl.contracts.config)
            cells.append(c)
    return Grid(path=full.path, raw=raw, cells=cells, grid_paths=full.grid_paths)


def tuning_results(db_path: Path, tuning: Grid) -> dict[str, dict[float, tuple[float | None, str]]]:
    """variant -> {lr: (final val_loss or None, why not usable)} of the phase-1 runs in the store."""
    from ..present.report import load_runs

    by_id = {c.run_id: c for c in tuning.cells}
    runs = load_runs(db_path, run_ids=list(by_id), curve_names=()) if Path(db_path).exists() else []
    out: dict[str, dict[float, tuple[float | None, str]]] = {}
    for c in tuning.cells:
        out.setdefault(variant(c), {})[c.train.lr] = (None, "not run")
    for r in runs:
        c = by_id[r.run_id]
        loss = r.final.get("val_loss")
        why = ("" if r.status == "completed" and loss is not None and math.isfinite(loss)
               and not (r.final.get("did_not_learn") or 0) >= 0.5
               else r.status if r.status != "completed" else DID_NOT_LEARN_WHY if loss is not None else "no val_loss")
        out[variant(c)][c.train.lr] = (loss, why)
    return out


DID_NOT_LEARN_WHY = "did not learn"


def best_lrs(results: dict[str, dict[float, tuple[float | None, str]]]) -> tuple[dict[str, float], list[str]]:
    """The learning rate with the lowest final val_loss per variant among the runs that learned (among the
    completed ones when none learned: ``unlearned`` names those variants), and the variants without a
    completed run."""
    best, missing = {}, []
    for v, by_lr in results.items():
        ok = [(loss, lr) for lr, (loss, why) in by_lr.items() if not why and loss is not None]
        ok = ok or [(loss, lr) for lr, (loss, why) in by_lr.items() if why == DID_NOT_LEARN_WHY and loss is not None]
        if ok:
            best[v] = min(ok)[1]
        else:
            missing.append(v)
    return best, missing


def unlearned(results: dict[str, dict[float, tuple[float | None, str]]], best: dict[str, float]) -> list[str]:
    """The variants whose chosen learning rate did not learn (none of the sweep did)."""
    return [v for v, lr in best.items() if results[v][lr][1] == DID_NOT_LEARN_WHY]


def seed_warnings(grid: Grid) -> list[str]:
    """Why phase 2 cannot give a verdict: too few seeds after the tuning seed (empty when enough)."""
    from ..analysis.stats import MIN_SEEDS, TOO_FEW

    if not grid.cells or not grid.cells[0].train.lr_sweep:
        return []
    seeds = list(grid.cells[0].experiment.seeds)
    left = len(seeds) - 1
    if left >= MIN_SEEDS:
        return []
    from ..grid.design import detectable

    decided = {a: d.sigmas for a, d in detectable(grid).items() if d.sigmas is not None}
    per_axis = ("; per axis, pooled over the other axes, the design can still decide " +
                ", ".join(f"{a} (levels {k:.1f} σ apart)" for a, k in decided.items()) if decided else
                "; no axis can get a verdict either")
    return [f"train.lr_sweep: seed {seeds[0]} tunes the learning rates, leaving {left} seed(s) {seeds[1:]} for "
            f"the comparison; the statistics need at least {MIN_SEEDS} seeds per cell for a verdict, so every "
            f"comparison of two cells will read \"{TOO_FEW}\"{per_axis}: give experiment.seeds at least "
            f"{MIN_SEEDS + 1} seeds"]


def edge_warnings(best: dict[str, float], sweep: list[float], labels: dict | None = None) -> list[str]:
    """One warning per variant whose best learning rate is the lowest or the highest of the sweep."""
    from ..grid.labels import grid_label

    lo, hi = min(sweep), max(sweep)
    shown = "[" + ", ".join(f"{v:g}" for v in sorted(sweep)) + "]"
    out = []
    for v, lr in best.items():
        edge = "top" if math.isclose(lr, hi) else "bottom" if math.isclose(lr, lo) else None
        if edge is None:
            continue
        name = str((labels or {}).get(v) or grid_label(json.loads(v)))
        beyond = "higher" if edge == "top" else "lower"
        out.append(f"lr sweep: {name}: its best lr {lr:g} is the {edge} edge of the sweep {shown}, so a {beyond} "
                   f"learning rate may be better still; extend train.lr_sweep past {lr:g} before trusting the "
                   "comparison")
    return out


def print_tuning_table(console, tuning: Grid, results: dict[str, dict[float, tuple[float | None, str]]],
                       best: dict[str, float]) -> None:
    """Phase 1's final val_loss per variant and learning rate, ``*`` on the one each variant gets; the
    variants labelled by abl.grid.labels; one block per variant when the table does not fit the terminal."""
    from rich.table import Table
    from rich.text import Text

    from ..grid.labels import cell_labels, grid_label
    from ..present.termlayout import PRESENTATION, fits, pack, print_wide, wrap

    configs: dict[Hashable, dict] = {}
    for c in tuning.cells:  # one config per variant, all at the same learning rate
        if math.isclose(c.train.lr, tuning.cells[0].train.lr):
            configs.setdefault(variant(c), c.config)
    fallback: dict[Hashable, str] = {v: grid_label(json.loads(v)) for v in results}
    labels = cell_labels(configs, [p for p in tuning.grid_paths if p != "train.lr"], fallback)
    title = "lr sweep: final val_loss on the tuning seed; * = the learning rate each variant gets"
    lrs = sorted({lr for by_lr in results.values() for lr in by_lr})
    table = Table(title=title, title_justify="left")
    table.add_column("variant", overflow="fold")
    for lr in lrs:
        table.add_column(f"lr {lr:g}", justify="right", no_wrap=True)
    rows = []
    for v, by_lr in results.items():
        cells = []
        for lr in lrs:
            loss, why = by_lr.get(lr, (None, "not run"))
            text = (f"{loss:.4f} ({why})" if why == DID_NOT_LEARN_WHY and loss is not None
                    else why if why else f"{loss:.4f}")
            cells.append(text + (" *" if best.get(v) == lr else ""))
        rows.append((str(labels.get(v, fallback[v])), cells))
        table.add_row(rows[-1][0], *cells)
    if PRESENTATION.layout == "wide" or (PRESENTATION.layout == "auto" and fits(console, table)):
        print_wide(console, table)
        return
    for line in wrap(title, console.width, ""):
        console.print(Text(line, style="bold"), soft_wrap=True)
    for i, (label, cells) in enumerate(rows, 1):
        first = f"{i:>{len(str(len(rows)))}}. "
        for line in wrap(label, console.width, " " * len(first), first=first):
            console.print(Text(line, style="bold"), soft_wrap=True)
        for line in pack([f"lr {lr:g}: {c}" for lr, c in zip(lrs, cells)], console.width, "     "):
            console.print(Text(line), soft_wrap=True)


def run_sweep(grid: Grid, registry, db_path: Path, runs_dir: Path, executor=None, retry_failed: bool = False,
              console=None, detect: float | None = None) -> int:
    """Both phases; returns the runs that did not complete plus the variants left without a usable learning
    rate (so ``abl run`` exits 1 for either). Prints which LR each variant got."""
    from .runner import run_grid

    if console is None:
        from ..present.termlayout import output_console

        console = output_console()
    tuning = tuning_grid(grid, registry)
    for w in seed_warnings(grid):
        console.print(f"[yellow]warning: {w}[/]", highlight=False)
    console.print(f"[bold]lr sweep[/]: phase 1 tunes every cell at lr in {grid.cells[0].train.lr_sweep} on seed "
                  f"{grid.cells[0].experiment.seeds[0]} (experiment {tuning.cells[0].experiment.name})")
    from ..present import termlayout

    machine = termlayout.PRESENTATION  # phase 1's summary is a table on the console: only phase 2's is piped
    termlayout.PRESENTATION = termlayout.Presentation(layout=machine.layout)
    try:
        failures = run_grid(tuning, registry, db_path, runs_dir, executor=executor, retry_failed=retry_failed,
                            console=console)
    finally:
        termlayout.PRESENTATION = machine
    results = tuning_results(db_path, tuning)
    best, missing = best_lrs(results)
    print_tuning_table(console, tuning, results, best)
    stuck = unlearned(results, best)
    learned = {v: lr for v, lr in best.items() if v not in stuck}
    for w in edge_warnings(learned, [float(v) for v in grid.cells[0].train.lr_sweep]):
        console.print(f"[yellow]warning: {w}[/]", highlight=False)
    if stuck:
        from ..grid.labels import grid_label

        console.print(f"[yellow]warning: lr sweep: {len(stuck)} variant(s) did not learn at any lr of the sweep "
                      f"({'; '.join(grid_label(json.loads(v)) for v in stuck)}); phase 2 trains each at its lowest "
                      "tuning val_loss, where it will be flagged \"did not learn\"[/]", highlight=False)
    if missing:
        console.print(f"[red]{len(missing)} variant(s) have no completed tuning run and are left out of "
                      "phase 2[/]")
    if not best:
        console.print("[red]lr sweep: no variant has a completed tuning run; phase 2 not started[/]")
        return failures + len(missing)
    final = final_grid(grid, registry, best)
    console.print(f"[bold]lr sweep[/]: phase 2 trains each variant at its own best lr on seeds "
                  f"{grid.cells[0].experiment.seeds[1:]}")
    return failures + len(missing) + run_grid(final, registry, db_path, runs_dir, executor=executor,
                                              retry_failed=retry_failed, console=console, detect=detect)
