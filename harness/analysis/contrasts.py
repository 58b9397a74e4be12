"""Within-cell contrasts: questions one cell answers about itself, tested paired by seed.

Some questions are not differences between cells but within one: does a model trained at length T
degrade at 2T and 4T (length extrapolation: ``val_loss_x2 - val_loss_x1``, ``val_loss_x4 -
val_loss_x1`` of the same run, Press et al. 2022, "Train Short, Test Long", arXiv:2108.12409, sec. 3),
and does a model beat its task's no-recall baseline (``<task>_accuracy - <task>_no_recall_baseline``,
docs/probes.md)? Each is a paired comparison over the cell's seeds — both figures come from the same
run — tested by the verdict engine (abl.analysis.stats.engine.analyse: paired t, at least MIN_SEEDS
seeds, Holm over every contrast shown, intervals adjusted alike), with its words: "worse" for a loss
at 4x means it degrades there; "better" for an accuracy means above the baseline.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

from ..contracts.status import COMPLETED
from .stats.engine import BETTER, WORSE, CellInput, ComparisonRow, analyse

LENGTH = re.compile(r"val_loss_x(\d+)")
ACCURACY = re.compile(r"((?:probe_)?(?P<task>.+))_accuracy")


@dataclass
class Contrast:
    """What one within-cell contrast compares: ``metric - reference`` of each run."""

    name: str  # "length x4 vs x1"
    metric: str
    reference: str  # a metric name; its value is that run's own
    lower_is_better: bool
    question: str  # the words of a verdict: (better, worse)
    words: tuple[str, str]


@dataclass
class WithinCell:
    """One cell's answer to one contrast."""

    cell: Hashable
    label: str
    contrast: Contrast
    row: ComparisonRow  # a = the metric, b = the reference, paired by seed; verdict after Holm

    def answer(self) -> str:
        """The verdict in the contrast's own words ("degrades at 4x", ...) or the engine's."""
        if self.row.verdict == BETTER:
            return self.contrast.words[0]
        if self.row.verdict == WORSE:
            return self.contrast.words[1]
        return self.row.verdict


def contrasts_of(metric_names: Sequence[str]) -> list[Contrast]:
    """The within-cell contrasts these recorded metrics allow: every recorded length factor k > 1 against
    k = 1, and every accuracy with its no-recall baseline recorded."""
    names = set(metric_names)
    out = []
    lengths = sorted(int(m.group(1)) for n in names if (m := LENGTH.fullmatch(n)))
    if 1 in lengths:
        for k in (k for k in lengths if k > 1):
            out.append(Contrast(f"length x{k} vs x1", f"val_loss_x{k}", "val_loss_x1", True,
                                f"does the loss at {k}x the trained length differ from 1x?",
                                (f"better at {k}x", f"degrades at {k}x")))
    for n in sorted(names):
        m = ACCURACY.fullmatch(n)
        if not m:
            continue
        task = m.group("task").removeprefix("probe_")
        for base in (f"{m.group(1)}_no_recall_baseline", f"{task}_no_recall_baseline"):
            if base in names:
                out.append(Contrast(f"{m.group(1)} accuracy vs its no-recall baseline", n, base, False,
                                    f"is {m.group(1)}'s accuracy above what no recall reaches?",
                                    ("above the no-recall baseline", "below the no-recall baseline")))
                break
    return out


def within_cell(runs: Sequence[Any], order: Sequence[str] | None = None,
                contrasts: Sequence[Contrast] | None = None) -> list[WithinCell]:
    """Every within-cell contrast of every cell (``runs``: abl.store.reader.StoredRun or alike:
    ``cell_key``, ``label``, ``seed``, ``status``, ``final``), Holm over all of them together."""
    by_cell: dict[str, list[Any]] = {}
    for r in runs:
        if r.status == COMPLETED:
            by_cell.setdefault(r.cell_key, []).append(r)
    if contrasts is None:
        contrasts = contrasts_of(sorted({n for rs in by_cell.values() for r in rs for n in r.final}))
    rank = {k: i for i, k in enumerate(order or [])}
    keys = sorted(by_cell, key=lambda k: rank.get(k, len(rank)))
    inputs, pairs, meta = [], [], []
    for k in keys:
        rs = by_cell[k]
        for c in contrasts:
            a, b = _values(rs, c.metric), _values(rs, c.reference)
            if not a or not b:
                continue
            ka, kb = (k, c.metric), (k, c.reference)
            inputs += [CellInput(ka, c.metric, a, data_key=k), CellInput(kb, c.reference, b, data_key=k)]
            pairs.append((ka, kb))
            meta.append((k, rs[0].label or k[:8], c))
    if not pairs:
        return []
    # one analysis, one Holm family over every contrast shown; the engine reads "better" as lower, so a
    # contrast whose metric is better higher (an accuracy) has its verdict turned to the metric's sense
    rows = analyse(_unique(inputs), pairs, lower_is_better=True).comparisons
    out = []
    for (k, label, c), row in zip(meta, rows):
        if not c.lower_is_better and row.verdict in (BETTER, WORSE):
            row.verdict = WORSE if row.verdict == BETTER else BETTER
        out.append(WithinCell(k, label, c, row))
    return out


def _values(runs: Sequence[Any], metric: str) -> dict:
    vals = {}
    for r in runs:
        v = (r.final or {}).get(metric)
        if v is not None and math.isfinite(float(v)):
            vals[r.seed] = float(v)
    return vals


def _unique(inputs: list[CellInput]) -> list[CellInput]:
    seen: dict[Hashable, CellInput] = {}
    for c in inputs:
        seen.setdefault(c.key, c)
    return list(seen.values())


def lines(items: Sequence[WithinCell]) -> list[str]:
    """The within-cell answers as text: a title, then one line per cell and contrast (none: no lines)."""
    if not items:
        return []
    from .formats import fmt_p

    tested = sum(w.row.p_adjusted is not None for w in items)
    out = [f"Within each cell (paired by seed; Holm over the {tested} contrasts tested):"]
    for w in items:
        r = w.row
        figures = "" if r.delta is None else f"Δ {r.delta:+.4f}"
        if r.ci_low is not None and r.ci_high is not None and r.p_adjusted is not None:
            figures += f" [{r.ci_low:+.4f}, {r.ci_high:+.4f}], p (Holm) {fmt_p(r.p_adjusted)}"
        out.append(f"  {w.label}  {w.contrast.name}: {figures + ': ' if figures else ''}{w.answer()}")
    return out
