"""The report's figures: loss curves, quality against cost, predicted against measured, the scaling fit.

Each figure names its metric by the metric catalogue (abl.analysis.metrics),
draws only the panels that mean something for these cells
(abl.analysis.sections), and carries the runs' conditions in its footer.
"""

from __future__ import annotations

import math

from ...analysis import metrics as catalogue
from ...analysis import sections, stats
from ...model.costmodel import MEMORY_BAND
from ..figures import (
    cell_channels,
    facet_groups,
    fig_to_png,
    finish_figure,
    plain_ticks,
    pyplot,
    si_ticks,
    style_dict,
)
from .costs import CONTENDED_MARK, measured
from ...store.reader import StoredRun
from .runs import Cell

# ---------------------------------------------------------------- plots


def _contended_handle():
    from matplotlib.lines import Line2D

    return Line2D([], [], color="0.4", marker="x", ls="none",
                  label=f"{CONTENDED_MARK} contended run: its speed is not comparable")


def _mean_curve(runs: list[StoredRun], name: str) -> tuple[list[int], list[float]]:
    by_step: dict[int, list[float]] = {}
    for r in runs:
        for step, v in r.curves.get(name, []):
            if v is not None and math.isfinite(v):
                by_step.setdefault(step, []).append(v)
    steps = sorted(s for s, vs in by_step.items() if len(vs) == len(runs))
    return steps, [sum(by_step[s]) / len(by_step[s]) for s in steps]


def _std(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0


def _smooth(ys: list[float], k: int) -> list[float]:
    if k <= 1 or len(ys) < 3:
        return ys
    out, acc = [], None
    a = 2.0 / (k + 1)
    for y in ys:
        acc = y if acc is None else a * y + (1 - a) * acc
        out.append(acc)
    return out


def _flops_per_token(c: Cell) -> float | None:
    f = (c.predicted or {}).get("flops_per_step")
    return f / c.runs[0].tokens_per_step if f else None


def loss_curve_panels(cells: list[Cell]) -> tuple[list[str], list[str]]:
    """(the panels of the loss-curve figure, one sentence per panel left out and why)."""
    panels, why = ["train", "tokens"], []
    fpt = [_flops_per_token(c) for c in cells]
    if all(f is not None for f in fpt) and sections.differs(fpt):
        panels.append("flops")
    elif all(f is None for f in fpt):
        why.append("No loss curve at equal FLOPs: no cell has a FLOPs prediction.")
    else:
        why.append("No loss curve at equal FLOPs: every cell costs the same FLOPs per token "
                   f"(within {sections.REL_TOL:.0%}), so it is the curve at equal tokens.")
    walls = [measured(c, "wall_s") for c in cells]
    if sections.differs(walls):
        panels.append("wall")
    else:
        why.append("No loss curve at equal wall time: the cells' wall times do not differ "
                   f"(within {sections.REL_TOL:.0%}) or were not measured.")
    return panels, why


def loss_curves_figure(cells: list[Cell], footer: str):
    """train_loss and val_loss against tokens; val_loss against predicted FLOPs and wall time when those
    differ between the cells. Seeds are drawn faintly, the mean over seeds boldly; no CI band."""
    plt = pyplot()
    panels, _ = loss_curve_panels(cells)
    channels = cell_channels(cells)  # one channel per axis of a factorial grid, as the dashboard
    groups = facet_groups(cells, channels)  # a row of panels per level of a third axis and beyond
    if len(groups) == 1:
        rows, cols = (2, 2) if len(panels) == 4 else (1, len(panels))
        fig, grid = plt.subplots(rows, cols, figsize=(4.3 * cols + 0.5, 3.6 * rows + 0.6), squeeze=False,
                                 layout="constrained")
        rows_of = [dict(zip(panels, grid.flat))]
        for ax in list(grid.flat)[len(panels):]:
            fig.delaxes(ax)
    else:  # the same panel of every row on the same axes, so the rows compare
        fig, grid = plt.subplots(len(groups), len(panels), figsize=(4.3 * len(panels) + 0.5,
                                                                    3.3 * len(groups) + 0.6),
                                 squeeze=False, layout="constrained", sharex="col", sharey="col")
        rows_of = [dict(zip(panels, row)) for row in grid]
    row_of = {i: g for g, (_, idx) in enumerate(groups) for i in idx}
    styles = [style_dict(channels.styles[str(c.key)]) for c in cells]
    bands = sections.bands_by_default([len(c.completed) for c in cells])
    any_contended = False
    for i, (c, st) in enumerate(zip(cells, styles)):
        runs = c.completed or c.runs
        if not runs:
            continue
        axes = rows_of[row_of[i]]
        line = {"color": st["color"], "ls": st["ls"]}
        tps = runs[0].tokens_per_step
        fpt = _flops_per_token(c)
        steps, tl = _mean_curve(runs, "train_loss")
        if steps:
            axes["train"].plot([s * tps for s in steps], _smooth(tl, max(1, len(steps) // 20)), **line,
                               label=c.label)
        for r in runs:
            pts = r.curves.get("val_loss", [])
            if len(runs) > 1 and pts and not bands:
                axes["tokens"].plot([s * tps for s, _ in pts], [v for _, v in pts], color=st["color"],
                                    alpha=0.3, lw=0.8)
            elapsed = dict(r.curves.get("elapsed_s", []))
            tw = [(elapsed[s], v) for s, v in pts if s in elapsed]
            if tw and "wall" in axes:
                hot = sections.is_contended(r.final)
                any_contended |= hot
                axes["wall"].plot(*zip(*tw), **line, alpha=0.6 if len(runs) > 1 else 1.0, lw=1,
                                  marker="x" if hot else st["marker"], ms=4,
                                  label=c.label if r is runs[0] else None)
        steps, vl = _mean_curve(runs, "val_loss")
        if steps:
            axes["tokens"].plot([s * tps for s in steps], vl, **line, marker=st["marker"], ms=3, label=c.label)
            if bands and len(runs) > 1:  # every cell has enough seeds: a 95% t-interval band
                per_step = {s: [v for r in runs for st_, v in r.curves.get("val_loss", []) if st_ == s]
                            for s in steps}
                half = [float(stats.t_halfwidth(_std(per_step[s]), len(per_step[s]))) for s in steps]
                axes["tokens"].fill_between([s * tps for s in steps], [m - h for m, h in zip(vl, half)],
                                            [m + h for m, h in zip(vl, half)], color=st["color"], alpha=0.15,
                                            lw=0)
            if fpt and "flops" in axes:
                axes["flops"].plot([s * tps * fpt for s in steps], vl, **line, marker=st["marker"], ms=3,
                                   label=c.label)
    val, train = catalogue.metric("val_loss").title, catalogue.metric("train_loss").title
    titles = {"train": ("train loss (EMA, mean over seeds)", "tokens", train),
              "tokens": ("val loss at equal tokens (mean, 95% CI band)" if bands else
                         "val loss at equal tokens (mean; seeds faint)", "tokens", val),
              "flops": ("val loss at equal training FLOPs (predicted)", catalogue.label("flops"), val),
              "wall": ("val loss at equal wall time (each seed)", catalogue.label("wall_s"), val)}
    for (level, _), axes in zip(groups, rows_of):
        for name, ax in axes.items():
            t, xl, yl = titles[name]
            ax.set(title=t + (f"\n{level}" if level else ""), xlabel=xl, ylabel=yl)
            ax.grid(alpha=0.3)
            if name in ("train", "tokens", "flops"):  # counts in the thousands and up: 8k 9k 10k, not 8000 9000 10000
                si_ticks(ax.xaxis)
    return finish_figure(fig, [ax for axes in rows_of for ax in axes.values()], footer,
                         [_contended_handle()] if any_contended else None, channels)


def plot_loss_curves(cells: list[Cell], footer: str) -> bytes:
    return fig_to_png(loss_curves_figure(cells, footer))


def cost_axes(cells: list[Cell]) -> tuple[list[tuple[str, dict[str, float | None]]], list[str]]:
    """The cost axes of quality vs cost that differ between the cells, and the names of those that do not."""
    def flops(c: Cell) -> float | None:
        steps = c.config["train"]["steps"]
        per_step = (c.predicted or {}).get("flops_per_step") or measured(c, "flops_per_step_measured")
        return per_step * steps if per_step else None

    cands = [(f"{catalogue.label('flops')} (predicted, whole run)", {c.key: flops(c) for c in cells}),
             ("wall time (s, measured)", {c.key: measured(c, "wall_s") for c in cells}),
             (catalogue.label("n_params"), {c.key: (c.predicted or {}).get("n_params") or measured(c, "n_params")
                             for c in cells})]
    keep, why = [], []
    for name, xs in cands:
        if sections.differs(xs.values()):
            keep.append((name, xs))
        else:
            why.append(name.split(" (")[0])
    return keep, why


def quality_vs_cost_figure(cells: list[Cell], stat_rows: list[dict], footer: str):
    """The compared metric (``stat_rows``' ``metric``: val_loss, or val_bpb across tokenizers, never the
    two on one axis) against each cost that differs between the cells (training FLOPs, wall time, parameters); None when none does. Mean over seeds with 95% CI bars when every cell has enough
    seeds (abl.analysis.sections.bands_by_default), else each seed faint beside the mean."""
    keep, _ = cost_axes(cells)
    if not keep:
        return None
    metric = stat_rows[0].get("metric", "val_loss") if stat_rows else "val_loss"
    plt = pyplot()
    channels = cell_channels(cells)  # one channel per axis of a factorial grid, as the dashboard
    groups = facet_groups(cells, channels)  # a row of panels per level of a third axis and beyond
    fig, grid = plt.subplots(len(groups), len(keep), figsize=(max(8.0, 4.4 * len(keep) + 0.6),
                                                              4.6 + 3.4 * (len(groups) - 1)),
                             squeeze=False, layout="constrained", sharex="col", sharey="col")
    row_of = {i: g for g, (_, idx) in enumerate(groups) for i in idx}
    by_key = {s["cell_key"]: s for s in stat_rows}
    bands = sections.bands_by_default([len(c.completed) for c in cells])
    styles = [style_dict(channels.styles[str(c.key)]) for c in cells]
    any_contended = False
    for i, (c, st) in enumerate(zip(cells, styles)):
        axes = list(grid[row_of[i]])
        s = by_key[c.key]
        if s["mean"] is None:
            continue
        err = None if (not bands or s["ci_high"] is None) else [[s["mean"] - s["ci_low"]],
                                                                 [s["ci_high"] - s["mean"]]]
        for ax, (name, xs) in zip(axes, keep):
            x = xs[c.key]
            if not x:
                continue
            ax.errorbar([x], [s["mean"]], yerr=err, fmt=st["marker"], color=st["color"], capsize=3,
                        label=c.label)
            if bands:
                continue
            for r in c.completed:
                y = r.final.get(metric)
                rx = r.final.get("wall_s") if name.startswith("wall") else x
                hot = name.startswith("wall") and sections.is_contended(r.final)
                any_contended |= hot
                if y is not None and rx:
                    ax.plot([rx], [y], "x" if hot else st["marker"], color=st["color"], alpha=0.35,
                            ms=5 if hot else 4)
    ylabel = f"final {catalogue.metric(metric).title} " + ("(mean, 95% CI)" if bands else "(mean; seeds faint)")
    for (level, _), row in zip(groups, grid):
        for ax, (name, _) in zip(row, keep):
            ax.set(xlabel=name, ylabel=ylabel, title=level)
            ax.grid(alpha=0.3)
    fig.suptitle("quality vs cost")
    return finish_figure(fig, list(grid.flat), footer, [_contended_handle()] if any_contended else None,
                         channels)


def plot_quality_vs_cost(cells: list[Cell], stat_rows: list[dict], footer: str) -> bytes | None:
    fig = quality_vs_cost_figure(cells, stat_rows, footer)
    return None if fig is None else fig_to_png(fig)


PLOTTED_CHECKS = {"n_params": "parameters (exact)", "flops_per_step": "FLOPs per step (flop counter)",
                  "train_peak_bytes": "training memory (peak tensor bytes)"}
# each panel's unit: the figures are divided by the scale, and the axes say the unit (memory in MiB, not bytes
# with a 1e7 offset)
PANEL_UNITS = {"n_params": (1e6, "M parameters"), "flops_per_step": (1e9, "GFLOP"),
               "train_peak_bytes": (2.0 ** 20, "MiB")}


def predicted_vs_measured_panels(rows: list[dict]) -> list[str]:
    """The figures worth a predicted-vs-measured panel: measured somewhere, and differing between cells
    (one point repeated per cell says nothing the summary does not)."""
    out = []
    for name in PLOTTED_CHECKS:
        pts = [(r["predicted"], r["measured"]) for r in rows if r["figure"] == name and r["predicted"]
               and r["measured"]]
        if pts and (sections.differs([p for p, _ in pts]) or sections.differs([m for _, m in pts])):
            out.append(name)
    return out


def predicted_vs_measured_figure(rows: list[dict], footer: str):
    figures = predicted_vs_measured_panels(rows)
    if not figures:
        return None
    plt = pyplot()
    fig, grid = plt.subplots(1, len(figures), figsize=(max(8.0, 4.4 * len(figures) + 0.6), 4.4), squeeze=False,
                             layout="constrained")
    axes = list(grid[0])
    for ax, name in zip(axes, figures):
        div, unit = PANEL_UNITS[name]
        pts = [(r["predicted"] / div, r["measured"] / div, str(r["agreement"]).startswith("DISAGREES"),
                r.get("source") == "measured") for r in rows if r["figure"] == name and r["predicted"] and r["measured"]]
        xs, ys, bad, _ = zip(*pts)
        lo, hi = min(xs + ys) * 0.8, max(xs + ys) * 1.25
        ax.plot([lo, hi], [lo, hi], color="0.5", lw=1, label="measured = predicted")
        if name == "flops_per_step":
            ax.fill_between([lo, hi], [lo * 0.95, hi * 0.95], [lo * 1.05, hi * 1.05], color="0.85",
                            label="±5%")
        if name == "train_peak_bytes":
            b_lo, b_hi = MEMORY_BAND
            ax.fill_between([lo, hi], [lo * b_lo, hi * b_lo], [lo * b_hi, hi * b_hi], color="0.85",
                            label=f"band {b_lo:g}-{b_hi:g}x")
        ok = [(x, y) for x, y, b, m in pts if not b and not m]
        ok_measured = [(x, y) for x, y, b, m in pts if not b and m]  # x: one step of the shape, no cost function
        no = [(x, y) for x, y, b, _ in pts if b]
        if ok:
            ax.scatter(*zip(*ok), s=18, zorder=3, color="tab:blue", label="agrees or not compared")
        if ok_measured:
            ax.scatter(*zip(*ok_measured), s=22, zorder=3, color="tab:blue", marker="s", facecolors="none",
                       label="x measured (no cost function)")
        if no:
            ax.scatter(*zip(*no), s=24, zorder=4, color="tab:red", marker="D", label="disagrees")
        scale = "log" if hi / lo > 30 else "linear"
        ax.set(xscale=scale, yscale=scale, xlabel=f"predicted [{unit}]", ylabel=f"measured [{unit}]",
               title=PLOTTED_CHECKS[name])
        if scale == "linear":
            plain_ticks(ax.xaxis)
            plain_ticks(ax.yaxis)
        ax.grid(alpha=0.3, which="both")
    return finish_figure(fig, axes, footer)


def plot_predicted_vs_measured(rows: list[dict], footer: str) -> bytes | None:
    fig = predicted_vs_measured_figure(rows, footer)
    return None if fig is None else fig_to_png(fig)


def scaling_figure(points: list[tuple[float, float, float]], fit, footer: str):
    import numpy as np

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 5), layout="constrained")
    n, d, l = (np.array(v, dtype=float) for v in zip(*points))
    budgets = sorted(set(d))
    cmap = plt.get_cmap("viridis")
    grid = np.logspace(np.log10(n.min() / 1.5), np.log10(n.max() * 1.5), 100)
    for j, dv in enumerate(budgets):
        col = cmap(j / max(1, len(budgets) - 1))
        m = d == dv
        ax.scatter(n[m], l[m], color=col, s=16, label=f"D = {dv:.3g} tokens")
        if fit is not None:
            ax.plot(grid, fit.predict(grid, dv), color=col, lw=1)
    ax.set(xscale="log", xlabel="N (non-embedding parameters)", ylabel=f"final {catalogue.metric('val_loss').title}",
           title="scaling fit: L = E + A/N^α + B/D^β")
    ax.grid(alpha=0.3, which="both")
    return finish_figure(fig, [ax], footer)


def plot_scaling(points: list[tuple[float, float, float]], fit, footer: str) -> bytes:
    return fig_to_png(scaling_figure(points, fit, footer))

