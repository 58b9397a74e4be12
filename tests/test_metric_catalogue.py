"""The metric catalogue (abl.analysis.metrics): every metric's label, unit, kind, final aggregate, better
direction and tokenizer comparability declared once, and read by the run summary, ``abl compare``, the
report, the dashboard and the store's final-values query.

The first tests reproduce what went wrong while these were spread over four modules: peak memory was the
peak in the dashboard and the last value in the summary and report; ``is_speed`` had two definitions; the
report's quality-vs-cost figure for cells with different tokenizers drew val_bpb means and val_loss seeds
on one axis labelled "final val_loss"; the store kept a summary query nothing called. The last tests scan
harness/ and dashboard/ for a metric's label or aggregate spelled outside the catalogue.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import duckdb
import pytest

from abl.analysis import metrics as catalogue
from abl.store import database as store

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("harness", "dashboard")
CATALOGUE_MODULE = Path("harness/analysis/metrics.py")
UNITS_MODULE = Path("harness/analysis/units.py")  # the catalogue's units, spelled once


def _store(path: Path, rows: list[tuple[str, int, str, float]]) -> Path:
    store.open_store(path).close()
    con = duckdb.connect(str(path))
    for run_id, cell, seed in (("a0", "A", 0), ("a1", "A", 1), ("b0", "B", 0)):
        con.execute("INSERT INTO runs (run_id, experiment, cell_key, label, seed, status, config) "
                    "VALUES (?, 'e', ?, ?, ?, 'completed', ?)",
                    [run_id, cell, cell, seed, '{"model": {"context": 8}, "train": {"batch_size": 2}}'])
    con.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?)", rows)
    con.close()
    return path


# a resumed run logs its peak memory once per segment: the second segment peaked lower than the first
MEMORY = [("a0", 10, "peak_mem_bytes", 500.0), ("a0", 20, "peak_mem_bytes", 300.0),
          ("a1", 20, "peak_mem_bytes", 400.0), ("b0", 20, "peak_mem_bytes", 100.0)]
SPEED = [("a0", s, "tokens_per_s", v) for s, v in ((1, 100.0), (2, 200.0), (3, 300.0), (4, 1000.0))]
LOSS = [(r, 20, "val_loss", v) for r, v in (("a0", 3.0), ("a1", 3.2), ("b0", 2.0))]


@pytest.fixture
def db(tmp_path):
    return _store(tmp_path / "abl.duckdb", MEMORY + SPEED + LOSS)


def test_peak_memory_is_the_peak_in_the_summary_the_report_the_dashboard_and_the_store(db, tmp_path):
    from abl.present import summary
    from abl.present.report.runs import load_runs

    assert catalogue.final_aggregate("peak_mem_bytes") == catalogue.MAX
    report_final = {r.run_id: r.final["peak_mem_bytes"] for r in load_runs(db, experiment="e", curve_names=())}
    assert report_final == {"a0": 500.0, "a1": 400.0, "b0": 100.0}
    view = summary.build(summary.load(db, run_ids=["a0", "a1", "b0"]), metrics=["val_loss"], title="e")
    assert view.figures["A"]["peak_mem_bytes"].values == [500.0, 400.0]
    con = duckdb.connect(str(db), read_only=True)
    try:
        sql = {(r, n): v for r, n, v in con.execute(store.final_values_sql()).fetchall()}
    finally:
        con.close()
    assert sql[("a0", "peak_mem_bytes")] == 500.0 and sql[("a0", "val_loss")] == 3.0
    assert sql[("a0", "tokens_per_s")] == 250.0  # throughput: the median step
    pytest.importorskip("pandas", reason="the dashboard extra is not installed")
    from abl.dashboard import queries as q

    s = q.Store(str(db), str(tmp_path / "runs"))
    fin = q.finals(s, q.Selection(), ["peak_mem_bytes", "tokens_per_s"]).set_index("run_id")
    assert fin["peak_mem_bytes"].to_dict() == report_final
    assert fin.loc["a0", "tokens_per_s"] == 250.0 == load_runs(db, experiment="e")[0].final["tokens_per_s"]


def _defs(name: str) -> list[str]:
    out = []
    for folder in SCANNED:
        for p in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(p.read_text(encoding="utf-8"))
            out += [str(p.relative_to(ROOT)) for n in ast.walk(tree)
                    if isinstance(n, ast.FunctionDef) and n.name == name]
    return out


def test_is_speed_is_defined_once_and_every_caller_agrees():
    pytest.importorskip("pandas", reason="the dashboard extra is not installed")
    from abl.dashboard import queries as q
    from abl.present import summary

    assert set(_defs("is_speed")) == {str(CATALOGUE_MODULE)}
    for name in ("hfu", "mfu", "tokens_per_s", "train_tokens_per_s", "decode_tokens_per_s", "val_loss",
                 "peak_mem_bytes", "mfu_x2"):
        assert summary.is_speed(name) == q.is_speed(name) == catalogue.is_speed(name), name
    assert catalogue.is_speed("hfu") and not catalogue.is_speed("val_loss")


def _tokenizer_cells():
    from abl.present.report.runs import Cell
    from abl.store.reader import StoredRun as Run

    cells = []
    for k, (tokenizer, bpb, loss, wall) in enumerate((("byte", 1.20, 0.83, 10.0), ("bpe", 1.10, 3.05, 20.0))):
        runs = []
        for seed in (0, 1):
            config = {"model": {"context": 8}, "train": {"batch_size": 2, "steps": 10},
                      "components": {"tokenizer": {"name": tokenizer}}}
            runs.append(Run(f"r{k}{seed}", "e", f"c{k}", tokenizer, seed, "completed", config, "c", {}, "cpu", {},
                            f"d{k}", "", "", final={"val_bpb": bpb + 0.01 * seed, "val_loss": loss + 0.01 * seed,
                                                   "wall_s": wall}))
        cells.append(Cell(f"c{k}", tokenizer, runs))
    return cells


def test_the_tokenizer_figure_plots_one_metric_on_an_axis_named_by_it():
    from abl.present.report.plots import quality_vs_cost_figure
    from abl.present.report.runs import cell_statistics, comparison_metric

    cells = _tokenizer_cells()
    metric = comparison_metric(cells)
    assert metric == "val_bpb"  # nats per token do not compare across tokenizers; bits per byte do
    fig = quality_vs_cost_figure(cells, cell_statistics(cells, cells[0], metric=metric), "")
    for ax in fig.axes:
        assert "bits/byte" in ax.get_ylabel() and "val_loss" not in ax.get_ylabel(), ax.get_ylabel()
        ys = [y for ln in ax.get_lines() for y in ln.get_ydata()]
        assert ys and all(1.0 < y < 1.3 for y in ys), ys  # every point a val_bpb; no val_loss among them


def test_the_store_has_one_final_values_path():
    assert not hasattr(store, "SUMMARY_SQL") and not hasattr(store, "cell_summary")


# ---------------------------------------------------------------- the catalogue itself


def test_families_and_their_members():
    m = catalogue.metric
    assert m("val_loss_x2").label == "val loss (2x context)" and m("val_loss_x2").kind == catalogue.LOSS
    assert not m("val_loss_x4").across_tokenizers and m("val_bpb_x2").across_tokenizers
    probe = m("probe_mqar_accuracy")
    assert (probe.kind, probe.better, probe.final) == (catalogue.ACCURACY, catalogue.HIGHER, catalogue.LAST)
    assert m("mqar_accuracy_pairs_8").label == "mqar accuracy pairs 8"
    assert m("probe_mqar_loss").is_loss and m("probe_mqar_loss").lower_is_better
    assert m("foo_tokens_per_s").is_speed and m("foo_tokens_per_s").final == catalogue.MEDIAN
    assert m("activation_bytes").final == catalogue.MAX
    unknown = m("some_new_thing")
    assert unknown.label == "some new thing" and unknown.kind == catalogue.OTHER
    for entry in catalogue.CATALOGUE.values():
        assert entry.kind in catalogue.KINDS and entry.final in catalogue.AGGREGATES, entry
        assert entry.better in (catalogue.LOWER, catalogue.HIGHER, catalogue.NEITHER), entry
    labels = [e.label for e in catalogue.CATALOGUE.values()]
    assert len(labels) == len(set(labels)), "two metrics with one label"


NAMES = [*catalogue.CATALOGUE, "val_loss_x2", "val_bpb_x8", "probe_mqar_accuracy", "mqar_accuracy_pairs_8",
         "probe_mqar_loss", "foo_tokens_per_s", "bar_per_s", "kv_bytes_per_layer", "activation_bytes",
         "aux_loss", "some_new_thing"]


def test_the_store_picks_the_same_aggregate_as_the_catalogue():
    con = duckdb.connect()
    try:
        got = dict(con.execute(f"SELECT name, {store.final_aggregate_sql()} FROM (SELECT unnest(?) AS name)",
                               [NAMES]).fetchall())
    finally:
        con.close()
    assert got == {n: catalogue.final_aggregate(n) for n in NAMES}


def test_final_value_in_python_matches_the_store(db):
    con = duckdb.connect(str(db), read_only=True)
    try:
        sql = {(r, n): v for r, n, v in con.execute(store.final_values_sql()).fetchall()}
        rows = con.execute("SELECT run_id, name, step, value FROM metrics").fetchall()
    finally:
        con.close()
    by: dict = {}
    for r, n, s, v in rows:
        by.setdefault((r, n), []).append((s, v))
    assert {k: catalogue.final_value(k[1], pts) for k, pts in by.items()} == sql


# ---------------------------------------------------------------- nothing spelled outside the catalogue

AGG_CALL = re.compile(r"\b(?:median|max|min|avg|arg_max|arg_min|quantile_cont|quantile_disc)\s*\(\s*value\b", re.I)
AGG_WORDS = set(catalogue.AGGREGATES)
DIRECTION_WORDS = {catalogue.LOWER, catalogue.HIGHER}


def _strings(node: ast.AST) -> list[tuple[int, str]]:
    """Every string constant under ``node``, f-strings as their literal parts joined."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.append((n.lineno, n.value))
        elif isinstance(n, ast.JoinedStr):
            out.append((n.lineno, "".join(v.value for v in n.values
                                          if isinstance(v, ast.Constant) and isinstance(v.value, str))))
    return out


def violations(source: str, where: str = "<source>") -> list[str]:
    """What a module spells that the catalogue owns: a catalogue label as a string of its own; a unit as a
    string of its own (one with a slash, such as nats/token) or in an axis title's brackets; SQL that
    aggregates ``value`` for a metric named in the same string; a dict from metric names to aggregates; a
    tuple or dict entry that pairs a metric name with a better direction."""
    tree = ast.parse(source)
    labels = {e.label: e.name for e in catalogue.CATALOGUE.values()}
    units = {e.unit for e in catalogue.CATALOGUE.values() if e.unit}
    unit_spellings = {u for u in units if "/" in u} | {f"[{u}]" for u in units}
    names = set(catalogue.CATALOGUE)
    out = []
    for line, text in _strings(tree):
        if text in labels:
            out.append(f"{where}:{line}: the label of {labels[text]} spelled by hand: {text!r}")
        if text in unit_spellings:
            out.append(f"{where}:{line}: a unit spelled by hand: {text!r}")
        if AGG_CALL.search(text):
            named = sorted(n for n in names if re.search(rf"'{re.escape(n)}'", text))
            if named:
                out.append(f"{where}:{line}: an aggregate chosen by hand for {', '.join(named)}")
    for n in ast.walk(tree):
        if isinstance(n, ast.Dict):
            for k, v in zip(n.keys, n.values):
                if (isinstance(k, ast.Constant) and k.value in names and isinstance(v, ast.Constant)
                        and v.value in AGG_WORDS):
                    out.append(f"{where}:{n.lineno}: the aggregate of {k.value} chosen by hand: {v.value!r}")
                if (isinstance(k, ast.Constant) and k.value in names and isinstance(v, ast.Call)
                        and any(isinstance(a, ast.Constant) and a.value in AGG_WORDS
                                for a in [*v.args, *(kw.value for kw in v.keywords)])):
                    out.append(f"{where}:{n.lineno}: the aggregate of {k.value} chosen by hand")
    for n in ast.walk(tree):
        pairs = []
        if isinstance(n, ast.Tuple):
            pairs = [(n.elts[i], n.elts[i + 1]) for i in range(len(n.elts) - 1)]
        elif isinstance(n, ast.Dict):
            pairs = [(k, v) for k, v in zip(n.keys, n.values) if k is not None]
        for a, b in pairs:
            if (isinstance(a, ast.Constant) and a.value in names and isinstance(b, ast.Constant)
                    and b.value in DIRECTION_WORDS):
                out.append(f"{where}:{n.lineno}: which direction of {a.value} is better, chosen by hand")
    return list(dict.fromkeys(out))  # an f-string's literal part is also a constant of its own


def test_no_module_spells_a_metric_outside_the_catalogue():
    found = []
    for folder in SCANNED:
        for p in sorted((ROOT / folder).rglob("*.py")):
            rel = p.relative_to(ROOT)
            if rel not in (CATALOGUE_MODULE, UNITS_MODULE):
                found += violations(p.read_text(encoding="utf-8"), str(rel))
    assert not found, "\n".join(found)


def test_the_scan_catches_a_planted_violation():
    planted = '''
HEADER = "peak memory"
SQL = "SELECT run_id, max(value) FROM metrics WHERE name = 'peak_mem_bytes' GROUP BY run_id"
FAST = f"SELECT median(value) FROM {{metrics}} WHERE name = 'tokens_per_s'"
AGG = {"mfu": "median"}
INFO = {"wall_s": Info("wall", "last")}
COSTS = (("tokens_per_s", "higher", False), ("n_params", "lower", False))
AXIS = title.replace("[bytes]", "[MiB]") + "nats/token"
'''
    found = violations(planted)
    assert len(found) == 9, found
    assert "peak_mem_bytes" in found[0] or "peak_mem_bytes" in " ".join(found)
    assert any("tokens_per_s" in f for f in found) and any("mfu" in f for f in found)
    assert violations("LABEL = catalogue.label('peak_mem_bytes')") == []
    assert json.dumps(violations("x = 1")) == "[]"


# figures that are counts, flags or plain ratios: shown as numbers, with no unit
UNITLESS = {"contended", "did_not_learn", "grad_norm", "load_per_core", "loss_spikes", "lr", "n_params",
            "n_params_non_embedding", "n_params_predicted"}


def test_every_metric_a_run_stores_has_its_unit(tmp_path):
    """A new user's Run detail page showed flops_per_step_predicted as 3,422,552,064 beside
    flops_per_step_measured as 3.56 GFLOP, and kv_cache_bytes_measured as 262,144: metrics the trainer
    writes that the catalogue gave no unit. Every metric of a real (tiny) run has one, or is a count/flag."""
    from conftest import run_abl

    grid = tmp_path / "g.toml"
    grid.write_text("[experiment]\nname = 'units'\nseeds = [0]\n[model]\nd_model = 32\nn_layers = 1\n"
                    "n_heads = 2\ncontext = 32\n[train]\nsteps = 4\nbatch_size = 2\neval_every = 2\n"
                    "eval_batches = 1\n")
    db = tmp_path / "abl.duckdb"
    r = run_abl(["run", str(grid), "--db", str(db)])
    assert r.returncode == 0, r.stderr
    con = duckdb.connect(str(db), read_only=True)
    names = [n for (n,) in con.sql("SELECT DISTINCT name FROM metrics ORDER BY 1").fetchall()]
    con.close()
    assert "val_loss" in names and len(names) > 30
    missing = [n for n in names if not catalogue.metric(n).unit and n not in UNITLESS]
    assert not missing, f"metrics without a unit: {missing}"
    assert catalogue.metric("flops_per_step_predicted").unit == catalogue.metric("flops_per_step_measured").unit
    assert catalogue.metric("kv_cache_bytes_measured").unit == "bytes"
