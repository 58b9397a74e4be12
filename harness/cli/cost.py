"""``abl cost``: the predicted cost of every cell of a grid, nothing trained (options: abl.cli)."""

from __future__ import annotations

import json

import click

from .common import fail, load_registry, user_errors


def cost(grid_file, recipes, overrides, as_json):
    """The body of ``abl cost``: its options and help are declared in abl.cli."""
    from ..analysis.formats import fmt_bytes
    from ..model.costmodel import predict

    registry = load_registry()
    if grid_file is None and not recipes:
        fail("abl cost needs a GRID_FILE, or --recipe NAME (repeatable; 'all' = every recipe)")
    try:
        grid = _grid(grid_file, recipes, list(overrides), registry)
        cells = list({c.cell_key: c for c in reversed(grid.cells)}.values())[::-1]
        preds = [predict(c, registry) for c in cells]
    except user_errors() as exc:
        fail(str(exc))
    if as_json:
        click.echo(json.dumps([{"cell": c.label, "cell_key": c.cell_key, **p} for c, p in zip(cells, preds)],
                              indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{grid.path}: predicted cost per cell (no training)", title_justify="left")
    table.add_column("#", justify="right")
    for path in grid.grid_paths or ["cell"]:
        table.add_column(path)
    cols = ("params", "non-emb", "fwd FLOP/tok", "train FLOP/step", "useful", "6N·tok", "act./step",
            "params+grad+adam", "KV/tok", "est. peak")
    for col in cols:
        table.add_column(col, justify="right")
    for i, (c, p) in enumerate(zip(cells, preds), 1):
        names = [str(c.varied.get(k, "?")) for k in grid.grid_paths] or [c.label]
        table.add_row(str(i), *names, f"{p['n_params']:,}", f"{p['n_params_non_embedding']:,}",
                      _si(p["flops_per_token"]), _si(p["flops_per_step"]), _si(p["useful_flops_per_step"]),
                      _si(p["flops_6n_per_token"] * p["tokens_per_step"]),
                      fmt_bytes(p["activation_bytes_per_step"]), fmt_bytes(p["static_bytes"]),
                      fmt_bytes(p["kv_cache_bytes_per_token"]), fmt_bytes(p["train_peak_bytes"]))
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 160))
    console.print(table)
    conds = sorted({(p["tokens_per_step"], p["activation_dtype_bytes"], p["vocab_size"]) for p in preds})
    console.print("per step = train.batch_size x model.context tokens; training = forward + backward as "
                  "executed (flop-counter convention); useful = model FLOPs for MFU; 6N = 6 x non-embedding "
                  "params, for reference. Conditions: " + "; ".join(
                      f"{t} tokens/step, activations {b} bytes/element, vocab {v}" for t, b, v in conds))


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


def _si(x, unit: str = "") -> str:
    if x is None:
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}".rstrip()
    return f"{x:.3g} {unit}".rstrip()
