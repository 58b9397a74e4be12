"""``abl ladder``: does the tiny-scale answer hold as the model grows? Per pair of variants along a size ladder.

The use case: resolve the runs (abl.cli.resolve, as abl compare does) of a grid file with a ``[ladder]``
(abl.grid.ladder) or of an experiment whose runs sweep sizes, group them into variants and sizes, and
print abl.analysis.ladder's verdicts: the ordering at each size, where the loss-compute fits cross, the
predicted difference at ``--at`` FLOPs.
"""

from __future__ import annotations

import click

from .common import fail, plugins_dir_option, read_db_option, user_errors
from .resolve import compared


@click.command("ladder")
@click.argument("source", metavar="EXPERIMENT_OR_GRID")
@read_db_option
@click.option("--metric", default="val_loss", show_default=True, help="The loss compared at each size.")
@click.option("--size", "size_paths", multiple=True, metavar="PATH",
              help="A setting that makes the sizes (repeatable; default: the grid's [ladder] keys, else the "
                   "swept model.d_model / model.n_layers).")
@click.option("--at", "target", type=click.FloatRange(min=0, min_open=True), default=None, metavar="FLOPS",
              help="Also predict each pair's difference at this training compute, e.g. --at 1e18.")
@click.option("--probe", "probes", multiple=True, metavar="METRIC",
              help="Beside the ladder: does this metric at each size (a probe's accuracy, e.g. mqar_accuracy) "
                   "rank the variants as the largest size's loss does? Repeatable; default: every *_accuracy "
                   "the runs recorded. The smaller sizes' own loss is always shown as the reference.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Overrides used when the grid was run (so the same cells are found).")
@plugins_dir_option
def command(source, db_path, metric, size_paths, target, probes, overrides):
    """Per pair of variants trained at several sizes: holds across sizes, flips near X FLOPs, or undetermined.

    At each size the pair is compared paired by seed (the same test and words as abl compare); each
    variant's loss is fitted against its training compute as a power law, and the compute where two
    fits cross is given with a bootstrap interval over seeds (or "no crossing in range").
    """
    from ..analysis.ladder import LadderError
    from ..present.report.runs import ReportError

    try:
        runs, paths = _runs(source, db_path, overrides, list(size_paths))
        _show(runs, metric, paths, target, list(probes))
    except user_errors() + (LadderError, ReportError) as exc:
        fail(str(exc))


def _runs(source: str, db_path: str | None, overrides, size_paths: list[str]):
    """The runs ``source`` stands for (abl.cli.resolve, as ``abl compare`` reads them) and the settings that
    make their sizes: ``size_paths``, else the grid's [ladder] keys, else the swept d_model / n_layers."""
    chosen = compared(source, db_path, overrides, [])
    runs = chosen.runs
    size_paths = size_paths or [f"model.{k}" for k in (chosen.ladder.get("sizes") or [{}])[0] if k != "lr"]
    if not size_paths:
        swept = {p for r in runs for p in r.grid_varied}
        size_paths = [p for p in ("model.d_model", "model.n_layers") if p in swept]
    if not size_paths:
        fail("these runs sweep no size: name the settings that make the sizes with --size PATH, or run a grid "
             "with a [ladder] (docs/grids.md)")
    return runs, size_paths


def _show(runs, metric: str, size_paths: list[str], target: float | None, probes: list[str]) -> None:
    from ..analysis.ladder import analyse_ladder, ladder_of_runs
    from ..present import termlayout

    console = termlayout.output_console()
    result = analyse_ladder(ladder_of_runs(runs, metric, size_paths), target=target)
    console.print(f"[bold]{metric} along the ladder[/bold] (sizes by {', '.join(size_paths)}; "
                  f"{result.computes[0]:.3g} to {result.computes[1]:.3g} training FLOPs)")
    for v, fit in result.fits.items():
        console.print(f"  {v}: L(C) = {fit.predict(1.0).item():.4g} * C^-{fit.b:.4f}")
    for pair in result.pairs:
        termlayout.print_wrapped(console, pair.sentence())
    if result.rank_agreement is not None:
        lo, hi = result.rank_interval or (float("nan"), float("nan"))
        console.print(f"rank agreement, smallest vs largest size (Kendall's tau): {result.rank_agreement:+.2f} "
                      f"[{lo:+.2f}, {hi:+.2f}]")
    for note in result.notes:
        console.print(f"note: {note}")
    _show_probes(runs, metric, size_paths, probes, console)


def _show_probes(runs, metric: str, size_paths: list[str], probes: list[str], console) -> None:
    """Probes beside the ladder (abl.analysis.ladder.probe_agreement): each probe at each size, and the smaller
    sizes' own loss as the reference, against the largest size's loss order."""
    from ..analysis.ladder import ladder_of_runs, probe_agreement
    from ..analysis.metrics import lower_is_better
    from ..present import termlayout

    recorded = sorted({m for r in runs for m in (r.final or {}) if m.endswith("_accuracy")})
    missing = [p for p in probes if p not in {m for r in runs for m in (r.final or {})}]
    if missing:
        fail(f"no run recorded {', '.join(missing)}: a probe is recorded by eval.probes (docs/grids.md)"
             + (f"; these runs recorded {', '.join(recorded)}" if recorded else ""))
    names = probes or recorded
    tables = {p: ladder_of_runs(runs, p, size_paths) for p in names}
    rows = probe_agreement(ladder_of_runs(runs, metric, size_paths), {p: t for p, t in tables.items() if t},
                           target=metric, lower_is_better={p: lower_is_better(p) for p in names})
    if not rows:
        return
    console.print(f"[bold]beside the ladder[/bold]: does a measurement at a smaller size rank the variants as "
                  f"{metric} at the largest size does (Kendall's tau, paired bootstrap interval)?")
    for row in rows:
        termlayout.print_wrapped(console, "  " + row.sentence())
