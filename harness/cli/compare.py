"""``abl compare``: compare the stored runs of an experiment or grid, nothing trained.

The use case: resolve the runs (abl.cli.resolve: a grid file's cells, of an lr
sweep its phase 2 as the store's tuning chose it; or an experiment's runs),
build the view (abl.present.summary.build, on abl.analysis.verdicts) and print it.
"""

from __future__ import annotations

import click

from .common import fail, plugins_dir_option, read_db_option, user_errors
from .resolve import Compared, compared


@click.command("compare")
@click.argument("source", metavar="EXPERIMENT_OR_GRID")
@read_db_option
@click.option("--metric", "metrics", multiple=True,
              help="Metric(s) to compare (repeatable; default: the grid's experiment.summary, else val_loss).")
@click.option("--baseline", default=None, help="Compare every cell with this one (label, 1-based index or "
                                              "cell-key prefix; default: experiment.baseline or the first cell).")
@click.option("--pairs", "pairs", multiple=True, metavar="A,B",
              help="Compare these two cells, first minus second (repeatable), e.g. --pairs 3,4.")
@click.option("--by", "by", default=None, metavar="PATH",
              help="This axis's main effect (pooled over the other axes, paired by seed), then every pair "
                   "of cells that differ in this setting only, e.g. --by model.ffn.")
@click.option("--bootstrap", is_flag=True, help="Percentile-bootstrap CIs and p-values (non-normal cells).")
@click.option("--correction", type=click.Choice(["holm", "none"]), default="holm", show_default=True,
              help="Multiple-comparison correction over the comparisons shown.")
@click.option("--detect", type=click.FloatRange(min=0, min_open=True), default=None, metavar="EFFECT",
              help="Also print how many seeds per cell would detect this difference at the observed variance.")
@click.option("--json", "as_json", is_flag=True, help="Print the analysis as JSON (the same as --format json).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv", "md"]), default="table",
              show_default=True, help="JSON (every metric's analysis), CSV (one row per cell) or Markdown tables.")
@click.option("--wide", is_flag=True, help="Full-width tables (default: tables when they fit the terminal, else "
              "one block per cell).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Overrides used when the grid was run (so the same cells are found).")
@plugins_dir_option
def command(source, db_path, metrics, baseline, pairs, by, bootstrap, correction, detect, as_json, fmt, wide,
            overrides):
    """Compare the stored runs of an experiment (or grid file) any way you like; nothing is trained.

    Same tests and words as the run summary, the report and the dashboard:
    first each swept axis's main effect (OLS with the other axes and the seed
    as blocks, Holm over the level pairs); then the cells, ranked as tie
    groups, and the comparisons: paired by seed when the cells share seeds and
    data order, else Welch; Holm over the comparisons shown, intervals
    adjusted alike; fewer than 3 seeds: too few to decide (no detectable
    difference); cells that did not learn are not ranked.
    """
    from ..analysis.verdicts import VerdictError
    from ..present.report.runs import ReportError
    from ..present.termlayout import Presentation

    if as_json and fmt not in ("table", "json"):
        fail(f"give --json or --format {fmt}, not both (--json is --format json)")
    presentation = Presentation(layout="wide" if wide else "auto", fmt="json" if as_json else fmt)
    try:
        chosen = compared(source, db_path, overrides, list(metrics))
        _show(chosen, baseline=baseline, pairs=pairs, by=by, bootstrap=bootstrap, correction=correction,
              detect=detect, presentation=presentation)
    except user_errors() + (ReportError, VerdictError) as exc:
        fail(str(exc))


def _show(chosen: Compared, *, baseline, pairs, by, bootstrap, correction, detect, presentation) -> None:
    """The view of ``chosen`` (abl.present.summary.build), printed as ``presentation`` says; with
    ``detect``, the seeds per cell that would detect that effect."""
    from ..analysis import verdicts
    from ..present import termlayout
    from ..present.summary import build, show

    console = termlayout.output_console()
    view = build(chosen.runs, metrics=chosen.metrics, title=chosen.title, order=chosen.order, paths=chosen.paths,
                 baseline=baseline or chosen.baseline, pairs=pairs, by=by, bootstrap=bootstrap,
                 correction=correction, every_metric=presentation.fmt == "json")
    show(console, view, presentation)
    if detect is not None:
        cells = verdicts.cell_inputs(chosen.runs, chosen.metrics[0], chosen.order)
        msg = verdicts.seeds_for_effect(cells, detect, max(1, len(cells) - 1))
        if presentation.fmt == "table":
            termlayout.print_wrapped(console, msg)
        else:
            click.echo(msg, err=True)
