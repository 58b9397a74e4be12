"""The ``abl`` command line: every command's click declaration (its arguments, options and help) in one place.

Each command's body lives in a module of its own, imported when the command
runs: run, plugins, ingest, dashboard, cost, report, compare, bench, selftest; what they
share (the default store, user errors as exit status 2, the store's lock) is
in common. Imports stay lazy so ``abl --help`` does not load torch. The top
layer: may import every layer of ``abl`` below it (run, bench, present, store,
the dashboard, ...); nothing imports it. Plugins add commands through the
``register_commands`` hook, loaded on first use.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from .choices import ExecutorChoice
from .common import DEFAULT_DB, fail, user_errors


class AblGroup(click.Group):
    """Built-in commands are listed eagerly; plugin commands load on first use."""

    _plugins_loaded = False

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        if cmd is None and not AblGroup._plugins_loaded:
            AblGroup._plugins_loaded = True
            from ..contracts.plugin_manager import load_plugins

            try:
                load_plugins().hook.register_commands(cli=self)
            except user_errors() as exc:
                fail(str(exc))
            cmd = super().get_command(ctx, name)
        return cmd


def _add_plugins_dirs(ctx, param, value):
    """``--plugins-dir``, before or after the command: each folder joins ``ABL_PLUGINS_DIR``
    (abl.contracts.plugin_manager loads every *.py file in it) before any plugin loads."""
    if value:
        existing = [p for p in os.environ.get("ABL_PLUGINS_DIR", "").split(os.pathsep) if p]
        added = [str(Path(d).resolve()) for d in value]
        os.environ["ABL_PLUGINS_DIR"] = os.pathsep.join(existing + [d for d in added if d not in existing])
    return value


def plugins_dir_option(f):
    """The ``--plugins-dir`` option: on the group (``abl --plugins-dir D run ...``) and on every command
    that loads plugins (``abl run ... --plugins-dir D``)."""
    return click.option("--plugins-dir", type=click.Path(file_okay=False), multiple=True, expose_value=False,
                        is_eager=True, callback=_add_plugins_dirs,
                        help="Also load every *.py file in this folder as a plugin (repeatable).")(f)


@click.group(cls=AblGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="abl")
@plugins_dir_option
def cli():
    """abl: ablations of decoder-only LM architectures, on your data and hardware.

    Run a grid of small training runs (abl run GRID.toml), list the variants
    (abl plugins), and compare results (abl dashboard).
    """


@cli.command("run")
@click.argument("grid_file", type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override any config key, e.g. --set model.d_model=64 (repeatable).")
@click.option("--dry-run", is_flag=True, help="Print the cells and exit without training.")
@click.option("--db", "db_path", default=None,
              help=f"DuckDB file to write (default: experiment.db of the grid, else {DEFAULT_DB}).")
@click.option("--runs-dir", default=None, help="Run folders (default: runs/ beside the database).")
@click.option("--retry", type=click.Choice(["failed"]), default=None,
              help="Also re-run cells that failed, diverged or ran out of memory.")
@click.option("--max-cells", default=10_000, show_default=True, type=click.IntRange(1),
              help="Refuse grids with more runs than this.")
@click.option("--executor", type=ExecutorChoice(), default="local", show_default=True,
              help="Where cells run: this machine, Slurm jobs (submitit), Ray tasks, or a plugin's executor "
                   "(abl plugins lists them).")
@click.option("--workers", default=None, type=click.IntRange(1, 256),
              help="local: cells at once (default: one per GPU, else 1).")
@click.option("--slurm-partition", default=None, help="slurm: partition.")
@click.option("--slurm-time", default=60, show_default=True, type=click.IntRange(1), help="slurm: minutes per cell.")
@click.option("--slurm-cluster", type=click.Choice(["slurm", "local"]), default="slurm", show_default=True,
              help="slurm: 'local' runs the submitit path on this machine without Slurm.")
@click.option("--gpus-per-cell", default=0, show_default=True, type=click.IntRange(0),
              help="slurm/ray: GPUs reserved per cell.")
@click.option("--ray-address", default=None, help="ray: address of an existing cluster (default: start a local one).")
@click.option("--detect", type=click.FloatRange(min=0, min_open=True), default=None, metavar="EFFECT",
              help="Also print how many seeds per cell the grid needs to detect this difference of the "
                   "first summary metric at the observed variance (with --dry-run: from the runs stored so far).")
@click.option("--wait", is_flag=True, help="If another abl run or ingest writes this database, queue behind it "
              "instead of stopping.")
@click.option("--force", is_flag=True, help="Run even if the cells' predicted memory does not fit the free memory.")
@click.option("--only", "only", multiple=True, metavar="AXIS=V1,V2",
              help="Run only the cells with these values of a grid axis, e.g. --only 'model.norm=rmsnorm,layernorm' "
                   "(repeatable, one per axis); run ids stay those of the full grid.")
@click.option("--cells", "cell_numbers", default=None, metavar="N,M-K",
              help="Run only these cells, by their number in --dry-run's listing, e.g. --cells 1,3 or 2-4.")
@click.option("--wide", is_flag=True, help="Print the summary as full-width tables (default: tables when they "
              "fit the terminal, else one block per cell).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv", "md"]), default="table",
              show_default=True, help="The summary at the end as JSON, CSV or Markdown on stdout (progress goes "
              "to stderr), for piping.")
@plugins_dir_option
def run_command(**options):
    """Expand GRID_FILE into cells, validate them all, then train those not yet completed.

    Running the same command again resumes the grid: completed cells are
    skipped, killed or interrupted ones restart (from their checkpoint when
    train.checkpoint_every is set), failed and diverged ones re-run only with
    --retry failed.
    """
    from .run import run

    run(**options)


@cli.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of the listing.")
@click.option("--recipe", "recipe", default=None, metavar="NAME",
              help="Show one architecture recipe whole: every setting with its source, and its gaps.")
@plugins_dir_option
def plugins_command(**options):
    """List every registered component by axis, and the architecture recipes: where each came from,
    what it is, its parameters.

    Each component gets a line with its name and origin (built-in, the
    installed package of an entry point, or the file a --plugins-dir folder
    held), the first sentence of its docstring, and one line per parameter
    with its type and default; long lines wrap, nothing is cut. Each recipe
    (model.recipe) gets its origin and a one-line source; --recipe NAME shows
    its every setting with the source that gives it.
    """
    from .plugins import plugins

    plugins(**options)


@cli.command("ingest")
@click.argument("run_dirs", nargs=-1, type=click.Path(exists=True, file_okay=False))
@click.option("--db", "db_path", default=DEFAULT_DB, show_default=True)
@click.option("--runs-dir", default=None, help="Ingest every run folder in here (default: runs/ beside the database).")
@click.option("--wait", is_flag=True, help="If another abl run or ingest writes this database, queue behind it.")
@plugins_dir_option
def ingest_command(**options):
    """Copy run folders into the database (rebuilds it from the folders if needed).

    A run whose worker completed but whose folder is not whole (a cut or
    garbled metrics.jsonl, a missing last step) is stored as incomplete, with
    what is missing; ingesting it again after a repair restores it.
    """
    from .ingest import ingest

    ingest(**options)


@cli.command("dashboard")
@click.option("--db", "db_path", default=DEFAULT_DB, show_default=True, help="DuckDB file to read.")
@click.option("--runs-dir", default=None,
              help="Run folders, read for the live metrics of running cells (default: runs/ beside the database).")
@click.option("--port", default=8501, show_default=True, type=click.IntRange(1, 65535))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; the default serves this machine only.")
@click.option("--snapshot", "snapshot_dir", default=None, type=click.Path(file_okay=False),
              help="Instead of serving: save a full-page PNG of every page into this folder and exit "
                   "(headless Chromium; a plain `chromium --screenshot` captures the page before it has drawn).")
@click.option("--width", "widths", multiple=True, type=click.IntRange(320, 4000),
              help="Window width in pixels for --snapshot (repeatable; default 1400).")
@plugins_dir_option
def dashboard_command(**options):
    """Serve the Streamlit comparison dashboard (needs the 'dashboard' extra).

    It only reads the store, with short read-only connections, so it can stay
    open while abl run writes to the same database. With --snapshot it saves a
    screenshot of every page instead.
    """
    from .dashboard import dashboard

    dashboard(**options)


@cli.command("cost")
@click.argument("grid_file", type=click.Path(dir_okay=False), required=False)
@click.option("--recipe", "recipes", multiple=True, metavar="NAME",
              help="Cost this architecture recipe at the grid's size (repeatable; 'all' = every recipe); "
                   "without GRID_FILE, at the default size (--set model.d_model=... to change it).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override any config key, e.g. --set model.d_model=64 (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list (one object per cell) instead.")
@plugins_dir_option
def cost_command(**options):
    """Print the predicted cost of every cell of GRID_FILE (or of each --recipe); nothing is trained.

    Parameters, FLOPs per token and per step, activation, parameter/optimizer
    and KV-cache memory, from the cost functions the components declare
    (harness/model/costmodel.py).
    """
    from .cost import cost

    cost(**options)


@cli.command("report")
@click.argument("source", metavar="GRID_FILE_OR_EXPERIMENT")
@click.option("--db", "db_path", default=None,
              help=f"DuckDB file to read (default: experiment.db of the grid, else {DEFAULT_DB}).")
@click.option("--out", "out_dir", default=None,
              help="Folder to write the report into (default: reports/<experiment>/ beside the database).")
@click.option("--format", "fmt", type=click.Choice(["md", "html"]), default="md", show_default=True,
              help="md: report.md with PNG plots beside it; html: one self-contained report.html.")
@click.option("--baseline", default=None,
              help="Baseline cell by label, cell key prefix or 1-based index (default: the grid's first cell).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Overrides used when the grid was run (so the same cells are found).")
@plugins_dir_option
def report_command(**options):
    """Write a self-contained report of a finished (or partly finished) grid.

    GRID_FILE_OR_EXPERIMENT is a grid file (its cells are looked up in the
    store) or an experiment name. The report holds the conditions, the grid,
    the comparison table with 95% CIs and verdicts against the baseline, loss
    curves, quality vs cost, predicted vs measured costs and, with at least 4
    model sizes spanning at least 4x in parameters, a scaling-law fit. A
    section that would mean nothing for these cells is left out, with one
    sentence saying why.
    """
    from .report import report

    report(**options)


@cli.command("compare")
@click.argument("source", metavar="EXPERIMENT_OR_GRID")
@click.option("--db", "db_path", default=None,
              help=f"DuckDB file to read (default: experiment.db of the grid, else {DEFAULT_DB}).")
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
def compare_command(**options):
    """Compare the stored runs of an experiment (or grid file) any way you like; nothing is trained.

    Same tests and words as the run summary, the report and the dashboard:
    first each swept axis's main effect (OLS with the other axes and the seed
    as blocks, Holm over the level pairs); then the cells, ranked as tie
    groups, and the comparisons: paired by seed when the cells share seeds and
    data order, else Welch; Holm over the comparisons shown, intervals
    adjusted alike; fewer than 3 seeds: too few to decide (no detectable
    difference); cells that did not learn are not ranked.
    """
    from .compare import compare

    compare(**options)


@cli.group("bench")
def bench_group():
    """Benchmarks of the harness itself (abl bench kernels)."""


_BENCH_OPS = ("rmsnorm", "layernorm", "rope", "swiglu", "geglu", "cross_entropy", "linear_cross_entropy",
              "flash_attention", "ssd_scan")


@bench_group.command("kernels")
@click.option("--op", "ops", multiple=True, type=click.Choice(_BENCH_OPS),
              help="Only these ops (repeatable; default: all).")
@click.option("--provider", "providers", multiple=True,
              type=click.Choice(["triton", "torch", "torch.compile", "liger", "flash-attn", "mamba-ssm"]),
              help="Only these providers (repeatable; default: every one available here).")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(["fp32", "bf16", "fp16"]),
              help="Input dtypes (repeatable; default bf16 on CUDA, fp32 on CPU).")
@click.option("--pass", "passes", multiple=True, type=click.Choice(["fwd", "bwd", "fwd+bwd"]),
              help="Passes to time (repeatable; default all three).")
@click.option("--size", type=click.Choice(["auto", "small", "large"]), default="auto", show_default=True,
              help="Shapes: small (CPU default) or large (CUDA default).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON instead of a table.")
@click.option("--db", "db_path", default=DEFAULT_DB, show_default=True, help="DuckDB file to write.")
@click.option("--no-store", is_flag=True, help="Do not write the rows to the database.")
def bench_kernels_command(**options):
    """Time every kernel op for every available provider: triton, torch, torch.compile, peers.

    p20/p50/p80 in milliseconds, effective GB/s (memory-bound ops) or TFLOP/s
    (attention, fused LM-head cross-entropy) and the fraction of the device's
    peak; stored in the database's ``bench`` table.
    """
    from .bench import kernels

    kernels(**options)


@bench_group.command("harness")
@click.option("--steps", default=200, show_default=True, type=click.IntRange(min=1),
              help="Training steps of the cell.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override the default cell (as in abl run), e.g. --set train.compile=true.")
@click.option("--cells", default=1, show_default=True, type=click.IntRange(min=1, max=64),
              help="Run this many cells of the same shape (seeds) one after another and report a cell "
                   "in the running grid (the first, with the run's one-off costs, apart).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@plugins_dir_option
def bench_harness_command(**options):
    """One cell as abl run runs it: its wall time split into training steps and the rest.

    Runs in a scratch store (nothing is kept); ``overhead`` is the share of the
    cell's wall time spent outside its training steps.
    """
    from .bench import harness

    harness(**options)


@cli.command("selftest")
@click.option("--quick", is_flag=True, help="Small sizes, one shape per op and dtype, short cells (what CI runs; "
              "on a CPU the kernels run in the Triton interpreter).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout (progress goes to stderr).")
@click.option("--db", "db_path", default=DEFAULT_DB, show_default=True,
              help="DuckDB file to write the report's rows to (table selftest); its JSON file goes beside it, "
                   "in selftest/.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
def selftest_command(**options):
    """Validate this machine in one command: environment, kernels, peaks, kernel bench, training.

    Reports the device and versions, which precisions are real here and which
    optional kernel providers import; checks every kernel op forward and
    backward against its reference; measures matmul and copy peaks beside the
    recorded ones; times the kernels against those peaks; trains short cells
    per precision, kernel backend and compile mode and checks that their
    losses agree. Writes a table, a JSON file and rows in the store; exits 1
    when a check fails.
    """
    from .selftest import selftest

    selftest(**options)


def main() -> None:
    cli(prog_name="abl")
