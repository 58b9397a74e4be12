"""The report's within-cell sections: length extrapolation (val_loss at 1x, 2x and 4x the trained context)
and the within-cell answers, which are the run summary's own (abl.analysis.contrasts.within_cell, the same
function over the same runs in the same cell order, and contrasts.lines, the same words)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...analysis import contrasts, stats
from ...analysis import metrics as catalogue
from .document import cell_signed
from .runs import EXTRAPOLATION


def extrapolation_section(ctx: Any) -> None:
    """Length extrapolation (``eval.extrapolation``), when any completed run recorded it: per cell the mean
    over seeds at 1x, 2x and 4x the trained context, on the same targets, and the change from 1x."""
    cells = ctx.cells
    if not any(r.final.get(m) is not None for c in cells for r in c.completed for m in EXTRAPOLATION):
        return
    ctx.doc.h(2, "Length extrapolation")
    rows = []
    for c in cells:
        mean = {m: (sum(vs) / len(vs) if vs else None) for m in EXTRAPOLATION
                for vs in [[r.final[m] for r in c.completed if r.final.get(m) is not None]]}
        x1 = mean["val_loss_x1"]
        rows.append([c.label, len(c.completed), *[stats.fmt(mean[m]) for m in EXTRAPOLATION],
                     *[cell_signed(mean[m] - x1) if mean[m] is not None and x1 is not None else "-"
                       for m in EXTRAPOLATION[1:]]])
    ctx.doc.table(["cell", "seeds", *[catalogue.label(m) for m in EXTRAPOLATION],
                   *[f"{m.rsplit('_x', 1)[1]}x - 1x" for m in EXTRAPOLATION[1:]]], rows,
                  "mean over completed seeds of the validation loss (nats/token) on the same target tokens at "
                  "every length, with 1, 2 and 4 times the trained context before them (abl.model.decode); only "
                  "the context changes, so 2x - 1x is the model's gain or loss from the longer input. 1x differs "
                  "from the final val_loss, scored on the regular windows, by the text scored. '-': the position "
                  f"encoding cannot reach that length, or the run predates val_loss_x1 (the run notes say). {ctx.cond}")


def within_cell_section(ctx: Any) -> None:
    """The within-cell answers (length x_k vs x1, accuracy vs the no-recall baseline): the summary's own
    computation (abl.analysis.contrasts.within_cell over the same runs in the same cell order, one Holm
    family over every contrast) and its words (contrasts.lines), written once, under the cells' report
    labels. Nothing when the runs recorded no such pair of metrics."""
    labels = {c.key: c.label for c in ctx.cells}
    within = [replace(w, label=labels.get(str(w.cell), w.label))
              for w in contrasts.within_cell(ctx.runs, [c.key for c in ctx.cells])]
    text = contrasts.lines(within)
    if text:
        ctx.doc.h(2, "Answers within each cell")
    for line in text:
        ctx.doc.p(line)
