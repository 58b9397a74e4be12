"""``abl run GRID --until-decided``: seeds are added only to the cells of comparisons still undecided.

The comparisons are the grid's one-axis pairs (two cells that differ in one swept setting only,
abl.analysis.stats.engine.by_axis), paired by seed. Each is held to a group-sequential design
(abl.analysis.sequential: O'Brien-Fleming alpha spending over a look at every seed count from the
grid's seeds up to ``--budget``, alpha shared by Bonferroni), so looking after every added seed does not
inflate the false-positive rate the way re-running a fixed t-test would. A round reads the stored runs,
decides what it can, and trains the next seed of every cell that an undecided comparison needs; it
stops when every comparison is decided or has reached the budget ("not distinguishable at the budget").
New seeds continue the grid's: after seeds [0, 1, 2] come 3, 4, ... . The run ids are the ones a grid
with those seeds has, so a later plain run finds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..analysis.sequential import CONTINUE, Look, SequentialPlan, decide, family_plan
from ..analysis.stats.engine import by_axis
from ..analysis.stats.power import MIN_SEEDS
from ..analysis.verdicts import cell_inputs, lower_is_better
from ..contracts.config import ConfigError, Grid
from ..contracts.status import COMPLETED


@dataclass
class Decision:
    """One comparison's state after a round: a - b on ``axis``, decided or not."""

    axis: str
    a: str  # labels
    b: str
    look: Look | None  # None: fewer paired seeds than the first look (runs failed)

    def sentence(self) -> str:
        what = self.look.sentence() if self.look else "fewer completed seeds than the first look: not looked at"
        return f"{self.a} vs {self.b} ({self.axis}): {what}"


def seed_sequence(seeds: Sequence[int], n: int) -> list[int]:
    """The first ``n`` seeds: the grid's, then the integers after its largest."""
    out = list(seeds)[:n]
    nxt = max(seeds) + 1
    while len(out) < n:
        out.append(nxt)
        nxt += 1
    return out


def design_for(grid: Grid, budget: int) -> tuple[SequentialPlan, list[tuple[str, Any, Any]]]:
    """The sequential plan the grid's comparisons are held to, and the comparisons (axis, cell a, cell b)
    as cell keys. Raises ConfigError when the grid cannot be run this way."""
    seeds = grid.cells[0].experiment.seeds
    if len(seeds) < MIN_SEEDS:
        raise ConfigError(f"--until-decided starts from the grid's seeds and needs at least {MIN_SEEDS} "
                          f"(experiment.seeds has {len(seeds)}): --set 'experiment.seeds=[0, 1, 2]'")
    if budget < len(seeds):
        raise ConfigError(f"--budget {budget} is below the grid's {len(seeds)} seeds")
    pairs = comparisons_of(grid)
    if not pairs:
        raise ConfigError("--until-decided needs a grid whose cells differ in one swept setting (no two cells "
                          "here form a one-axis pair)")
    return family_plan(len(pairs), budget, first=len(seeds)), pairs


def comparisons_of(grid: Grid) -> list[tuple[str, Any, Any]]:
    """Every pair of cells that differ in one swept setting only, by the grid's own settings."""
    from ..analysis.stats.engine import CellInput
    from ..analysis.verdicts import settings

    firsts: dict[str, Any] = {}
    for c in grid.cells:
        firsts.setdefault(c.cell_key, c)
    cells = [CellInput(k, c.label, {}, settings=settings(c.config)) for k, c in firsts.items()]
    out = []
    for axis in grid.grid_paths:
        out += [(axis, a, b) for a, b in by_axis(cells, axis)]
    return out


def look_at(runs: Sequence[Any], pairs: list[tuple[str, Any, Any]], plan: SequentialPlan,
            metric: str) -> list[Decision]:
    """Each comparison at the largest planned look its paired completed seeds reach."""
    cells = {c.key: c for c in cell_inputs(runs, metric)}
    out = []
    for axis, a, b in pairs:
        ca, cb = cells.get(a), cells.get(b)
        label_a, label_b = (ca.label if ca else str(a)[:8]), (cb.label if cb else str(b)[:8])
        if ca is None or cb is None or len(set(ca.values) & set(cb.values)) < plan.looks[0]:
            out.append(Decision(axis, label_a, label_b, None))
            continue
        out.append(Decision(axis, label_a, label_b,
                            decide(ca.values, cb.values, plan, lower_is_better=lower_is_better(metric))))
    return out


def wanted_seeds(decisions: list[Decision], pairs: list[tuple[str, Any, Any]], plan: SequentialPlan,
                 first: int) -> dict[Any, int]:
    """How many seeds each cell of an undecided comparison needs for the comparison's next look."""
    out: dict[Any, int] = {}
    for d, (_, a, b) in zip(decisions, pairs):
        if d.look is None:
            n = first
        elif d.look.decision == CONTINUE:
            nxt = plan.next_look(d.look.seeds)
            if nxt is None:
                continue
            n = nxt
        else:
            continue
        for k in (a, b):
            out[k] = max(out.get(k, 0), n)
    return out


def run_until_decided(expand: Callable[[list[int] | None], Grid], read: Callable[[list[str]], list[Any]],
                      train: Callable[[Grid], Any], *, budget: int, metric: str = "val_loss",
                      say: Callable[[str], None] = print) -> list[Decision]:
    """Rounds of look, then train the seeds the undecided comparisons need, until none is left.

    ``expand(seeds)``: the grid with these seeds (None: its own); ``read(run_ids)``: their stored runs
    (abl.store.reader.read_runs); ``train(grid)``: run these cells as ``abl run`` does. Returns the last
    round's decisions. Raises ConfigError when the grid cannot be run this way.

    Each ``expand`` runs the components' checks and cost functions (plugin code) in the ``abl run`` parent,
    so it runs under abl.run.guard's time limit (``--plugin-timeout``)."""
    from .guard import time_limit

    def grid_of(seeds: list[int] | None) -> Grid:
        with time_limit("a round's grid (its components' parameters, checks and costs)"):
            return expand(seeds)

    grid = grid_of(None)
    seeds = list(grid.cells[0].experiment.seeds)
    plan, pairs = design_for(grid, budget)
    say(f"until decided: {len(pairs)} comparison(s), each held to a {plan.describe()} "
        f"(alpha {plan.alpha * len(pairs):g} shared by Bonferroni); at most {budget} seeds per cell")
    have = len(seeds)
    trained_before: set[str] = set()
    while True:
        grown = grid_of(seed_sequence(seeds, have))
        runs = read([c.run_id for c in grown.cells])
        decisions = look_at(runs, pairs, plan, metric)
        wanted = wanted_seeds(decisions, pairs, plan, len(seeds))
        if not wanted:
            break
        have = max(have, max(wanted.values()))
        grown = grid_of(seed_sequence(seeds, have))
        done = {r.run_id for r in runs if r.status == COMPLETED}
        order = {s: i for i, s in enumerate(seed_sequence(seeds, have))}
        todo = [c for c in grown.cells
                if c.cell_key in wanted and order[c.seed] < wanted[c.cell_key] and c.run_id not in done]
        fresh = [c for c in todo if c.run_id not in trained_before]
        if not fresh:  # every cell asked for was tried and did not complete: more rounds would not help
            say("until decided: stopped; the runs the undecided comparisons need did not complete "
                "(see the table above; --retry failed trains failed ones again)")
            break
        trained_before.update(c.run_id for c in todo)
        undecided = sum(1 for d in decisions if d.look is None or d.look.decision == CONTINUE)
        say(f"until decided: {undecided} comparison(s) undecided; training {len(todo)} run(s) of "
            f"{len({c.cell_key for c in todo})} cell(s), up to {have} seeds")
        train(Grid(path=grown.path, raw=grown.raw, cells=todo, grid_paths=grown.grid_paths))
    for d in decisions:
        say(d.sentence())
    return decisions
