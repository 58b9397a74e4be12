"""Fair learning rates: every variant compared at its own best learning rate.

A comparison at one shared learning rate favours the variants that happen to
like it; published ablations that skip tuning are a known source of false
wins. With ``train.lr_sweep = [1e-3, 3e-3, 1e-2]`` a grid runs in two phases:

1. tuning: every cell of the grid at every learning rate of the sweep, on the
   first seed only (the first ``train.lr_tuning_seeds`` seeds), in the
   experiment ``<name>.lr_tuning``;
2. comparison: each variant (a cell of the grid) at the learning rate that
   gave its lowest final ``val_loss`` in phase 1 (the lowest mean over the
   tuning seeds), on the remaining seeds, in the experiment ``<name>``. A
   learning rate whose run did not complete, or did not learn
   (abl.analysis.health), on any tuning seed is never chosen while another
   learned on all of them. A variant that learned at no learning rate of the sweep (on a
   task, a mixer that never leaves the no-recall baseline) still goes to
   phase 2, at the completed run's lowest final ``val_loss``, with a warning:
   its phase-2 runs are flagged "did not learn" there, which is the finding
   (leaving it out would hide it). A variant with no completed tuning run is
   left out of phase 2.

The tuning seeds are kept out of phase 2, so picking the best learning rate
on them does not bias the comparison (the selection and the test use
different seeds).

Why more than one tuning seed (``train.lr_tuning_seeds = 2``): one seed
cannot show that a learning rate is stable. At the edge of stability a
variant can reach the lowest loss on the tuning seed and stall or diverge on
others; the lowest loss on one seed then picks exactly that edge, and the
comparison inherits a variant that fails on some seeds (on selective copying,
Mamba at lr 1e-2: solved on two seeds, never left the plateau on a third).
Averaging the tuning loss over seeds, and refusing a learning rate that did
not learn on one of them, follows Bouthillier et al. 2021 ("Accounting for
Variance in Machine Learning Benchmarks", MLSys, arXiv:2103.03098):
hyperparameters chosen under one draw of the seed-dependent sources of
variation carry that draw's luck into the comparison.

Each phase-2 run records what was swept, which learning rate won and on
which seeds under ``config["lr_tuned"]`` (so in its run id), and its label
ends with ``lr=<chosen>``: every summary and report says which learning rate
each variant got. ``abl compare <name>`` compares every phase-2 run of the
experiment; ``abl compare`` / ``abl report`` of the grid file compare the
phase 2 the store's tuning runs choose for the grid as it is now
(``compared_grid``).

Both phases' grids are expanded in the ``abl run`` parent, running the components' checks and cost
functions (plugin code), so each expansion runs under abl.run.guard's time limit (``--plugin-timeout``).

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
from ..contracts.status import COMPLETED
from ..grid.design import compared_seeds
from ..grid.gridfile import expand
from .guard import time_limit

TUNING_SUFFIX = ".lr_tuning"


def _raw(grid: Grid) -> dict:
    raw = copy.deepcopy(grid.raw)
    raw.setdefault("train", {})["lr_sweep"] = []
    raw["train"].pop("lr_tuning_seeds", None)
    raw.setdefault("grid", {})["train.lr"] = [float(v) for v in grid.cells[0].train.lr_sweep]
    return raw


def variant(cell: Cell) -> str:
    """The grid cell a run belongs to, whatever its learning rate."""
    return json.dumps({k: v for k, v in cell.varied.items() if k != "train.lr"}, sort_keys=True, default=str)


def tuning_seeds(grid: Grid) -> list[int]:
    """The seeds that tune the learning rates: the first ``train.lr_tuning_seeds`` of the grid's."""
    return list(grid.cells[0].experiment.seeds[:grid.cells[0].train.lr_tuning_seeds])


def _seeds_text(seeds: list[int]) -> str:
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds}"


def tuning_grid(grid: Grid, registry) -> Grid:
    """Phase 1: every cell at every swept learning rate, on the tuning seeds, experiment ``<name>.lr_tuning``.

    Its runs are plain runs at one learning rate (no sweep, no ``lr_tuning_seeds`` in their config), so the
    tuning run of a seed keeps its run id whatever the number of tuning seeds."""
    raw = _raw(grid)
    exp = raw.setdefault("experiment", {})
    exp["name"] = grid.cells[0].experiment.name + TUNING_SUFFIX
    exp["seeds"] = tuning_seeds(grid)
    with time_limit("the lr sweep's phase 1 grid (its components' parameters, checks and costs)"):
        return expand(raw, registry, source=grid.path)


def final_grid(grid: Grid, registry, best: dict[str, float]) -> Grid:
    """Phase 2: each variant at its best learning rate (``best``: variant -> lr), on the other seeds."""
    raw = _raw(grid)
    raw.setdefault("experiment", {})["seeds"] = compared_seeds(grid)
    with time_limit("the lr sweep's phase 2 grid (its components' parameters, checks and costs)"):
        full = expand(raw, registry, source=grid.path)
    swept = [float(v) for v in grid.cells[0].train.lr_sweep]
    tuned_on = tuning_seeds(grid)
    cells = []
    for c in full.cells:
        v = variant(c)
        if v in best and math.isclose(c.train.lr, best[v]):
            c.config["lr_tuned"] = {"lr_sweep": swept, "chosen": best[v],
                                    "tuning_experiment": grid.cells[0].experiment.name + TUNING_SUFFIX,
                                    "tuning_seed": tuned_on[0]}
            if len(tuned_on) > 1:  # left out for one seed, so run ids from before it existed stay the same
                c.config["lr_tuned"]["tuning_seeds"] = tuned_on
            c.run_id = run_id_of(c.config)  # the canonical shape, as every run id (abl.contracts.config)
            cells.append(c)
    return Grid(path=full.path, raw=raw, cells=cells, grid_paths=full.grid_paths)


PerSeed = dict[str, dict[float, dict[int, tuple[float | None, str]]]]


def compared_grid(grid: Grid, registry, db_path: Path) -> Grid:
    """The grid whose runs a comparison of ``grid`` reads (``abl compare`` / ``abl report`` of a grid file):
    ``grid`` itself, or under train.lr_sweep its phase 2 as the store's tuning runs choose it now, the cells
    ``run_sweep`` trains in phase 2 (no cell before any tuning run completed). Not the experiment's every
    run: a store can hold phase-2 runs of the same experiment from an earlier config of the grid."""
    if not grid.cells or not grid.cells[0].train.lr_sweep:
        return grid
    best, _ = best_lrs(tuning_results(db_path, tuning_grid(grid, registry)))
    return final_grid(grid, registry, best)


def tuning_runs(db_path: Path, tuning: Grid) -> PerSeed:
    """variant -> {lr: {seed: (final val_loss or None, why not usable)}} of the phase-1 runs in the store."""
    from ..store import reader

    by_id = {c.run_id: c for c in tuning.cells}
    runs = (reader.read_runs(db_path, run_ids=list(by_id), metrics=("val_loss", "did_not_learn"))
            if Path(db_path).exists() else [])
    out: PerSeed = {}
    for c in tuning.cells:
        out.setdefault(variant(c), {}).setdefault(c.train.lr, {})[c.seed] = (None, "not run")
    for r in runs:
        c = by_id[r.run_id]
        loss = r.final.get("val_loss")
        why = ("" if r.status == COMPLETED and loss is not None and math.isfinite(loss)
               and not (r.final.get("did_not_learn") or 0) >= 0.5
               else r.status if r.status != COMPLETED else DID_NOT_LEARN_WHY if loss is not None else "no val_loss")
        out[variant(c)][c.train.lr][c.seed] = (loss, why)
    return out


def over_seeds(per_seed: dict[int, tuple[float | None, str]]) -> tuple[float | None, str]:
    """One learning rate's tuning result over its tuning seeds: the mean final val_loss, usable ("") only when
    it learned on every seed. A run that did not complete (or has no val_loss) on any seed makes the learning
    rate unusable (None, why, naming the seed); one that did not learn on some seeds keeps the mean with
    ``did not learn`` (on which seeds, when others learned), so it is chosen only where no lr learned."""
    many = len(per_seed) > 1
    for seed, (loss, why) in sorted(per_seed.items()):
        if why and why != DID_NOT_LEARN_WHY:
            return None, why + (f" on seed {seed}" if many else "")
    losses = [loss for loss, _ in per_seed.values() if loss is not None]
    mean = sum(losses) / len(losses)
    stuck = [seed for seed, (_, why) in sorted(per_seed.items()) if why == DID_NOT_LEARN_WHY]
    if not stuck:
        return mean, ""
    if len(stuck) == len(per_seed):
        return mean, DID_NOT_LEARN_WHY
    return mean, f"{DID_NOT_LEARN_WHY} on seed{'s' if len(stuck) > 1 else ''} {', '.join(map(str, stuck))}"


def tuning_results(db_path: Path, tuning: Grid) -> dict[str, dict[float, tuple[float | None, str]]]:
    """variant -> {lr: (mean final val_loss over the tuning seeds or None, why not usable)} (``over_seeds``)."""
    return summarise(tuning_runs(db_path, tuning))


def summarise(per_seed: PerSeed) -> dict[str, dict[float, tuple[float | None, str]]]:
    return {v: {lr: over_seeds(seeds) for lr, seeds in by_lr.items()} for v, by_lr in per_seed.items()}


DID_NOT_LEARN_WHY = "did not learn"


def _stuck(why: str) -> bool:
    return why.startswith(DID_NOT_LEARN_WHY)


def best_lrs(results: dict[str, dict[float, tuple[float | None, str]]]) -> tuple[dict[str, float], list[str]]:
    """The learning rate with the lowest final val_loss per variant among the runs that learned (among the
    completed ones when none learned: ``unlearned`` names those variants), and the variants without a
    completed run."""
    best, missing = {}, []
    for v, by_lr in results.items():
        ok = [(loss, lr) for lr, (loss, why) in by_lr.items() if not why and loss is not None]
        ok = ok or [(loss, lr) for lr, (loss, why) in by_lr.items() if _stuck(why) and loss is not None]
        if ok:
            best[v] = min(ok)[1]
        else:
            missing.append(v)
    return best, missing


def unlearned(results: dict[str, dict[float, tuple[float | None, str]]], best: dict[str, float]) -> list[str]:
    """The variants whose chosen learning rate did not learn (on every tuning seed none of the sweep did)."""
    return [v for v, lr in best.items() if _stuck(results[v][lr][1])]


def seed_warnings(grid: Grid) -> list[str]:
    """Why phase 2 cannot give a verdict: too few seeds after the tuning seed (empty when enough)."""
    from ..analysis.stats.engine import TOO_FEW
    from ..analysis.stats.power import MIN_SEEDS

    if not grid.cells or not grid.cells[0].train.lr_sweep:
        return []
    tuned, compared = tuning_seeds(grid), compared_seeds(grid)
    left = len(compared)
    if left >= MIN_SEEDS:
        return []
    from ..grid.design import detectable

    decided = {a: d.sigmas for a, d in detectable(grid).items() if d.sigmas is not None}
    per_axis = ("; per axis, pooled over the other axes, the design can still decide " +
                ", ".join(f"{a} (levels {k:.1f} σ apart)" for a, k in decided.items()) if decided else
                "; no axis can get a verdict either")
    verb = "tunes" if len(tuned) == 1 else "tune"
    return [f"train.lr_sweep: {_seeds_text(tuned)} {verb} the learning rates, leaving {left} seed(s) {compared} "
            f"for the comparison; the statistics need at least {MIN_SEEDS} seeds per cell for a verdict, so every "
            f"comparison of two cells will read \"{TOO_FEW}\"{per_axis}: give experiment.seeds at least "
            f"{MIN_SEEDS + len(tuned)} seeds"]


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
                       best: dict[str, float], per_seed: PerSeed | None = None, layout: str = "auto") -> None:
    """Phase 1's final val_loss per variant and learning rate (the mean over the tuning seeds, each seed's
    after it in brackets when there are several), ``*`` on the one each variant gets; the variants labelled
    by abl.grid.labels; one block per variant when the table does not fit the terminal."""
    from rich.table import Table
    from rich.text import Text

    from ..grid.labels import cell_labels, grid_label
    from ..present.termlayout import fits, pack, print_wide, wrap

    configs: dict[Hashable, dict] = {}
    for c in tuning.cells:  # one config per variant, all at the same learning rate
        if math.isclose(c.train.lr, tuning.cells[0].train.lr):
            configs.setdefault(variant(c), c.config)
    fallback: dict[Hashable, str] = {v: grid_label(json.loads(v)) for v in results}
    labels = cell_labels(configs, [p for p in tuning.grid_paths if p != "train.lr"], fallback)
    seeds = sorted({c.seed for c in tuning.cells})
    title = ("lr sweep: final val_loss on the tuning seed; * = the learning rate each variant gets" if len(seeds) == 1
             else f"lr sweep: mean final val_loss over tuning seeds {', '.join(map(str, seeds))}, then each seed's in "
                  "brackets; * = the learning rate each variant gets")
    lrs = sorted({lr for by_lr in results.values() for lr in by_lr})
    table = Table(title=Text(title), title_justify="left")  # Text: brackets in it are not markup
    table.add_column("variant", overflow="fold")
    for lr in lrs:
        table.add_column(f"lr {lr:g}", justify="right", no_wrap=True)
    rows = []
    for v, by_lr in results.items():
        cells = []
        for lr in lrs:
            loss, why = by_lr.get(lr, (None, "not run"))
            text = (f"{loss:.4f} ({why})" if _stuck(why) and loss is not None
                    else why if why else f"{loss:.4f}")
            each = (per_seed or {}).get(v, {}).get(lr, {})
            if len(each) > 1 and loss is not None:
                text += " [" + ", ".join(f"{each[s][0]:.4f}" for s in sorted(each)) + "]"  # all completed
            cells.append(text + (" *" if best.get(v) == lr else ""))
        rows.append((str(labels.get(v, fallback[v])), cells))
        table.add_row(Text(rows[-1][0]), *(Text(c) for c in cells))
    if layout == "wide" or (layout == "auto" and fits(console, table)):
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
              console=None, detect: float | None = None, presentation=None) -> int:
    """Both phases; returns the runs that did not complete plus the variants left without a usable learning
    rate (so ``abl run`` exits 1 for either). Prints which LR each variant got. ``presentation``
    (abl.present.termlayout.Presentation): how phase 2's summary is printed; phase 1's summary and the
    tuning table are tables on the console in its layout (only phase 2's summary is piped)."""
    from ..present.termlayout import Presentation
    from .runner import run_grid

    if console is None:
        from ..present.termlayout import output_console

        console = output_console()
    tuning = tuning_grid(grid, registry)
    for w in seed_warnings(grid):
        console.print(f"[yellow]warning: {w}[/]", highlight=False)
    console.print(f"[bold]lr sweep[/]: phase 1 tunes every cell at lr in {grid.cells[0].train.lr_sweep} on "
                  f"{_seeds_text(tuning_seeds(grid))} (experiment {tuning.cells[0].experiment.name})")
    presentation = presentation or Presentation()
    failures = run_grid(tuning, registry, db_path, runs_dir, executor=executor, retry_failed=retry_failed,
                        console=console, presentation=Presentation(layout=presentation.layout))
    per_seed = tuning_runs(db_path, tuning)
    results = summarise(per_seed)
    best, missing = best_lrs(results)
    print_tuning_table(console, tuning, results, best, per_seed, layout=presentation.layout)
    stuck = unlearned(results, best)
    learned = {v: lr for v, lr in best.items() if v not in stuck}
    for w in edge_warnings(learned, [float(v) for v in grid.cells[0].train.lr_sweep]):
        console.print(f"[yellow]warning: {w}[/]", highlight=False)
    if stuck:
        from ..grid.labels import grid_label

        every = "" if len(tuning_seeds(grid)) == 1 else " on every tuning seed"
        console.print(f"[yellow]warning: lr sweep: {len(stuck)} variant(s) did not learn at any lr of the sweep"
                      f"{every} ({'; '.join(grid_label(json.loads(v)) for v in stuck)}); phase 2 trains each at its "
                      "lowest tuning val_loss, where it will be flagged \"did not learn\"[/]", highlight=False)
    if missing:
        console.print(f"[red]{len(missing)} variant(s) have no completed tuning run and are left out of "
                      "phase 2[/]")
    if not best:
        console.print("[red]lr sweep: no variant has a completed tuning run; phase 2 not started[/]")
        return failures + len(missing)
    final = final_grid(grid, registry, best)
    console.print(f"[bold]lr sweep[/]: phase 2 trains each variant at its own best lr on seeds "
                  f"{compared_seeds(grid)}")
    return failures + len(missing) + run_grid(final, registry, db_path, runs_dir, executor=executor,
                                              retry_failed=retry_failed, console=console, detect=detect,
                                              presentation=presentation)
