"""What a researcher sees at the end of ``abl run`` and from ``abl compare``: whole, distinct cell labels at
80 columns, readable headers, the full tables with --wide, JSON / CSV / Markdown for piping, the spread of
speed over seeds and a mark on cells measured on a busy machine. Stores are built from synthetic run
folders (nothing is trained)."""

import csv
import io
import json
import math
import re
import time
import zlib

import pytest
from click.testing import CliRunner
from rich.console import Console

ROOT_GRIDS = ("norms", "position")
SEEDS = [0, 1, 2]
SHORT = ["train.steps=10", "train.eval_every=5"]  # the run folders below hold 10 steps


def _loss(cell) -> float:
    h = zlib.crc32(cell.cell_key.encode()) % 1000 / 1000
    return 2.0 + 0.2 * h + 0.01 * cell.seed


def _speed(cell) -> float:
    return 20_000.0 + 1_000.0 * cell.seed + 10.0 * (zlib.crc32(cell.cell_key.encode()) % 100)


def write_runs(grid, runs_dir, overrides=(), contended=lambda cell: False):
    """Run folders as a worker leaves them, for every run of ``grid`` (a shipped grid name or a file)."""
    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid

    g = load_grid(grid, get_registry(), [*SHORT, *overrides])
    now = time.time()
    for i, cell in enumerate(g.cells):
        d = runs_dir / cell.run_id
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(cell.config))
        (d / "meta.json").write_text(json.dumps({"cell_key": cell.cell_key, "label": cell.label,
                                                 "git_commit": "abc123", "grid_file": str(grid),
                                                 "grid": cell.grid_record(str(grid))}))
        (d / "info.json").write_text(json.dumps({"device": "cpu (test)", "data_fingerprint": "f" * 64,
                                                 "unigram_floor": 3.26}))
        (d / "status.json").write_text(json.dumps({"status": "completed", "started": now + i,
                                                   "finished": now + i + 1}))
        final = _loss(cell)
        lines = [{"step": 0, "n_params": 1000.0}]
        for step in range(1, 11):
            row = {"step": step, "train_loss": final + 2.0 / step, "tokens_per_s": _speed(cell) * 2}
            if step % 5 == 0:
                row["val_loss"] = final + (0.3 if step == 5 else 0.0)
                if cell.model.position != "learned" and cell.eval.extrapolation:
                    row["val_loss_x2"] = final + 0.5
                    row["val_loss_x4"] = final + 1.0
            lines.append(row)
        lines.append({"step": 10, "wall_s": 1.0, "peak_mem_bytes": 3e8, "train_tokens_per_s": _speed(cell),
                      "contended": 1.0 if contended(cell) else 0.0,
                      # a task's accuracy and its per-slice parts (abl.present.taskreport)
                      "pystdlib_accuracy": 0.5 + 0.1 * (final - 2.0) + 0.01 * cell.seed,
                      "pystdlib_accuracy_4": 0.6, "pystdlib_accuracy_16": 0.4 + 0.01 * cell.seed})
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return g


def make_store(tmp_path, grid, overrides=(), contended=lambda cell: False):
    from abl.store import database as store

    runs = tmp_path / "results" / "runs"
    g = write_runs(grid, runs, [f"experiment.seeds={SEEDS}", *overrides], contended)
    db = tmp_path / "results" / "abl.duckdb"
    store.ingest_dirs(db, sorted(runs.iterdir()))
    return g, db


def summary_text(db, g, width, layout="auto"):
    from abl.present.summary import Presentation, print_run_summary

    console = Console(record=True, width=width)
    print_run_summary(console, db, g, presentation=Presentation(layout=layout))
    return console.export_text()


def cell_labels_of(db, g):
    from abl.grid.labels import run_labels
    from abl.present.summary import load

    runs = load(db, run_ids=[c.run_id for c in g.cells])
    return list(run_labels(runs, g.grid_paths).values())


def numbered(lines):
    """The labels on the numbered lines of the stacked layout ("12. norm=rmsnorm, block=pre")."""
    return [m.group(1) for m in (re.match(r"^\s*\d+\. (.*)$", ln) for ln in lines) if m]


def _block_of(text, label):
    """The stacked block of the cell labelled ``label``: its numbered line and the indented lines below."""
    lines = text.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.split(". ", 1)[-1] == label and ln.lstrip()[:1].isdigit())
    block = [lines[i]]
    for ln in lines[i + 1:]:
        if not ln.startswith("     "):
            break
        block.append(ln)
    return "\n".join(block)


@pytest.mark.parametrize("name", ROOT_GRIDS)
def test_the_summary_reads_at_80_columns(tmp_path, name):
    g, db = make_store(tmp_path, name)
    text = summary_text(db, g, 80)
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= 80
    labels = cell_labels_of(db, g)
    assert len(labels) == len({c.cell_key for c in g.cells}) == len(set(labels))  # distinct
    for lbl in labels:
        # whole, on the numbered line of its cell (never cut, never an ellipsis)
        assert sum(ln.split(". ", 1)[-1] == lbl for ln in lines) == 1, lbl
        block = _block_of(text, lbl)
        assert "tokens/s (loop)" in block and "peak memory" in block and "seeds 3/3" in block
    assert "…" not in text
    # every value of every axis is in some label (the cells can be told apart by what was swept)
    for c in g.cells:
        assert any(all(f"{p.split('.')[-1]}={c.varied[p]}" in lbl for p in g.grid_paths) for lbl in labels)
    # the comparisons refer to cells by number and label
    assert "each cell minus the baseline #1 (" in text
    assert any(ln.startswith("#2 − #1: ") for ln in lines)


def test_the_position_grid_tests_each_extrapolation_loss_at_80_columns(tmp_path):
    g, db = make_store(tmp_path, "position")
    text = summary_text(db, g, 80)
    for m in ("val_loss", "val_loss_x2", "val_loss_x4"):
        assert f"position: {m}, each cell minus the baseline" in text
    assert "val loss (2x context)" in text and "val_loss_x2 " not in text.replace("position: val_loss_x2", "")


def test_cells_that_differ_only_in_a_component_parameter_get_distinct_labels(tmp_path):
    from abl.present.summary import Presentation, render
    from abl.store import database as store

    runs = tmp_path / "runs"
    write_runs("position", runs, ["experiment.seeds=[0, 1]", "grid.model.position=['sinusoidal', 'rope']"])
    write_runs("position", runs, ["experiment.seeds=[0, 1]", "grid.model.position=['sinusoidal']",
                                  "position.sinusoidal.embed_scale=false"])
    db = tmp_path / "abl.duckdb"
    store.ingest_dirs(db, sorted(runs.iterdir()))
    from abl.present.summary import load

    loaded = load(db, experiment="position")
    console = Console(record=True, width=80)
    render(console, loaded, metrics=["val_loss"], title="position",
           presentation=Presentation(layout="stacked"))
    text = console.export_text()
    heads = numbered(text.splitlines())
    assert len(heads) == 3 and len(set(heads)) == 3, heads
    assert any("embed_scale=false" in h for h in heads) and any("embed_scale=true" in h for h in heads)


def test_wide_prints_the_full_tables(tmp_path):
    g, db = make_store(tmp_path, "norms")
    text = summary_text(db, g, 80, layout="wide")
    header = next(ln for ln in text.splitlines() if "tokens/s (loop)" in ln)
    for col in ("#", "rank", "cell", "seeds", "val loss (mean ± std)", "95% CI", "tokens/s (loop)",
                "tokens/s (median step)", "peak memory", "health"):
        assert col in header
    assert len(header) > 80  # wider than the terminal: the full table, not squeezed
    for lbl in cell_labels_of(db, g):
        assert any(f"│ {lbl} " in ln for ln in text.splitlines())
    assert "train_tokens_per_s" not in text and "peak_mem_bytes" not in text
    # auto: a terminal wide enough gets the same tables
    assert "val loss (mean ± std)" in summary_text(db, g, 400)


def _compare(args):
    from abl.cli import cli

    r = CliRunner().invoke(cli, ["compare", *args])
    assert r.exit_code == 0, r.output
    return r.output


def test_format_json_csv_md_for_piping(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    g, db = make_store(tmp_path, "norms")
    labels = set(cell_labels_of(db, g))
    out = json.loads(_compare(["norms", "--db", str(db), "--format", "json"]))
    assert out == json.loads(_compare(["norms", "--db", str(db), "--json"]))  # --json: the alias
    cells = out[0]["cells"]
    assert {c["label"] for c in cells} == labels and sorted(c["number"] for c in cells) == list(range(1, 14))
    speed = cells[0]["figures"]["train_tokens_per_s"]
    assert speed["n"] == 3 and speed["min"] < speed["mean"] < speed["max"] and speed["std"] > 0

    rows = list(csv.DictReader(io.StringIO(_compare(["norms", "--db", str(db), "--format", "csv"]))))
    assert {r["label"] for r in rows} == labels and len(rows) == 13
    r0 = rows[0]
    assert float(r0["train_tokens_per_s_std"]) > 0 and r0["contended"] == "False"
    by_label = {c["label"]: c for c in cells}
    assert float(r0["val_loss_mean"]) == pytest.approx(by_label[r0["label"]]["mean"])

    from abl.cli import cli

    r = CliRunner().invoke(cli, ["compare", "norms", "--db", str(db), "--json", "--format", "csv"])
    assert r.exit_code == 2 and "not both" in r.output

    md = _compare(["norms", "--db", str(db), "--format", "md"])
    table = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert table[0].startswith("| # | rank | cell | seeds | val loss (mean ± std) |")
    for lbl in labels:
        assert any(f"| {lbl} |" in ln for ln in table)


def test_abl_run_format_json_puts_only_the_summary_on_stdout(tmp_path, monkeypatch):
    """The summary at the end of abl run, as JSON (the cells are stored already, so nothing trains)."""
    from abl.cli import cli

    monkeypatch.chdir(tmp_path)
    g, db = make_store(tmp_path, "norms")
    sets = [x for kv in [*SHORT, f"experiment.seeds={SEEDS}"] for x in ("--set", kv)]
    r = CliRunner().invoke(cli, ["run", "norms", "--db", str(db), *sets, "--format", "json"])
    assert r.exit_code == 0, r.output + r.stderr
    out = json.loads(r.stdout)
    assert out[0]["metric"] == "val_loss" and len(out[0]["cells"]) == 13
    assert "0 to run" in r.stderr  # the progress went to stderr


def test_speed_shows_its_spread_and_contended_cells_are_marked(tmp_path):
    from abl.present.summary import CONTENDED_NOTE

    busy = {"layernorm": True}
    g, db = make_store(tmp_path, "norms", ["grid.model.norm=['layernorm', 'rmsnorm']", "grid.model.block=['pre']"],
                       contended=lambda cell: busy.get(cell.model.norm, False) and cell.seed == 1)
    text = summary_text(db, g, 80)
    busy_block, calm_block = _block_of(text, "norm=layernorm"), _block_of(text, "norm=rmsnorm")
    # mean ± std over the seeds: 20,000 + 1,000 x seed (+ a per-cell offset); std 1,000
    speeds = [_speed(c) for c in g.cells if c.model.norm == "rmsnorm"]
    mean = sum(speeds) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in speeds) / 2)
    assert f"tokens/s (loop) {mean:,.0f} ± {sd:,.0f}" in calm_block
    assert "tokens/s (loop) " in busy_block and "*" in busy_block.split("tokens/s (loop) ")[1].split("   ")[0]
    assert "*" not in calm_block
    note = " ".join(text.split())
    assert " ".join(CONTENDED_NOTE.split()) in note
    # the same in the wide table and in JSON
    wide = summary_text(db, g, 80, layout="wide")
    row = next(ln for ln in wide.splitlines() if "│ norm=layernorm " in ln)
    assert "*" in row and CONTENDED_NOTE[:40] in wide
    assert "*" not in next(ln for ln in wide.splitlines() if "│ norm=rmsnorm " in ln)
    # and in Markdown, escaped so the mark is not read as emphasis
    from abl.present.summary import as_md, build, load

    md = as_md(build(load(db, run_ids=[c.run_id for c in g.cells]), metrics=["val_loss"], title="norms",
                     paths=g.grid_paths))
    row = next(ln for ln in md.splitlines() if "| norm=layernorm |" in ln)
    assert "\\*" in row and "\\*" not in next(ln for ln in md.splitlines() if "| norm=rmsnorm |" in ln)
    # a single seed: no spread to show
    from abl.present.summary import Figure

    assert Figure("train_tokens_per_s", [12345.0]).text() == "12,345"
    assert Figure("train_tokens_per_s", [12345.0], contended=True).text() == "12,345*"
    assert Figure("peak_mem_bytes", [1.0, 3.0], contended=True).text() == "2 B"  # not a speed figure


def test_a_grid_without_contention_records_has_no_mark(tmp_path):
    """Older stores have no contended metric: nothing is marked."""
    g, db = make_store(tmp_path, "norms", ["grid.model.block=['pre']"])
    import duckdb

    con = duckdb.connect(str(db))
    con.execute("DELETE FROM metrics WHERE name = 'contended'")
    con.close()
    text = summary_text(db, g, 80)
    assert "*" not in text and "busy" not in text


def test_the_task_accuracy_table_reads_at_80_columns(tmp_path):
    from abl.present.taskreport import print_summary

    g, db = make_store(tmp_path, "norms")
    console = Console(record=True, width=80)
    print_summary(console, db, g)
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= 80
    for lbl in cell_labels_of(db, g):
        assert sum(ln.split(". ", 1)[-1] == lbl for ln in lines) == 1, lbl
        block = _block_of(text, lbl)
        assert "pystdlib accuracy (mean ± std)" in block and "pystdlib accuracy 16" in block
    assert "baseline" in _block_of(text, "norm=layernorm, block=pre")
    console = Console(record=True, width=300)
    print_summary(console, db, g)
    wide = console.export_text()
    assert any("│ norm=none, block=pre " in ln for ln in wide.splitlines())


def test_the_lr_sweep_table_reads_at_80_columns():
    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid
    from abl.run.lr_sweep import print_tuning_table, tuning_grid, variant

    reg = get_registry()
    g = load_grid("ffn", reg, ["train.lr_sweep=[1e-4, 3e-4, 1e-3, 2e-3, 3e-3, 5e-3, 1e-2, 3e-2]",
                               "experiment.seeds=[0, 1]"])
    tuning = tuning_grid(g, reg)
    results: dict = {}
    for c in tuning.cells:
        results.setdefault(variant(c), {})[c.train.lr] = (2.0 + abs(math.log10(c.train.lr / 3e-3)), "")
    best = {v: min(by_lr, key=lambda lr: by_lr[lr][0]) for v, by_lr in results.items()}
    for width, stacked in ((80, True), (300, False)):
        console = Console(record=True, width=width)
        print_tuning_table(console, tuning, results, best)
        lines = console.export_text().splitlines()
        assert max(len(ln) for ln in lines) <= width
        heads = numbered(lines)
        if stacked:
            assert len(heads) == len(results) == len(set(heads))
            assert sum("lr 0.003: 2.0000 *" in ln for ln in lines) == len(results)
        else:
            assert not heads and sum("2.0000 *" in ln for ln in lines) == len(results)


def test_output_that_is_not_a_terminal_takes_columns_when_set(monkeypatch):
    """A log file keeps the full tables; COLUMNS=80 (a narrow pager, a CI log viewer) gets the stacked layout."""
    from abl.present.termlayout import LOG_WIDTH, output_console

    monkeypatch.setenv("COLUMNS", "80")
    assert output_console().width == 80
    monkeypatch.delenv("COLUMNS")
    assert output_console().width >= LOG_WIDTH


@pytest.mark.parametrize("columns", [60, 90])
def test_detect_line_wraps_at_columns(tmp_path, monkeypatch, capsys, columns):
    """``abl run --dry-run --detect`` printed one unwrapped line however narrow the window (soft wrap)."""
    from types import SimpleNamespace

    from abl.present import summary

    monkeypatch.setenv("COLUMNS", str(columns))
    exp = SimpleNamespace(summary=["val_loss"])
    grid = SimpleNamespace(cells=[SimpleNamespace(experiment=exp, cell_key=k, run_id=f"r{k}") for k in "ab"])
    summary.print_detect(grid, tmp_path / "absent.duckdb", 0.01)
    out = capsys.readouterr().out
    assert "--detect 0.01" in out and "2 completed seeds" in " ".join(out.split())
    assert max(len(line) for line in out.splitlines()) <= columns, out
    assert len(out.splitlines()) >= 2  # the sentence is longer than one line at these widths


@pytest.mark.parametrize("layout", ["wide", "stacked", "markdown"])
def test_a_comparison_table_with_no_row_that_can_decide_is_one_line_not_an_empty_table(tmp_path, layout):
    """At 2 seeds no per-cell comparison can decide: the summary says so in one line under the table's
    title, with no header of an empty table (a new user's run of the flagship printed one)."""
    g, db = make_store(tmp_path, "norms", ["experiment.seeds=[0, 1]"])
    if layout == "markdown":
        text = _compare(["norms", "--db", str(db), "--format", "md"])
    else:
        text = summary_text(db, g, 200, layout=layout)
    assert "not listed: too few seeds to decide" in text
    header = re.compile(r"(┃|\|)\s*a\s*(┃|\|)\s*b\s*(┃|\|)")
    assert not header.search(text), text
