"""``abl report``: a self-contained report of one experiment from the store.

Markdown with PNG plots beside it, or one HTML file with the plots embedded,
plus ``report.json`` with every number at full precision. Contents:

1. conditions: where and how the runs ran (device, versions, commit, data
   fingerprint, precision), grouped; every figure and table repeats them;
2. the grid: what varies between cells and the settings they share;
3. the comparison table: final val_loss per cell over seeds with mean, std,
   95% CI, and the delta against the baseline cell with its CI, p-value and
   verdict (harness/stats.py);
4. loss curves at equal tokens, equal (predicted) training FLOPs and equal
   wall time;
5. quality against cost;
6. predicted (harness/costmodel.py) against measured costs, disagreements
   flagged, never hidden;
7. a scaling-law fit (harness/scaling.py) when the cells span enough model
   sizes (``abl.analysis.sections.scaling_fit_applies``).

A section, panel or axis appears only when it means something for these cells
(``abl.analysis.sections``): no scaling fit over one model size, no FLOPs (or other
cost) axis where every cell costs the same, CI bars only with enough seeds
(seed points and lines otherwise); a section left out says why in one
sentence. Predicted against measured is a summary per figure with only the
disagreements listed (the full table is folded away in HTML). Cells are named
by ``abl.grid.labels`` (the settings that differ between them), drawn in colours
(and line styles past 20 cells) that tell them apart, with legends outside the
data. Runs whose machine was contended (``abl.analysis.sections.is_contended``) are
marked wherever a speed figure is shown.

The store is opened read-only. Nothing here names a variant.
"""

from __future__ import annotations

import base64
import html
import json
import math
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..analysis import sections, stats
from ..analysis.health import DID_NOT_LEARN_MARGIN
from ..analysis.tables import flatten
from ..model.costmodel import CHECKS, MEMORY_BAND, agreement
from ..store.rundir import COMPLETED
from .figures import (
    LINE_STYLES,
    MARKERS,
    add_footer,
    cell_styles,
    fig_to_png,
    finish_figure,
    legend_outside,
    pyplot,
    thin_ticks,
    tick_labels,
)

MIN_SIZES_FOR_FIT = sections.MIN_SIZES  # kept for callers; the rule is abl.analysis.sections.scaling_fit_applies
FINAL_NAMES = ("n_params", "n_params_non_embedding", "peak_mem_bytes", "peak_tensor_bytes",
               "baseline_rss_bytes", "wall_s",
               "flops_per_step_measured", "device_peak_flops", "mfu", "hfu", "val_loss", "val_bpb",
               "train_tokens_per_s", "compile_s",
               "unigram_floor", "did_not_learn", "loss_spikes", "max_loss_spike",  # these 4: abl.analysis.health
               sections.CONTENDED, "cpu_util", "load_per_core")  # these 3: the machine's contention


class ReportError(Exception):
    """Nothing to report, or an unusable source (a user error)."""


# ---------------------------------------------------------------- data


@dataclass
class Run:
    run_id: str
    experiment: str
    cell_key: str
    label: str
    seed: int
    status: str
    config: dict
    git_commit: str
    versions: dict
    device: str
    env: dict
    data_fingerprint: str
    grid_file: str
    notes: str
    final: dict = field(default_factory=dict)  # metric name -> last value (tokens_per_s: median)
    curves: dict = field(default_factory=dict)  # metric name -> [(step, value)]

    @property
    def tokens_per_step(self) -> int:
        return int(self.config["train"]["batch_size"]) * int(self.config["model"]["context"])

    @property
    def data_key(self) -> tuple:
        """What fixes the data order apart from the seed (see harness/stats.py)."""
        return (self.data_fingerprint, self.config["model"]["context"], self.config["train"]["batch_size"])


@dataclass
class Cell:
    key: str
    label: str
    runs: list[Run]
    predicted: dict | None = None
    predict_error: str = ""

    @property
    def completed(self) -> list[Run]:
        return [r for r in self.runs if r.status == COMPLETED]

    @property
    def config(self) -> dict:
        return self.runs[0].config


def _json(text: Any, default: Any) -> Any:
    if text is None:
        return default
    if isinstance(text, (dict, list)):
        return text
    try:
        return json.loads(text)
    except (TypeError, json.JSONDecodeError):
        return default


def load_runs(db_path: str | Path, *, run_ids: list[str] | None = None, experiment: str | None = None,
              curve_names: tuple[str, ...] = ("val_loss", "train_loss", "elapsed_s"),
              final_names: tuple[str, ...] = FINAL_NAMES) -> list[Run]:
    """Runs (with their final metrics and curves) by run id or experiment name, read-only."""
    from ..store import database as store

    if not Path(db_path).exists():
        raise ReportError(f"no database at {db_path} (abl run writes it; --db picks another)")
    con = store.connect(db_path, read_only=True)
    try:
        tables = {r[0] for r in con.execute("SHOW TABLES").fetchall()}
        if "runs" not in tables:
            raise ReportError(f"{db_path} has no runs table: not an abl database, or nothing ran yet")
        cols = ("run_id, experiment, cell_key, label, seed, status, config, git_commit, versions, device, "
                "env, data_fingerprint, grid_file, notes")
        if run_ids is not None:
            rows = con.execute(f"SELECT {cols} FROM runs WHERE list_contains(?, run_id) "
                               "ORDER BY started NULLS LAST, run_id", [run_ids]).fetchall()
        else:
            rows = con.execute(f"SELECT {cols} FROM runs WHERE experiment = ? "
                               "ORDER BY started NULLS LAST, run_id", [experiment]).fetchall()
        runs = [Run(r[0], r[1], r[2] or r[0], r[3] or "", r[4], r[5], _json(r[6], {}), r[7] or "unknown",
                    _json(r[8], {}), r[9] or "unknown", _json(r[10], {}), r[11] or "unknown", r[12] or "",
                    r[13] or "") for r in rows]
        ids = [r.run_id for r in runs]
        by_id = {r.run_id: r for r in runs}
        if ids:
            for rid, name, value in con.execute(
                    store.final_values_sql("list_contains(?, run_id) AND list_contains(?, name)"),
                    [ids, list(final_names)]).fetchall():
                by_id[rid].final[name] = value
            for rid, value in con.execute(
                    "SELECT run_id, median(value) FROM metrics WHERE list_contains(?, run_id) "
                    "AND name = 'tokens_per_s' GROUP BY run_id", [ids]).fetchall():
                by_id[rid].final["tokens_per_s"] = value
            for rid, name, step, value in con.execute(
                    "SELECT run_id, name, step, value FROM metrics WHERE list_contains(?, run_id) "
                    "AND list_contains(?, name) ORDER BY run_id, name, step",
                    [ids, list(curve_names)]).fetchall():
                by_id[rid].curves.setdefault(name, []).append((step, value))
        return runs
    finally:
        con.close()


def experiments(db_path: str | Path) -> list[str]:
    from ..store import database as store

    if not Path(db_path).exists():
        return []
    con = store.connect(db_path, read_only=True)
    try:
        if "runs" not in {r[0] for r in con.execute("SHOW TABLES").fetchall()}:
            return []
        return [r[0] for r in con.execute("SELECT DISTINCT experiment FROM runs ORDER BY 1").fetchall()]
    finally:
        con.close()


def group_cells(runs: list[Run], order: list[str] | None = None) -> list[Cell]:
    """Runs grouped by cell, in ``order`` (cell keys, e.g. the grid's) then first-seen order."""
    cells: dict[str, Cell] = {}
    for r in runs:
        cells.setdefault(r.cell_key, Cell(r.cell_key, r.label or r.cell_key[:8], [])).runs.append(r)
    for c in cells.values():
        c.runs.sort(key=lambda r: r.seed)
    rank = {k: i for i, k in enumerate(order or [])}
    return sorted(cells.values(), key=lambda c: rank.get(c.key, len(rank)))


def pick_baseline(cells: list[Cell], baseline: str | None) -> Cell:
    """The baseline cell: the first healthy one (the grid's first cell), or one chosen by label, key or
    1-based index (abl.analysis.verdicts.find_cell)."""
    from ..analysis.verdicts import VerdictError, default_baseline, find_cell

    inputs = _inputs(cells)
    try:
        chosen = find_cell(inputs, baseline) if baseline else default_baseline(inputs)
    except VerdictError as exc:
        raise ReportError(str(exc)) from None
    return next(c for c in cells if c.key == chosen.key)


def _inputs(cells: list[Cell], metric: str = "val_loss"):
    from ..analysis.verdicts import cell_inputs

    return cell_inputs([r for c in cells for r in c.runs], metric, [c.key for c in cells])


def final_val_losses(cell: Cell, metric: str = "val_loss") -> dict[int, float]:
    return {r.seed: r.final[metric] for r in cell.completed if r.final.get(metric) is not None}


def comparison_metric(cells: list[Cell]) -> str:
    """What cells are compared on: ``val_loss`` (nats per token), or ``val_bpb`` (bits per byte) when
    their data or tokenizer differ, so a token means different things, and every completed run has it."""
    runs = [r for c in cells for r in c.completed]
    data = {json.dumps([(r.config.get("components") or {}).get(a) for a in ("dataset", "tokenizer")],
                       sort_keys=True, default=str) for r in runs}
    if len(data) > 1 and runs and all(r.final.get("val_bpb") is not None for r in runs):
        return "val_bpb"
    return "val_loss"


def cell_statistics(cells: list[Cell], baseline: Cell, alpha: float = stats.ALPHA,
                    bootstrap: bool = False, metric: str = "val_loss") -> list[dict[str, Any]]:
    """One dict per cell: the final ``metric`` over seeds, learning health, and the comparison with
    ``baseline`` (abl.analysis.stats.analyse: the same engine and defaults as the run summary, abl compare and
    the dashboard)."""
    inputs = _inputs(cells, metric)
    analysis = stats.analyse(inputs, stats.against_baseline([c.key for c in cells], baseline.key), alpha=alpha,
                             bootstrap=bootstrap)
    comps = {cr.a: cr for cr in analysis.comparisons}
    out = []
    for c, row in zip(cells, analysis.cells):
        comp = comps.get(c.key)
        h = row.health
        out.append({
            "cell_key": c.key, "label": c.label, "runs": len(c.runs), "completed": len(c.completed),
            "seeds": sorted(inputs[cells.index(c)].values), "n": row.n, "mean": row.mean, "std": row.std,
            "ci_low": row.ci_low, "ci_high": row.ci_high, "rank": row.rank,
            "delta": comp.delta if comp else (0.0 if row.n else None),
            "delta_ci_low": comp.ci_low if comp else None, "delta_ci_high": comp.ci_high if comp else None,
            "p_value": comp.p_value if comp else None, "p_adjusted": comp.p_adjusted if comp else None,
            "mdd": comp.mdd if comp else None, "test": comp.test if comp else stats.BASELINE,
            "verdict": comp.verdict if comp else stats.BASELINE, "note": comp.note if comp else "",
            "is_baseline": c.key == baseline.key, "did_not_learn": h.did_not_learn, "unigram_floor": h.floor,
            "loss_spikes": h.loss_spikes, "max_loss_spike": h.max_loss_spike, "method": analysis.method,
        })
    return out


def statistics_for_runs(db_path: str | Path, run_ids: list[str], order: list[str] | None = None,
                        baseline: str | None = None) -> list[dict[str, Any]]:
    """``cell_statistics`` straight from the store, on ``comparison_metric``, which each row
    names under ``metric``.

    ``order``: cell keys in grid order (the first is the baseline unless
    ``baseline`` names another by label, key prefix or 1-based index).
    """
    cells = group_cells(load_runs(db_path, run_ids=run_ids, curve_names=()), order)
    if not cells:
        return []
    metric = comparison_metric(cells)
    return [{**row, "metric": metric} for row in cell_statistics(cells, pick_baseline(cells, baseline),
                                                                 metric=metric)]


# ---------------------------------------------------------------- conditions


def run_conditions(r: Run) -> dict[str, str]:
    v = r.versions or {}
    env = r.env or {}
    precision = str(env.get("precision", r.config.get("train", {}).get("precision", "?")))
    if env.get("emulated"):
        precision += " (emulated)"
    return {
        "device": r.device,
        "torch": str(v.get("torch", "?")),
        "python": str(v.get("python", "?")),
        "abl commit": r.git_commit,
        "data": f"{r.data_fingerprint[:12]}" + (f" ({env['data_description']})" if env.get("data_description")
                                                  else ""),
        "precision": precision,
        "kernels": str(env.get("kernels", "?")),
    }


def condition_groups(runs: list[Run]) -> list[tuple[dict[str, str], list[Run]]]:
    groups: dict[str, tuple[dict[str, str], list[Run]]] = {}
    for r in runs:
        cond = run_conditions(r)
        groups.setdefault(json.dumps(cond, sort_keys=True), (cond, []))[1].append(r)
    return list(groups.values())


def measured_runs(runs: list[Run]) -> list[Run]:
    """The runs whose numbers are shown: the completed ones (all, when none is). A run still going, or
    one that failed or was killed, may not have recorded its environment yet: it is no condition of
    any number in the report."""
    return [r for r in runs if r.status == COMPLETED] or list(runs)


def conditions_line(runs: list[Run]) -> str:
    """One line that says where every number came from (the completed runs)."""
    runs = measured_runs(runs)
    groups = condition_groups(runs)
    seeds = sorted({r.seed for r in runs})
    seed_txt = f"seeds {','.join(map(str, seeds))}"
    if len(groups) == 1:
        c = groups[0][0]
        return (f"{c['device']}; torch {c['torch']}, python {c['python']}; abl {c['abl commit'][:12]}; "
                f"data {c['data']}; precision {c['precision']}; kernels {c['kernels']}; {seed_txt}")
    return f"{len(groups)} different run conditions (see the Conditions table); {seed_txt}"


def report_environment() -> dict[str, str]:
    """Where the report itself was made (predictions are computed here)."""
    from ..store.provenance import git_commit, package_versions

    out = {"platform": platform.platform(), "abl commit": git_commit(),
           **package_versions(("abl", "torch", "numpy", "scipy", "duckdb", "matplotlib"))}
    return out


# ---------------------------------------------------------------- grid description


def _settings(config: dict) -> dict[str, Any]:
    flat = flatten({k: config.get(k) for k in ("model", "train", "data")})
    for axis, spec in (config.get("components") or {}).items():
        if isinstance(spec, dict) and spec.get("params"):
            for k, v in spec["params"].items():
                flat[f"{axis}.{spec['name']}.{k}"] = v
    return flat


def varied_and_fixed(cells: list[Cell]) -> tuple[list[str], dict[str, Any]]:
    """Config paths that differ between cells, and the settings all cells share."""
    flats = [_settings(c.config) for c in cells]
    # parameters of a component only some cells select are implied by the selector column
    keys = [k for k in flats[0] if all(k in f for f in flats)]
    varied = [k for k in keys if len({json.dumps(f[k], default=str) for f in flats}) > 1]
    fixed = {k: flats[0][k] for k in keys if k not in varied}
    return varied, fixed


# ---------------------------------------------------------------- predictions


def attach_predictions(cells: list[Cell], registry) -> None:
    """Predicted costs per cell from the registered cost functions (errors kept, not raised)."""
    from ..contracts.config import ConfigError
    from ..contracts.registry import RegistryError
    from ..grid.gridfile import cell_from_config
    from ..model.costmodel import predict

    for c in cells:
        r = c.runs[0]
        try:
            cell = cell_from_config(r.config, registry)
            vocab = r.env.get("vocab_size") or None
            c.predicted = predict(cell, registry, vocab_size=vocab)
        except (ConfigError, RegistryError) as exc:
            c.predict_error = str(exc).splitlines()[0]
        except Exception as exc:  # noqa: BLE001 - a report still comes out, with the reason
            c.predict_error = f"{type(exc).__name__}: {exc}"


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(vals) / len(vals) if vals else None


def measured(cell: Cell, name: str) -> float | None:
    return _mean([r.final.get(name) for r in cell.completed])


def model_flops_utilization(cell: Cell) -> float | None:
    """MFU as the trainer recorded it: useful (model) FLOPs per step over the median
    step time of the same timed steps, over the device peak (abl.run.train.mfu).

    Useful FLOPs are the variant-aware prediction (model FLOPs, recomputation excluded, as in
    the MFU of Chowdhery et al. 2022, PaLM, arXiv:2204.02311, App. B), so a variant cannot show an MFU above 100%
    by being counted as dense attention. There is no fallback from a single
    step's tokens/s: one noisy step once gave a report an MFU of 105%.
    """
    return measured(cell, "mfu")


def cost_rows(cells: list[Cell]) -> list[dict[str, Any]]:
    """Predicted vs measured, one dict per cell and check (see costmodel.CHECKS)."""
    rows = []
    for c in cells:
        for pred_key, meas_key, required in CHECKS:
            pred = c.predicted.get(pred_key) if c.predicted else None
            meas = measured(c, meas_key)
            ratio, verdict = agreement(pred, meas, required)
            if pred is None and c.predict_error:
                verdict = f"not predicted: {c.predict_error}"
            elif meas_key == "peak_tensor_bytes" and meas is not None and any(
                    r.env.get("kernels") == "triton" for r in c.completed):
                verdict = ("not compared: the run used the Triton kernels, which keep less for backward "
                           "than the torch reference path the prediction models")
            rows.append({"cell_key": c.key, "label": c.label, "figure": pred_key, "predicted": pred,
                         "measured": meas, "measured_as": meas_key, "ratio": ratio, "agreement": verdict})
    return rows


def cost_summary(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(one summary per figure, the rows that disagree) from ``cost_rows``.

    A summary: ``figure``, ``cells``, ``compared`` (both sides known), ``agree``,
    ``disagree``, ``not_compared``, and ``worst_ratio`` (the measured / predicted
    farthest from 1, as a factor either way). The outliers are the rows whose
    agreement is a disagreement; every other row is counted, not listed."""
    by_figure: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_figure.setdefault(r["figure"], []).append(r)
    out = []
    for figure, rs in by_figure.items():
        ratios = [r["ratio"] for r in rs if r["ratio"] is not None and r["ratio"] > 0]
        worst = max(ratios, key=lambda x: max(x, 1 / x)) if ratios else None
        agree = sum(1 for r in rs if str(r["agreement"]).startswith("agrees"))
        disagree = sum(1 for r in rs if str(r["agreement"]).startswith("DISAGREES"))
        out.append({"figure": figure, "cells": len(rs), "compared": agree + disagree, "agree": agree,
                    "disagree": disagree, "not_compared": len(rs) - agree - disagree, "worst_ratio": worst,
                    "worst_cell": next((r["label"] for r in rs if r["ratio"] == worst), None)})
    outliers = [r for r in rows if str(r["agreement"]).startswith("DISAGREES")]
    return out, outliers


def contended_runs(runs: list[Run]) -> list[Run]:
    """The completed runs whose machine was contended during their loop (``abl.analysis.sections.is_contended``)."""
    return [r for r in runs if r.status == COMPLETED and sections.is_contended(r.final)]


def contention_note(runs: list[Run]) -> str:
    """One sentence on the contended runs ("" when none is)."""
    bad = contended_runs(runs)
    if not bad:
        return ""
    done = [r for r in runs if r.status == COMPLETED]
    return (f"{len(bad)} of {len(done)} completed runs ran on a contended machine (marked {CONTENDED_MARK}): "
            "their tokens/s, wall time and MFU are not comparable with the other runs' (the loss at equal "
            "tokens is).")


CONTENDED_MARK = "‡"


# ---------------------------------------------------------------- plots


def _contended_handle():
    from matplotlib.lines import Line2D

    return Line2D([], [], color="0.4", marker="x", ls="none",
                  label=f"{CONTENDED_MARK} contended run: its speed is not comparable")


def _mean_curve(runs: list[Run], name: str) -> tuple[list[int], list[float]]:
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
    rows, cols = (2, 2) if len(panels) == 4 else (1, len(panels))
    fig, grid = plt.subplots(rows, cols, figsize=(4.3 * cols + 0.5, 3.6 * rows + 0.6), squeeze=False,
                             layout="constrained")
    axes = dict(zip(panels, grid.flat))
    for ax in list(grid.flat)[len(panels):]:
        fig.delaxes(ax)
    styles = cell_styles(len(cells))
    bands = sections.bands_by_default([len(c.completed) for c in cells])
    any_contended = False
    for c, st in zip(cells, styles):
        runs = c.completed or c.runs
        if not runs:
            continue
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
    titles = {"train": ("train loss (EMA, mean over seeds)", "tokens", "cross-entropy (nats)"),
              "tokens": ("val loss at equal tokens (mean, 95% CI band)" if bands else
                         "val loss at equal tokens (mean; seeds faint)", "tokens", "val_loss"),
              "flops": ("val loss at equal training FLOPs (predicted)", "training FLOPs", "val_loss"),
              "wall": ("val loss at equal wall time (each seed)", "wall time (s)", "val_loss")}
    for name, ax in axes.items():
        t, xl, yl = titles[name]
        ax.set(title=t, xlabel=xl, ylabel=yl)
        ax.grid(alpha=0.3)
    return finish_figure(fig, list(axes.values()), footer, [_contended_handle()] if any_contended else None)


def plot_loss_curves(cells: list[Cell], footer: str) -> bytes:
    return fig_to_png(loss_curves_figure(cells, footer))


def _cost_axes(cells: list[Cell]) -> tuple[list[tuple[str, dict[str, float | None]]], list[str]]:
    """The cost axes of quality vs cost that differ between the cells, and the names of those that do not."""
    def flops(c: Cell) -> float | None:
        steps = c.config["train"]["steps"]
        per_step = (c.predicted or {}).get("flops_per_step") or measured(c, "flops_per_step_measured")
        return per_step * steps if per_step else None

    cands = [("training FLOPs (predicted, whole run)", {c.key: flops(c) for c in cells}),
             ("wall time (s, measured)", {c.key: measured(c, "wall_s") for c in cells}),
             ("parameters", {c.key: (c.predicted or {}).get("n_params") or measured(c, "n_params")
                             for c in cells})]
    keep, why = [], []
    for name, xs in cands:
        if sections.differs(xs.values()):
            keep.append((name, xs))
        else:
            why.append(name.split(" (")[0])
    return keep, why


def quality_vs_cost_figure(cells: list[Cell], stat_rows: list[dict], footer: str):
    """Final val_loss against each cost that differs between the cells (training FLOPs, wall time,
    parameters); None when none does. Mean over seeds with 95% CI bars when every cell has enough
    seeds (abl.analysis.sections.bands_by_default), else each seed faint beside the mean."""
    keep, _ = _cost_axes(cells)
    if not keep:
        return None
    plt = pyplot()
    fig, grid = plt.subplots(1, len(keep), figsize=(max(8.0, 4.4 * len(keep) + 0.6), 4.6), squeeze=False,
                             layout="constrained")
    axes = list(grid[0])
    by_key = {s["cell_key"]: s for s in stat_rows}
    bands = sections.bands_by_default([len(c.completed) for c in cells])
    styles = cell_styles(len(cells))
    any_contended = False
    for c, st in zip(cells, styles):
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
                y = r.final.get("val_loss")
                rx = r.final.get("wall_s") if name.startswith("wall") else x
                hot = name.startswith("wall") and sections.is_contended(r.final)
                any_contended |= hot
                if y is not None and rx:
                    ax.plot([rx], [y], "x" if hot else st["marker"], color=st["color"], alpha=0.35,
                            ms=5 if hot else 4)
    ylabel = "final val_loss (mean, 95% CI)" if bands else "final val_loss (mean; seeds faint)"
    for ax, (name, _) in zip(axes, keep):
        ax.set(xlabel=name, ylabel=ylabel)
        ax.grid(alpha=0.3)
    fig.suptitle("quality vs cost")
    return finish_figure(fig, axes, footer, [_contended_handle()] if any_contended else None)


def plot_quality_vs_cost(cells: list[Cell], stat_rows: list[dict], footer: str) -> bytes | None:
    fig = quality_vs_cost_figure(cells, stat_rows, footer)
    return None if fig is None else fig_to_png(fig)


PLOTTED_CHECKS = {"n_params": "parameters (exact)", "flops_per_step": "FLOPs per step (flop counter)",
                  "train_peak_bytes": "training memory (peak tensor bytes)"}


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
        pts = [(r["predicted"], r["measured"], str(r["agreement"]).startswith("DISAGREES")) for r in rows
               if r["figure"] == name and r["predicted"] and r["measured"]]
        xs, ys, bad = zip(*pts)
        lo, hi = min(xs + ys) * 0.8, max(xs + ys) * 1.25
        ax.plot([lo, hi], [lo, hi], color="0.5", lw=1, label="measured = predicted")
        if name == "flops_per_step":
            ax.fill_between([lo, hi], [lo * 0.95, hi * 0.95], [lo * 1.05, hi * 1.05], color="0.85",
                            label="±5%")
        if name == "train_peak_bytes":
            b_lo, b_hi = MEMORY_BAND
            ax.fill_between([lo, hi], [lo * b_lo, hi * b_lo], [lo * b_hi, hi * b_hi], color="0.85",
                            label=f"band {b_lo:g}-{b_hi:g}x")
        ok = [(x, y) for x, y, b in pts if not b]
        no = [(x, y) for x, y, b in pts if b]
        if ok:
            ax.scatter(*zip(*ok), s=18, zorder=3, color="tab:blue", label="agrees or not compared")
        if no:
            ax.scatter(*zip(*no), s=24, zorder=4, color="tab:red", marker="D", label="disagrees")
        scale = "log" if hi / lo > 30 else "linear"
        ax.set(xscale=scale, yscale=scale, xlabel=f"predicted {name}", ylabel="measured",
               title=PLOTTED_CHECKS[name])
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
    ax.set(xscale="log", xlabel="N (non-embedding parameters)", ylabel="final val_loss",
           title="scaling fit: L = E + A/N^α + B/D^β")
    ax.grid(alpha=0.3, which="both")
    return finish_figure(fig, [ax], footer)


def plot_scaling(points: list[tuple[float, float, float]], fit, footer: str) -> bytes:
    return fig_to_png(scaling_figure(points, fit, footer))


# ---------------------------------------------------------------- document


@dataclass
class Doc:
    blocks: list[tuple] = field(default_factory=list)

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", level, text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def table(self, headers: list[str], rows: list[list[Any]], caption: str = "") -> None:
        self.blocks.append(("table", headers, [[("-" if x is None else str(x)) for x in r] for r in rows],
                            caption))

    def image(self, name: str, png: bytes | None, caption: str) -> None:
        if png:
            self.blocks.append(("img", name, png, caption))

    def pre(self, text: str) -> None:
        self.blocks.append(("pre", text))

    def details(self, summary: str, headers: list[str], rows: list[list[Any]], caption: str = "") -> None:
        """A table folded away in HTML (a <details> block); left out of Markdown."""
        self.blocks.append(("details", summary, headers,
                            [[("-" if x is None else str(x)) for x in r] for r in rows], caption))

    def markdown(self) -> str:
        out = []
        for b in self.blocks:
            if b[0] == "h":
                out.append("#" * b[1] + " " + b[2])
            elif b[0] == "p":
                out.append(b[1])
            elif b[0] == "table":
                _, headers, rows, caption = b

                def cell(x: str) -> str:
                    return x.replace("|", "\\|").replace("\n", " ")

                lines = ["| " + " | ".join(map(cell, headers)) + " |",
                         "|" + "|".join("---" for _ in headers) + "|"]
                lines += ["| " + " | ".join(map(cell, r)) + " |" for r in rows]
                if caption:
                    lines += ["", f"*{caption}*"]
                out.append("\n".join(lines))
            elif b[0] == "img":
                out.append(f"![{b[1].rsplit('.', 1)[0].replace('_', ' ')}]({b[1]})\n\n*{b[3]}*")
            elif b[0] == "pre":
                out.append("```\n" + b[1] + "\n```")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        e = html.escape
        out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>"
               "body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
               "table{border-collapse:collapse;font-size:13px;margin:.5em 0}.tw{overflow-x:auto;max-width:100%}"
               "td,th{border:1px solid #ccc;padding:3px 7px;text-align:left}th{background:#f3f3f3}"
               "caption{caption-side:bottom;font-size:12px;color:#555;text-align:left;padding-top:4px}"
               "img{max-width:100%;height:auto}figure{margin:1em 0}figcaption{font-size:12px;color:#555}"
               "pre{background:#f6f6f6;padding:8px;overflow-x:auto}details{margin:.5em 0}"
               "summary{cursor:pointer}</style></head><body>"]
        for b in self.blocks:
            if b[0] == "h":
                out.append(f"<h{b[1]}>{e(b[2])}</h{b[1]}>")
            elif b[0] == "p":
                out.append(f"<p>{e(b[1])}</p>")
            elif b[0] == "table":
                _, headers, rows, caption = b
                out.append("<div class='tw'><table>" + (f"<caption>{e(caption)}</caption>" if caption else "")
                           + "<tr>" + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr>"
                           + "".join("<tr>" + "".join(f"<td>{e(x)}</td>" for x in r) + "</tr>" for r in rows)
                           + "</table></div>")
            elif b[0] == "img":
                data = base64.b64encode(b[2]).decode()
                out.append(f"<figure><img alt='{e(b[3])}' src='data:image/png;base64,{data}'>"
                           f"<figcaption>{e(b[3])}</figcaption></figure>")
            elif b[0] == "pre":
                out.append(f"<pre>{e(b[1])}</pre>")
            elif b[0] == "details":
                _, summary, headers, rows, caption = b
                out.append(f"<details><summary>{e(summary)}</summary><div class='tw'><table>"
                           + (f"<caption>{e(caption)}</caption>" if caption else "")
                           + "<tr>" + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr>"
                           + "".join("<tr>" + "".join(f"<td>{e(x)}</td>" for x in r) + "</tr>" for r in rows)
                           + "</table></div></details>")
        out.append("</body></html>")
        return "\n".join(out)


def _num(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if isinstance(x, int) or (x.is_integer() and abs(x) < 1e15):
        return f"{int(x):,}"
    return f"{x:.4g}"


def _bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ci(lo: float | None, hi: float | None) -> str:
    return "-" if lo is None or hi is None else f"[{stats.fmt(lo)}, {stats.fmt(hi)}]"


def _signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.4f}"


# ---------------------------------------------------------------- the report


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


def scaling_points(cells: list[Cell]) -> list[tuple[float, float, float]]:
    """(N non-embedding, D training tokens, final val_loss) for every completed run."""
    pts = []
    for c in cells:
        for r in c.completed:
            n = r.final.get("n_params_non_embedding") or (c.predicted or {}).get("n_params_non_embedding")
            loss = r.final.get("val_loss")
            d = r.final.get("tokens") or r.config["train"]["steps"] * r.tokens_per_step
            if n and loss is not None and math.isfinite(loss):
                pts.append((float(n), float(d), float(loss)))
    return pts


def build_report(runs: list[Run], *, source: str, db_path: str, registry, order: list[str] | None = None,
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
    stat_rows = cell_statistics(cells, base, metric=metric)
    rows = cost_rows(cells)
    cond = conditions_line(runs)
    experiment = runs[0].experiment
    doc = Doc()
    title = f"abl report: {experiment}"
    doc.h(1, title)
    completed = sum(len(c.completed) for c in cells)
    doc.p(f"Source: {source}. Database: {db_path}. {len(cells)} cells, {len(runs)} runs ({completed} completed"
          + (f", {missing_runs} runs of the grid not in the store yet" if missing_runs else "")
          + f"). Generated {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}.")
    doc.p(f"Conditions of every number below: {cond}.")

    # 1. conditions: of the completed runs (a running, failed or killed run is no condition of a number)
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
    contention = contention_note(runs)
    if contention:
        doc.p("WARNING: " + contention)
    env = report_environment()
    doc.table(list(env), [list(env.values())], "where this report was made (predicted costs are computed here)")

    # 2. grid
    doc.h(2, "Grid")
    varied, fixed = varied_and_fixed(cells)
    if grid_raw and isinstance(grid_raw.get("grid"), dict):
        doc.pre("\n".join(f"{k} = {json.dumps(v)}" for k, v in grid_raw["grid"].items()))
    doc.table(["#", "cell"] + varied + ["seeds (completed/runs)", "status"],
              [[i, c.label] + [_flatten_get(c.config, k) for k in varied]
               + [f"{len(c.completed)}/{len(c.runs)}", ",".join(sorted({r.status for r in c.runs}))]
               for i, c in enumerate(cells, 1)],
              f"cells in grid order; baseline: #{cells.index(base) + 1} {base.label}")
    shown = {k: v for k, v in fixed.items() if not k.startswith(("train.device", "train.threads"))}
    doc.table(["setting", "value"], [[k, json.dumps(v) if not isinstance(v, str) else v]
                                     for k, v in shown.items()], "settings shared by every cell")

    # 3. comparison
    doc.h(2, f"Comparison: final {metric}")
    table_rows = []
    for i, s in enumerate(stat_rows, 1):
        health = (f"did not learn {s['did_not_learn']}/{s['completed']} (floor {stats.fmt(s['unigram_floor'], 3)})"
                  if s["did_not_learn"] else "") or (f"spikes {s['loss_spikes']}" if s["loss_spikes"] else "ok")
        table_rows.append([i, s["label"], f"{s['n']}/{s['runs']}", "-" if s["rank"] is None else s["rank"],
                           stats.fmt(s["mean"]), stats.fmt(s["std"]),
                           _ci(s["ci_low"], s["ci_high"]),
                           "-" if s["is_baseline"] else _signed(s["delta"]),
                           _ci(s["delta_ci_low"], s["delta_ci_high"]), stats.fmt_p(s["p_value"]),
                           stats.fmt_p(s["p_adjusted"]), s["test"], stats.fmt(s["mdd"]), s["verdict"], health])
    doc.table(["#", "cell", "n", "rank", "mean", "std", "95% CI", "Δ vs baseline", "Δ 95% CI", "p", "p (Holm)",
               "test", "MDD", "verdict", "health"],
              table_rows,
              (f"val_bpb: bits per byte, the validation loss over the bytes of text its tokens cover "
               f"(the cells' data or tokenizers differ, so a token is not the same unit), "
               if metric == "val_bpb" else
               f"val_loss: mean cross-entropy (nats) on the fixed validation batches at the last step, ")
              + f"completed runs only. CI: Student t, 95%. Δ = cell - baseline ({base.label}); lower is better. "
              f"{stat_rows[0]['method']} Health: did not learn = final val_loss within "
              f"{DID_NOT_LEARN_MARGIN} nats of the data's unigram floor; spikes = training-loss spikes "
              f"(abl.analysis.health). {cond}")
    notes = [f"{s['label']}: {s['note']}" for s in stat_rows if s["note"]]
    for n in notes:
        doc.p("Note: " + n)

    # 4. curves, 5. quality vs cost
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
    doc.h(2, "Quality vs cost")
    bands = sections.bands_by_default([len(c.completed) for c in cells])
    cost_axes, same = _cost_axes(cells)
    png = plot_quality_vs_cost(cells, stat_rows, cond)
    if png:
        doc.image("quality_vs_cost.png", png,
                  "final val_loss " + ("(mean over seeds, 95% CI bars)" if bands else
                                       f"(mean over seeds bold, each seed faint; fewer than "
                                       f"{sections.MIN_SEEDS_FOR_BANDS} seeds per cell, so no CI bars)")
                  + " against " + ", ".join(n.split(" (")[0] for n, _ in cost_axes) + f". {cond}")
    if same:
        doc.p(("No quality-vs-cost plot: " if not png else "Not plotted against final val_loss: ")
              + " and ".join(same) + f", the same for every cell (within {sections.REL_TOL:.0%}).")

    # 6. predicted vs measured
    doc.h(2, "Predicted vs measured costs")
    prow = []
    for c in cells:
        pr = c.predicted or {}
        hot = any(sections.is_contended(r.final) for r in c.completed)
        mark = f" {CONTENDED_MARK}" if hot else ""
        prow.append([c.label, _num(pr.get("n_params")), _num(pr.get("n_params_non_embedding")),
                     _num(pr.get("flops_per_step")), _num(pr.get("useful_flops_per_step")),
                     _bytes(pr.get("static_bytes")), _bytes(pr.get("activation_bytes_per_step")),
                     _bytes(pr.get("kv_cache_bytes_per_token")),
                     _num(measured(c, "tokens_per_s")) + mark, _pct(model_flops_utilization(c)) + mark])
    doc.table(["cell", "params", "non-emb. params", "train FLOPs/step", "useful FLOPs/step",
               "params+grads+AdamW", "activations/step", "KV cache/token", "tokens/s (measured)",
               "MFU (measured)"], prow,
              "predicted from the components' cost functions (harness/costmodel.py) at each cell's batch size, "
              "context and precision; tokens/s: median over steps, mean over seeds; MFU: useful (model) FLOPs "
              "per token x tokens/s / the device peak the run recorded (on CPU measured at start-up with a "
              f"large matmul)." + (f" {CONTENDED_MARK}: a seed of the cell ran on a contended machine."
                                   if contention else "") + f" {cond}")
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
              f"{MEMORY_BAND[0]:g}-{MEMORY_BAND[1]:g} (the calibration is in harness/costmodel.py). The "
              "device's own peak (CUDA allocation, or CPU peak RSS, which adds the runtime's fixed overhead) "
              f"is in the runs table as peak_mem_bytes. {cond}")
    cost_table = (["cell", "figure", "predicted", "measured", "measured / predicted", "agreement"],
                  [[r["label"], r["figure"], _num(r["predicted"]), _num(r["measured"]),
                    "-" if r["ratio"] is None else f"{r['ratio']:.4f}", r["agreement"]] for r in rows])
    if outliers:
        doc.p(f"{len(outliers)} of {sum(s['compared'] for s in summary)} compared checks disagree:")
        doc.table(cost_table[0], [[r["label"], r["figure"], _num(r["predicted"]), _num(r["measured"]),
                                   "-" if r["ratio"] is None else f"{r['ratio']:.4f}", r["agreement"]]
                                  for r in outliers], f"the checks that disagree. {cond}")
    else:
        doc.p(f"Every compared check agrees ({sum(s['compared'] for s in summary)} of {len(rows)} checks have "
              "both a prediction and a measurement).")
    doc.details(f"every check, one row per cell and figure ({len(rows)} rows)", *cost_table,
                "the full table is in report.json (predicted_vs_measured)")
    errs = sorted({c.predict_error for c in cells if c.predict_error})
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

    # 7. scaling
    pts = scaling_points(cells)
    fit, fit_note = None, sections.scaling_fit_applies(p[0] for p in pts) or ""
    if not fit_note:
        from ..analysis.scaling import ScalingFitError
        from ..analysis.scaling import fit as fit_scaling

        doc.h(2, "Scaling fit")
        try:
            fit = fit_scaling(*zip(*pts))
        except ScalingFitError as exc:
            fit_note = str(exc)
        if fit is not None:
            doc.table(["E", "A", "α", "B", "β", "form", "points", "sizes", "token budgets", "rmse(log L)"],
                      [[_num(fit.E), _num(fit.A), _num(fit.alpha), _num(fit.B), _num(fit.beta), fit.form,
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

    from .taskreport import report_section as task_accuracy_section

    task_accuracy_section(doc, cells, base, db_path, cond, pyplot, fig_to_png)

    labels_by_key = {c.key: c.label for c in cells}
    run_notes = [(r, r.notes) for r in runs if r.notes]
    if run_notes or any(r.status != COMPLETED for r in runs):
        doc.h(2, "Run notes")
        doc.table(["cell", "seed", "status", "notes"],
                  [[labels_by_key.get(r.cell_key, r.label), r.seed, r.status, r.notes] for r in runs
                   if r.notes or r.status != COMPLETED])
    return Report(title, source, db_path, cells, base, stat_rows, rows, fit, pts, fit_note, doc)


def label_cells(cells: list[Cell], grid_raw: dict | None = None) -> None:
    """Every cell's display label from the settings that differ between these cells (abl.grid.labels),
    the grid's paths first when the grid is known."""
    from ..grid.labels import run_labels

    grid = (grid_raw or {}).get("grid")
    order = [k for k in grid if k != "exclude"] if isinstance(grid, dict) else []
    labels = run_labels([r for c in cells for r in c.runs], order)
    for c in cells:
        c.label = labels.get(c.key, c.label)


def _flatten_get(config: dict, key: str) -> Any:
    return _settings(config).get(key)


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

