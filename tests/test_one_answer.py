"""One answer per question, the MDD at the verdict's level, and words that agree with the numbers
(issue 41, item 1; issue 40, items 1 and 3).

The findings reproduced: in a one-axis grid the pooled per-axis model and the per-cell paired t gave two
verdicts on one pair; the MDD was computed at an unadjusted alpha, so a row could show |Δ| above its MDD
and read "not distinguishable"; rows at 2 seeds showed a Holm p and an adjusted interval that excluded 0
beside "too few seeds to decide"; every cell at 2 seeds was ranked "1=".
"""

import json
import math
import re

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.power import TTestPower

from abl.analysis import answers, oneanswer, stats, verdicts


def _cell(key, vals, **levels):
    return stats.CellInput(key, key, vals, 0, settings={a: json.dumps(v) for a, v in levels.items()})


def _one_axis(seeds=3):
    """Three levels of one axis: a steady pair (a, b) and a noisy one (c), as the MQA grid had."""
    rng = np.random.default_rng(7)
    shared = rng.normal(0, 0.05, seeds)
    a = {s: 2.00 + shared[s] + rng.normal(0, 0.001) for s in range(seeds)}
    b = {s: 2.10 + shared[s] + rng.normal(0, 0.001) for s in range(seeds)}
    c = {s: 2.06 + shared[s] + rng.normal(0, 0.04) for s in range(seeds)}
    return [_cell("A", a, x="a"), _cell("B", b, x="b"), _cell("C", c, x="c")]


def test_a_one_axis_grid_answers_each_pair_once_by_its_paired_t():
    cells = _one_axis()
    (e,) = verdicts.axis_effects(cells, ["x"])
    assert e.design == "one-axis" and e.model.startswith("paired t across seeds")
    # the answer's figures are the paired t of the two cells, Holm over the 3 level pairs (scipy recomputed)
    raw = {}
    for x, y in [("a", "b"), ("a", "c"), ("b", "c")]:
        cx = next(c for c in cells if c.settings["x"] == json.dumps(x))
        cy = next(c for c in cells if c.settings["x"] == json.dumps(y))
        raw[frozenset((x, y))] = sps.ttest_rel(list(cx.values.values()), list(cy.values.values())).pvalue
    order = sorted(raw, key=raw.get)
    holm = {k: min(1.0, max((3 - i) * raw[j] for i, j in enumerate(order[:order.index(k) + 1])))
            for k in order}
    for c in e.contrasts:
        assert c.p_value == pytest.approx(raw[frozenset((c.a, c.b))])
        assert c.p_adjusted == pytest.approx(holm[frozenset((c.a, c.b))])
    # the per-cell table (each cell against the baseline A) shows the same verdict for the same pair
    an = stats.analyse(cells, stats.against_baseline([c.key for c in cells], "A"))
    answers.reconcile(cells, an, [e])
    level = {"A": "a", "B": "b", "C": "c"}
    for row in an.comparisons:
        x = next(c for c in e.contrasts if {c.a, c.b} == {level[row.a], level[row.b]})
        sign = 1 if x.a == level[row.a] else -1
        assert row.delta == pytest.approx(sign * x.delta) and row.p_adjusted == pytest.approx(x.p_adjusted)
        assert stats.verdict_word(row.verdict) in (stats.BETTER, stats.WORSE, stats.SAME) and row.model == e.model
        assert (row.verdict == x.verdict) if sign == 1 or x.verdict == stats.SAME else row.verdict != x.verdict
    # the cells' ranks are the levels' ranks
    assert {level[r.key]: r.rank for r in an.cells} == {lv.level: lv.rank for lv in e.levels}


def test_a_factorial_grids_per_cell_rows_are_diagnostics_not_second_verdicts():
    rng = np.random.default_rng(1)
    cells = []
    for n, dn in (("rms", 0.0), ("ln", 0.05)):
        for b, db in (("pre", 0.0), ("post", 0.1)):
            shared = {s: rng.normal(0, 0.02) for s in range(3)}
            cells.append(_cell(f"{n}-{b}", {s: 2.0 + dn + db + v + rng.normal(0, 0.003) for s, v in shared.items()},
                               norm=n, block=b))
    effects = verdicts.axis_effects(cells, ["norm", "block"])
    assert {e.design for e in effects} == {"factorial"}
    assert effects[0].model.startswith("pooled over block, paired by seed")
    an = stats.analyse(cells, stats.against_baseline([c.key for c in cells], "rms-pre"))
    answers.reconcile(cells, an, effects)
    for row in an.comparisons:
        assert row.role == stats.DIAGNOSTIC_ROLE and row.verdict.startswith(stats.DIAGNOSTIC)
        assert stats.verdict_word(row.verdict) == stats.DIAGNOSTIC  # the dashboard's word for it
    assert all(r.rank is None and r.rank_text == "per axis" for r in an.cells)


def test_the_mdd_is_at_the_verdicts_level_and_exact():
    """GELU - ReLU showed Δ 0.027 beside MDD 0.023 (alpha 0.05 unadjusted) and read 'not distinguishable'."""
    rng = np.random.default_rng(11)
    base = {s: 2.0 + rng.normal(0, 0.05) for s in range(4)}
    cells = [stats.CellInput("base", "base", base, 0)]
    for k, d in (("big", -0.08), ("mid", 0.03), ("zero", 0.0)):
        cells.append(stats.CellInput(k, k, {s: v + d + rng.normal(0, 0.01) for s, v in base.items()}, 0))
    an = stats.analyse(cells, stats.against_baseline([c.key for c in cells], "base"))
    for c in an.comparisons:
        level = 0.05 * c.p_value / c.p_adjusted
        assert c.level == pytest.approx(level) and 0.05 / 3 - 1e-12 <= c.level <= 0.05
        # statsmodels: a paired t of n = 4 at the verdict's level has 80% power at the MDD
        sd = c.se * math.sqrt(4)
        assert TTestPower().power(c.mdd / sd, nobs=4, alpha=level) == pytest.approx(0.8, abs=1e-6)
        # and so a difference above its MDD is never "not distinguishable" (the interval is at that level)
        if abs(c.delta) > c.mdd:
            assert c.verdict in (stats.BETTER, stats.WORSE)


def test_rows_with_too_few_seeds_show_no_adjusted_p_interval_or_mdd():
    """Rows with CI [+0.23, +0.66] and p (Holm) 0.024 read 'too few seeds to decide' (issue 40, item 3)."""
    cells = [stats.CellInput("a", "a", {0: 2.0, 1: 2.1}, 0), stats.CellInput("b", "b", {0: 2.44, 1: 2.55}, 0)]
    (c,) = stats.analyse(cells, [("b", "a")]).comparisons
    assert c.verdict.startswith(stats.TOO_FEW) and c.p_value is not None  # the raw p is still there
    assert (c.p_adjusted, c.ci_low, c.ci_high, c.mdd, c.level) == (None, None, None, None, None)
    assert c.ci_raw_low is not None  # kept for whoever wants the raw interval


def _rows_agree(an: stats.Analysis) -> None:
    """Each row's verdict against its numbers, by the rule the legend states."""
    legend = an.method
    assert "excludes 0 exactly when the verdict is better or worse" in legend
    assert f"fewer than {stats.MIN_SEEDS} seeds on a side: {stats.TOO_FEW}, with no adjusted p, no interval" in legend
    for c in an.comparisons:
        word = stats.verdict_word(c.verdict)
        if word in (stats.BETTER, stats.WORSE, stats.SAME):
            assert min(c.n_a, c.n_b) >= stats.MIN_SEEDS and c.p_adjusted is not None
            assert (c.p_adjusted < an.alpha) == (word != stats.SAME), c
            assert (c.ci_low > 0 or c.ci_high < 0) == (word != stats.SAME), c
            if c.mdd is not None and abs(c.delta) > c.mdd:
                assert word != stats.SAME, c
        elif word == stats.TOO_FEW:
            assert c.p_adjusted is None and c.ci_low is None and c.mdd is None, c


def test_every_rendered_row_follows_the_legend(tmp_path):
    """Render the terminal summary (stacked and Markdown) of a one-axis grid with 2- and 4-seed cells; parse
    each comparison's line and check its verdict against its interval and p (Holm)."""
    from rich.console import Console

    from abl.present import summary

    rng = np.random.default_rng(5)
    shared = rng.normal(0, 0.05, 4)
    cells = [_cell(k, {s: 2.0 + d + shared[s] + rng.normal(0, 0.01) for s in range(n)}, x=k)
             for k, d, n in (("a", 0.0, 4), ("b", 0.05, 4), ("c", 0.4, 2), ("d", 0.01, 4), ("e", -0.2, 4))]
    an = stats.analyse(cells, stats.against_baseline([c.key for c in cells], "a"))
    effects = verdicts.axis_effects(cells, ["x"])
    answers.reconcile(cells, an, effects)
    _rows_agree(an)
    for e in effects:
        _rows_agree(stats.Analysis([], e.contrasts, e.alpha, stats.HOLM, False, True))
    view = summary.View(title="g", metric="val_loss", cells=cells, numbers={c.key: i for i, c in enumerate(cells, 1)},
                        tables=[("val_loss", an, "each cell minus the baseline a")], extra=[], figures={}, lr=None,
                        effects=effects)
    lines = [ln for _, ln in summary.stacked_lines(view, 200)]
    text = "\n".join(lines)
    # the legend once
    assert text.count("Verdict: better or worse when") == 1
    # every listed row: verdict against its interval and p (Holm)
    listed = [ln for ln in lines if "verdict: " in ln and "Δ " in ln]
    assert listed
    for ln in listed:
        ci = re.search(r"CI \(Holm-adj\.\) \[([-+0-9.]+), ([-+0-9.]+)\]", ln)
        p = re.search(r"p \(Holm\) ([0-9.e-]+|<[0-9.e-]+)", ln)
        word = ln.split("verdict: ")[1]
        assert ci and p, ln
        lo, hi = float(ci.group(1)), float(ci.group(2))
        decided = word.startswith((stats.BETTER, stats.WORSE))
        assert decided == (lo > 0 or hi < 0), ln
        assert decided == (float(p.group(1).lstrip("<")) < 0.05), ln
    # the per-axis lines (a forest plot in words): each level's interval to the best against its verdict
    levels = [ln for ln in lines if "to the best, CI (Holm-adj.)" in ln]
    assert levels
    for ln in levels:
        lo, hi = (float(x) for x in re.search(r"\[([-+0-9.]+), ([-+0-9.]+)\]", ln).groups())
        assert ln.rstrip().endswith((stats.WORSE, stats.SAME)), ln
        assert (lo > 0 or hi < 0) == ln.rstrip().endswith(stats.WORSE), ln
    # the 2-seed cell's comparison is not listed as if it could decide; no rank for it
    assert "1 comparison not listed: too few seeds to decide (n=2" in text
    assert next(r for r in an.cells if r.key == "c").rank_text == "untested (n=2)"
    md = summary.as_md(view)
    assert md.count("Verdict: better or worse when") == 1
    console = Console(record=True, width=300)
    summary.show(console, view)
    assert console.export_text().count("Verdict: better or worse when") == 1


def test_a_one_axis_designs_figure_is_the_power_of_its_paired_t():
    """The design line states what the verdicts' own test can decide: for a one-axis grid each pair's paired t
    (the difference of two runs has sd sigma * sqrt(2)), Holm over the pairs; a simulation at the stated
    figure finds the planted pair in at least 80% of repetitions."""
    design = [stats.CellInput(k, k, {s: 0.0 for s in range(4)}, 0, settings={"x": json.dumps(k)}) for k in "pqr"]
    k = stats.detectable_by_design(design, ["x"])["x"].sigmas
    assert k is not None
    rng = np.random.default_rng(3)
    hits, reps = 0, 300
    for _ in range(reps):
        seed_fx = rng.normal(0, 1, 4)
        sim = [_cell(x, {s: {"p": 0.0, "q": k, "r": k / 2}[x] + seed_fx[s] + rng.normal() for s in range(4)}, x=x)
               for x in "pqr"]
        (e,) = verdicts.axis_effects(sim, ["x"])
        assert e.design == "one-axis" and e.model.startswith("paired t")
        pq = next(c for c in e.contrasts if {c.a, c.b} == {"p", "q"})
        hits += pq.verdict in (stats.BETTER, stats.WORSE)
    assert hits / reps >= 0.8 - 3 * np.sqrt(0.16 / reps)


def test_a_diagnostic_never_hides_that_a_pair_is_not_comparable():
    """A factorial grid's per-cell row flagged 'not comparable' (scored on other validation targets) keeps
    that verdict: only test verdicts become diagnostics."""
    rng = np.random.default_rng(2)
    cells = [_cell(f"{n}-{b}", {s: 2.0 + rng.normal(0, 0.01) for s in range(3)}, norm=n, block=b)
             for n in ("rms", "ln") for b in ("pre", "post")]
    effects = verdicts.axis_effects(cells, ["norm", "block"])
    an = stats.analyse(cells, stats.against_baseline([c.key for c in cells], "rms-pre"))
    an.comparisons[0].verdict = verdicts.NOT_COMPARABLE
    answers.reconcile(cells, an, effects)
    assert an.comparisons[0].verdict == verdicts.NOT_COMPARABLE and an.comparisons[0].role == stats.VERDICT
    assert all(c.role == stats.DIAGNOSTIC_ROLE for c in an.comparisons[1:])


def test_the_report_leads_with_the_answer_and_its_rows_follow_the_legend(tmp_path, monkeypatch):
    """abl report on a factorial grid: the per-axis section before the comparison, each level's interval to the
    best against its verdict, the per-cell rows as diagnostics with no rank, and the legend once."""
    import test_axis_effects as ax
    from test_report import parse_table

    from abl.present.report.runs import load_runs
    from abl.present.report.sections import build_report

    monkeypatch.chdir(tmp_path)
    grid, db, g = ax._store(tmp_path, ax.GRID, ax._norms_value)
    runs = load_runs(db, run_ids=[c.run_id for c in g.cells])
    rep = build_report(runs, source=str(grid), db_path=str(db), registry=None,
                       order=list(dict.fromkeys(c.cell_key for c in g.cells)), grid_raw=g.raw)
    md = rep.doc.markdown()
    assert md.index("## Per axis") < md.index("## Comparison")
    assert md.count("How to read the verdicts:") == 1 and md.count("Verdict: better or worse when") == 1
    levels = parse_table(md, "| axis | level |")
    assert levels
    for row in levels:
        if row["CI (Holm-adj.)"] in ("-", ""):
            continue
        lo, hi = (float(x) for x in row["CI (Holm-adj.)"].strip("[]").split(","))
        word = row["verdict against the best"]
        assert (lo > 0 or hi < 0) == (word in (stats.BETTER, stats.WORSE)), row
        assert (float(row["p (Holm)"].lstrip("<")) < 0.05) == (word in (stats.BETTER, stats.WORSE)), row
    for s in rep.stat_rows:
        assert s["rank"] is None and s["rank_text"] in ("per axis", "-")
        if not s["is_baseline"] and s["p_adjusted"] is not None:
            assert s["role"] == stats.DIAGNOSTIC_ROLE and s["verdict"].startswith(stats.DIAGNOSTIC)


def test_a_nested_axis_level_shared_by_several_cells_does_not_overwrite_their_rows():
    """Found on the MoE grid (routing, aux loss and capacity apply to the MoE cells only): the per-axis
    answer of ``model.ffn`` (pooled moe level against swiglu) was copied onto every 'MoE cell minus swiglu'
    row, so eight different cells showed one Δ. A level pair answers a row only when each level is that one
    cell; otherwise the row keeps its own paired test of its own two cells."""
    rng = np.random.default_rng(3)
    shared = rng.normal(0, 0.03, 3)
    dense = {s: 1.85 + shared[s] for s in range(3)}
    moe1 = {s: 1.85 + shared[s] + rng.normal(0, 0.002) for s in range(3)}
    moe2 = {s: 1.99 + shared[s] + rng.normal(0, 0.002) for s in range(3)}
    cells = [_cell("D", dense, ffn="swiglu"), _cell("M1", moe1, ffn="moe", routing="token_choice"),
             _cell("M2", moe2, ffn="moe", routing="expert_choice")]
    for c in cells[:1]:
        c.settings["routing"] = json.dumps(None)
    effects = verdicts.axis_effects(cells, ["ffn"], only="ffn")
    an = stats.analyse(cells, stats.against_baseline([c.key for c in cells], "D"))
    answers.reconcile(cells, an, effects)
    rows = {r.a: r for r in an.comparisons}
    assert rows["M1"].delta == pytest.approx(np.mean([moe1[s] - dense[s] for s in range(3)]))
    assert rows["M2"].delta == pytest.approx(np.mean([moe2[s] - dense[s] for s in range(3)]))
    # the axis is the question (its levels are not cells): the rows are diagnostics with their own figures,
    # and the cells are ranked per axis, as in a factorial grid
    assert all(r.role == stats.DIAGNOSTIC_ROLE for r in rows.values())
    assert {r.unranked for r in an.cells} == {"per axis"}


def test_an_axis_nested_in_one_level_is_answered_among_the_cells_where_it_applies():
    """MoE's routing applies to the MoE cells only: the swiglu cell does not hold it, so the whole grid's
    model had no term for it and the summary never answered the axis its header says it decides."""
    rng = np.random.default_rng(5)
    shared = rng.normal(0, 0.03, 3)

    def vals(mean):
        return {s: mean + shared[s] + rng.normal(0, 0.002) for s in range(3)}

    cells = [_cell("D", vals(1.85), ffn="swiglu"),
             _cell("T", vals(1.95), ffn="moe", routing="token_choice"),
             _cell("E", vals(1.88), ffn="moe", routing="expert_choice")]
    effects = {e.axis: e for e in verdicts.axis_effects(cells, ["ffn", "routing"])}
    assert set(effects) == {"ffn", "routing"}
    r = effects["routing"]
    assert r.best.level == "expert_choice" and "token_choice" in r.verdict() and "better" in r.verdict()
    assert "among the 2 cells where it applies (ffn = moe)" in r.note
    # the paired t of the two MoE cells, as a one-axis grid answers a pair (scipy recomputed)
    raw = sps.ttest_rel(list(cells[1].values.values()), list(cells[2].values.values())).pvalue
    assert r.contrasts[0].p_value == pytest.approx(raw)


def test_no_per_axis_verdict_on_a_per_token_loss_across_tokenizers():
    """Found on the tokenizers grid: the per-cell rows refused val_loss across tokenizers, but the per-axis
    answer above them called bytes better than BPE on nats per token. Now every axis says why it has no
    verdict and which metric compares; val_bpb still gets its answer."""
    rng = np.random.default_rng(9)

    def vals(mean):
        return {s: mean + rng.normal(0, 0.01) for s in range(3)}

    cells = [_cell("B", vals(2.0), **{"data.tokenizer": "byte"}),
             _cell("P", vals(4.4), **{"data.tokenizer": "bpe", "tokenizer.bpe.vocab_size": 1024}),
             _cell("Q", vals(5.1), **{"data.tokenizer": "bpe", "tokenizer.bpe.vocab_size": 4096})]
    paths = ["data.tokenizer", "tokenizer.bpe.vocab_size"]
    effects = verdicts.axis_effects(cells, paths, "val_loss")
    assert {e.axis for e in effects} == set(paths)
    assert all(e.best is None and "compare val_bpb" in e.note for e in effects)
    assert verdicts.verdict_lines(effects) == []
    bpb = verdicts.axis_effects(cells, paths, "val_bpb")
    assert all(e.best is not None for e in bpb)


def test_the_one_answer_is_built_in_one_place_and_a_model_that_cannot_fit_is_tolerated_only_when_asked(monkeypatch):
    """oneanswer.answered: the summary, abl compare and the dashboard's Compare page take their answer from it (the
    page used to recompute the per-axis answers and reconcile a copy of its cached analysis itself)."""
    cells = _one_axis()

    def analyse_runs(runs, **kw):
        return cells, stats.analyse(cells, stats.against_baseline([c.key for c in cells], "A")), "each against A"

    monkeypatch.setattr(oneanswer, "analyse_runs", analyse_runs)
    answer = oneanswer.answered([], paths=["x"])
    (e,) = answer.effects
    assert answer.what == "each against A" and not answer.effects_problem
    assert all(row.model == e.model for row in answer.analysis.comparisons)  # reconciled with the axis's answer
    assert oneanswer.answered([], paths=["x"], pairs=("A,B",)).effects == []  # chosen pairs are their own question

    def cannot_fit(*args, **kwargs):
        raise np.linalg.LinAlgError("Singular matrix")

    monkeypatch.setattr(oneanswer, "axis_effects", cannot_fit)
    with pytest.raises(np.linalg.LinAlgError):
        oneanswer.answered([], paths=["x"])
    tolerated = oneanswer.answered([], paths=["x"], tolerate=True)
    assert tolerated.effects == [] and tolerated.effects_problem == "LinAlgError: Singular matrix"
    assert [r.key for r in tolerated.analysis.cells] == ["A", "B", "C"]
    # the per-cell verdicts stand, under their own test's name
    assert all(row.verdict and stats.verdict_word(row.verdict) != stats.DIAGNOSTIC and row.model != e.model
               for row in tolerated.analysis.comparisons)
