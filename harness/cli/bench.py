"""``abl bench kernels``, ``harness`` and ``seeds``: benchmarks of the kernels and of the harness."""

from __future__ import annotations

import click

from ..store.workspace import DEFAULT_DB, Workspace
from .common import fail, plugins_dir_option, user_errors


@click.group("bench")
def command():
    """Benchmarks of the harness itself (abl bench kernels)."""


_BENCH_OPS = ("rmsnorm", "layernorm", "rope", "swiglu", "geglu", "cross_entropy", "linear_cross_entropy",
              "flash_attention", "ssd_scan")


@command.command("kernels")
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
def kernels(ops, providers, dtypes, passes, size, device, as_json, db_path, no_store):
    """Time every kernel op for every available provider: triton, torch, torch.compile, peers.

    p20/p50/p80 in milliseconds, effective GB/s (memory-bound ops) or TFLOP/s
    (attention, fused LM-head cross-entropy) and the fraction of the device's
    peak; stored in the database's ``bench`` table.
    """
    import json

    from ..bench.kernelbench import run_bench, store_rows
    from ..run.preflight import db_problems
    from ..train.loop import resolve_device

    db = Workspace.at(db_path).db  # --db has a default: no rule to apply
    problems = [] if no_store else db_problems(db)  # a store that cannot take the rows: before timing
    if problems:
        fail("\n".join(problems))

    try:
        dev = resolve_device(device)
    except RuntimeError as exc:
        fail(str(exc))
    rows = run_bench(dev, ops=list(ops) or None, providers=list(providers) or None,
                     dtypes=list(dtypes) or None, passes=list(passes) or None, size=size,
                     log=lambda msg: click.echo(msg, err=True))
    if not no_store:
        try:
            store_rows(db, rows)
        except user_errors() as exc:
            fail(str(exc))
    if as_json:
        click.echo(json.dumps(rows, indent=1, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    device_name = rows[0]["device"] if rows else str(dev)
    table = Table(title=f"abl bench kernels: {device_name} (times in ms)")
    for col in ("op", "shape", "dtype", "pass", "provider"):
        table.add_column(col)
    for col in ("p20", "p50", "p80", "GB/s", "TFLOP/s", "of peak"):
        table.add_column(col, justify="right")

    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    for r in rows:
        table.add_row(r["op"], r["shape"], r["dtype"], r["pass"], r["provider"], num(r["p20"], ".4g"),
                      num(r["p50"], ".4g"), num(r["p80"], ".4g"), num(r["gbps"], ".3g"),
                      num(r["tflops"], ".3g"),
                      "-" if r["peak_fraction"] is None else f"{100 * r['peak_fraction']:.1f}%")
    console = Console()
    console.width = max(console.width, 150)  # one row per line, also when piped
    console.print(table)
    for basis in dict.fromkeys(r["peak_basis"] for r in rows):
        click.echo(f"peak: {basis}")
    if not no_store:
        click.echo(f"stored {len(rows)} rows in {db_path} (table bench)")


@command.command("harness")
@click.option("--steps", default=200, show_default=True, type=click.IntRange(min=1),
              help="Training steps of the cell.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override the default cell (as in abl run), e.g. --set train.compile=true.")
@click.option("--cells", default=1, show_default=True, type=click.IntRange(min=1, max=64),
              help="Run this many cells of the same shape (seeds) one after another and report a cell "
                   "in the running grid (the first, with the run's one-off costs, apart).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@plugins_dir_option
def harness(steps, overrides, cells, as_json):
    """One cell as abl run runs it: its wall time split into training steps and the rest.

    Runs in a scratch store (nothing is kept); ``overhead`` is the share of the
    cell's wall time spent outside its training steps.
    """
    import json

    from ..bench.harness import run_harness_bench

    try:
        out = run_harness_bench(steps, list(overrides), cells=cells)
    except user_errors() as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(str(exc))
    except RuntimeError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(1) from None
    if as_json:
        click.echo(json.dumps(out, indent=1))
        return
    if "first_cell" in out:
        f = out["first_cell"]
        click.echo(f"{out['cells']} cells of one shape in {out['grid_wall_s']:.1f} s; the first (with the run's "
                   f"one-off costs) took {f['cell_wall_s']:.2f} s, overhead {100 * f['overhead']:.1f}% "
                   f"({100 * f['overhead_besides_evaluations']:.1f}% besides the grid's evaluations); "
                   f"a cell in the running grid (median of the others):")
    click.echo(f"cell {out['cell']}, {out['steps']} steps: {out['cell_wall_s']:.2f} s of wall time")
    for key, what in (("steps_s", "training steps"), ("loop_other_s", "rest of the loop (evals, tracker)"),
                      ("before_loop_s", "worker, before the first step"),
                      ("after_loop_s", "worker, after the last step"),
                      ("process_s", "process start, imports, store")):
        click.echo(f"  {what:<36} {out[key]:8.2f} s  {100 * out[key] / out['cell_wall_s']:5.1f}%")
    if out["compile_s"] is not None:
        click.echo(f"  (of which torch.compile: {out['compile_s']:.2f} s)")
    click.echo(f"  (of which the grid's evaluations:    {out['evaluations_s']:8.2f} s  "
               f"{100 * out['evaluations_s'] / out['cell_wall_s']:5.1f}%)")
    click.echo(f"overhead (wall time outside the training steps): {100 * out['overhead']:.1f}%; "
               f"besides the grid's evaluations: {100 * out['overhead_besides_evaluations']:.1f}%")
    if out.get("grid", {}).get("line"):  # what abl run ends with (abl.run.busy)
        click.echo(out["grid"]["line"])


@command.command("seeds")
@click.option("--seeds", default=4, show_default=True, type=click.IntRange(min=2, max=64),
              help="Models of one cell, one per seed.")
@click.option("--steps", default=20, show_default=True, type=click.IntRange(min=1), help="Timed steps of each way.")
@click.option("--warmup", default=3, show_default=True, type=click.IntRange(min=0), help="Untimed steps before.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override the default cell (as in abl run), e.g. --set train.kernels=torch.")
@click.option("--no-concurrent", is_flag=True, help="Skip the one-process-per-seed way.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@plugins_dir_option
def seeds(seeds, steps, warmup, overrides, no_concurrent, as_json):
    """The seeds of one cell trained as one stacked model (torch.func vmap), apart, and one process each.

    Times a step of all the seeds each way on this device and says whether the stacked losses match the
    apart ones (issue 37, item 4: whether stacking seeds pays before abl run does it).
    """
    import json

    from ..bench.seeds import run_seeds_bench

    try:
        out = run_seeds_bench(seeds, steps, warmup, overrides=list(overrides), concurrent=not no_concurrent)
    except user_errors() as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(str(exc))
    if as_json:
        click.echo(json.dumps(out, indent=1))
        return
    click.echo(f"cell {out['cell']}, {out['seeds']} seeds, {out['device']}, kernels {out['kernels']}, precision "
               f"{out['precision']}; median of {out['steps']} steps after {out['warmup']}, load {out['load']:.2f}")
    for key, what, error in (("apart_step_s", "apart (one after another)", "apart_error"),
                             ("concurrent_step_s", "concurrent (a process each)", "concurrent_error"),
                             ("stacked_step_s", "stacked (vmap)", "stacked_error")):
        value = out[key]
        shown = f"{1e3 * value:9.1f} ms a step of all seeds" if value is not None else f"not measured: {out.get(error)}"
        click.echo(f"  {what:<28} {shown}")
    if out.get("unbatched_ops"):
        click.echo(f"  (no batching rule, run once per seed: {', '.join(out['unbatched_ops'])})")
    if out.get("loss_check"):
        lc = out["loss_check"]
        click.echo(f"stacked vs apart: {out['speedup_vs_apart']:.2f}x"
                   + (f", vs concurrent {out['speedup_vs_concurrent']:.2f}x" if "speedup_vs_concurrent" in out else "")
                   + f"; losses of the first {lc['steps']} steps "
                   + ("bit for bit the same" if lc["bitwise"] else f"differ by up to {lc['max_abs_diff']:.2g}"))
