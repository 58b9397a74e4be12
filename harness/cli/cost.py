"""``abl cost``: the predicted cost of every cell of a grid, nothing trained."""

from __future__ import annotations

import json

import click

from .common import fail, load_registry, plugins_dir_option, user_errors


@click.command("cost")
@click.argument("grid_file", type=click.Path(dir_okay=False), required=False)
@click.option("--recipe", "recipes", multiple=True, metavar="NAME",
              help="Cost this architecture recipe at the grid's size (repeatable; 'all' = every recipe); "
                   "without GRID_FILE, at the default size (--set model.d_model=... to change it).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override any config key, e.g. --set model.d_model=64 (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list (one object per cell) instead.")
@plugins_dir_option
def command(grid_file, recipes, overrides, as_json):
    """Print the predicted cost of every cell of GRID_FILE (or of each --recipe); nothing is trained.

    Parameters, FLOPs per token and per step, activation, parameter/optimizer
    and KV-cache memory, from the cost functions the components declare
    (harness/model/costmodel.py).
    """
    from ..analysis.formats import fmt_bytes, fmt_si
    from ..model.costmodel import predict
    from ..run.guard import time_limit

    registry = load_registry()
    if grid_file is None and not recipes:
        fail("abl cost needs a GRID_FILE, or --recipe NAME (repeatable; 'all' = every recipe)")
    try:  # plugin code (checks, cost functions, a measured forward) under the time limit (abl.run.guard)
        with time_limit("loading the grid (its components' parameters, checks and costs)"):
            grid = _grid(grid_file, recipes, list(overrides), registry)
        cells = list({c.cell_key: c for c in reversed(grid.cells)}.values())[::-1]
        with time_limit("the cells' costs (the components' cost functions, or a measured step without one)"):
            preds = [predict(c, registry, measure_missing=True) for c in cells]
    except user_errors() as exc:
        fail(str(exc))
    for note in grid.notes:
        click.echo(f"note: {note}", err=True)
    if as_json:
        click.echo(json.dumps([{"cell": c.label, "cell_key": c.cell_key, **p} for c, p in zip(cells, preds)],
                              indent=1))
        return
    from rich.console import Console

    from ..present import termlayout

    rows = [{"params": f"{p['n_params']:,}", "non-emb": f"{p['n_params_non_embedding']:,}",
             "fwd FLOP /tok": fmt_si(p["flops_per_token"]), "train FLOP /step": fmt_si(p["flops_per_step"]),
             "useful": fmt_si(p["useful_flops_per_step"]),
             "6N·tok": fmt_si(p["flops_6n_per_token"] * p["tokens_per_step"]),
             "act. /step": fmt_bytes(p["activation_bytes_per_step"]),
             "params + grad + Adam": fmt_bytes(p["static_bytes"]),
             "decode cache": "-" if p["cost_source"] == "measured" else decode_cache_text(p),
             "est. peak": fmt_bytes(p["train_peak_bytes"]), "source": p["cost_source"]} for p in preds]
    measured = [i for i, p in enumerate(preds, 1) if p["cost_source"] == "measured"]
    title = "predicted cost per cell (no training)" if not measured else (
        "cost per cell: predicted, or measured on one step where a component declares no cost function"
        if len(measured) < len(preds) else "measured cost per cell (one step each on the CPU, no training)")
    title = f"{grid.path}: {title}"
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 160))
    table = cost_table(title, grid.grid_paths, cells, rows, list(rows[0]))
    if termlayout.fits(console, table):
        console.print(table)
    else:  # too wide for the terminal: compute and memory apart, each at its full width (no column cut)
        for part, cols in (("compute", COMPUTE), ("memory", MEMORY)):
            termlayout.print_wide(console, cost_table(f"{title}, {part}", grid.grid_paths, cells, rows, cols))
    conds = sorted({(p["tokens_per_step"], p["activation_dtype_bytes"], p["vocab_size"]) for p in preds})
    console.print("per step = train.batch_size x model.context tokens; training = forward + backward as "
                  "executed (flop-counter convention); useful = model FLOPs for MFU; 6N = 6 x non-embedding "
                  "params, for reference; decode cache = bytes per token of a cache that grows with the sequence "
                  "(/tok: a KV cache), or a fixed size per sequence (/seq fixed: a sliding window's cache or a "
                  "recurrent state). Conditions: " + "; ".join(
                      f"{t} tokens/step, activations {b} bytes/element, vocab {v}" for t, b, v in conds))
    if measured:
        from ..model.costmodel import missing_costs

        why = sorted({m for c, p in zip(cells, preds) if p["cost_source"] == "measured"
                      for m in missing_costs(c.components, registry)})
        console.print(f"measured (cells {', '.join(map(str, measured))}): {', '.join(why)} declare(s) no cost "
                      "function, so those cells were built once per shape on the CPU: FLOPs counted over one "
                      "forward and backward by torch.utils.flop_counter.FlopCounterMode (as executed, so useful "
                      "= counted), est. peak = live tensor memory over one training step (torch's MemTracker); "
                      "'-' = not measured (activations per step, KV cache). A cost function (docs/plugins.md, "
                      "'Costs') predicts them without building the model.")


COMPUTE = ("params", "non-emb", "fwd FLOP /tok", "train FLOP /step", "useful", "6N·tok", "source")
MEMORY = ("act. /step", "params + grad + Adam", "decode cache", "est. peak", "source")


def cost_table(title: str, paths, cells, rows: list[dict], cols):
    """A rich table of the cells' settings and the columns ``cols`` of ``rows``. Nothing is cut: a setting's
    name and values keep their width, and a header breaks only at its spaces."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("#", justify="right")
    names = [[str(c.varied.get(k, "?")) for k in paths] or [c.label] for c in cells]
    for j, path in enumerate(paths or ["cell"]):
        table.add_column(path, min_width=max(len(v) for v in [path, *(n[j] for n in names)]), no_wrap=True)
    for col in cols:
        table.add_column(col, justify="right", no_wrap=True,
                         min_width=max([len(w) for w in col.split()] + [len(r[col]) for r in rows]))
    for i, (n, r) in enumerate(zip(names, rows), 1):
        table.add_row(str(i), *n, *(r[c] for c in cols))
    return table


def decode_cache_text(p: dict) -> str:
    """The decode cache of a prediction (abl.model.costmodel.predict), as abl.analysis.formats writes it."""
    from ..analysis.formats import fmt_decode_cache

    return fmt_decode_cache(p.get("kv_cache_bytes_per_token") or 0, p.get("state_bytes_per_sequence") or 0)


def _grid(grid_file, recipes, overrides, registry):
    """The grid to cost: GRID_FILE, with a sweep over ``model.recipe`` when recipes are named (a grid
    of the default size without a file). Raises ConfigError."""
    from ..grid.gridfile import expand, load_grid
    from ..grid.parsing import apply_override, parse_overrides

    names = list(dict.fromkeys(n for r in recipes for n in (sorted(registry.recipes) if r == "all" else [r])))
    if names:
        for name in names:
            registry.recipe(name)  # an unknown name: RegistryError, listing the recipes
        overrides = overrides + ["grid.model.recipe=" + json.dumps(names)]
    if grid_file is not None:
        return load_grid(grid_file, registry, overrides)
    raw: dict = {"experiment": {"name": "recipes"}}
    for key, value in parse_overrides(overrides):
        apply_override(raw, key, value)
    return expand(raw, registry, source="--recipe")
