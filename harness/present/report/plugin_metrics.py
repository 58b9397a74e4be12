"""The report's section for the metrics plugins declare shown by default (hook register_metrics): each such
metric that a completed run logged, per cell, in its catalogue unit (abl.analysis.metrics). abl's own
metrics have their own sections; a report of runs without plugin metrics has no such section."""

from __future__ import annotations

from typing import Any

from ...analysis import metrics as catalogue


def plugin_metrics_section(ctx: Any) -> None:
    """A table: one row per cell, one column per plugin metric shown by default (the mean over the cell's
    completed runs, as ``abl.analysis.metrics.display`` writes it in its unit)."""
    names = [n for n in catalogue.shown_by_default(own=False)
             if any(n in r.final for c in ctx.cells for r in c.completed)]
    if not names:
        return
    ctx.doc.h(2, "Plugin metrics")
    rows = []
    for i, cell in enumerate(ctx.cells, 1):
        row: list[Any] = [i, cell.label]
        for n in names:
            values = [float(r.final[n]) for r in cell.completed if r.final.get(n) is not None]
            row.append(catalogue.display(n, sum(values) / len(values)) if values else "-")
        rows.append(row)
    sources = "; ".join(f"{catalogue.metric(n).label}: {catalogue.metric(n).description or n} "
                        f"(unit {catalogue.metric(n).unit or 'none'}, final value: {catalogue.metric(n).final}, "
                        f"declared by plugin {catalogue.metric(n).plugin})" for n in names)
    ctx.doc.table(["#", "cell", *[catalogue.header(n) for n in names]], rows,
                  f"mean over each cell's completed runs. {sources}. {ctx.cond}")
