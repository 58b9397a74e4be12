"""Task accuracy in the ``abl run`` summary and in ``abl report`` (abl.data.tasks' metrics).

A cell's accuracy metrics are ``<dataset>_accuracy`` when it trained on a task
and ``probe_<name>_accuracy`` per ``eval.probes`` entry; their per-slice parts
(``..._accuracy_<slice>``, e.g. MQAR's accuracy by number of pairs) come
along. Final values go through the statistics engine (harness/analysis/stats/, the
same summaries and tests as val_loss, with higher = better). Beside each, the
task's no-recall baseline (``<dataset>_no_recall_baseline``, abl.data.tasks:
what a model gets without the capability the task probes) and how many seeds
ended at or below it ("did not learn", abl.analysis.health). The report adds
accuracy curves and accuracy against model width, one line per mixer (one
panel per value of any other grid path, e.g. the number of pairs).

Nothing here names a task or a variant; mixers are told apart by the config's
``model.layer_pattern`` (a hybrid) or ``model.mixer``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Hashable

from ..analysis import stats
from ..analysis.health import DID_NOT_LEARN_ACCURACY_MARGIN, at_baseline
from ..analysis.metrics import lower_is_better
from ..data.tasks import baseline_metric

WIDTH = "model.d_model"


def accuracy_metrics_of(config: dict) -> list[str]:
    """The main accuracy metrics a run with this config may record."""
    names = [f"{config.get('data', {}).get('dataset', '')}_accuracy"]
    names += [f"probe_{p['name']}_accuracy" for p in config.get("probes", [])]
    return names


def mixer_label(config: dict) -> str:
    model = config.get("model", {})
    return str(model.get("layer_pattern") or model.get("mixer", "?"))


def load(db_path: str | Path, run_ids: list[str]) -> tuple[dict[str, dict[str, float]], dict]:
    """(run_id -> {metric: final value}, run_id -> {metric: [(step, value)]}) of the accuracy metrics
    (read through abl.store.reader)."""
    from ..store import reader

    finals: dict[str, dict[str, float]] = {}
    for r in reader.read_runs(db_path, run_ids=run_ids):
        for name, value in r.final.items():
            if "_accuracy" in name or "_no_recall_baseline" in name:
                finals.setdefault(r.run_id, {})[name] = value
    names = sorted({n for f in finals.values() for n in f if n.endswith("_accuracy")})
    curves: dict[str, dict[str, list]] = {}
    if names:
        for r in reader.read_runs(db_path, run_ids=run_ids, metrics=(), curves=names):
            if r.curves:
                curves[r.run_id] = r.curves
    return finals, curves


def metric_table(cells: list[tuple[str, str, list[tuple[str, int, dict]]]], finals: dict, metric: str,
                 baseline: str) -> list[dict[str, Any]]:
    """Per cell (key, label, [(run_id, seed, config)] of completed runs): the metric's summary over
    seeds and its comparison with the baseline cell (higher is better: abl.analysis.metrics), plus per-slice
    means, the task's no-recall baseline and the seeds at or below it (``did_not_learn``, ``health``)."""
    floor_name = baseline_metric(metric[:-len("_accuracy")]) if metric.endswith("_accuracy") else None
    # a probe at its baseline shows a model without recall, not one that failed to learn what it trained on
    flag = "at the no-recall baseline" if metric.startswith("probe_") else stats.DID_NOT_LEARN
    values = {key: {seed: finals[rid][metric] for rid, seed, _ in runs if metric in finals.get(rid, {})}
              for key, _, runs in cells}
    if baseline not in values or not values[baseline]:
        baseline = next((k for k, v in values.items() if v), baseline)
    results = (stats.compare_cells(values, baseline, lower_is_better=lower_is_better(metric))
               if baseline in values else [])
    rows = []
    for (key, label, runs), res in zip(cells, results):
        if not res.summary.n:
            continue
        slices: dict[str, list[float]] = {}
        for rid, _, _ in runs:
            for name, v in finals.get(rid, {}).items():
                if name.startswith(metric + "_"):
                    slices.setdefault(name[len(metric) + 1:], []).append(v)
        floors = [finals[rid][floor_name] for rid, _, _ in runs if floor_name in finals.get(rid, {})]
        below = sum(at_baseline(finals[rid][metric], finals[rid][floor_name]) for rid, _, _ in runs
                    if metric in finals.get(rid, {}) and floor_name in finals.get(rid, {}))
        s, c = res.summary, res.comparison
        rows.append({"baseline": sum(floors) / len(floors) if floors else None, "did_not_learn": below,
                     "health": f"{flag} {below}/{s.n}" if below else "ok" if floors else "-",
                     "cell_key": key, "label": label, "config": runs[0][2], "n": s.n, "mean": s.mean,
                     "std": s.std, "ci_low": s.ci_low, "ci_high": s.ci_high, "delta": c.delta,
                     "p_value": c.p_value, "test": c.test, "verdict": c.verdict, "is_baseline": key == baseline,
                     "slices": {k: sum(v) / len(v) for k, v in sorted(slices.items(), key=_slice_order)}})
    return rows


def _slice_order(item: tuple[str, Any]) -> tuple:
    name = item[0]
    tail = name.rsplit("_", 1)[-1]
    return (name.rsplit("_", 1)[0], int(tail) if tail.isdigit() else math.inf, name)


def metrics_present(configs: list[dict], finals: dict) -> list[str]:
    seen = {n for f in finals.values() for n in f}
    out: list[str] = []
    for cfg in configs:
        out += [m for m in accuracy_metrics_of(cfg) if m in seen and m not in out]
    return out


# ---------------------------------------------------------------- abl run


def print_summary(console: Any, db_path: Path, grid: Any, layout: str = "auto") -> None:
    """After the val_loss table: one accuracy table per accuracy metric the grid recorded (one block per
    cell, its figures beneath its label, when the table does not fit the terminal; ``layout``: as
    abl.present.termlayout.Presentation's)."""
    from rich.table import Table
    from rich.text import Text

    from ..analysis.verdicts import display_name
    from ..contracts.status import COMPLETED
    from ..grid.labels import cell_labels
    from ..store.database import statuses
    from .termlayout import fits, pack, print_wide, wrap

    try:
        run_ids = [c.run_id for c in grid.cells]
        finals, _ = load(db_path, run_ids)
        status = statuses(db_path, run_ids)
    except Exception as exc:  # noqa: BLE001 - the accuracy table must never hide the results
        console.print(f"[yellow]task accuracy unavailable: {exc}[/]")
        return
    metrics = metrics_present([c.config for c in grid.cells], finals)
    if not metrics:
        return
    order: dict[str, tuple[str, list]] = {}
    configs: dict[Hashable, dict] = {}
    for c in grid.cells:
        entry = order.setdefault(c.cell_key, (c.label, []))
        configs.setdefault(c.cell_key, c.config)
        if status.get(c.run_id) == COMPLETED:
            entry[1].append((c.run_id, c.seed, c.config))
    labels = cell_labels(configs, list(grid.grid_paths or []), {k: v[0] for k, v in order.items()})
    cells = [(k, str(labels[k]), runs) for k, (_, runs) in order.items()]
    numbers = {k: i for i, k in enumerate(order, 1)}
    for metric in metrics:
        rows = metric_table(cells, finals, metric, cells[0][0])
        slice_names = list(dict.fromkeys(s for r in rows for s in r["slices"]))
        name = display_name(metric)
        title = (f"{grid.cells[0].experiment.name}: final {metric} by cell (exact match on the answer positions; "
                 "higher is better; the same statistics as val_loss)")
        table = Table(title=title, title_justify="left")
        header = ["#", "cell", "seeds", f"{name} (mean ± std)", "95% CI", "Δ vs baseline (p)", "no-recall baseline",
                  "health", *[f"{name} {s}" for s in slice_names]]
        for col in header:
            table.add_column(col, no_wrap=col != "cell", overflow="fold")
        texts = []
        for r in rows:
            acc = stats.fmt(r["mean"], 3) + ("" if r["std"] is None else f" ± {r['std']:.3f}")
            ci = "-" if r["ci_low"] is None else f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
            delta = "baseline" if r["is_baseline"] else (
                "-" if r["delta"] is None else f"{r['delta']:+.3f} ({stats.fmt_p(r['p_value'])})")
            row = [str(numbers[r["cell_key"]]), r["label"], str(r["n"]), acc, ci, delta, stats.fmt(r["baseline"], 3),
                   r["health"], *[stats.fmt(r["slices"].get(s), 3) for s in slice_names]]
            texts.append(row)
            table.add_row(*row)
        if layout == "wide" or (layout == "auto" and fits(console, table)):
            print_wide(console, table)
            continue
        for line in wrap(title, console.width, ""):
            console.print(Text(line, style="bold"), soft_wrap=True)
        for row in texts:
            first = f"{row[0]:>{len(str(len(numbers)))}}. "
            for line in wrap(row[1], console.width, " " * len(first), first=first):
                console.print(Text(line, style="bold"), soft_wrap=True)
            items = [f"{h} {v}" for h, v in zip(header[2:], row[2:])]
            for line in pack(items, console.width, "     "):
                console.print(Text(line), soft_wrap=True)


# ---------------------------------------------------------------- abl report


def accuracy_figure(rows_by_metric: dict[str, list[dict]], curves: dict, runs_by_cell: dict, footer: str,
                    plt: Any) -> Any:
    """Accuracy curves (mean over seeds) and final accuracy against model width per mixer; None without
    a metric. Cells in distinct styles (abl.present.figures.cell_styles), legends to the right of each panel."""
    from .figures import add_footer, cell_styles, thin_ticks

    if not rows_by_metric:
        return None
    metrics = list(rows_by_metric)
    # panels of the width plot: every other varied setting (e.g. the number of pairs)
    fig, axes = plt.subplots(len(metrics), 2, figsize=(14, 4.2 * len(metrics)), squeeze=False,
                             layout="constrained")
    for m_i, metric in enumerate(metrics):
        rows = rows_by_metric[metric]
        ax_c, ax_w = axes[m_i]
        for r, st in zip(rows, cell_styles(len(rows))):
            by_step: dict[int, list[float]] = {}
            for rid in runs_by_cell.get(r["cell_key"], []):
                for step, v in curves.get(rid, {}).get(metric, []):
                    by_step.setdefault(step, []).append(v)
            steps = sorted(by_step)
            if steps:
                ax_c.plot(steps, [sum(by_step[s]) / len(by_step[s]) for s in steps], marker=st["marker"], ms=3,
                          lw=1, color=st["color"], ls=st["ls"], label=r["label"])
        ax_c.set(title=f"{metric} during training (mean over seeds)", xlabel="step", ylabel="accuracy",
                 ylim=(-0.02, 1.02))
        groups = width_groups(rows)
        mixers = list(dict.fromkeys(g[1] for g in groups))
        panels = list(dict.fromkeys(g[0] for g in groups))
        colors = [st["color"] for st in cell_styles(len(mixers))]
        styles = ["-", "--", ":", "-."]
        for (panel, mixer), pts in groups.items():
            pts.sort()
            col = colors[mixers.index(mixer)]
            ls = styles[panels.index(panel) % len(styles)]
            xs = [p[0] for p in pts]
            ys = [p[1] for p in pts]
            err = [[y - (lo if lo is not None else y) for _, y, lo, _ in pts],
                   [(hi if hi is not None else y) - y for _, y, _, hi in pts]]
            ax_w.errorbar(xs, ys, yerr=err, color=col, ls=ls, marker="o", ms=4, capsize=2,
                          label=f"{mixer}" + (f" · {panel}" if panel else ""))
        ax_w.set(title=f"final {metric} vs model width, per mixer", xlabel="d_model", ylabel="accuracy",
                 ylim=(-0.02, 1.02))
        ax_w.set_xscale("log", base=2)
        ax_w.axhline(0.9, color="0.6", lw=0.8, ls=":")
        for floor in sorted({round(r["baseline"], 3) for r in rows if r.get("baseline") is not None}):
            ax_w.axhline(floor, color="0.3", lw=0.8, ls="--")  # a no-recall baseline (one per slice setting)
        for ax in (ax_c, ax_w):
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:  # beside the panel, never over the data
                ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0,
                          frameon=False)
    thin_ticks(fig)
    add_footer(fig, footer)
    return fig


def plot_accuracy(rows_by_metric: dict[str, list[dict]], curves: dict, runs_by_cell: dict, footer: str,
                  plt: Any, to_png: Any) -> bytes | None:
    """``accuracy_figure`` as PNG bytes."""
    fig = accuracy_figure(rows_by_metric, curves, runs_by_cell, footer, plt)
    return None if fig is None else to_png(fig)


def width_groups(rows: list[dict]) -> dict[tuple[str, str], list[tuple]]:
    """(panel, mixer) -> [(d_model, mean, ci_low, ci_high)]; the panel names the other settings
    that vary between the rows (everything but the width, the mixer and the seed)."""
    from ..analysis.tables import flatten

    flats = [flatten({k: v for k, v in r["config"].items() if k not in ("seed", "experiment", "probes")})
             for r in rows]
    skip = {WIDTH, "model.mixer", "model.layer_pattern"}
    # the mixer's own parameters vary with the mixer: they are not a panel
    mixer_parts = ("components.mixer.", "components.layer_mixers", "config.matched")
    keys = [k for k in flats[0] if k not in skip and not k.startswith(mixer_parts) and all(k in f for f in flats)
            and len({repr(f[k]) for f in flats}) > 1] if flats else []
    out: dict[tuple[str, str], list[tuple]] = {}
    for r, f in zip(rows, flats):
        panel = ", ".join(f"{k.split('.')[-1]}={f[k]}" for k in keys)
        out.setdefault((panel, mixer_label(r["config"])), []).append(
            (f.get(WIDTH, 0), r["mean"], r["ci_low"], r["ci_high"]))
    return out


def report_section(doc: Any, cells: list[Any], baseline: Any, db_path: str, cond: str, pyplot: Any,
                   to_png: Any) -> dict[str, list]:
    """The report's "Task accuracy" section (nothing when no run recorded an accuracy metric).

    ``cells``: harness.report cells; ``pyplot``: a function returning matplotlib.pyplot;
    ``to_png``: figure -> PNG bytes. Returns the rows per metric (for report.json)."""
    runs = [r for c in cells for r in c.completed]
    if not runs:
        return {}
    finals, curves = load(db_path, [r.run_id for r in runs])
    metrics = metrics_present([r.config for r in runs], finals)
    if not metrics:
        return {}
    table_cells = [(c.key, c.label, [(r.run_id, r.seed, r.config) for r in c.completed]) for c in cells]
    rows_by_metric = {m: metric_table(table_cells, finals, m, baseline.key) for m in metrics}
    doc.h(2, "Task accuracy")
    doc.p("Exact-match accuracy of the greedy prediction on the answer positions of fixed validation "
          "examples (the same for every cell), at the last step; higher is better. Statistics as for "
          "val_loss (harness/analysis/stats/): mean over seeds, 95% t-interval, Δ against the baseline with a "
          "paired or Welch t-test. \"no-recall baseline\" is what a model reaches without the capability the "
          "task probes (for MQAR the best rule from the query's position alone, not 1/N); a seed that ends at "
          f"or below it (within {DID_NOT_LEARN_ACCURACY_MARGIN}) did not learn.")
    for metric, rows in rows_by_metric.items():
        slice_names = list(dict.fromkeys(s for r in rows for s in r["slices"]))
        doc.table(["#", "cell", "mixer", "d_model", "n", "mean", "std", "95% CI", "Δ vs baseline", "p",
                   "test", "verdict", "no-recall baseline", "health", *slice_names],
                  [[i, r["label"], mixer_label(r["config"]), r["config"]["model"]["d_model"], r["n"],
                    stats.fmt(r["mean"], 3), stats.fmt(r["std"], 3),
                    "-" if r["ci_low"] is None else f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]",
                    "-" if r["is_baseline"] or r["delta"] is None else f"{r['delta']:+.3f}",
                    stats.fmt_p(r["p_value"]), r["test"], r["verdict"], stats.fmt(r["baseline"], 3), r["health"],
                    *[stats.fmt(r["slices"].get(s), 3)
                                                                for s in slice_names]]
                   for i, r in enumerate(rows, 1)],
                  f"final {metric} per cell; the last columns are its per-slice parts (e.g. accuracy by "
                  f"number of key-value pairs). {cond}")
    runs_by_cell = {c.key: [r.run_id for r in c.completed] for c in cells}
    doc.image("task_accuracy.png", plot_accuracy(rows_by_metric, curves, runs_by_cell, cond, pyplot(), to_png),
              f"left: accuracy during training; right: final accuracy against model width, one line per "
              f"mixer (95% CI bars over seeds; the dotted line is 0.9, the dashed ones the no-recall "
              f"baselines). {cond}")
    return {m: [{k: v for k, v in r.items() if k != "config"} for r in rows] for m, rows in rows_by_metric.items()}
