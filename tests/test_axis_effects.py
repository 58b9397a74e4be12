"""Analysis that follows the grid's design (issue 26): per swept axis, its main effect, pooled over the other
axes and paired by seed (OLS with blocks), in the vocabulary of the cell tables; the summary and abl compare
lead with it; budget-matched grids compare by an axis."""

import json
import time
import zlib

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats as sps

from abl.analysis import stats, verdicts

# the norms grid's design (ablations/norms.toml): 4 norms x 4 block layouts, "none" only with "pre", 2 seeds
NORMS = ["layernorm", "rmsnorm", "scalenorm", "none"]
BLOCKS = ["pre", "post", "sandwich", "post_branch"]
NORM_EFFECT = {"layernorm": 0.0, "rmsnorm": 0.0, "scalenorm": 0.03, "none": 0.15}
BLOCK_EFFECT = {"pre": 0.0, "post": 0.05, "sandwich": 0.012, "post_branch": 0.025}
SEED_EFFECT = {0: 0.0, 1: 0.04}  # shared by every cell of a seed (the data order): the blocks remove it
NOISE = 0.004


def cells_of_norms(interaction=0.0, seed=1, seeds=None, blocks=None):
    rng = np.random.default_rng(seed)
    block_effect = blocks or BLOCK_EFFECT
    seed_effect = SEED_EFFECT if seeds is None else {s: 0.04 * s for s in range(seeds)}
    out = []
    for n in NORMS:
        for b in BLOCKS:
            if n == "none" and b != "pre":
                continue
            bump = interaction if (n, b) == ("rmsnorm", "post") else 0.0
            vals = {s: 2.5 + NORM_EFFECT[n] + block_effect[b] + bump + se + rng.normal(0, NOISE)
                    for s, se in seed_effect.items()}
            out.append(stats.CellInput(f"{n}/{b}", f"norm={n}, block={b}", vals, "same data",
                                       settings={"model.norm": json.dumps(n), "model.block": json.dumps(b)}))
    return out


def _by_axis(effects):
    return {e.axis: e for e in effects}


def test_two_seeds_pooled_over_the_other_axis_give_verdicts_per_axis():
    cells = cells_of_norms()
    # the cell table alone cannot decide on 2 seeds
    an = stats.analyse(cells, stats.against_baseline([c.key for c in cells], "layernorm/pre"))
    assert all(c.verdict.startswith(stats.TOO_FEW) for c in an.comparisons)
    fx = _by_axis(verdicts.axis_effects(cells, ["model.norm", "model.block"]))
    norm, block = fx["model.norm"], fx["model.block"]
    assert norm.blocks == ["model.block", "seed"] and block.blocks == ["model.norm", "seed"]
    # block: pre best, ahead of sandwich by 0.012, decided; the order of the layouts as built
    assert [lv.level for lv in block.levels] == ["pre", "sandwich", "post_branch", "post"]
    assert block.verdict() == "pre is better than sandwich"
    assert [lv.rank for lv in block.levels] == [1, 2, 3, 4]
    # norm: layernorm and rmsnorm are the same model up to the mean subtraction: a tie, declared so
    top = {lv.level: lv for lv in norm.levels}
    assert {norm.levels[0].level, norm.levels[1].level} == {"layernorm", "rmsnorm"}
    assert norm.verdict().startswith(stats.SAME)
    assert top["layernorm"].rank == top["rmsnorm"].rank == 1 and top["layernorm"].tied
    assert top["scalenorm"].rank == 3
    sc = next(c for c in norm.contrasts if {c.a, c.b} == {"layernorm", "scalenorm"})
    assert sc.verdict in (stats.BETTER, stats.WORSE)
    # "none" ran 2 seeds in one layout: too few runs for a verdict on it, none invented
    assert all(c.verdict.startswith(stats.TOO_FEW) for c in norm.contrasts if "none" in (c.a, c.b))
    for e in (norm, block):  # intervals and verdicts agree
        for c in e.contrasts:
            if not c.verdict.startswith(stats.TOO_FEW):
                assert (c.ci_low > 0 or c.ci_high < 0) == (c.verdict in (stats.BETTER, stats.WORSE))
    # the lines every summary leads with, and the closing verdicts
    lines = verdicts.effect_section(list(fx.values()), "norms")
    assert lines[0].startswith("norms: val_loss per axis") and "statsmodels" in lines[-1]
    assert any(ln.startswith("model.block: best pre") and "verdict: pre is better than sandwich" in ln
               for ln in lines)
    assert verdicts.verdict_lines(list(fx.values()))[1] == "Verdict, model.block: pre is better than sandwich"


def test_the_contrast_is_the_least_squares_estimate_with_blocks():
    """An independent recomputation: dummy-coded least squares with numpy, the t-test with scipy."""
    cells = cells_of_norms()
    block = _by_axis(verdicts.axis_effects(cells, ["model.norm", "model.block"]))["model.block"]
    rows = [(json.loads(c.settings["model.norm"]), json.loads(c.settings["model.block"]), s, v)
            for c in cells for s, v in c.values.items()]
    cols = [("norm", n) for n in NORMS[1:]] + [("block", b) for b in BLOCKS[1:]] + [("seed", 1)]
    X = np.array([[1.0] + [float({"norm": n, "block": b, "seed": s}[k] == lv) for k, lv in cols]
                  for n, b, s, _ in rows])
    y = np.array([v for *_, v in rows])
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ beta
    df = len(y) - X.shape[1]
    cov = resid @ resid / df * np.linalg.inv(X.T @ X)
    i = 1 + cols.index(("block", "sandwich"))  # sandwich - pre = its coefficient
    c = next(c for c in block.contrasts if (c.a, c.b) == ("pre", "sandwich"))
    assert c.delta == pytest.approx(-beta[i]) and c.se == pytest.approx(np.sqrt(cov[i, i]))
    assert c.df == df == 18
    assert c.p_value == pytest.approx(2 * sps.t.sf(abs(beta[i]) / np.sqrt(cov[i, i]), df))


def test_an_interaction_that_matters_is_reported():
    fx = _by_axis(verdicts.axis_effects(cells_of_norms(interaction=0.08), ["model.norm", "model.block"]))
    text = fx["model.norm"].interaction_text()
    assert "depends on model.block" in text and "interaction F(" in text
    assert not _by_axis(verdicts.axis_effects(cells_of_norms(), ["model.norm", "model.block"]))[
        "model.norm"].interaction_text()


GRID = """
[experiment]
name = "norms-axes"
seeds = [0, 1]
[model]
d_model = 32
n_heads = 4
n_layers = 2
context = 16
[train]
steps = 20
batch_size = 4
[grid]
"model.norm" = ["layernorm", "rmsnorm", "scalenorm", "none"]
"model.block" = ["pre", "post", "sandwich", "post_branch"]
exclude = [
    { "model.norm" = "none", "model.block" = "post" },
    { "model.norm" = "none", "model.block" = "sandwich" },
    { "model.norm" = "none", "model.block" = "post_branch" },
]
"""


def write_runs(grid_path, runs_dir, value_of):
    from abl.contracts.plugin_manager import get_registry
    from abl.grid.gridfile import load_grid

    g = load_grid(grid_path, get_registry())
    now = time.time()
    for i, cell in enumerate(g.cells):
        d = runs_dir / cell.run_id
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(cell.config))
        (d / "meta.json").write_text(json.dumps({"cell_key": cell.cell_key, "label": cell.label,
                                                 "git_commit": "abc123", "grid_file": str(grid_path)}))
        (d / "info.json").write_text(json.dumps({"device": "cpu (test)", "data_fingerprint": "f" * 64,
                                                 "unigram_floor": 3.26}))
        (d / "status.json").write_text(json.dumps({"status": "completed", "started": now + i,
                                                   "finished": now + i + 1}))
        final = value_of(cell)
        lines = [{"step": 0, "n_params": 1000.0}] + [
            {"step": s, "train_loss": final + 2.0 / s, **({"val_loss": final} if s == 20 else {})}
            for s in range(1, 21)] + [{"step": 20, "wall_s": 1.0, "peak_mem_bytes": 1e6}]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return g


def _store(tmp_path, text, value_of):
    from abl.store import database as store

    grid = tmp_path / "grid.toml"
    grid.write_text(text)
    runs = tmp_path / "results" / "runs"
    g = write_runs(grid, runs, value_of)
    db = tmp_path / "results" / "abl.duckdb"
    store.ingest_dirs(db, sorted(runs.iterdir()))
    return grid, db, g


def _norms_value(cell):
    n, b = cell.model.norm, cell.model.block
    noise = NOISE * np.random.default_rng(zlib.crc32(f"{n}{b}{cell.seed}".encode())).standard_normal()
    return 2.5 + NORM_EFFECT[n] + BLOCK_EFFECT[b] + SEED_EFFECT[cell.seed] + noise


def test_compare_and_the_run_summary_lead_with_the_axes_and_end_with_their_verdicts(tmp_path, monkeypatch):
    from rich.console import Console

    from abl.cli import cli
    from abl.present.summary import print_run_summary

    monkeypatch.chdir(tmp_path)
    grid, db, g = _store(tmp_path, GRID, _norms_value)
    r = CliRunner().invoke(cli, ["compare", str(grid), "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    axes = {a["axis"]: a for a in json.loads(r.output)[0]["axes"]}
    assert set(axes) == {"model.norm", "model.block"}
    assert axes["model.block"]["verdict"] == "pre is better than sandwich"
    assert axes["model.norm"]["verdict"].startswith(stats.SAME)
    console = Console(record=True, width=140)
    print_run_summary(console, db, g)
    text = console.export_text().splitlines()
    first = next(i for i, ln in enumerate(text) if ln.strip())
    assert text[first].startswith("norms-axes: val_loss per axis (main effects)")  # the answer leads
    closing = [ln for ln in text if ln.startswith("Verdict, ")]
    assert closing == [f"Verdict, model.norm: {axes['model.norm']['verdict']}",
                       "Verdict, model.block: pre is better than sandwich"]
    assert text[-2:] == closing  # and ends the summary
    # abl compare --by one axis leads with that axis only
    r = CliRunner().invoke(cli, ["compare", str(grid), "--db", str(db), "--by", "model.block", "--format", "md"])
    assert r.exit_code == 0, r.output
    assert "- model.block: best pre" in r.output and "- model.norm:" not in r.output


MATCHED = """
[experiment]
name = "mixers-matched"
seeds = [0, 1, 2]
[model]
d_model = 32
n_heads = 4
n_layers = 2
context = 16
ffn = "swiglu"
[train]
steps = 20
batch_size = 4
match = "params"
[grid]
"model.mixer" = ["mha", "mqa"]
"model.norm" = ["layernorm", "rmsnorm"]
"""


def test_by_an_axis_works_on_a_budget_matched_grid(tmp_path, monkeypatch):
    from abl.cli import cli

    monkeypatch.chdir(tmp_path)
    value = lambda c: 2.0 + (0.05 if c.model.mixer == "mqa" else 0.0) + 0.01 * c.seed  # noqa: E731
    grid, db, g = _store(tmp_path, MATCHED, value)
    widths = {json.dumps(c.config["components"]["ffn"]["params"], sort_keys=True) for c in g.cells}
    assert len(widths) > 1  # matching gave the mixers different FFN widths
    r = CliRunner().invoke(cli, ["compare", str(grid), "--db", str(db), "--by", "model.mixer", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)[0]
    assert len(out["comparisons"]) == 2  # mha against mqa at each norm
    assert [a["axis"] for a in out["axes"]] == ["model.mixer"] and out["axes"][0]["best"] == "mha"


def test_the_dashboard_leads_with_the_same_per_axis_lines(tmp_path, monkeypatch):
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from abl.analysis.verdicts import analyse_runs, axis_effects
    from abl.present.summary import load

    monkeypatch.chdir(tmp_path)
    grid, db, g = _store(tmp_path, GRID, _norms_value)
    monkeypatch.setenv("ABL_DB", str(db))
    monkeypatch.setenv("ABL_RUNS_DIR", str(tmp_path / "results" / "runs"))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py"), default_timeout=90)
    at.switch_page("views/compare.py")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    text = "\n".join(str(x.value) for x in [*at.markdown, *at.caption, *at.subheader])
    cells, _, _ = analyse_runs(load(db, experiment="norms-axes"))
    effects = axis_effects(cells, (), "val_loss")
    # the page leads with the answer: each axis's verdict, the same words as the summary's per-axis lines
    assert "The answer: val loss per axis" in text
    assert {e.axis for e in effects} == {"model.norm", "model.block"}
    for e in effects:
        assert f"**{e.axis}** — verdict: {e.verdict()}" in text
    assert "**model.block** — verdict: pre is better than sandwich" in text


def test_the_report_has_the_per_axis_section(tmp_path, monkeypatch):
    from abl.present.report.runs import load_runs
    from abl.present.report.sections import build_report

    monkeypatch.chdir(tmp_path)
    grid, db, g = _store(tmp_path, GRID, _norms_value)
    runs = load_runs(db, run_ids=[c.run_id for c in g.cells])
    rep = build_report(runs, source=str(grid), db_path=str(db), registry=None,
                       order=list(dict.fromkeys(c.cell_key for c in g.cells)), grid_raw=g.raw)
    md = rep.doc.markdown()
    assert "## Per axis: main effects on val_loss" in md
    assert md.index("## Per axis") < md.index("## Comparison")  # the answer leads
    assert "pre is better than sandwich" in md and "model.norm: best" in md


def _cell(key, vals, **levels):
    return stats.CellInput(key, key, vals, 0, settings={a: json.dumps(v) for a, v in levels.items()})


def test_designs_the_model_cannot_pair_or_test_say_so():
    # one seed, one axis: no residual variance, no verdict invented
    one = verdicts.axis_effects([_cell("a", {0: 1.0}, x="a"), _cell("b", {0: 1.1}, x="b")], ["x"])
    assert one[0].contrasts == [] and "no residual variance" in one[0].note
    assert verdicts.verdict_lines(one) == []
    # the levels ran different seeds: the seed is no block (it would be confounded with the level)
    apart = verdicts.axis_effects([_cell("a", {0: 1.0, 1: 1.1, 2: 1.2}, x="a"),
                                   _cell("b", {3: 1.5, 4: 1.6, 5: 1.75}, x="b")], ["x"])
    assert apart[0].blocks == [] and "not paired by seed" in apart[0].note
    c = apart[0].contrasts[0]
    # one axis: each pair of levels is answered by the two cells' own test (issue 41, item 1): Welch here
    ref = sps.ttest_ind([1.0, 1.1, 1.2], [1.5, 1.6, 1.75], equal_var=False)
    assert c.p_value == pytest.approx(ref.pvalue) and c.verdict == stats.BETTER and "Welch" in apart[0].model


def test_the_shipped_norms_grid_at_its_shipped_seeds_ends_with_a_verdict_per_axis(tmp_path, monkeypatch):
    """ablations/norms.toml as shipped (its seeds), runs written without training: the summary's last lines
    are a verdict on the norm axis and on the block axis, where the cell table has only 'too few seeds'."""
    import test_summary_layout as layout
    from rich.console import Console

    from abl.present.summary import print_run_summary
    from abl.store import database as store

    def loss(cell):
        n, b = cell.model.norm, cell.model.block
        noise = NOISE * np.random.default_rng(zlib.crc32(f"{n}{b}{cell.seed}".encode())).standard_normal()
        return 2.5 + NORM_EFFECT[n] + BLOCK_EFFECT[b] + 0.03 * cell.seed + noise

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(layout, "_loss", loss)
    g = layout.write_runs("norms", tmp_path / "runs")
    assert sorted({c.seed for c in g.cells}) == [0, 1]  # the shipped seeds
    db = tmp_path / "abl.duckdb"
    store.ingest_dirs(db, sorted((tmp_path / "runs").iterdir()))
    console = Console(record=True, width=100)
    print_run_summary(console, db, g)
    lines = console.export_text().splitlines()
    assert lines[-2].startswith("Verdict, model.norm: not distinguishable: ")  # layernorm = rmsnorm here
    assert lines[-1] == "Verdict, model.block: pre is better than sandwich"
    # each cell against the baseline, on 2 seeds: no per-cell row can decide, so none is listed as if it
    # could; one line counts them (issue 40, item 1), and no cell is ranked (the levels are)
    assert not any("test: paired t (n=2)" in ln for ln in lines)
    assert sum("12 comparisons not listed: too few seeds to decide (n=2" in ln for ln in lines) == 1


def test_seeds_for_an_axis_reach_the_requested_power():
    """--detect per axis: at the seeds it names, the main-effect contrast finds the difference in >= 80% of
    simulated grids (Monte Carlo over the norms design at the true residual sd; --detect itself plans at the
    observed one, an estimate)."""
    e = _by_axis(verdicts.axis_effects(cells_of_norms(), ["model.norm", "model.block"]))["model.block"]
    assert e.sigma == pytest.approx(NOISE, rel=0.5)  # the estimate, from 2 seeds
    e.sigma = NOISE
    effect = 0.004  # sandwich to post_branch, two of the least-run levels: about 1.5 residual sd
    blocks = {**BLOCK_EFFECT, "post_branch": BLOCK_EFFECT["sandwich"] + effect}
    k = stats.seeds_for_axis(e, effect)
    assert k is not None and 3 <= k <= 10
    hits = 0
    for rep in range(40):
        fx = _by_axis(verdicts.axis_effects(cells_of_norms(seed=100 + rep, seeds=k, blocks=blocks),
                                            ["model.norm", "model.block"]))
        c = next(c for c in fx["model.block"].contrasts if {c.a, c.b} == {"sandwich", "post_branch"})
        hits += c.verdict in (stats.BETTER, stats.WORSE)
    assert hits / 40 >= 0.7  # 80% power, less Monte-Carlo noise (sd 0.06 at 40 draws)
    # the sentence --detect prints per axis, at the observed residual sd
    observed = _by_axis(verdicts.axis_effects(cells_of_norms(), ["model.norm", "model.block"]))["model.block"]
    lines = verdicts.axis_seeds(cells_of_norms(), effect)
    assert any(ln.startswith(f"--detect {effect:g}, model.block (main effect") and
               f": {stats.seeds_for_axis(observed, effect)} seeds" in ln for ln in lines)
