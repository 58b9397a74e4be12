"""What ``abl report`` and the Costs page show for a grid of one model size (issue 16's findings).

The store imitates the norms grid (13 cells x 2 seeds of one model, a few
thousand parameters apart, every cell the same FLOPs) with synthetic run
folders: a scaling fit, a FLOPs axis and a 52-row predicted-vs-measured table
mean nothing there; a run still going must not make the conditions differ; 13
cells must be told apart in the figures; contended runs are marked.
"""

import json
import time
from types import SimpleNamespace

import pytest
from test_report import parse_table

NORMS = """
[experiment]
name = "normslike"
seeds = [0, 1]
[model]
d_model = 64
n_layers = 4
n_heads = 4
context = 16
vocab_size = 4096
[train]
steps = 20
batch_size = 4
eval_every = 10
[grid]
"model.norm" = ["layernorm", "rmsnorm", "scalenorm", "none"]
"model.block" = ["pre", "post", "sandwich", "post_branch"]
exclude = [
    { "model.norm" = "none", "model.block" = "post" },
    { "model.norm" = "none", "model.block" = "sandwich" },
    { "model.norm" = "none", "model.block" = "post_branch" },
]
"""

OUTLIER_CELL = 5  # its measured peak tensor memory is twice the prediction
CONTENDED_CELLS = (2, 7, 11)  # seed 1 of these ran on a contended machine


def _write_run(d, cell, *, status, info, final, loss, tokens_per_s, wall, started):
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(cell.config))
    (d / "meta.json").write_text(json.dumps({
        "cell_key": cell.cell_key, "label": cell.label, "git_commit": "abc123",
        "versions": {"torch": "2.x", "python": "3.x"}, "grid_file": "normslike.toml",
        "grid": cell.grid_record("normslike.toml")}))
    if info:
        (d / "info.json").write_text(json.dumps({
            "device": "cpu (test)", "data_fingerprint": "f" * 64, "vocab_size": 4096, "precision": "fp32",
            "emulated": False, "kernels": "torch", "peak_mem_kind": "cpu_peak_rss"}))
    (d / "status.json").write_text(json.dumps({"status": status, "started": started}
                                              | ({"finished": started + 1} if status == "completed" else {})))
    lines = [{"step": 0, "n_params": final["n_params"], "n_params_non_embedding": final["n_params_non_embedding"]}]
    last = 20 if status == "completed" else 7
    for step in range(1, last + 1):
        row = {"step": step, "train_loss": loss + 1.0 / step, "tokens_per_s": tokens_per_s,
               "elapsed_s": wall * step / 20}
        if step % 10 == 0:
            row["val_loss"] = loss + (0.5 if step == 10 else 0.0)
        lines.append(row)
    if status == "completed":
        lines.append({"step": 20, **{k: v for k, v in final.items() if not k.startswith("n_params")},
                      "wall_s": wall})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


@pytest.fixture(scope="module")
def norms_store(tmp_path_factory):
    """(grid path, db path, grid): 13 cells x 2 seeds completed, plus a third seed of the first cell still
    running (no info.json yet, as a worker that has just started leaves it)."""
    from abl.contracts.plugin_manager import get_registry
    from abl.contracts.config import cell_from_config, run_id_of
    from abl.grid.gridfile import load_grid
    from abl.model.costmodel import predict
    from abl.store import database as store

    tmp = tmp_path_factory.mktemp("norms")
    grid = tmp / "normslike.toml"
    grid.write_text(NORMS)
    reg = get_registry()
    g = load_grid(grid, reg)
    runs = tmp / "results" / "runs"
    now = time.time()
    keys = list(dict.fromkeys(c.cell_key for c in g.cells))
    for i, cell in enumerate(g.cells):
        k = keys.index(cell.cell_key)
        p = predict(cell_from_config(cell.config, reg), reg, vocab_size=4096)
        hot = k in CONTENDED_CELLS and cell.seed == 1
        final = {"n_params": p["n_params"], "n_params_non_embedding": p["n_params_non_embedding"],
                 "flops_per_step_measured": p["flops_per_step"],
                 "peak_tensor_bytes": p["train_peak_bytes"] * (2.0 if k == OUTLIER_CELL else 1.02),
                 "peak_mem_bytes": 5e8, "mfu": 0.01 if hot else 0.2, "contended": 1.0 if hot else 0.0}
        _write_run(runs / cell.run_id, cell, status="completed", info=True, final=final,
                   loss=3.0 + 0.01 * k + 0.003 * cell.seed, tokens_per_s=2400.0 if hot else 40_000.0 + 10 * k,
                   wall=30.0 if hot else 2.0 + 0.01 * k, started=now + i)
    first = g.cells[0]
    running = SimpleNamespace(config={**first.config, "seed": 2}, cell_key=first.cell_key, label=first.label,
                              run_id=run_id_of({**first.config, "seed": 2}), grid_record=first.grid_record)
    _write_run(runs / running.run_id, running, status="running", info=False,
               final={"n_params": 1, "n_params_non_embedding": 1}, loss=3.0, tokens_per_s=1000.0, wall=1.0,
               started=now + 100)
    db = tmp / "results" / "abl.duckdb"
    store.ingest_dirs(db, sorted(runs.iterdir()))
    return grid, db, g


def _report(norms_store, tmp_path, fmt="md"):
    from abl.contracts.plugin_manager import get_registry
    from abl.present.report.runs import load_runs
    from abl.present.report.sections import build_report, write_report

    grid, db, g = norms_store
    runs = load_runs(db, experiment="normslike")
    rep = build_report(runs, source="normslike", db_path=str(db), registry=get_registry())
    path = write_report(rep, tmp_path / "rep", fmt)
    return rep, path.read_text()


def test_the_store_is_one_model_of_slightly_different_sizes_at_equal_flops(norms_store):
    from abl.contracts.plugin_manager import get_registry
    from abl.present.report.costs import attach_predictions
    from abl.present.report.runs import group_cells, load_runs

    grid, db, g = norms_store
    runs = load_runs(db, experiment="normslike")
    assert len(runs) == 27 and sum(r.status == "running" for r in runs) == 1
    sizes = {r.final["n_params_non_embedding"] for r in runs if r.status == "completed"}
    assert len(sizes) >= 4 and max(sizes) / min(sizes) < 1.05  # several "sizes", one model
    cells = group_cells(runs)
    attach_predictions(cells, get_registry())
    assert len(cells) == 13 and len({c.predicted["flops_per_step"] for c in cells}) == 1


def test_one_model_size_has_no_scaling_fit_and_says_why(norms_store, tmp_path):
    rep, md = _report(norms_store, tmp_path)
    assert "## Scaling fit" not in md and not (tmp_path / "rep" / "scaling.png").exists()
    assert rep.fit is None
    assert "No scaling fit: a scaling fit needs at least 4 model sizes" in md
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert data["scaling_fit"] is None and "model sizes" in data["scaling_note"]


def test_equal_flops_give_no_flops_axis(norms_store, tmp_path):
    from abl.contracts.plugin_manager import get_registry
    from abl.present.report import plots

    rep, md = _report(norms_store, tmp_path)
    fig = plots.loss_curves_figure(rep.cells, "")
    labels = [ax.get_xlabel() + " " + ax.get_title() for ax in fig.axes]
    assert not any("FLOPs" in t for t in labels), labels
    assert any("wall time" in t for t in labels)  # the wall times differ: that axis stays
    fig = plots.quality_vs_cost_figure(rep.cells, rep.stat_rows, "")
    xlabels = [ax.get_xlabel() for ax in fig.axes]
    assert xlabels == ["wall time (s, measured)"], xlabels  # FLOPs and parameters are the same for every cell
    assert "No loss curve at equal FLOPs: every cell costs the same FLOPs per token" in md
    assert "Not plotted against final val_loss: training FLOPs and parameters, the same for every cell" in md
    # the predicted-vs-measured plot keeps only the figure that differs between cells (memory)
    fig = plots.predicted_vs_measured_figure(rep.cost_rows, "")
    assert [ax.get_title() for ax in fig.axes] == ["training memory (peak tensor bytes)"]
    # in MiB, each tick the number itself: not raw bytes under a 1e7 offset
    ax = fig.axes[0]
    assert ax.get_xlabel() == "predicted [MiB]" and ax.get_ylabel() == "measured [MiB]"
    fig.canvas.draw()
    assert not ax.xaxis.get_offset_text().get_text() and not ax.yaxis.get_offset_text().get_text()
    top = max(float(t.get_text().replace(",", "").replace("−", "-")) for t in ax.get_yticklabels()
              if t.get_text())
    assert 1 < top < 1e5  # MiB of a small model, not bytes
    del get_registry


def test_predicted_vs_measured_is_a_summary_with_the_outliers(norms_store, tmp_path):
    rep, md = _report(norms_store, tmp_path)
    assert len(rep.cost_rows) == 52  # 13 cells x 4 checks: the table the issue found too long
    summary = parse_table(md, "| figure | cells | agree |")
    assert [r["figure"] for r in summary] == ["n_params", "n_params_non_embedding", "flops_per_step",
                                              "train_peak_bytes"]
    mem = summary[3]
    assert (mem["cells"], mem["agree"], mem["disagree"]) == ("13", "12", "1")
    assert mem["worst measured / predicted"].startswith("2.0000 (")
    outliers = parse_table(md, "compared checks disagree")
    assert len(outliers) == 1 and outliers[0]["figure"] == "train_peak_bytes"
    outlier_label = rep.cells[OUTLIER_CELL].label
    assert outliers[0]["cell"] == outlier_label and outlier_label in mem["worst measured / predicted"]
    assert "| cell | figure |" in md  # the outliers' table ...
    assert md.count("agrees (exact)") == 0  # ... and no row of the full one in Markdown
    _, html = _report(norms_store, tmp_path, "html")
    folded = html[html.index("<details>"):html.index("</details>")]
    assert folded.count("<tr>") == 53  # the full table, folded away in HTML


def test_a_running_run_gives_no_different_conditions_warning(norms_store, tmp_path):
    from abl.present.report.conditions import conditions_line
    from abl.present.report.runs import load_runs

    rep, md = _report(norms_store, tmp_path)
    assert "different conditions" not in md
    assert "1 run(s) that did not complete (1 running)" in md
    runs = load_runs(norms_store[1], experiment="normslike")
    assert conditions_line(runs).startswith("cpu (test); torch 2.x")


def test_a_failed_run_with_another_device_is_ignored_but_two_completed_devices_warn(norms_store, tmp_path):
    from abl.contracts.plugin_manager import get_registry
    from abl.present.report.runs import load_runs
    from abl.present.report.sections import build_report

    runs = load_runs(norms_store[1], experiment="normslike")
    runs[0].status, runs[0].device = "failed", "other"
    md = build_report(runs, source="x", db_path=str(norms_store[1]), registry=get_registry()).doc.markdown()
    assert "different conditions" not in md
    runs[0].status = "completed"
    md = build_report(runs, source="x", db_path=str(norms_store[1]), registry=get_registry()).doc.markdown()
    assert "WARNING: the completed runs ran under different conditions" in md


def _distinct_styles(ax) -> tuple[int, int]:
    """(cells drawn, distinct (colour, line style, marker) among them) of the lines that carry a label."""
    lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    styles = {(tuple(round(c, 3) for c in ln.get_color()) if not isinstance(ln.get_color(), str)
               else ln.get_color(), ln.get_linestyle(), ln.get_marker()) for ln in lines}
    return len(lines), len(styles)


def _assert_readable(fig):
    """Legend outside every panel; no two tick labels of an axis overlapping."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert legends, "no legend"
    for leg in legends:
        lb = leg.get_window_extent(renderer)
        for ax in fig.axes:
            assert not lb.overlaps(ax.get_window_extent(renderer)), "legend over a panel"
    from abl.present.figures import MIN_GAP_PX

    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            # apart by a few pixels, not merely not overlapping: touching labels read as one
            # ("8000 9000 1000011000")
            boxes = [t.get_window_extent(renderer).padded(MIN_GAP_PX / 2 - 0.5)
                     for t in axis.get_ticklabels(which="both") if t.get_visible() and t.get_text()]
            for i, a in enumerate(boxes):
                for b in boxes[i + 1:]:
                    assert not a.overlaps(b), f"tick labels running together on {ax.get_title()!r}"
            assert not axis.get_offset_text().get_text(), f"an offset multiplier on {ax.get_title()!r}"


def test_thirteen_cells_are_told_apart_named_by_their_settings_with_the_legend_outside(norms_store, tmp_path):
    from abl.present.report import plots

    rep, md = _report(norms_store, tmp_path)
    labels = [c.label for c in rep.cells]
    assert len(set(labels)) == 13 and "norm=scalenorm, block=sandwich" in labels
    fig = plots.loss_curves_figure(rep.cells, "footer")
    for ax in fig.axes:
        drawn, distinct = _distinct_styles(ax)
        if ax.get_title().startswith(("train loss", "val loss at equal tokens")):
            assert drawn == distinct == 13, ax.get_title()
    # a factorial grid's legend is by axis (issue 40 item 2): each norm and each block layout once, not 13 cells
    legend_texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"model.norm", "layernorm", "scalenorm", "none", "model.block", "pre", "post_branch"} <= set(legend_texts)
    assert not set(labels) & set(legend_texts)
    _assert_readable(fig)
    _assert_readable(plots.quality_vs_cost_figure(rep.cells, rep.stat_rows, "footer"))
    _assert_readable(plots.predicted_vs_measured_figure(rep.cost_rows, "footer"))


@pytest.mark.parametrize("n", [3, 10, 13, 20, 27, 45])
def test_cell_styles_are_distinct(n):
    from abl.present.figures import cell_styles

    styles = cell_styles(n)
    assert len({(s["color"], s["ls"], s["marker"]) for s in styles}) == n


def test_two_seeds_draw_seed_points_not_ci_bars(norms_store, tmp_path):
    from abl.present.report import plots

    rep, md = _report(norms_store, tmp_path)
    fig = plots.quality_vs_cost_figure(rep.cells, rep.stat_rows, "")
    ax = fig.axes[0]
    assert not any(len(c.lines[1]) for c in ax.containers)  # no error bar caps: no CI bar at n = 2
    faint = [ln for ln in ax.get_lines() if ln.get_alpha() is not None and ln.get_alpha() < 1]
    assert len(faint) == 26  # every seed, faint
    assert "fewer than 3 seeds per cell, so no CI bars" in md


def test_contended_runs_are_marked_where_speed_is_shown(norms_store, tmp_path):
    from abl.present.report import plots
    from abl.present.report.costs import CONTENDED_MARK

    rep, md = _report(norms_store, tmp_path)
    assert "WARNING: 3 of 26 completed runs ran on a contended machine" in md
    assert "not comparable" in md
    cost = {r["cell"]: r for r in parse_table(md, "| cell | params |")}
    for k, c in enumerate(rep.cells):
        marked = cost[c.label]["tokens/s (measured)"].endswith(CONTENDED_MARK)
        assert marked == (k in CONTENDED_CELLS), c.label
    fig = plots.loss_curves_figure(rep.cells, "")
    wall = next(ax for ax in fig.axes if "wall time" in ax.get_title())
    assert sum(ln.get_marker() == "x" for ln in wall.get_lines()) == len(CONTENDED_CELLS)
    assert any("contended" in t.get_text() for t in fig.legends[0].get_texts())


def test_an_older_store_without_the_contended_metric_marks_nothing(norms_store, tmp_path):
    from abl.contracts.plugin_manager import get_registry
    from abl.present.report.runs import load_runs
    from abl.present.report.sections import build_report

    runs = load_runs(norms_store[1], experiment="normslike")
    for r in runs:
        r.final.pop("contended", None)
    md = build_report(runs, source="x", db_path=str(norms_store[1]), registry=get_registry()).doc.markdown()
    assert "contended" not in md


def test_the_costs_page_follows_the_same_rules(norms_store, monkeypatch):
    """The dashboard's Costs page on the same store: the summary and the one outlier, not 52 rows in view;
    no scaling fit, with why; the contended runs counted."""
    testing = pytest.importorskip("streamlit.testing.v1", reason="streamlit is in the dashboard extra")
    from conftest import ROOT

    grid, db, g = norms_store
    monkeypatch.setenv("ABL_DB", str(db))
    monkeypatch.setenv("ABL_RUNS_DIR", str(db.parent / "runs"))
    at = testing.AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    at.switch_page("views/costs.py")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    text = "\n".join(str(x.value) for kind in (at.warning, at.info, at.success, at.caption, at.markdown)
                     for x in kind)
    assert "1 of 52 compared checks disagree: norm=rmsnorm, block=post: train_peak_bytes" in text
    assert "3 of 26 completed runs ran on a contended machine" in text
    assert "No scaling fit of L(N, D)" in text and "model sizes" in text
    # plain tables that wrap to fit the page (abl.dashboard.common.text_table): a header row and their rows
    summary, outliers = [m.value for m in at.markdown if "abl-text-table" in m.value][:2]
    assert summary.count("<tr") == 1 + 4 and outliers.count("<tr") == 1 + 1
    assert "<td>train_peak_bytes</td>" in outliers
    assert len(at.dataframe[0].value) == 52  # the full table, folded in an expander
    assert "Scaling fit" in {s.value for s in at.subheader}


def test_task_accuracy_figure_tells_thirteen_cells_apart_with_legends_beside_the_panels():
    from abl.present.figures import pyplot as _pyplot
    from abl.present.taskreport import accuracy_figure

    rows, curves, runs_by_cell = [], {}, {}
    for k in range(13):
        cfg = {"model": {"d_model": 32 * 2 ** (k % 3), "mixer": ["mha", "ssm", "hybrid"][k % 3]},
               "data": {"dataset": "task"}, "train": {"lr": 1e-3 * (1 + k // 3)}}
        rows.append({"cell_key": f"c{k}", "label": f"mixer={cfg['model']['mixer']}, d_model="
                     f"{cfg['model']['d_model']}, lr={cfg['train']['lr']:g}", "config": cfg,
                     "mean": 0.1 + 0.06 * k, "ci_low": None, "ci_high": None})
        runs_by_cell[f"c{k}"] = [f"r{k}"]
        curves[f"r{k}"] = {"task_accuracy": [(s, min(1.0, 0.05 * k * s / 100)) for s in range(0, 1001, 100)]}
    fig = accuracy_figure({"task_accuracy": rows}, curves, runs_by_cell, "conditions " * 40, _pyplot())
    drawn, distinct = _distinct_styles(fig.axes[0])
    assert drawn == distinct == 13
    _assert_readable(fig)


def test_crowded_tick_labels_are_thinned_until_none_overlap():
    from matplotlib.ticker import FixedLocator, FuncFormatter

    from abl.present.figures import pyplot as _pyplot
    from abl.present.figures import thin_ticks, tick_labels

    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(5, 3), layout="constrained")
    a.plot([2.0e5, 2.6e5], [1, 2])
    a.set_xscale("log")  # a narrow log range labels its minor ticks
    b.plot([0, 1], [0, 1])
    b.xaxis.set_major_locator(FixedLocator([i / 20 for i in range(21)]))
    b.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x * 1e9:,.0f} FLOPs"))

    def overlaps(ax) -> bool:
        boxes = [t.get_window_extent() for t in tick_labels(ax.xaxis)]
        return any(p.overlaps(q) for i, p in enumerate(boxes) for q in boxes[i + 1:])

    fig.canvas.draw()
    assert overlaps(a) and overlaps(b)  # the problem, as drawn without thinning
    thin_ticks(fig)
    assert not overlaps(a) and not overlaps(b)
    assert len(tick_labels(b.xaxis)) >= 2  # thinned, not emptied
    plt.close(fig)


def test_loss_curves_band_only_with_three_seeds(norms_store, tmp_path):
    """Two seeds: the seed lines faint and no band; three seeds (the ladder store): a CI band per cell."""
    from matplotlib.collections import PolyCollection

    from abl.present.report import plots
    from abl.present.report.runs import group_cells
    from abl.store.reader import StoredRun

    rep, md = _report(norms_store, tmp_path)
    ax = next(a for a in plots.loss_curves_figure(rep.cells, "").axes if "equal tokens" in a.get_title())
    assert not [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert sum(1 for ln in ax.get_lines() if ln.get_alpha() == 0.3) == 26
    assert "(fewer than 3 seeds per cell: no CI band)" in md
    runs = [r for c in rep.cells[:3] for r in c.completed]
    for i, r in enumerate(list(runs)):  # a third seed for three cells
        extra = StoredRun(**{**r.__dict__, "run_id": r.run_id + "b", "seed": r.seed + 2,
                              "curves": {k: [(s, v + 0.01 * (i % 3)) for s, v in pts] for k, pts in r.curves.items()}})
        if r.seed == 0:
            runs.append(extra)
    cells = group_cells(runs)
    assert [len(c.completed) for c in cells] == [3, 3, 3]
    ax = next(a for a in plots.loss_curves_figure(cells, "").axes if "equal tokens" in a.get_title())
    assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == 3
    assert "95% CI band" in ax.get_title()


def test_report_json_carries_the_summary_and_the_contended_runs(norms_store, tmp_path):
    rep, md = _report(norms_store, tmp_path)
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert len(data["predicted_vs_measured"]) == 52  # every row at full precision
    mem = next(s for s in data["predicted_vs_measured_summary"] if s["figure"] == "train_peak_bytes")
    assert (mem["agree"], mem["disagree"]) == (12, 1) and mem["worst_ratio"] == pytest.approx(2.0)
    hot = {r.run_id for c in rep.cells for r in c.completed if r.final.get("contended") == 1.0}
    assert set(data["contended_runs"]) == hot and len(hot) == len(CONTENDED_CELLS)
