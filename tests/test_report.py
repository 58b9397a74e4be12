"""``abl report``: the comparison table's CIs and verdicts against a direct computation from the store."""

import json
import math
import re
import time

import numpy as np
import pytest
from conftest import run_abl
from scipy import stats as sps


def parse_table(md: str, heading: str) -> list[dict[str, str]]:
    """The first Markdown table after ``heading``, as dicts keyed by its header."""
    lines = md[md.index(heading):].splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    header, body = rows[0], rows[2:]
    return [dict(zip(header, r)) for r in body]


def parse_ci(text: str) -> tuple[float, float]:
    lo, hi = text.strip("[]").split(",")
    return float(lo), float(hi)


def direct_from_store(db, experiment):
    """cell label -> {seed: final val_loss}, straight from DuckDB, in the order cells first started."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("""
        SELECT r.label, r.seed, arg_max(m.value, m.step)
        FROM runs r JOIN metrics m USING (run_id)
        WHERE r.experiment = ? AND r.status = 'completed' AND m.name = 'val_loss'
        GROUP BY r.label, r.seed""", [experiment]).fetchall()
    con.close()
    out: dict[str, dict[int, float]] = {}
    for label, seed, value in rows:
        out.setdefault(label, {})[seed] = value
    return out


def check_comparison_table(md: str, values: dict[str, dict[int, float]], baseline: str,
                           stuck: set[str] = frozenset()) -> None:
    """Every number of the comparison table, recomputed with scipy from the store's values (Holm by hand).

    ``stuck``: cells the store flags as did_not_learn; they are neither ranked nor tested. The grid has one
    axis, so its question is every pair of its levels: Holm runs over all pairs of the cells that learned,
    and the rows against the baseline show those pairs' verdicts (issue 41, item 1: one verdict per pair)."""
    import itertools

    table = {r["cell"]: r for r in parse_table(md, "## Comparison")}
    assert set(table) == set(values)
    base = values[baseline]
    every = {}
    for a, b in itertools.combinations([k for k in values if k not in stuck], 2):
        seeds = sorted(set(values[a]) & set(values[b]))
        every[(a, b)] = sps.ttest_rel([values[a][s] for s in seeds], [values[b][s] for s in seeds]).pvalue
    order = sorted(every, key=every.get)
    holm_pairs, running = {}, 0.0
    for rank, k in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * every[k]))
        holm_pairs[k] = running
    raw = {k[0] if k[1] == baseline else k[1]: p for k, p in every.items() if baseline in k}
    holm = {k[0] if k[1] == baseline else k[1]: p for k, p in holm_pairs.items() if baseline in k}
    for label, vals in values.items():
        row = table[label]
        x = np.array([vals[s] for s in sorted(vals)])
        assert row["n"] == f"{len(x)}/{len(x)}"
        assert float(row["mean"]) == pytest.approx(x.mean(), abs=6e-5)
        assert float(row["std"]) == pytest.approx(x.std(ddof=1), abs=6e-5)
        lo, hi = sps.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=sps.sem(x))
        assert parse_ci(row["95% CI"]) == (pytest.approx(lo, abs=6e-5), pytest.approx(hi, abs=6e-5))
        if label in stuck:
            assert row["rank"] == "-" and row["health"].startswith("did not learn")
        if label == baseline:
            assert row["verdict"] == "baseline"
            continue
        if label in stuck or baseline in stuck:
            assert row["verdict"].startswith("did not learn") and row["p"] == "-"
            continue
        seeds = sorted(set(vals) & set(base))
        assert set(vals) == set(base)  # one grid, same seeds: paired by seed
        d = np.array([vals[s] - base[s] for s in seeds])
        # the interval is adjusted like the verdict: at Holm's step level alpha * p / p_Holm (issue 26)
        level = 1 - 0.05 * raw[label] / holm[label]
        dlo, dhi = sps.t.interval(level, len(d) - 1, loc=d.mean(), scale=sps.sem(d))
        assert row["test"] == f"paired t (n={len(d)})"
        assert float(row["Δ vs baseline"]) == pytest.approx(d.mean(), abs=6e-5)
        assert parse_ci(row["Δ CI (Holm-adj.)"]) == (pytest.approx(dlo, abs=6e-5), pytest.approx(dhi, abs=6e-5))
        for col, ref in (("p", raw[label]), ("p (Holm)", holm[label])):
            p = row[col]
            assert (ref < 1e-4) if p == "<0.0001" else float(p) == pytest.approx(ref, abs=6e-5)
        if len(d) < 3:
            assert row["verdict"].startswith("too few seeds to decide")
        else:
            expected = ("not distinguishable" if not holm[label] < 0.05
                        else "better" if d.mean() < 0 else "worse")
            assert row["verdict"] == expected


# ---------------------------------------------------------------- a synthetic store (fast)


LADDER = """
[experiment]
name = "ladder"
seeds = [0, 1, 2]
[model]
d_model = 32
n_heads = 4
context = 16
vocab_size = 64
[train]
steps = 20
batch_size = 4
eval_every = 10
[grid]
"model.n_layers" = [1, 2, 4, 8]
"""


def write_fake_runs(grid, runs_dir, loss_of) -> None:
    """Run folders as a worker leaves them, with metrics from ``loss_of(cell, model_params)``."""
    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid
    from abl.model.decoder import DecoderLM

    reg = get_registry()
    g = load_grid(grid, reg)
    now = time.time()
    for i, cell in enumerate(g.cells):
        d = runs_dir / cell.run_id
        d.mkdir(parents=True)
        model = DecoderLM(cell.model, cell.components, reg)
        n, n_ne = model.n_params(), model.n_params(non_embedding=True)
        (d / "config.json").write_text(json.dumps(cell.config))
        (d / "meta.json").write_text(json.dumps({
            "cell_key": cell.cell_key, "label": cell.label, "git_commit": "abc123",
            "versions": {"torch": "2.x", "python": "3.x"}, "grid_file": str(grid)}))
        (d / "info.json").write_text(json.dumps({
            "device": "cpu (test)", "data_fingerprint": "f" * 64, "vocab_size": 64, "precision": "fp32",
            "emulated": False, "kernels": "torch", "peak_mem_kind": "cpu_peak_rss"}))
        (d / "status.json").write_text(json.dumps({"status": "completed", "started": now + i,
                                                   "finished": now + i + 1}))
        final = loss_of(cell, n_ne)
        lines = [{"step": 0, "n_params": n, "n_params_non_embedding": n_ne}]
        for step in range(1, 21):
            row = {"step": step, "train_loss": final + 1.0 / step, "tokens_per_s": 1000.0 + step,
                   "elapsed_s": 0.1 * step}
            if step % 10 == 0:
                row["val_loss"] = final + (0.5 if step == 10 else 0.0)
            lines.append(row)
        lines.append({"step": 20, "peak_mem_bytes": 5e8, "baseline_rss_bytes": 4e8, "wall_s": 2.0 + i})
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def chinchilla_loss(cell, n_ne):
    seed_effect = {0: 0.0, 1: 0.013, 2: -0.009}[cell.seed]
    return 1.5 + 30.0 / n_ne ** 0.4 + seed_effect + 0.002 * math.sin(7 * n_ne + cell.seed)


@pytest.fixture
def ladder_store(tmp_path):
    from abl.store import database as store

    grid = tmp_path / "ladder.toml"
    grid.write_text(LADDER)
    runs = tmp_path / "results" / "runs"
    write_fake_runs(grid, runs, chinchilla_loss)
    db = tmp_path / "results" / "abl.duckdb"
    store.ingest_dirs(db, sorted(runs.iterdir()))
    return grid, db


def test_report_numbers_match_a_direct_computation_from_the_store(ladder_store, tmp_path):
    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid
    from abl.present.report.runs import load_runs
    from abl.present.report.sections import build_report, write_report

    grid, db = ladder_store
    reg = get_registry()
    g = load_grid(grid, reg)
    runs = load_runs(db, run_ids=[c.run_id for c in g.cells])
    rep = build_report(runs, source=str(grid), db_path=str(db), registry=reg,
                       order=list(dict.fromkeys(c.cell_key for c in g.cells)), grid_raw=g.raw)
    out = write_report(rep, tmp_path / "rep", "md")
    md = out.read_text()
    values = direct_from_store(db, "ladder")
    check_comparison_table(md, values, baseline="n_layers=1")
    for png in ("loss_curves.png", "quality_vs_cost.png", "predicted_vs_measured.png", "scaling.png"):
        assert (tmp_path / "rep" / png).read_bytes()[:4] == b"\x89PNG"
        assert f"]({png})" in md
    # every figure and table carries its conditions
    assert md.count("cpu (test); torch 2.x, python 3.x; abl abc123; data ffffffffffff") >= 6
    # predicted vs measured: parameters are exact
    summary = {r["figure"]: r for r in parse_table(md, "| figure | cells | agree |")}
    assert summary["n_params"]["agree"] == summary["n_params"]["cells"] == "4"
    # 4 model sizes over 8x: the scaling fit is there, with constants near the generating ones
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    fit = data["scaling_fit"]
    assert fit["n_sizes"] == 4 and "L(N)" in fit["form"]
    assert fit["alpha"] == pytest.approx(0.4, abs=0.15)
    # the API the run summary uses gives the same statistics
    from abl.present.report.runs import statistics_for_runs

    again = statistics_for_runs(db, [c.run_id for c in g.cells], order=list(dict.fromkeys(c.cell_key for c in g.cells)))
    assert [(r["label"], r["verdict"], r["p_value"]) for r in again] == \
        [(r["label"], r["verdict"], r["p_value"]) for r in rep.stat_rows]
    # report.json carries the same statistics at full precision
    by_label = {r["label"]: r for r in data["comparison"]}
    x = np.array(list(values["n_layers=4"].values()))
    assert by_label["n_layers=4"]["mean"] == pytest.approx(x.mean(), rel=1e-12)


def abl(args, cwd, monkeypatch):
    """The CLI in-process (a subprocess per call is too slow on a shared 2-core machine)."""
    from click.testing import CliRunner

    from abl.cli import cli

    monkeypatch.chdir(cwd)
    return CliRunner().invoke(cli, args)


def test_report_cli_html_is_self_contained_and_by_experiment_name(ladder_store, tmp_path, monkeypatch):
    grid, db = ladder_store
    r = abl(["report", "ladder", "--db", str(db), "--format", "html", "--out", str(tmp_path / "h"),
             "--baseline", "n_layers=2"], tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output
    html = (tmp_path / "h" / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 4
    assert not re.search(r"src='(?!data:)", html)  # no file references
    assert "paired t (n=3)" in html and "baseline: #2 n_layers=2" in html


def test_report_user_errors_exit_2_without_a_traceback(ladder_store, tmp_path, monkeypatch):
    grid, db = ladder_store
    for args, needle in (
        (["report", "nosuch", "--db", str(db)], "no experiment 'nosuch'"),
        (["report", "ladder", "--db", str(tmp_path / "none.duckdb")], "no database"),
        (["report", "missing.toml", "--db", str(db)], "no such grid file"),
        (["report", "ladder", "--db", str(db), "--baseline", "zzz"], "--baseline 'zzz' matches 0 cells"),
    ):
        r = abl(args, tmp_path, monkeypatch)
        assert r.exit_code == 2, (args, r.output)
        assert needle in r.output and "Traceback" not in r.output
        assert isinstance(r.exception, SystemExit)  # fail(): a message and exit 2, nothing raised


def test_help_lists_cost_and_report_without_importing_torch():
    import subprocess
    import sys

    code = ("import io, sys, contextlib\nfrom abl.cli import cli\nbuf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf):\n    try:\n        cli(['--help'])\n"
            "    except SystemExit:\n        pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "assert ' cost ' in buf.getvalue() and ' report ' in buf.getvalue(), buf.getvalue()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- through the real CLI (slow)


TINY = """
[experiment]
name = "report-tiny"
seeds = [0, 1, 2]
[model]
d_model = 16
n_layers = 1
n_heads = 2
context = 16
[train]
steps = 4
batch_size = 4
eval_every = 2
eval_batches = 2
warmup_steps = 2
threads = 1
[data]
dataset = "text_file"
[dataset.text_file]
path = "corpus.txt"
[grid]
"model.norm" = ["rmsnorm", "layernorm"]
"""


@pytest.mark.slow
def test_report_on_a_finished_tiny_grid(tmp_path):
    import sysconfig
    from pathlib import Path

    src = Path(sysconfig.get_paths()["stdlib"]) / "argparse.py"
    (tmp_path / "corpus.txt").write_bytes(src.read_bytes()[:60_000])
    (tmp_path / "grid.toml").write_text(TINY)
    db = tmp_path / "db" / "abl.duckdb"
    r = run_abl(["run", "grid.toml", "--db", str(db), "--workers", "2"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = run_abl(["report", "grid.toml", "--db", str(db)], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    md = (db.parent / "reports" / "report-tiny" / "report.md").read_text()
    values = direct_from_store(db, "report-tiny")
    assert sorted(len(v) for v in values.values()) == [3, 3]
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    stuck = {lbl for (lbl,) in con.execute("SELECT DISTINCT r.label FROM runs r JOIN metrics m USING (run_id) "
                                           "WHERE m.name = 'did_not_learn' AND m.value = 1").fetchall()}
    con.close()
    # 4 steps: no cell gets below its unigram floor, so none is ranked or tested
    assert stuck == set(values)
    check_comparison_table(md, values, baseline="norm=rmsnorm", stuck=stuck)  # the grid's first cell
    summary = {r["figure"]: r for r in parse_table(md, "| figure | cells | agree |")}
    assert summary["n_params"]["agree"] == summary["n_params"]["cells"] == "2"
