"""The verdict tables of the terminal: the ``abl run`` summary and ``abl compare``.

Both read the store through the one reader (abl.store.reader) and compute with
abl.analysis.verdicts / abl.analysis.stats, like ``abl report`` and the dashboard. The metrics
shown are the grid's ``experiment.summary`` (loss metrics get a verdict
table each; the first one ranks the cells); the baseline is
``experiment.baseline`` or ``--baseline``, a display choice only.

What is shown is computed once (``build``: a ``View``) and printed as

- tables, when they fit the terminal (or always, with ``--wide``);
- else the stacked layout: a numbered line per cell with its whole label
  (abl.grid.labels: the settings that differ between the cells shown, component
  parameters included), its figures on indented lines beneath; each
  comparison names its cells by number and label;
- JSON, CSV or Markdown on stdout (``--format``), for piping.

Cells are numbered in grid order (the numbers ``--baseline`` and ``--pairs``
take). Speed figures (tokens/s, MFU) show mean ± std over seeds, and a ``*``
when any run of the cell was measured on a busy machine (its ``contended``
metric, abl.analysis.sections.is_contended), with a footnote saying why.
Names, units and which figures are speeds come from the metric catalogue
(abl.analysis.metrics).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import click

from ..analysis import contrasts, oneanswer, stats, verdicts
from ..analysis.health import MAX_LOAD_PER_CORE, MIN_CPU_UTIL
from ..analysis.metrics import MEASURED_ALONE, is_speed  # speed figures show their spread; a contended run marks them
from ..analysis.metrics import metric as catalogue_entry
from ..analysis.metrics import shown_by_default
from ..analysis.sections import is_contended
from ..contracts.status import COMPLETED
from ..grid.labels import run_labels
from . import termlayout
from .termlayout import Presentation, fits, pack, print_wide, wrap  # noqa: F401 - re-exported

# shown after the grid's own summary metrics when the runs have them: the cell's true rate
# (train_tokens_per_s: every token over the loop's wall time), the median step's rate, peak memory
ALWAYS = ("train_tokens_per_s", "tokens_per_s", "mfu", "alone_tokens_per_s", "alone_mfu", "peak_mem_bytes")


def load(db_path: Path, *, run_ids: list[str] | None = None, experiment: str | None = None,
         metrics: Sequence[str] = ("val_loss",)):
    """The runs with the final value of every stored metric (abl.store.reader, through the report's
    ``load_runs``); ``metrics``, the ones shown, are among them when stored."""
    from .report.runs import load_runs

    return load_runs(db_path, run_ids=run_ids, experiment=experiment, curve_names=())


CONTENDED_NOTE = (f"* the machine was busy during this cell (load per core > {MAX_LOAD_PER_CORE:g} or the run got "
                  f"< {MIN_CPU_UTIL:.0%} of its CPU time), or it shared its GPU with other cells of the grid: its "
                  f"speed is not comparable")
# the speed pass's figures (abl.run.speedpass), when a view shows them
ALONE_NOTE = ("(alone): timed with the device to itself by the speed pass after the grid (the median of a fixed "
              "number of steps after warm-up, one shape at a time); the other speed figures are the cells' own")


def contended_note(view) -> str:
    """The footnote on contended speed figures, and on the speed pass's when the view shows them."""
    alone = any(m in MEASURED_ALONE for m in view.extra)
    return CONTENDED_NOTE + (f"; {ALONE_NOTE}" if alone else "")


def relabel(runs, paths: Sequence[str] = ()) -> list:
    """The runs (copies) with display labels (abl.grid.labels: the settings that differ between these cells)."""
    labels = run_labels(runs, list(paths))
    return [dataclasses.replace(r, label=labels.get(str(r.cell_key), r.label)) for r in runs]


@dataclass
class Figure:
    """One metric of one cell over its completed seeds."""

    metric: str
    values: list[float]
    contended: bool = False

    @property
    def mean(self) -> float | None:
        return sum(self.values) / len(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        if len(self.values) < 2:
            return None
        m = sum(self.values) / len(self.values)
        return math.sqrt(sum((x - m) ** 2 for x in self.values) / (len(self.values) - 1))

    def text(self) -> str:
        if not self.values:
            return "-"
        out = verdicts.value_text(self.metric, self.mean)
        if is_speed(self.metric) and self.std is not None and self.metric not in MEASURED_ALONE:
            mean, std = self.mean or 0.0, self.std
            # the spread at the mean's precision: 24,584 ± 431, not ± 430.7
            out += " ± " + (f"{std:,.0f}" if abs(mean) >= 100 and catalogue_entry(self.metric).unit != "fraction"
                            else verdicts.value_text(self.metric, std))
        # a speed-pass figure (abl.run.speedpass) was timed alone: the cell's contention is not its
        return out + ("*" if self.contended and is_speed(self.metric) and self.metric not in MEASURED_ALONE else "")

    def as_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "std": self.std, "min": min(self.values, default=None),
                "max": max(self.values, default=None), "n": len(self.values), "contended": self.contended}


def figures(runs, metrics: Sequence[str]) -> dict[Any, dict[str, Figure]]:
    """cell key -> metric -> Figure over the completed runs (contended when any of the cell's runs was)."""
    out: dict[Any, dict[str, Figure]] = {}
    contended: dict[Any, bool] = {}
    for r in runs:
        if r.status == COMPLETED and is_contended(r.final):
            contended[r.cell_key] = True
    for r in runs:
        cell = out.setdefault(r.cell_key, {m: Figure(m, [], contended.get(r.cell_key, False)) for m in metrics})
        if r.status != COMPLETED:
            continue
        for m in metrics:
            v = r.final.get(m)
            if v is not None and math.isfinite(float(v)):
                cell[m].values.append(float(v))
    return out


def _lrs(runs) -> dict[str, float] | None:
    tuned = {r.cell_key: r.config["lr_tuned"]["chosen"] for r in runs if r.config.get("lr_tuned")}
    return tuned or None


@dataclass
class View:
    """Everything the summary shows, computed once (abl.analysis.verdicts / abl.analysis.stats), printed in any format."""

    title: str
    metric: str  # the first metric: it ranks the cells
    cells: list[stats.CellInput]
    numbers: dict[Any, int]  # cell key -> its number among the cells shown (--baseline / --pairs take it)
    tables: list[tuple[str, stats.Analysis, str]]  # (metric, analysis, which comparisons) per verdict table
    extra: list[str]  # further metrics shown per cell
    figures: dict[Any, dict[str, Figure]]
    lr: dict | None
    effects: list = dataclasses.field(default_factory=list)  # stats.AxisEffect per swept axis: the headline
    within: list = dataclasses.field(default_factory=list)  # abl.analysis.contrasts.WithinCell: within-cell answers

    @property
    def analysis(self) -> stats.Analysis:
        return self.tables[0][1]

    @property
    def contended(self) -> bool:
        return any(f.contended for cell in self.figures.values() for m, f in cell.items() if is_speed(m))

    def ranked(self) -> list[stats.CellRow]:
        return sorted(self.analysis.cells, key=lambda r: r.order_key)


def build(runs, *, metrics: Sequence[str], title: str, order: Sequence[str] | None = None,
          paths: Sequence[str] = (), baseline: str | None = None, pairs: Sequence[str] = (),
          by: str | None = None, bootstrap: bool = False, correction: str = stats.HOLM,
          every_metric: bool = False) -> View:
    """The summary of ``runs``: labelled by ``paths`` (the grid's axes, when known), cells in ``order``.

    A verdict table per loss metric (``every_metric``: per metric, as ``--format json`` gives them)."""
    runs = relabel(runs, paths)
    first, rest = metrics[0], list(metrics[1:])
    # the per-axis answer leads (all swept axes, or the one --by names; none for chosen pairs), and the per-cell
    # rows agree with (one-axis grid) or stand as diagnostics beside (factorial grid) it: one verdict per pair
    cells, analysis, what, effects, _ = oneanswer.answered(runs, metric=first, paths=paths, order=order,
                                                         baseline=baseline, pairs=pairs, by=by, bootstrap=bootstrap,
                                                         correction=correction)
    tables = [(first, analysis, what)]
    for m in [m for m in rest if every_metric or verdicts.metric_is_loss(m)]:
        _, an, w = verdicts.analyse_runs(runs, metric=m, order=order, baseline=baseline, pairs=pairs, by=by,
                                         bootstrap=bootstrap, correction=correction)
        tables.append((m, an, w))
    shown = [*ALWAYS, *shown_by_default(own=False)]  # and a plugin's metrics declared shown by default
    extra = [m for m in dict.fromkeys([*rest, *shown]) if any(m in r.final for r in runs)]
    return View(title=title, metric=first, cells=cells, numbers={c.key: i for i, c in enumerate(cells, 1)},
                tables=tables, extra=extra, figures=figures(runs, extra), lr=_lrs(runs), effects=effects,
                within=contrasts.within_cell(runs, order))


def effect_lines(view: View) -> list[str]:
    """The per-axis answer: a title and each axis's lines (its method is in the legend, printed once)."""
    return verdicts.effect_section(view.effects, view.title, view.metric)[:-1]


def legend(view: View) -> str:
    """The statistics legend, printed once per summary (abl.analysis.verdicts.legend)."""
    return verdicts.legend(view.analysis, view.effects)


def table_title(view: View, m: str, an: stats.Analysis, what: str) -> str:
    """A comparison table's title: which comparisons, and, for a factorial grid's per-cell rows, that they
    are diagnostics (the per-axis verdicts answer)."""
    title = f"{view.title}: {m}, {what}"
    if any(c.role == stats.DIAGNOSTIC_ROLE for c in an.comparisons):
        title += (" — diagnostics: per-cell tests, no verdict of their own (the per-axis verdicts above "
                  "answer the question)")
    return title


# ---------------------------------------------------------------- printing


def _cells_table(view: View):
    texts = {m: {k: f.text() for k, f in ((k, cell[m]) for k, cell in view.figures.items())} for m in view.extra}
    return verdicts.cells_table(view.cells, view.analysis, f"{view.title}: {view.metric} by cell, best first",
                                {verdicts.display_name(m): texts[m] for m in view.extra}, view.lr,
                                numbers=view.numbers, metric=view.metric)


def _tables(view: View) -> list:
    return [_cells_table(view)] + [verdicts.comparisons_table(an, table_title(view, m, an, what))
                                   for m, an, what in view.tables]


def stacked_lines(view: View, width: int) -> list[tuple[str, str]]:
    """The stacked layout as (style, line) pairs, no line wider than ``width``: a numbered line per cell with
    its whole label, its figures on indented lines; each comparison as its cells' numbers and labels, then
    its figures and verdict."""
    out: list[tuple[str, str]] = []
    ind = "     "
    by_key = {c.key: c for c in view.cells}
    digits = len(str(len(view.cells)))

    def head(number: int, label: str) -> list[str]:
        first = f"{number:>{digits}}. "
        return wrap(label, width, " " * len(first), first=first)

    for i, line in enumerate(effect_lines(view)):
        out += [("bold" if i == 0 else "", ln) for ln in wrap(line, width, "      ", first="")]
    if view.effects:
        out.append(("", ""))
    out += [("bold", ln) for ln in wrap(f"{view.title}: {view.metric} by cell, best first "
                                         f"(# is the cell's number: --baseline and --pairs take it)", width, "")]
    name = verdicts.display_name(view.metric)
    for r in view.ranked():
        statuses = by_key[r.key].statuses if r.key in by_key else {}
        runs = sum(statuses.values()) or r.n
        others = ", ".join(f"{n} {st}" for st, n in statuses.items() if st != COMPLETED)
        out += [("bold", ln) for ln in head(view.numbers[r.key], r.label)]
        items = ["rank " + r.rank_text,
                 f"{name} {verdicts.fmt(r.mean)}" + ("" if r.std is None else f" ± {verdicts.fmt(r.std)}"),
                 "" if r.ci_low is None else f"95% CI [{verdicts.fmt(r.ci_low)}, {verdicts.fmt(r.ci_high)}]",
                 f"seeds {r.n}/{runs}"]
        items += [f"{verdicts.display_name(m)} {view.figures.get(r.key, {}).get(m, Figure(m, [])).text()}"
                  for m in view.extra]
        if view.lr:
            items.append(f"lr {view.lr[r.key]:g}" if view.lr.get(r.key) is not None else "lr -")
        health = "; ".join(x for x in (r.status or verdicts.health_text(r.health), others) if x and x != "-")
        if health:
            items.append(health)
        out += [("", ln) for ln in pack(items, width, ind)]
    if view.contended:
        out += [("yellow", ln) for ln in wrap(contended_note(view), width, "  ", first="")]
    for m, an, what in view.tables:
        out.append(("", ""))
        bases = {c.b for c in an.comparisons}
        one_base = len(bases) == 1 and "baseline" in what
        title = table_title(view, m, an, what)
        if one_base:
            b = next(iter(bases))
            title = title.replace(f"the baseline {by_key[b].label}", f"the baseline #{view.numbers[b]} "
                                                                     f"({by_key[b].label})")
        out += [("bold", ln) for ln in wrap(title, width, "")]
        adj = "p (Holm)" if an.correction == stats.HOLM else "p (adj.)"
        rows, left = verdicts.shown_comparisons(an)
        for c in rows:
            na, nb = view.numbers.get(c.a), view.numbers.get(c.b)
            lead = f"#{na} − #{nb}: "
            label = c.a_label if one_base else f"{c.a_label}  minus  {c.b_label}"
            out += [("bold", ln) for ln in wrap(label, width, " " * len(lead), first=lead)]
            items = [f"Δ {verdicts.fmt(c.delta, signed=True)}",
                     "" if c.ci_low is None else f"{an.interval_header} "
                     f"[{verdicts.fmt(c.ci_low, signed=True)}, {verdicts.fmt(c.ci_high, signed=True)}]",
                     f"p {stats.fmt_p(c.p_value)}", f"{adj} {stats.fmt_p(c.p_adjusted)}", f"test: {c.test}",
                     "" if c.mdd is None else f"MDD {verdicts.fmt(c.mdd)}", f"verdict: {c.verdict}"]
            out += [("", ln) for ln in pack(items, width, ind)]
        if left:
            out += [("", ln) for ln in wrap(left, width, "  ", first="")]
    within = contrasts.lines(view.within)
    if within:
        out.append(("", ""))
        out += [("bold", ln) for ln in wrap(within[0], width, "")]
        for line in within[1:]:
            out += [("", ln) for ln in wrap(line, width, "      ", first="")]
    out.append(("", ""))
    out += [("dim", ln) for ln in wrap(legend(view), width, "")]
    return out


def as_json(view: View) -> list[dict[str, Any]]:
    """One object per verdict table: the analysis as ``abl compare --json`` has always given it, each cell
    with its number, its figures (mean, std, min, max over seeds) and whether its speed was contended."""
    out = []
    for m, an, what in view.tables:
        cells = []
        for r in an.cells:
            figs = view.figures.get(r.key, {})
            cells.append({**r.__dict__, "health": r.health.__dict__, "number": view.numbers.get(r.key),
                          "figures": {k: f.as_dict() for k, f in figs.items()},
                          "contended": any(f.contended for f in figs.values())})
        out.append({"metric": m, "comparisons_of": what, "method": an.method, "cells": cells,
                    "comparisons": [c.as_dict() for c in an.comparisons],
                    **({"axes": verdicts.effects_json(view.effects)} if m == view.metric else {})})
    return out


def csv_rows(view: View) -> list[dict[str, Any]]:
    """One row per cell (raw numbers, for a spreadsheet): the ranking metric's statistics, every verdict
    table's verdict against its comparison's other side, and the figures' mean and std."""
    rows = []
    by_key = {c.key: c for c in view.cells}
    for r in view.ranked():
        row: dict[str, Any] = {"number": view.numbers[r.key], "label": r.label, "rank": r.rank, "group": r.group,
                               "unranked": r.unranked, "seeds": r.n,
                               "runs": sum(by_key[r.key].statuses.values()) if r.key in by_key else r.n,
                               f"{view.metric}_mean": r.mean, f"{view.metric}_std": r.std,
                               f"{view.metric}_ci_low": r.ci_low, f"{view.metric}_ci_high": r.ci_high}
        for m, an, _ in view.tables:
            if m != view.metric:
                c = an.cell(r.key)
                row.update({f"{m}_mean": c.mean, f"{m}_std": c.std})
        for m in view.extra:
            f = view.figures.get(r.key, {}).get(m) or Figure(m, [])
            row[f"{m}_mean"], row[f"{m}_std"] = f.mean, f.std
        if view.lr:
            row["lr"] = view.lr.get(r.key)
        row["contended"] = any(f.contended for f in view.figures.get(r.key, {}).values())
        row["health"] = r.status or verdicts.health_text(r.health)
        rows.append(row)
    return rows


def as_csv(view: View) -> str:
    import csv
    import io

    rows = csv_rows(view)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue()


def _md_cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def as_md(view: View) -> str:
    """The tables as Markdown (readable headers, whole labels)."""
    lines: list[str] = []

    def table(header: list[str], rows: list[list[Any]]) -> None:
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        lines.extend("| " + " | ".join(_md_cell(x) for x in row) + " |" for row in rows)
        lines.append("")

    by_key = {c.key: c for c in view.cells}
    eff = effect_lines(view)
    if eff:
        lines += [f"### {eff[0]}", "", *[f"- {_md_cell(x.strip())}" for x in eff[1:]], ""]
    lines += [f"### {view.title}: {view.metric} by cell, best first", ""]
    name = verdicts.display_name(view.metric)
    header = ["#", "rank", "cell", "seeds", f"{name} (mean ± std)", "95% CI",
              *[verdicts.display_name(m) for m in view.extra], *(["lr"] if view.lr else []), "health"]
    rows = []
    for r in view.ranked():
        runs = sum(by_key[r.key].statuses.values()) if r.key in by_key else r.n
        rows.append([view.numbers[r.key], r.rank_text, r.label, f"{r.n}/{runs}",
                     verdicts.fmt(r.mean) + ("" if r.std is None else f" ± {verdicts.fmt(r.std)}"),
                     "-" if r.ci_low is None else f"[{verdicts.fmt(r.ci_low)}, {verdicts.fmt(r.ci_high)}]",
                     *[(view.figures.get(r.key, {}).get(m) or Figure(m, [])).text().replace("*", "\\*")
                       for m in view.extra],
                     *([f"{view.lr[r.key]:g}" if view.lr and view.lr.get(r.key) is not None else "-"]
                       if view.lr else []),
                     r.status or verdicts.health_text(r.health)])
    table(header, rows)
    if view.contended:
        lines += ["\\" + contended_note(view), ""]
    for m, an, what in view.tables:
        lines += [f"### {table_title(view, m, an, what)}", ""]
        rows_shown, left = verdicts.shown_comparisons(an)
        if rows_shown:  # no header of an empty table: the sentence below says why nothing is listed
            table(["a", "b", "Δ = a − b", an.interval_header, "p", "p (Holm)" if an.correction == stats.HOLM else "p (adj.)",
                   "test", "MDD", "verdict"],
                  [[f"#{view.numbers.get(c.a)} {c.a_label}", f"#{view.numbers.get(c.b)} {c.b_label}",
                    verdicts.fmt(c.delta, signed=True),
                    "-" if c.ci_low is None else
                    f"[{verdicts.fmt(c.ci_low, signed=True)}, {verdicts.fmt(c.ci_high, signed=True)}]",
                    stats.fmt_p(c.p_value), stats.fmt_p(c.p_adjusted), c.test, verdicts.fmt(c.mdd), c.verdict]
                   for c in rows_shown])
        if left:
            lines += [left, ""]
    lines += [legend(view), ""]
    return "\n".join(lines)


def show(console, view: View, presentation: Presentation | None = None) -> None:
    """Print ``view``: as JSON / CSV / Markdown on stdout, else as tables or the stacked layout."""
    from rich.text import Text

    p = presentation or Presentation()
    if p.fmt == "json":
        click.echo(json.dumps(as_json(view), indent=1, default=str))
        return
    if p.fmt == "csv":
        click.echo(as_csv(view), nl=False)
        return
    if p.fmt == "md":
        click.echo(as_md(view))
        return
    tables = _tables(view)
    layout = p.layout
    if layout == "auto":
        layout = "wide" if all(fits(console, t) for t in tables) else "stacked"
    if layout == "stacked":
        for style, line in stacked_lines(view, console.width):
            console.print(Text(line, style=style), soft_wrap=True)
        return
    for i, line in enumerate(effect_lines(view)):
        console.print(Text(line, style="bold" if i == 0 else ""))
    print_wide(console, tables[0])
    if view.contended:
        console.print(contended_note(view), style="yellow")
    for t in tables[1:]:
        print_wide(console, t)
    for i, line in enumerate(contrasts.lines(view.within)):
        console.print(Text(line, style="" if i else "bold"), soft_wrap=True)
    console.print(Text(legend(view), style="dim"))


def render(console, runs, *, metrics: Sequence[str], title: str, order: Sequence[str] | None = None,
           paths: Sequence[str] = (), baseline: str | None = None, pairs: Sequence[str] = (),
           by: str | None = None, bootstrap: bool = False, correction: str = stats.HOLM,
           presentation: Presentation | None = None) -> list[stats.Analysis]:
    """Print the cell table (ranked by the first metric) and one verdict table per loss metric."""
    p = presentation or Presentation()
    view = build(runs, metrics=metrics, title=title, order=order, paths=paths, baseline=baseline, pairs=pairs,
                 by=by, bootstrap=bootstrap, correction=correction, every_metric=p.fmt == "json")
    show(console, view, p)
    return [an for _, an, _ in view.tables]


def print_run_summary(console, db_path: Path, grid, detect: float | None = None,
                      presentation: Presentation | None = None) -> None:
    """The end of ``abl run``: the grid's verdict tables (and with ``detect``, the seeds it would need)."""
    exp = grid.cells[0].experiment
    metrics = list(getattr(exp, "summary", None) or ["val_loss"])
    order = list(dict.fromkeys(c.cell_key for c in grid.cells))
    paths = list(getattr(grid, "grid_paths", None) or [])
    try:
        runs = load(db_path, run_ids=[c.run_id for c in grid.cells], metrics=metrics)
        if not runs:
            return
        if metrics == ["val_loss"]:  # the default: a grid that names its metrics gets them as named
            from .report.runs import comparison_metric, group_cells

            if comparison_metric(group_cells(runs, order)) == "val_bpb":
                # the cells' data or tokenizers differ, so a token is not one unit: bits per byte rank them
                metrics = ["val_bpb", "val_loss"]
                console.print("val_bpb: validation loss in bits per byte of text (the cells' data or "
                              "tokenizers differ, so a token is not the same unit: bits per byte rank them)")
        p = presentation or Presentation()
        view = build(runs, metrics=metrics, title=exp.name, order=order, paths=paths,
                     baseline=getattr(exp, "baseline", "") or None, every_metric=p.fmt == "json")
        show(console, view, p)
        labels = run_labels(runs, paths)
        compiled: dict[str, list[float]] = {}  # train.compile cells: their compile time, apart from tokens/s
        for r in runs:
            if r.final.get("compile_s") is not None:
                compiled.setdefault(labels.get(r.cell_key, r.label), []).append(float(r.final["compile_s"]))
        for label, times in compiled.items():
            console.print(f"torch.compile time, {label}: {sum(times) / len(times):.1f} s per run "
                          "(before the first step; not in tokens/s)")
        if detect is not None:
            cells = verdicts.cell_inputs(runs, metrics[0], order)
            termlayout.print_wrapped(console, verdicts.seeds_for_effect(cells, detect, max(1, len(cells) - 1)))
        for line in verdicts.verdict_lines(view.effects) if p.fmt == "table" else []:  # the grid's answer, last
            console.print(line, style="bold", markup=False)
    except verdicts.VerdictError as exc:
        console.print(f"[yellow]statistics: {exc}[/]")
    except Exception as exc:  # noqa: BLE001 - statistics must never hide the results or lose the run
        console.print(f"[yellow]statistics unavailable: {type(exc).__name__}: {exc}[/]")


def print_detect(grid, db_path: Path, detect: float) -> None:
    """``abl run --dry-run --detect``: the seeds needed, from the grid's runs stored so far (of an lr sweep,
    the caller passes its phase 2: abl.run.lr_sweep.compared_grid)."""
    exp = grid.cells[0].experiment
    metrics = list(exp.summary or ["val_loss"])
    order = list(dict.fromkeys(c.cell_key for c in grid.cells))
    runs = load(db_path, run_ids=[c.run_id for c in grid.cells], metrics=metrics) if db_path.exists() else []
    cells = verdicts.cell_inputs(runs, metrics[0], order)
    termlayout.print_wrapped(termlayout.output_console(),
                             verdicts.seeds_for_effect(cells, detect, max(1, len(order) - 1)))

