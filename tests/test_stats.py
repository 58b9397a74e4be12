"""Multi-seed statistics against scipy's reference implementations."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from abl.analysis import stats


def test_summary_matches_a_t_interval():
    vals = {0: 3.10, 1: 3.25, 2: 3.17, 3: 3.30}
    s = stats.summarize(vals)
    x = np.array(list(vals.values()))
    lo, hi = sps.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=sps.sem(x))
    assert s.n == 4
    assert s.mean == pytest.approx(x.mean())
    assert s.std == pytest.approx(x.std(ddof=1))
    assert (s.ci_low, s.ci_high) == (pytest.approx(lo), pytest.approx(hi))
    assert s.ci_halfwidth == pytest.approx(hi - x.mean())


def test_summary_of_one_value_has_no_spread_and_non_finite_values_are_dropped():
    s = stats.summarize({0: 2.5, 1: float("nan"), 2: float("inf")})
    assert (s.n, s.mean, s.std, s.ci_low, s.ci_high) == (1, 2.5, None, None, None)
    assert stats.summarize([]).mean is None


def test_paired_comparison_is_scipys_paired_t_test():
    base = {0: 3.00, 1: 3.10, 2: 2.95, 3: 3.05}
    cell = {0: 2.96, 1: 3.07, 2: 2.93, 3: 3.00}
    c = stats.compare(cell, base)
    ref = sps.ttest_rel(list(cell.values()), list(base.values()))
    d = np.array(list(cell.values())) - np.array(list(base.values()))
    lo, hi = sps.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=sps.sem(d))
    assert c.test == "paired t (n=4)"
    assert c.p_value == pytest.approx(ref.pvalue)
    assert c.delta == pytest.approx(d.mean())
    assert (c.ci_low, c.ci_high) == (pytest.approx(lo), pytest.approx(hi))
    assert c.verdict == ("better" if ref.pvalue < 0.05 else stats.SAME)


def test_welch_when_seeds_differ_is_scipys_welch_test():
    base = {0: 3.00, 1: 3.10, 2: 2.95}
    cell = {5: 3.20, 6: 3.31, 7: 3.26, 8: 3.18}
    c = stats.compare(cell, base)
    a, b = list(cell.values()), list(base.values())
    ref = sps.ttest_ind(a, b, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert c.test == "Welch t"
    assert c.p_value == pytest.approx(ref.pvalue)
    assert c.df == pytest.approx(ref.df)
    assert (c.ci_low, c.ci_high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert c.verdict == "worse"  # higher loss, p < 0.05


def test_pairing_can_be_refused():
    base = {0: 3.0, 1: 3.1, 2: 2.9}
    cell = {0: 3.01, 1: 3.12, 2: 2.92}
    paired = stats.compare(cell, base)
    welch = stats.compare(cell, base, paired=False)
    assert paired.test.startswith("paired") and welch.test == "Welch t"
    # the shared seed-to-seed variance cancels when paired
    assert paired.p_value < 0.05 < welch.p_value


def test_verdicts():
    base = {i: 3.0 + 0.01 * (i % 3) for i in range(6)}
    assert stats.compare({i: v - 0.5 for i, v in base.items()}, base).verdict == "better"
    assert stats.compare({i: v + 0.5 for i, v in base.items()}, base).verdict == "worse"
    noisy = {i: v + (0.05 if i % 2 else -0.05) for i, v in base.items()}
    assert stats.compare(noisy, base).verdict == "not distinguishable"
    # higher is better for accuracy-like metrics
    assert stats.compare({i: v + 0.5 for i, v in base.items()}, base, lower_is_better=False).verdict == "better"


def test_fewer_than_two_seeds_gives_no_test_and_says_so():
    c = stats.compare({0: 2.9}, {0: 3.0})
    assert c.p_value is None and c.delta == pytest.approx(-0.1)
    assert c.verdict.startswith("too few seeds to decide") and "n=1" in c.verdict
    assert "no variance estimate" in c.note


def test_identical_differences_do_not_divide_by_zero():
    base = {0: 3.0, 1: 3.1, 2: 3.2}
    same = stats.compare(dict(base), base)
    shifted = stats.compare({k: v - 0.1 for k, v in base.items()}, base)
    assert (same.p_value, same.verdict) == (1.0, stats.SAME)
    assert shifted.p_value == 0.0 and shifted.verdict == "better"
    assert math.isclose(shifted.ci_low, -0.1) and math.isclose(shifted.ci_high, -0.1)


def test_compare_cells_pairs_only_cells_on_the_same_data():
    values = {"a": {0: 3.0, 1: 3.1, 2: 2.9}, "b": {0: 2.9, 1: 3.0, 2: 2.8}, "c": {0: 2.9, 1: 3.0, 2: 2.8}}
    res = stats.compare_cells(values, "a", data_keys={"a": "d1", "b": "d1", "c": "d2"})
    assert [r.key for r in res] == ["a", "b", "c"]
    assert res[0].comparison.verdict == "baseline"
    assert res[1].comparison.test.startswith("paired")
    assert res[2].comparison.test == "Welch t" and "not paired" in res[2].comparison.note
    with pytest.raises(KeyError):
        stats.compare_cells(values, "zzz")


def test_formatting():
    assert stats.fmt(1.23456) == "1.2346" and stats.fmt(None) == "-" and stats.fmt(float("nan")) == "-"
    assert stats.fmt_p(0.00001) == "<0.0001" and stats.fmt_p(0.5) == "0.5000"


def test_one_welch_and_one_paired_implementation_serve_cli_and_dashboard():
    # the dashboard's vectorised Welch (from per-cell summaries) is the CLI's Welch
    a, b = [3.20, 3.31, 3.26, 3.18], [3.00, 3.10, 2.95]
    diff, lo, hi, p, df = stats.welch_test(a, b)
    w = stats.welch(np.mean(a), np.std(a, ddof=1), len(a), np.mean(b), np.std(b, ddof=1), len(b))
    assert (float(w["diff"]), float(w["diff_lo"]), float(w["diff_hi"]), float(w["p"]), float(w["dof"])) == \
        pytest.approx((diff, lo, hi, p, df))
    vec = stats.welch(np.array([np.mean(a), np.mean(b)]), np.array([np.std(a, ddof=1), np.std(b, ddof=1)]),
                      np.array([len(a), len(b)]), np.mean(b), np.std(b, ddof=1), len(b))
    assert vec["p"][0] == pytest.approx(p) and vec["diff"][1] == 0.0
    cell, base = {0: 2.96, 1: 3.07, 2: 2.93}, {0: 3.00, 1: 3.10, 2: 2.95, 7: 9.0}
    r = stats.paired(cell, base)
    assert (r["diff"], r["diff_lo"], r["diff_hi"], r["p"], r["pairs"]) == \
        pytest.approx(stats.paired_test(cell, base))


def test_zero_spread_is_exact_for_the_cli_and_untested_for_the_dashboard():
    # the callers keep their behaviour: the CLI calls a shift with no spread certain, the dashboard n/a
    base = {0: 3.0, 1: 3.1, 2: 3.2}
    shifted = {k: v - 0.1 for k, v in base.items()}
    assert stats.paired_test(shifted, base)[3] == 0.0 and math.isnan(stats.paired(shifted, base)["p"])
    assert stats.welch_test([1.0, 1.0], [1.0, 1.0]) == (0.0, 0.0, 0.0, 1.0, 2.0)
    assert stats.welch_test([2.0, 2.0], [1.0, 1.0])[3] == 0.0
    assert np.isnan(stats.welch(2.0, 0.0, 2, 1.0, 0.0, 2)["p"])
    assert stats.stars(float(stats.welch(2.0, 0.0, 2, 1.0, 0.0, 2)["p"])) == "n/a"


def test_summaries_of_dicts_and_of_frames_give_the_same_interval():
    pd = pytest.importorskip("pandas")
    vals = {0: 3.10, 1: 3.25, 2: 3.17}
    s = stats.summarize(vals)
    g = stats.summarize_groups(pd.DataFrame({"cell": ["a"] * 3, "value": list(vals.values())}), "cell").iloc[0]
    assert (g["n"], g["mean"], g["std"], g["ci_lo"], g["ci_hi"]) == \
        pytest.approx((s.n, s.mean, s.std, s.ci_low, s.ci_high))


# ---------------------------------------------------------------- the verdict engine (stats.analyse)


def _cells(values, data=None, flagged=()):
    return [stats.CellInput(k, k, v, (data or {}).get(k, "d"),
                            stats.Health(runs=len(v), did_not_learn=len(v) if k in flagged else 0, floor=3.26))
            for k, v in values.items()]


def test_holm_over_the_comparisons_shown_decides_the_verdicts():
    rng = np.random.default_rng(3)
    seeds = range(5)
    base = {s: 3.0 + rng.normal(0, 0.05) for s in seeds}
    values = {"base": base,
              "a": {s: v - 0.03 + rng.normal(0, 0.01) for s, v in base.items()},
              "b": {s: v + 0.01 + rng.normal(0, 0.01) for s, v in base.items()},
              "c": {s: v + 0.2 + rng.normal(0, 0.01) for s, v in base.items()}}
    an = stats.analyse(_cells(values), stats.against_baseline(list(values), "base"))
    raw = [sps.ttest_rel([values[k][s] for s in seeds], [base[s] for s in seeds]).pvalue for k in "abc"]
    # Holm by hand: sort, multiply by (m - rank), running max, cap at 1
    order = np.argsort(raw)
    adj = np.empty(3)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (3 - rank) * raw[i]))
        adj[i] = running
    for comp, p, pa in zip(an.comparisons, raw, adj):
        assert comp.test == "paired t (n=5)"
        assert comp.p_value == pytest.approx(p) and comp.p_adjusted == pytest.approx(pa)
        assert comp.verdict == (stats.SAME if not pa < 0.05 else "better" if comp.delta < 0 else "worse")
    assert "Holm" in an.method and "paired" in an.method
    # the same table without a correction says so and uses the raw p
    plain = stats.analyse(_cells(values), stats.against_baseline(list(values), "base"), correction="none")
    assert "no multiple-comparison correction" in plain.method
    assert [c.p_adjusted for c in plain.comparisons] == pytest.approx(raw)


def test_two_seeds_are_too_few_to_decide_and_state_no_detectable_difference():
    # a +0.84-nat gap on 2 seeds: t has 1 df, so the design cannot decide
    values = {"base": {0: 2.10, 1: 2.30}, "cell": {0: 2.90, 1: 3.18}}
    comp = stats.analyse(_cells(values), [("cell", "base")]).comparisons[0]
    assert comp.verdict.startswith(stats.TOO_FEW) and "n=2" in comp.verdict
    # no detectable difference from a variance with one degree of freedom (issue 26)
    assert comp.mdd is None and "detectable" not in comp.verdict
    # a bimodal cell on 2 seeds is not "not distinguishable" either
    wide = {"base": {0: 2.0, 1: 2.1}, "cell": {0: -3.0, 1: 8.0}}
    assert stats.analyse(_cells(wide), [("cell", "base")]).comparisons[0].verdict.startswith(stats.TOO_FEW)


def test_seeds_needed_reaches_the_requested_power():
    sd, effect = 0.02, 0.02
    n = stats.seeds_needed(sd, effect, paired=True)
    assert n is not None and n >= stats.MIN_SEEDS
    # at n the exact power (noncentral t) reaches 80%, at n - 1 it does not
    def power(k):
        df, ncp = k - 1, effect / (sd / np.sqrt(k))
        crit = sps.t.ppf(0.975, df)
        return sps.nct.sf(crit, df, ncp) + sps.nct.cdf(-crit, df, ncp)
    assert power(n) >= 0.8 and (n == stats.MIN_SEEDS or power(n - 1) < 0.8)
    # Welch needs more than paired; more comparisons (Holm's alpha / m) need more
    assert stats.seeds_needed(sd, effect, paired=False) > n
    assert stats.seeds_needed(sd, effect, comparisons=10) > n
    # a Monte-Carlo check of the paired figure
    rng = np.random.default_rng(0)
    hits = np.mean([sps.ttest_1samp(rng.normal(effect, sd, n), 0).pvalue < 0.05 for _ in range(2000)])
    assert hits == pytest.approx(0.8, abs=0.05) or hits > 0.8


def test_bootstrap_ci_is_seeded_and_brackets_the_difference():
    rng = np.random.default_rng(1)
    base = {s: 3.0 + rng.normal(0, 0.05) for s in range(8)}
    cell = {s: v - 0.1 + rng.exponential(0.02) for s, v in base.items()}
    a = stats.analyse(_cells({"base": base, "cell": cell}), [("cell", "base")], bootstrap=True)
    b = stats.analyse(_cells({"base": base, "cell": cell}), [("cell", "base")], bootstrap=True)
    ca = a.comparisons[0]
    assert ca.test.startswith("bootstrap (paired")
    assert (ca.ci_low, ca.ci_high, ca.p_value) == (b.comparisons[0].ci_low, b.comparisons[0].ci_high,
                                                    b.comparisons[0].p_value)
    d = np.array([cell[s] - base[s] for s in base])
    assert ca.ci_low < d.mean() < ca.ci_high < 0
    assert ca.verdict == "better" and "bootstrap" in a.method
    # against a direct resampling of the differences
    boot = d[np.random.default_rng(stats.BOOTSTRAP_SEED).integers(0, 8, (stats.BOOTSTRAP_RESAMPLES, 8))].mean(1)
    assert (ca.ci_low, ca.ci_high) == pytest.approx(tuple(np.quantile(boot, [0.025, 0.975])))


def test_a_cell_that_did_not_learn_is_not_ranked_or_tested():
    values = {"base": {0: 2.0, 1: 2.05, 2: 2.02}, "stuck": {0: 3.21, 1: 3.22, 2: 3.20},
              "good": {0: 1.9, 1: 1.95, 2: 1.93}}
    an = stats.analyse(_cells(values, flagged={"stuck"}), stats.against_baseline(list(values), "base"))
    assert an.cell("stuck").rank is None and "did not learn" in an.cell("stuck").status
    assert (an.cell("good").rank, an.cell("base").rank) == (1, 2)
    stuck = next(c for c in an.comparisons if c.a == "stuck")
    assert stuck.verdict.startswith(stats.DID_NOT_LEARN) and stuck.p_value is None
    # it does not count in the Holm family either
    good = next(c for c in an.comparisons if c.a == "good")
    assert good.p_adjusted == pytest.approx(good.p_value)


def test_by_axis_pairs_cells_that_differ_in_that_axis_only():
    cells = [stats.CellInput(f"{f}/{n}", f"{f}/{n}", {}, settings={"model.ffn": f, "model.norm": n})
             for f in ("relu", "gelu", "swiglu") for n in ("rms", "ln")]
    pairs = stats.by_axis(cells, "model.ffn")
    assert len(pairs) == 6  # 3 ffn pairs x 2 norms
    assert all(a.split("/")[1] == b.split("/")[1] and a != b for a, b in pairs)


def test_every_name_used_from_abl_analysis_stats_is_its_public_api():
    """abl.analysis.stats is one public name over its rooms: every ``stats.X`` (where ``stats`` is
    abl.analysis.stats) and ``from abl.analysis.stats import X`` in harness/, dashboard/ and tests/
    names an attribute it lists in ``__all__``."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    imports_the_module = ("from abl.analysis import stats", "from ..analysis import stats", "from . import stats",
                          "from ..analysis import stats, ")
    used: dict[str, str] = {}
    for folder in ("harness", "dashboard", "tests"):
        for path in (root / folder).rglob("*.py"):
            if "stats" in path.relative_to(root).parts[:-1]:
                continue  # the package itself
            text = path.read_text()
            as_module = any(line.strip().startswith(imports_the_module) for line in text.splitlines())
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("analysis.stats"):
                    used.update({a.name: str(path.relative_to(root)) for a in node.names})
                elif as_module and isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                        and node.value.id == "stats" and not node.attr.startswith("__"):
                    used[node.attr] = str(path.relative_to(root))
    assert len(used) >= 30, sorted(used)  # the scan found the users (present, dashboard, verdicts, tests)
    missing = {name: where for name, where in used.items() if name not in stats.__all__}
    assert not missing, f"used but not in abl.analysis.stats.__all__: {missing}"
    assert all(hasattr(stats, name) for name in stats.__all__)
