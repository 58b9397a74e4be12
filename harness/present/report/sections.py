"""The report's sections, one function each, in the order ``build_report`` writes them.

1. conditions: where and how the runs ran (device, versions, commit, data
   fingerprint, precision), grouped; every figure and table repeats them;
2. the grid: what varies between cells and the settings they share;
3. the comparison table: the final compared metric per cell over seeds with
   mean, std, 95% CI, and the delta against the baseline cell with its CI,
   p-value and verdict (abl.analysis.stats);
4. loss curves at equal tokens, equal (predicted) training FLOPs and equal
   wall time;
5. quality against cost;
6. predicted (abl.model.costmodel) against measured costs, disagreements
   flagged, never hidden;
7. a scaling-law fit (abl.analysis.scaling) when the cells span enough model
   sizes; then length extrapolation (val_loss_x1/x2/x4, when recorded) and the
   answers within each cell (the run summary's, abl.present.report.within),
   task accuracy (abl.present.taskreport) and the run notes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ...analysis import metrics as catalogue
from ...analysis import sections, stats
from ...analysis.formats import fmt_decode_cache, fmt_speed
from ...analysis.health import DID_NOT_LEARN_MARGIN
from ...contracts.status import COMPLETED
from ...model.costmodel import MEMORY_BAND
from ...store.provenance import plugin_lines
from ...store.reader import StoredRun
from ..figures import fig_to_png, pyplot
from .conditions import (
    condition_groups,
    conditions_line,
    measured_runs,
    report_environment,
    setting_value,
    varied_and_fixed,
)
from .costs import (
    CONTENDED_MARK,
    attach_predictions,
    compared_note,
    contended_runs,
    contention_note,
    cost_rows,
    cost_source,
    cost_summary,
    measured,
    measured_note,
    model_flops_utilization,
    scaling_points,
)
from .document import Doc, cell_bytes, cell_ci, cell_num, cell_pct, cell_signed
from .plots import (
    PLOTTED_CHECKS,
    cost_axes,
    loss_curve_panels,
    plot_loss_curves,
    plot_predicted_vs_measured,
    plot_quality_vs_cost,
    plot_scaling,
    predicted_vs_measured_panels,
)
from .plugin_metrics import plugin_metrics_section
from .runs import (
    Cell,
    ReportError,
    cell_statistics,
    comparison_metric,
    group_cells,
    label_cells,
    pick_baseline,
)
from .within import extrapolation_section, within_cell_section


@dataclass
class Report:
    title: str
    source: str
    db_path: str
    cells: list[Cell]
    baseline: Cell
    stat_rows: list[dict]
    cost_rows: list[dict]
    fit: Any
    fit_points: list
    fit_note: str
    doc: Doc


@dataclass
class Context:
    """What every section reads: the runs, their cells, the statistics, and the document it writes to."""

    doc: Doc
    runs: list[StoredRun]
    cells: list[Cell]
    base: Cell
    metric: str
    stat_rows: list[dict]
    cost_rows: list[dict]
    cond: str  # the conditions line every figure and table repeats
    contention: str  # one sentence on the contended runs ("" when none is)
    grid_raw: dict | None
    db_path: str
    effects: list = field(default_factory=list)  # stats.AxisEffect per swept axis: the report's answer
    effects_error: str = ""  # why the per-axis analysis is unavailable ("" when it is)


def build_report(runs: list[StoredRun], *, source: str, db_path: str, registry, order: list[str] | None = None,
                 baseline: str | None = None, grid_raw: dict | None = None,
                 missing_runs: int = 0) -> Report:
    if not runs:
        raise ReportError(f"no runs of {source} in {db_path}")
    cells = group_cells(runs, order)
    base = pick_baseline(cells, baseline)
    label_cells(cells, grid_raw)
    if registry is not None:
        attach_predictions(cells, registry)
    metric = comparison_metric(cells)
    effects, effects_error = axis_answers(cells, metric, grid_raw)
    ctx = Context(Doc(), runs, cells, base, metric, cell_statistics(cells, base, metric=metric, effects=effects),
                  cost_rows(cells), conditions_line(runs), contention_note(runs), grid_raw, db_path,
                  effects, effects_error)
    title = f"abl report: {runs[0].experiment}"
    header(ctx, title, source, missing_runs)
    conditions_section(ctx)
    grid_section(ctx)
    axes_section(ctx)
    comparison_section(ctx)
    loss_curves_section(ctx)
    quality_vs_cost_section(ctx)
    predicted_vs_measured_section(ctx)
    fit, pts, fit_note = scaling_section(ctx)
    extrapolation_section(ctx)
    within_cell_section(ctx)  # the summary's within-cell answers (abl.analysis.contrasts), once
    task_accuracy_section(ctx)
    plugin_metrics_section(ctx)  # the metrics a plugin declares shown by default (hook register_metrics)
    run_notes_section(ctx)
    return Report(title, source, db_path, cells, base, ctx.stat_rows, ctx.cost_rows, fit, pts, fit_note, ctx.doc)


def header(ctx: Context, title: str, source: str, missing_runs: int) -> None:
    """The title, what the report covers, and the conditions of every number in it."""
    doc, cells, runs = ctx.doc, ctx.cells, ctx.runs
    doc.h(1, title)
    completed = sum(len(c.completed) for c in cells)
    doc.p(f"Source: {source}. Database: {ctx.db_path}. {len(cells)} cells, {len(runs)} runs ({completed} completed"
          + (f", {missing_runs} runs of the grid not in the store yet" if missing_runs else "")
          + f"). Generated {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}.")
    doc.p(f"Conditions of every number below: {ctx.cond}.")


def conditions_section(ctx: Context) -> None:
    """1. Conditions: where and how the completed runs ran (a running, failed or killed run is no condition
    of a number), and where this report was made."""
    doc, cells, runs, contention = ctx.doc, ctx.cells, ctx.runs, ctx.contention
    doc.h(2, "Conditions")
    shown_runs = measured_runs(runs)
    groups = condition_groups(shown_runs)
    keys = list(groups[0][0])
    doc.table(keys + ["runs", "cells"],
              [[g[k] for k in keys] + [len(rs), len({r.cell_key for r in rs})] for g, rs in groups],
              "where and how the runs ran (from each run's info.json and meta.json)")
    left = [r for r in runs if r not in shown_runs]
    if left:
        by_status: dict[str, int] = {}
        for r in left:
            by_status[r.status] = by_status.get(r.status, 0) + 1
        doc.p(f"Not in the conditions above: {len(left)} run(s) that did not complete ("
              + ", ".join(f"{n} {st}" for st, n in sorted(by_status.items()))
              + "); no number in this report comes from them.")
    if len(groups) > 1:
        doc.p("WARNING: the completed runs ran under different conditions; a difference between cells may "
              "come from the environment rather than the variant.")
    if contention:
        doc.p("WARNING: " + contention)
    for line in plugin_lines([r.plugins for r in shown_runs]):  # which plugins, and one edited between runs
        doc.p(line)
    env = report_environment()
    doc.table(list(env), [list(env.values())], "where this report was made (predicted costs are computed here)")


def grid_section(ctx: Context) -> None:
    """2. The grid: what varies between the cells, and the settings they share."""
    doc, cells, base, grid_raw = ctx.doc, ctx.cells, ctx.base, ctx.grid_raw
    doc.h(2, "Grid")
    varied, fixed = varied_and_fixed(cells)
    if grid_raw and isinstance(grid_raw.get("grid"), dict):
        doc.pre("\n".join(f"{k} = {json.dumps(v)}" for k, v in grid_raw["grid"].items()))
    doc.table(["#", "cell"] + varied + ["seeds (completed/runs)", "status"],
              [[i, c.label] + [setting_value(c.config, k) for k in varied]
               + [f"{len(c.completed)}/{len(c.runs)}", ",".join(sorted({r.status for r in c.runs}))]
               for i, c in enumerate(cells, 1)],
              f"cells in grid order; baseline: #{cells.index(base) + 1} {base.label}")
    shown = {k: v for k, v in fixed.items() if not k.startswith(("train.device", "train.threads"))}
    doc.table(["setting", "value"], [[k, json.dumps(v) if not isinstance(v, str) else v]
                                     for k, v in shown.items()], "settings shared by every cell")


def axis_answers(cells: list[Cell], metric: str, grid_raw: dict | None) -> tuple[list, str]:
    """Each swept axis's answer (abl.analysis.verdicts.axis_effects), and why there is none ("" when fine)."""
    from ...analysis import verdicts

    paths = [k for k in ((grid_raw or {}).get("grid") or {}) if k != "exclude"]
    inputs = verdicts.cell_inputs([r for c in cells for r in c.runs], metric, [c.key for c in cells])
    try:
        return verdicts.axis_effects(inputs, paths, metric), ""
    except Exception as exc:  # noqa: BLE001 - a design the model cannot fit must not lose the report
        return [], f"Per-axis analysis unavailable: {type(exc).__name__}: {exc}"


def axes_section(ctx: Context) -> None:
    """3a. Per axis: each swept axis's main effect (abl.analysis.verdicts.axis_effects), the answer the CLI
    summary and the dashboard lead with: per axis the verdict line (best level, the verdict, the one model
    that gave it), then its levels with rank (or why untested), mean, and the difference to the best level."""
    from ...analysis import answers, verdicts

    if ctx.effects_error:
        ctx.doc.p(ctx.effects_error)
        return
    effects = ctx.effects
    if not effects:
        return
    ctx.doc.h(2, f"Per axis: main effects on {ctx.metric}, best level first")
    for line in verdicts.effect_lines(effects, ctx.metric):
        if not line.startswith(" "):
            ctx.doc.p(line)
    rows = []
    for e in effects:
        h = e.headline()
        for lv in e.levels:
            c = answers.to_best(e, lv.level)  # the level against the best one: a forest plot's row in figures
            rows.append([e.axis, lv.level, lv.rank_text, stats.fmt(lv.mean), lv.n,
                         "-" if c is None else cell_signed(c.delta), "-" if c is None else cell_ci(c.ci_low, c.ci_high),
                         "-" if c is None else stats.fmt_p(c.p_adjusted), "-" if c is None else stats.fmt(c.mdd),
                         "best level" if lv is e.best else "-" if c is None else c.verdict])
        if h is not None and e.interaction_text():
            rows.append([e.axis, "", "", "", "", "", "", "", "", e.interaction_text()])
    ctx.doc.table(["axis", "level", "rank", "mean (least-squares in a factorial grid)", "runs", "Δ to the best",
                   "CI (Holm-adj.)", "p (Holm)", "MDD", "verdict against the best"], rows,
                  f"each axis's levels, best first; the verdict line above names the model; the statistics legend "
                  f"is below the comparison table. {ctx.cond}")


def comparison_section(ctx: Context) -> None:
    """3. The comparison table: the final compared metric per cell over seeds, against the baseline."""
    from ...analysis import verdicts

    doc, base, metric, stat_rows, cond = ctx.doc, ctx.base, ctx.metric, ctx.stat_rows, ctx.cond
    doc.h(2, f"Comparison: final {metric}")
    if any(s["role"] == stats.DIAGNOSTIC_ROLE for s in stat_rows):
        doc.p("Per cell, diagnostics: the per-cell tests against the baseline, with no verdict of their own; the "
              "per-axis verdicts above answer the question (" + "; ".join(
                  f"{e.axis}: {e.model}" for e in ctx.effects if e.design == "factorial" and e.contrasts) + ").")
    table_rows = []
    for i, s in enumerate(stat_rows, 1):
        health = (f"did not learn {s['did_not_learn']}/{s['completed']} (floor {stats.fmt(s['unigram_floor'], 3)})"
                  if s["did_not_learn"] else "") or (f"spikes {s['loss_spikes']}" if s["loss_spikes"] else "ok")
        table_rows.append([i, s["label"], f"{s['n']}/{s['runs']}", s.get("rank_text") or "-",
                           stats.fmt(s["mean"]), stats.fmt(s["std"]),
                           cell_ci(s["ci_low"], s["ci_high"]),
                           "-" if s["is_baseline"] else cell_signed(s["delta"]),
                           cell_ci(s["delta_ci_low"], s["delta_ci_high"]), stats.fmt_p(s["p_value"]),
                           stats.fmt_p(s["p_adjusted"]), s["test"], stats.fmt(s["mdd"]), s["verdict"], health])
    doc.table(["#", "cell", "n", "rank", "mean", "std", "95% CI", "Δ vs baseline",
               f"Δ {stat_rows[0].get('interval_header', '95% CI')}", "p", "p (Holm)",
               "test", "MDD", "verdict", "health"],
              table_rows,
              (f"val_bpb: bits per byte, the validation loss over the bytes of text its tokens cover "
               f"(the cells' data or tokenizers differ, so a token is not the same unit), "
               if metric == "val_bpb" else
               f"val_loss: mean cross-entropy (nats) on the fixed validation batches at the last step, ")
              + f"completed runs only. CI of a mean: Student t, 95%. Δ = cell - baseline ({base.label}); lower is better. "
              f"Health: did not learn = final val_loss within "
              f"{DID_NOT_LEARN_MARGIN} nats of the data's unigram floor; spikes = training-loss spikes "
              f"(abl.analysis.health). {cond}")
    notes = [f"{s['label']}: {s['note']}" for s in stat_rows if s["note"]]
    for n in notes:
        doc.p("Note: " + n)
    # the statistics legend, once in the report
    pooled = any(e.design == "factorial" and e.contrasts for e in ctx.effects)
    doc.p("How to read the verdicts: " + " ".join([*([verdicts.EFFECTS_METHOD] if pooled else []),
                                                    stat_rows[0]["method"]]))


def loss_curves_section(ctx: Context) -> None:
    """4. Loss curves at equal tokens, and at equal FLOPs and wall time where those differ."""
    doc, cells, runs, cond, contention = ctx.doc, ctx.cells, ctx.runs, ctx.cond, ctx.contention
    doc.h(2, "Loss curves")
    panels, why_not = loss_curve_panels(cells)
    names = {"flops": "equal predicted training FLOPs", "wall": "equal wall time"}
    doc.image("loss_curves.png", plot_loss_curves(cells, cond),
              "loss curves at equal tokens" + "".join(f", {names[p]}" for p in panels if p in names)
              + ("; val loss at equal tokens: the mean over seeds with a 95% t-interval band"
                 if sections.bands_by_default([len(c.completed) for c in cells]) else
                 f"; each seed faint, the mean over seeds bold (fewer than {sections.MIN_SEEDS_FOR_BANDS} seeds "
                 "per cell: no CI band)") + f". {cond}")
    for sentence in why_not:
        doc.p(sentence)
    if contention and "wall" in panels:
        doc.p(f"At equal wall time, the contended runs are drawn with x: {contention}")


def quality_vs_cost_section(ctx: Context) -> None:
    """5. Quality against each cost that differs between the cells."""
    doc, cells, stat_rows, cond = ctx.doc, ctx.cells, ctx.stat_rows, ctx.cond
    doc.h(2, "Quality vs cost")
    bands = sections.bands_by_default([len(c.completed) for c in cells])
    axes, same = cost_axes(cells)
    png = plot_quality_vs_cost(cells, stat_rows, cond)
    if png:
        doc.image("quality_vs_cost.png", png,
                  "final val_loss " + ("(mean over seeds, 95% CI bars)" if bands else
                                       f"(mean over seeds bold, each seed faint; fewer than "
                                       f"{sections.MIN_SEEDS_FOR_BANDS} seeds per cell, so no CI bars)")
                  + " against " + ", ".join(n.split(" (")[0] for n, _ in axes) + f". {cond}")
    if same:
        doc.p(("No quality-vs-cost plot: " if not png else "Not plotted against final val_loss: ")
              + " and ".join(same) + f", the same for every cell (within {sections.REL_TOL:.0%}).")


def predicted_vs_measured_section(ctx: Context) -> None:
    """6. Predicted (abl.model.costmodel) against measured costs: a summary per figure, the
    disagreements listed, every check folded away."""
    doc, cells, runs, rows, cond, contention = ctx.doc, ctx.cells, ctx.runs, ctx.cost_rows, ctx.cond, ctx.contention
    doc.h(2, "Predicted vs measured costs")
    # a cell with a component that declares no cost function has its figures measured (as abl cost says)
    note = measured_note(cells)
    src = ["source"] if note else []
    prow = []
    # the speed pass's figures (abl.run.speedpass), where it timed the cells' shapes alone after a packed grid
    alone = [m for m in catalogue.MEASURED_ALONE if any(measured(c, m) is not None for c in cells)]
    for c in cells:
        pr = c.predicted or {}
        hot = any(sections.is_contended(r.final) for r in c.completed)
        mark = f" {CONTENDED_MARK}" if hot else ""
        prow.append([c.label, cell_num(pr.get("n_params")), cell_num(pr.get("n_params_non_embedding")),
                     cell_num(pr.get("flops_per_step")), cell_num(pr.get("useful_flops_per_step")),
                     cell_bytes(pr.get("static_bytes")), cell_bytes(pr.get("activation_bytes_per_step")),
                     fmt_decode_cache(pr.get("kv_cache_bytes_per_token"), pr.get("state_bytes_per_sequence")),
                     fmt_speed(measured(c, "tokens_per_s"), unit=False) + mark,  # one precision: whole tokens/s
                     cell_pct(model_flops_utilization(c)) + mark]
                    + [fmt_speed(measured(c, m), unit=False) if m == "alone_tokens_per_s" else cell_pct(measured(c, m))
                       for m in alone] + ([cost_source(c)] if note else []))
    doc.table(["cell", "params", "non-emb. params", "train FLOPs/step", "useful FLOPs/step",
               "params+grads+AdamW", "activations/step", "decode cache", "tokens/s (measured)",
               "MFU (measured)", *[catalogue.metric(m).label for m in alone], *src], prow,
              "predicted from the components' cost functions (harness/model/costmodel.py) at each cell's batch size, "
              "context and precision" + (", or measured where the source says so (below)" if note else "")
              + "; tokens/s: median over steps, mean over seeds; MFU: useful (model) FLOPs "
              "per token x tokens/s / the device peak the run recorded (on CPU measured at start-up with a "
              f"large matmul)." + (f" {CONTENDED_MARK}: a seed of the cell ran on a contended machine."
                                   if contention else "")
              + (" (alone): the cell's shape timed with the device to itself by the speed pass after the grid "
                 "(abl.run.speedpass: the median of a fixed number of steps after warm-up); never marked "
                 "contended." if alone else "") + f" {cond}")
    if note:
        doc.p(note)
    if contention:
        doc.p(contention)
    summary, outliers = cost_summary(rows)
    doc.table(["figure", "cells", "agree", "disagree", "not compared", "worst measured / predicted"],
              [[s["figure"], s["cells"], s["agree"], s["disagree"], s["not_compared"],
                "-" if s["worst_ratio"] is None else f"{s['worst_ratio']:.4f} ({s['worst_cell']})"]
               for s in summary],
              "required: parameters exact, FLOPs per step within 5% of torch.utils.flop_counter on one step. "
              "Memory: predicted = fp32 params + grads + AdamW moments (+ autocast weight copies) + activations "
              "saved for backward + the loss's fp32 logit gradient, on the torch reference path; measured = "
              "peak_tensor_bytes, the largest total of live tensor storages during one whole training step "
              "(torch's MemTracker, the same on every device); required: measured / predicted within "
              f"{MEMORY_BAND[0]:g}-{MEMORY_BAND[1]:g} (the calibration is in harness/model/costmodel.py). The "
              "device's own peak (CUDA allocation, or CPU peak RSS, which adds the runtime's fixed overhead) "
              f"is in the runs table as peak_mem_bytes. {cond}")
    def check_row(r: dict) -> list:
        return [r["label"], r["figure"], cell_num(r["predicted"]), *([r["source"]] if note else []),
                cell_num(r["measured"]), "-" if r["ratio"] is None else f"{r['ratio']:.4f}", r["agreement"]]

    cost_table = (["cell", "figure", "predicted", *src, "measured", "measured / predicted", "agreement"],
                  [check_row(r) for r in rows])
    if outliers:
        doc.p(f"{len(outliers)} of {sum(s['compared'] for s in summary)} compared checks disagree:")
        doc.table(cost_table[0], [check_row(r) for r in outliers], f"the checks that disagree. {cond}")
    else:
        doc.p(f"Every compared check agrees ({sum(s['compared'] for s in summary)} of {len(rows)} checks have "
              "both a prediction and a measurement).")
    if skipped := compared_note(rows):  # never "all agree" alone when cells were not compared
        doc.p(skipped)
    doc.details(f"every check, one row per cell and figure ({len(rows)} rows)", *cost_table,
                "the full table is in report.json (predicted_vs_measured)")
    errs = sorted({c.predict_error for c in cells if c.predict_error and not c.not_loaded})  # those: above
    for e in errs:
        doc.p("Not predicted: " + e)
    png = plot_predicted_vs_measured(rows, cond)
    if png:
        doc.image("predicted_vs_measured.png", png,
                  f"predicted against measured costs (one point per cell; red: disagrees). {cond}")
    plotted = predicted_vs_measured_panels(rows)
    flat = [PLOTTED_CHECKS[f].split(" (")[0] for f in PLOTTED_CHECKS
            if f not in plotted and any(r["figure"] == f and r["measured"] for r in rows)]
    if flat:
        doc.p("Not plotted against each other (the summary above says how they agree): "
              + ", ".join(flat) + f", whose predicted and measured values are the same for every cell "
              f"(within {sections.REL_TOL:.0%}).")


def scaling_section(ctx: Context) -> tuple[Any, list, str]:
    """7. A scaling-law fit, when the cells span enough model sizes (abl.analysis.sections.scaling_fit_applies);
    returns (the fit or None, its points, why there is none)."""
    doc, cells, cond = ctx.doc, ctx.cells, ctx.cond
    pts = scaling_points(cells)
    fit, fit_note = None, sections.scaling_fit_applies(p[0] for p in pts) or ""
    if not fit_note:
        from ...analysis.scaling import ScalingFitError
        from ...analysis.scaling import fit as fit_scaling

        doc.h(2, "Scaling fit")
        try:
            fit = fit_scaling(*zip(*pts))
        except ScalingFitError as exc:
            fit_note = str(exc)
        if fit is not None:
            doc.table(["E", "A", "α", "B", "β", "form", "points", "sizes", "token budgets", "rmse(log L)"],
                      [[cell_num(fit.E), cell_num(fit.A), cell_num(fit.alpha), cell_num(fit.B), cell_num(fit.beta), fit.form,
                        fit.n_points, fit.n_sizes, fit.n_token_budgets, f"{fit.rmse_log:.3g}"]],
                      "Chinchilla form fitted by Huber loss (δ=1e-3) on log L with L-BFGS from a grid of starts "
                      f"(Hoffmann et al. 2022, App. D); N = non-embedding parameters, D = training tokens; every "
                      f"completed run is a point. {cond}")
            for n in fit.notes:
                doc.p("Note: " + n)
        else:
            doc.p(f"No fit: {fit_note}")
        doc.image("scaling.png", plot_scaling(pts, fit, cond), f"final val_loss against model size. {cond}")
    elif pts:
        doc.p(f"No scaling fit: {fit_note}.")
    return fit, pts, fit_note


def task_accuracy_section(ctx: Context) -> None:
    """Task accuracy per cell (abl.present.taskreport), when the runs trained on or probed a task."""
    from ..taskreport import report_section

    report_section(ctx.doc, ctx.cells, ctx.base, ctx.db_path, ctx.cond, pyplot, fig_to_png)


def run_notes_section(ctx: Context) -> None:
    """The notes of runs that have any, and every run that did not complete."""
    doc, cells, runs = ctx.doc, ctx.cells, ctx.runs
    labels_by_key = {c.key: c.label for c in cells}
    run_notes = [(r, r.notes) for r in runs if r.notes]
    if run_notes or any(r.status != COMPLETED for r in runs):
        doc.h(2, "Run notes")
        doc.table(["cell", "seed", "status", "notes"],
                  [[labels_by_key.get(r.cell_key, r.label), r.seed, r.status, r.notes] for r in runs
                   if r.notes or r.status != COMPLETED])


def write_report(rep: Report, out_dir: str | Path, fmt: str = "md") -> Path:
    """Write report.md + PNGs (fmt "md") or one self-contained report.html, and report.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "md":
        for b in rep.doc.blocks:
            if b[0] == "img":
                (out / b[1]).write_bytes(b[2])
        path = out / "report.md"
        path.write_text(rep.doc.markdown(), encoding="utf-8")
    elif fmt == "html":
        path = out / "report.html"
        path.write_text(rep.doc.html(rep.title), encoding="utf-8")
    else:
        raise ReportError(f"unknown format {fmt!r}: md or html")
    data = {
        "title": rep.title, "source": rep.source, "database": rep.db_path,
        "baseline": rep.baseline.key, "conditions": [c for c, _ in condition_groups(
            [r for c in rep.cells for r in c.runs])],
        "report_environment": report_environment(),
        "comparison": rep.stat_rows,
        "predicted": {c.key: {k: v for k, v in (c.predicted or {}).items() if k != "parts"} for c in rep.cells},
        "predicted_vs_measured": rep.cost_rows,
        "predicted_vs_measured_summary": cost_summary(rep.cost_rows)[0],
        "contended_runs": [r.run_id for r in contended_runs([r for c in rep.cells for r in c.runs])],
        "scaling_fit": rep.fit.as_dict() if rep.fit is not None else None, "scaling_note": rep.fit_note,
    }
    (out / "report.json").write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    return path

