"""Issue 40 item 2, beyond two axes: colour for one axis, marker (or line style) for the second, a panel per
level of the third, the same mapping in every panel, on the dashboard and in the report, with legends by
axis (a legend entry per level, not per cell). Also: the dashboard's within-cell answers read only the
metrics their contrasts compare, and the report's within-cell answers are the summary's computation.

The store is written in place (no training): 3 norms x 2 block layouts x 2 position encodings, 3 seeds,
with val_loss at 1x and 4x the trained context and a task accuracy beside its no-recall baseline.
"""

import json
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from conftest import ROOT, chart_specs, dashboard_app

pytest.importorskip("streamlit", reason="the dashboard extra is not installed: pip install 'abl[dashboard]'")
import duckdb  # noqa: E402

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from abl.dashboard import queries as q  # noqa: E402
from abl.present import palette  # noqa: E402

NORMS = ["layernorm", "rmsnorm", "scalenorm"]
BLOCKS = ["pre", "post"]
POSITIONS = ["rope", "alibi"]
PATHS = ["model.norm", "model.block", "model.position"]
SEEDS = (0, 1, 2)
EXPERIMENT = "three"


def cells() -> list[tuple[str, str, str]]:
    return [(n, b, p) for n in NORMS for b in BLOCKS for p in POSITIONS]


def build(folder: Path) -> Path:
    """A 12-cell x 3-seed store of a 3-axis grid, shaped like abl's (runs and metrics rows)."""
    from abl.store import database as abl_store

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "runs").mkdir(exist_ok=True)
    db = folder / "abl.duckdb"
    abl_store.open_store(db).close()
    con = duckdb.connect(str(db))
    t0 = datetime(2026, 1, 1, 12, 0, 0)
    runs, rows = [], []
    for i, (norm, block, pos) in enumerate(cells()):
        key = f"{norm[:4]}{block[:4]}{pos[:4]}{i:02d}".ljust(16, "0")
        for seed in SEEDS:
            run_id = f"{key}s{seed}"
            config = {"experiment": {"name": EXPERIMENT, "seeds": list(SEEDS)}, "seed": seed,
                      "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "context": 64, "position": pos,
                                "mixer": "mha", "ffn": "gelu", "norm": norm, "block": block},
                      "train": {"steps": 100, "batch_size": 8, "lr": 3e-3, "warmup_steps": 10, "eval_every": 50,
                                "eval_batches": 4},
                      "data": {"dataset": "pystdlib"}}
            started = t0 + timedelta(minutes=3 * (3 * i + seed))
            runs.append((run_id, EXPERIMENT, key, f"norm={norm}, block={block}, position={pos}", seed,
                         "completed", json.dumps(config), started, started + timedelta(seconds=60), "abc1234", "cpu",
                         "three.toml", json.dumps(PATHS), i,
                         json.dumps({"model.norm": norm, "model.block": block, "model.position": pos})))
            floor = 2.0 + 0.05 * i + 0.003 * seed
            for step in range(1, 101, 5):
                rows.append((run_id, step, "train_loss", floor + 2.0 / (1 + step / 10)))
                rows.append((run_id, step, "tokens_per_s", 9000.0 + 200 * i + 7 * seed))
                rows.append((run_id, step, "elapsed_s", step * 0.5))
            for step in (50, 100):
                rows.append((run_id, step, "val_loss", floor + 0.1 + 2.0 / (1 + step / 10)))
                rows.append((run_id, step, "elapsed_s", step * 0.5 + seed))
            degrade = 0.4 if pos == "alibi" else 0.0
            for name, value in (("train_loss", floor + 0.2), ("wall_s", 50.0 + 3 * i + seed),
                                ("n_params", 100_000.0 + 64 * i), ("val_loss_x1", floor + 0.2),
                                ("val_loss_x4", floor + 0.2 + degrade + 0.01 * seed),
                                ("copy_accuracy", 0.6 + 0.01 * i + 0.02 * seed),
                                ("copy_no_recall_baseline", 0.1), ("peak_mem_bytes", 5e8 + 1e6 * i)):
                rows.append((run_id, 100, name, value))
    con.executemany("INSERT INTO runs (run_id, experiment, cell_key, label, seed, status, config, started, "
                    "finished, git_commit, device, grid_file, grid_paths, grid_index, grid_varied) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", runs)
    con.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?)", rows)
    con.close()
    return db


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("three"))


def test_a_third_axis_gets_a_panel_per_level_with_the_same_colours_and_markers():
    from types import SimpleNamespace

    runs = [SimpleNamespace(experiment="e", cell_key="-".join(c), grid_file="g.toml", grid_index=i,
                            grid_paths=PATHS, grid_varied=dict(zip(PATHS, c)), config={})
            for i, c in enumerate(cells())]
    ch = palette.grid_styles(runs)
    assert ch.colour_axis == "model.norm" and ch.form_axes == ("model.block",)
    assert ch.facet_axes == ("model.position",) and ch.faceted
    assert ch.facet_levels == ("model.position=rope", "model.position=alibi")
    assert ch.colour_levels == tuple(NORMS) and ch.form_levels == tuple(BLOCKS)
    assert "one panel per model.position" in ch.describe()
    # the same (colour, marker) for a norm and block in every panel; within a panel, every cell its own look
    for n in NORMS:
        for b in BLOCKS:
            assert ch.styles[f"{n}-{b}-rope"].colour == ch.styles[f"{n}-{b}-alibi"].colour
            assert ch.styles[f"{n}-{b}-rope"].marker == ch.styles[f"{n}-{b}-alibi"].marker
    for p in POSITIONS:
        looks = [ch.styles[k] for k in ch.styles if ch.facet_of[k] == f"model.position={p}"]
        assert len(looks) == 6 and len({(s.colour, s.marker) for s in looks}) == 6


# ---------------------------------------------------------------- the dashboard


def _encodings(spec: dict) -> list[dict]:
    inner = spec.get("spec", spec)
    return [layer.get("encoding", {}) for layer in inner.get("layer", [inner])]


def _check_panels_and_legends(spec: dict, form_channel: str) -> None:
    """One panel per level of the third axis; colour by the first axis (a legend entry per norm) and the
    marker or line style by the second (an entry per block layout), not an entry per cell."""
    assert spec["facet"]["field"] == "facet_level"
    assert spec["facet"]["sort"] == [f"model.position={p}" for p in POSITIONS]
    data = max((d for d in spec["_data"].values() if "facet_level" in d), key=len)
    if "part" in data:  # Trade-offs: the points, beside the front drawn in every panel
        data = data[data["part"] == "point"]
    assert set(data["facet_level"]) == {f"model.position={p}" for p in POSITIONS}
    colour = next(e["color"] for e in _encodings(spec) if e.get("color", {}).get("field") == "colour_level")
    form = next(e[form_channel] for e in _encodings(spec) if e.get(form_channel, {}).get("field") == "form_level")
    assert colour["scale"]["domain"] == NORMS and colour["title"] == "model.norm"
    assert form["scale"]["domain"] == BLOCKS and form["title"] == "model.block"
    assert len(set(colour["scale"]["range"])) == 3 and set(colour["scale"]["range"]) <= set(palette.COLOURS)
    # each panel: the same six (norm, block) pairs, each once
    for p in POSITIONS:
        part = data[data["facet_level"] == f"model.position={p}"].drop_duplicates("cell")
        assert len(part) == 6 and len(set(zip(part["colour_level"], part["form_level"]))) == 6


def test_curves_draw_a_panel_per_level_of_the_third_axis(three, monkeypatch):
    at = dashboard_app(three, monkeypatch, "curves")
    shown = chart_specs(at)
    assert shown
    for spec in shown:
        _check_panels_and_legends(spec, "strokeDash")
    assert any("one panel per model.position" in c.value for c in at.caption)


def test_tradeoffs_draw_a_panel_per_level_with_the_whole_front_in_each(three, monkeypatch):
    at = dashboard_app(three, monkeypatch, "tradeoffs")
    speed = chart_specs(at)[0]
    _check_panels_and_legends(speed, "shape")
    data = max(speed["_data"].values(), key=len)
    front = data[data["part"] == "front"]
    assert len(front) and set(front["facet_level"]) == {f"model.position={p}" for p in POSITIONS}
    # the same front points in every panel
    a, b = (set(front.loc[front["facet_level"] == f"model.position={p}", "cell"]) for p in POSITIONS)
    assert a == b


def test_compare_facets_its_per_cell_chart_by_the_third_axis(three, monkeypatch):
    at = dashboard_app(three, monkeypatch, "compare")
    assert next(s for s in at.selectbox if s.label == "Facet by").value == "model.position"
    panels = [s for s in chart_specs(at) if "vconcat" in s]
    assert panels, "no per-cell chart with a panel per level"
    titles = [p.get("title") for p in panels[-1]["vconcat"]]
    assert titles == [f"model.position = {p}" for p in POSITIONS]


def test_within_cell_reads_only_the_metrics_its_contrasts_compare(three, monkeypatch):
    from abl.store import reader

    asked = []
    real = reader.read_runs

    def spy(*args, **kw):
        asked.append(kw.get("metrics"))
        return real(*args, **kw)

    monkeypatch.setattr(reader, "read_runs", spy)
    store = q.Store(str(three), str(three.parent / "runs"))
    answers = q.within_cell(store, q.Selection())
    read = [m for m in asked if m is not None and "val_loss_x1" in m]
    assert read == [["copy_accuracy", "copy_no_recall_baseline", "val_loss_x1", "val_loss_x4"]]
    assert None not in asked  # never every metric
    # and the answers are the ones every metric gives
    from abl.analysis import contrasts

    full = contrasts.within_cell(real(str(three)), q.grid_cell_order(store, q.Selection()))
    assert [(w.cell, w.contrast.name, w.answer(), w.row.delta) for w in answers] == \
        [(w.cell, w.contrast.name, w.answer(), w.row.delta) for w in full]
    assert {w.answer() for w in answers if "alibi" in w.label and "x4" in w.contrast.name} == {"degrades at 4x"}


# ---------------------------------------------------------------- the report


@pytest.fixture(scope="module")
def report(three):
    from abl.present.report.runs import load_runs
    from abl.present.report.sections import build_report

    runs = load_runs(three, experiment=EXPERIMENT)
    return runs, build_report(runs, source=EXPERIMENT, db_path=str(three), registry=None)


def _legend_texts(fig) -> list[str]:
    assert len(fig.legends) == 1
    return [t.get_text() for t in fig.legends[0].get_texts()]


@pytest.mark.parametrize("figure", ["loss_curves", "quality_vs_cost"])
def test_the_report_draws_a_row_of_panels_per_level_and_legends_by_axis(report, figure):
    from abl.present.report import plots

    _, rep = report
    fig = (plots.loss_curves_figure(rep.cells, "footer") if figure == "loss_curves"
           else plots.quality_vs_cost_figure(rep.cells, rep.stat_rows, "footer"))
    titles = [ax.get_title() for ax in fig.axes]
    for p in POSITIONS:
        assert any(t.endswith(f"model.position={p}") for t in titles), titles
    per_row = len(fig.axes) // 2
    assert len(fig.axes) == 2 * per_row  # the same panels in each row
    for ax in fig.axes:  # each panel: its level's six cells, each its own (colour, marker)
        level = "rope" if ax.get_title().endswith("rope") else "alibi"
        labels = {lbl for lbl in ax.get_legend_handles_labels()[1] if not lbl.startswith("_")}
        assert labels and all(lbl.endswith(f"position={level}") for lbl in labels), (ax.get_title(), labels)
    texts = _legend_texts(fig)
    # a legend entry per level of each axis, each once, headed by its axis; no entry per cell
    for level in [*NORMS, *BLOCKS, "model.norm", "model.block"]:
        assert texts.count(level) == 1, (level, texts)
    assert not [t for t in texts if "norm=" in t]
    assert len([t for t in texts if t.strip()]) == 2 + len(NORMS) + len(BLOCKS)


def test_the_report_legend_of_a_two_axis_grid_is_by_axis(three, tmp_path):
    from abl.present.report import plots
    from abl.present.report.runs import group_cells, load_runs

    runs = [r for r in load_runs(three, experiment=EXPERIMENT) if r.grid_varied["model.position"] == "rope"]
    cells = group_cells(runs)
    texts = _legend_texts(plots.loss_curves_figure(cells, ""))
    assert [t for t in texts if t.strip()] == ["model.norm", *NORMS, "model.block", *BLOCKS]
    assert not any(ax.get_title().endswith("rope") for ax in plots.loss_curves_figure(cells, "").axes)


def test_the_reports_within_cell_answers_are_the_summarys(report):
    """The report wrote only the length contrasts, from a separate call without the cell order: its
    'Holm over N' counted a family the lines did not show. Now: the summary's computation, every line."""
    from abl.analysis import contrasts

    runs, rep = report
    md = rep.doc.markdown()
    summary = contrasts.lines(contrasts.within_cell(runs, [c.key for c in rep.cells]))
    assert summary and summary[0] in md  # the same family, the same count
    assert "copy accuracy vs its no-recall baseline" in md and "length x4 vs x1" in md
    for line in summary[1:]:  # the same figures and words, under the report's label for the cell
        assert line.split("  ", 2)[-1] in md


def test_a_panel_only_for_the_levels_drawn():
    """tests/dashboard/tiny_grid.toml's third axis (train.diverge_loss) has one cell at 1.0, which diverged:
    Trade-offs draws no point of it, so no panel of its own (a panel with nothing but the front in it), and
    with one level left, one plot."""
    import pandas as pd

    from types import SimpleNamespace

    from abl.dashboard import charts

    runs = [SimpleNamespace(experiment="e", cell_key="-".join(c), grid_file="g.toml", grid_index=i,
                            grid_paths=PATHS, grid_varied=dict(zip(PATHS, c)), config={})
            for i, c in enumerate(cells())]
    ch = palette.grid_styles(runs)
    key_of = {"-".join(c): "-".join(c) for c in cells()}
    rope = [k for k in key_of if k.endswith("-rope")]
    df = pd.DataFrame({"cell": rope, "x": [1000.0 + 10 * i for i in range(len(rope))], "y": 3.0, "y_lo": 2.9,
                       "y_hi": 3.1, "n": 3, "front": [True] + [False] * (len(rope) - 1)})
    one = charts.pareto_chart(df, "x", "tokens/s", "loss", None, False, "higher", channels=ch, key_of=key_of)
    assert "facet" not in one.to_dict() and "layer" in one.to_dict()
    both = pd.concat([df, df.assign(cell=[k.replace("-rope", "-alibi") for k in rope])], ignore_index=True)
    two = charts.pareto_chart(both, "x", "tokens/s", "loss", None, False, "higher", channels=ch,
                              key_of=key_of).to_dict()
    assert two["facet"]["sort"] == ["model.position=rope", "model.position=alibi"]
