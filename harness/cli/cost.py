"""``abl cost``: the predicted cost of every cell of a grid, nothing trained (options: abl.cli)."""

from __future__ import annotations

import click

from .common import fail, load_registry, user_errors


def cost(grid_file, overrides, as_json):
    """The body of ``abl cost``: its options and help are declared in abl.cli."""
    import json

    from ..grid.gridfile import load_grid
    from ..model.costmodel import predict

    registry = load_registry()
    try:
        grid = load_grid(grid_file, registry, list(overrides))
        cells = list({c.cell_key: c for c in reversed(grid.cells)}.values())[::-1]
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
    from rich.table import Table

    measured = [i for i, p in enumerate(preds, 1) if p["cost_source"] == "measured"]
    title = "predicted cost per cell (no training)" if not measured else (
        "cost per cell: predicted, or measured on one step where a component declares no cost function"
        if len(measured) < len(preds) else "measured cost per cell (one step each on the CPU, no training)")
    table = Table(title=f"{grid.path}: {title}", title_justify="left")
    table.add_column("#", justify="right")
    for path in grid.grid_paths or ["cell"]:
        table.add_column(path)
    cols = ("params", "non-emb", "fwd FLOP/tok", "train FLOP/step", "useful", "6N·tok", "act./step",
            "params+grad+adam", "KV/tok", "est. peak")
    for col in cols:
        table.add_column(col, justify="right")
    table.add_column("source")
    for i, (c, p) in enumerate(zip(cells, preds), 1):
        names = [str(c.varied.get(k, "?")) for k in grid.grid_paths] or [c.label]
        table.add_row(str(i), *names, f"{p['n_params']:,}", f"{p['n_params_non_embedding']:,}",
                      _si(p["flops_per_token"]), _si(p["flops_per_step"]), _si(p["useful_flops_per_step"]),
                      _si(p["flops_6n_per_token"] * p["tokens_per_step"]),
                      _bytes(p["activation_bytes_per_step"]), _bytes(p["static_bytes"]),
                      _bytes(p["kv_cache_bytes_per_token"]), _bytes(p["train_peak_bytes"]), p["cost_source"])
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 160))
    console.print(table)
    conds = sorted({(p["tokens_per_step"], p["activation_dtype_bytes"], p["vocab_size"]) for p in preds})
    console.print("per step = train.batch_size x model.context tokens; training = forward + backward as "
                  "executed (flop-counter convention); useful = model FLOPs for MFU; 6N = 6 x non-embedding "
                  "params, for reference. Conditions: " + "; ".join(
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


def _bytes(x) -> str:
    from ..analysis.formats import fmt_bytes

    return "-" if x is None else fmt_bytes(x)


def _si(x, unit: str = "") -> str:
    if x is None:
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}".rstrip()
    return f"{x:.3g} {unit}".rstrip()
