"""The one answer of a set of runs (issue 41): the verdict table, the per-axis answers that lead it, and the
table made to agree with them (abl.analysis.answers.reconcile), built in one place for the run summary,
``abl compare`` and the dashboard."""

from __future__ import annotations

from typing import NamedTuple, Sequence

from . import answers, stats
from .verdicts import analyse_runs, axis_effects


class Answer(NamedTuple):
    """What every answer of a set of runs shows: the cells, the per-cell analysis made to agree with the per-axis
    answers, the sentence naming the comparisons, the per-axis answers, and why those could not be computed
    (empty when they were)."""
    cells: list[stats.CellInput]
    analysis: stats.Analysis
    what: str
    effects: list[stats.AxisEffect]
    effects_problem: str = ""


def answered(runs, *, metric: str = "val_loss", paths: Sequence[str] = (), order: Sequence[str] | None = None,
             baseline: str | None = None, pairs: Sequence[str] = (), by: str | None = None,
             bootstrap: bool = False, correction: str = stats.HOLM, tolerate: bool = False) -> Answer:
    """The one answer of ``runs`` on ``metric`` (the run summary, ``abl compare`` and the dashboard show it):
    abl.analysis.verdicts.analyse_runs, the per-axis answers (all swept axes, or the one ``by`` names; none for
    chosen ``pairs``, which are their own question) and ``reconcile``: one verdict per pair.

    ``tolerate``: a design the per-axis model cannot fit leaves the per-cell tables standing, with the reason in
    ``effects_problem`` (a page that must still show them), instead of raising."""
    cells, analysis, what = analyse_runs(runs, metric=metric, order=order, baseline=baseline, pairs=pairs, by=by,
                                         bootstrap=bootstrap, correction=correction)
    effects: list[stats.AxisEffect] = []
    problem = ""
    if not pairs:
        try:
            effects = axis_effects(cells, paths, metric, only=by)
        except Exception as exc:  # noqa: BLE001 - only when tolerated; raised as it is otherwise
            if not tolerate:
                raise
            problem = f"{type(exc).__name__}: {exc}"
    answers.reconcile(cells, analysis, effects)
    return Answer(cells, analysis, what, effects, problem)
