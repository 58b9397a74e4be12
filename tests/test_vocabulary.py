"""One vocabulary that cannot contradict itself (issue 26): intervals adjusted the way the verdicts are, no
detectable difference from fewer than 3 seeds, ranks as tie groups, and the dashboard's words are the CLI's."""

from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from abl.analysis import stats

ROOT = Path(__file__).resolve().parents[1]


def _cells(values):
    return [stats.CellInput(k, k, dict(v), 0) for k, v in values.items()]


BASE = {0: 2.00, 1: 2.04, 2: 1.97, 3: 2.02, 4: 1.99}
# per-seed differences to the base: one clear gain, one raw p ~ 0.02 that Holm over 4 does not keep, two nulls
DIFFS = {"clear": [-0.10, -0.11, -0.09, -0.10, -0.105], "edge": [0.03, 0.01, 0.025, 0.005, 0.02],
         "null1": [0.01, -0.01, 0.0, 0.005, -0.005], "null2": [-0.02, 0.01, 0.015, -0.01, 0.0]}


def _family():
    values = {"base": BASE, **{k: {s: BASE[s] + d for s, d in zip(BASE, ds)} for k, ds in DIFFS.items()}}
    return values, stats.analyse(_cells(values), stats.against_baseline(list(values), "base"))


def test_intervals_are_adjusted_like_the_verdicts():
    values, an = _family()
    edge = next(c for c in an.comparisons if c.a == "edge")
    # the finding: the raw 95% interval excludes 0 while the Holm verdict is "not distinguishable"
    raw = sps.ttest_rel([values["edge"][s] for s in BASE], list(BASE.values()))
    lo, hi = raw.confidence_interval(0.95)
    assert lo > 0 and edge.p_value == pytest.approx(raw.pvalue) and edge.verdict == stats.SAME
    assert (edge.ci_raw_low, edge.ci_raw_high) == (pytest.approx(lo), pytest.approx(hi))
    for c in an.comparisons:
        excludes = c.ci_low > 0 or c.ci_high < 0
        assert excludes == (c.verdict in (stats.BETTER, stats.WORSE)), c
    # the interval is the t-interval at Holm's step level alpha * p / p_Holm
    level = 0.05 * edge.p_value / edge.p_adjusted
    d = np.array(DIFFS["edge"])
    hw = sps.t.ppf(1 - level / 2, 4) * d.std(ddof=1) / np.sqrt(5)
    assert (edge.ci_low, edge.ci_high) == (pytest.approx(d.mean() - hw), pytest.approx(d.mean() + hw))
    assert edge.ci_level == pytest.approx(1 - level)
    assert "Holm-adjusted" in an.interval and "Holm" in an.interval_header and an.interval in an.method
    # without a correction both are raw, and the table says so
    plain = stats.analyse(_cells(values), stats.against_baseline(list(values), "base"), correction="none")
    e = next(c for c in plain.comparisons if c.a == "edge")
    assert (e.ci_low, e.ci_high) == (pytest.approx(lo), pytest.approx(hi)) and e.verdict == stats.WORSE
    assert plain.interval_header == "95% CI" and "unadjusted" in plain.method


def test_bootstrap_intervals_follow_holm_too():
    values, _ = _family()
    an = stats.analyse(_cells(values), stats.against_baseline(list(values), "base"), bootstrap=True)
    assert an.comparisons and all(c.test.startswith("bootstrap") for c in an.comparisons)
    for c in an.comparisons:  # the bootstrap p inverts the percentile interval, so they agree too
        assert (c.ci_low > 0 or c.ci_high < 0) == (c.verdict in (stats.BETTER, stats.WORSE)), c


def test_no_detectable_difference_from_fewer_than_three_seeds():
    # the case: a clear difference on 2 seeds, a variance with one degree of freedom
    two = {"base": {0: 2.10, 1: 2.30}, "cell": {0: 2.056, 1: 2.26}}
    comp = stats.analyse(_cells(two), [("cell", "base")]).comparisons[0]
    assert comp.verdict.startswith(stats.TOO_FEW) and "n=2" in comp.verdict
    assert comp.mdd is None and "detectable" not in comp.verdict
    three = {"base": {0: 2.10, 1: 2.30, 2: 2.2}, "cell": {0: 2.056, 1: 2.26, 2: 2.17}}
    assert stats.analyse(_cells(three), [("cell", "base")]).comparisons[0].mdd > 0


def test_ranks_are_tie_groups():
    rng = np.random.default_rng(3)
    seed = {s: rng.normal(0, 0.03) for s in range(4)}
    noise = lambda: rng.normal(0, 0.002)  # noqa: E731
    values = {"relu": {s: 2.10 + v + noise() for s, v in seed.items()},
              "swiglu": {s: 2.00 + v + noise() for s, v in seed.items()},
              "geglu": {s: 2.0001 + v + noise() for s, v in seed.items()}}
    an = stats.analyse(_cells(values), stats.against_baseline(list(values), "relu"))
    sw, ge, re = an.cell("swiglu"), an.cell("geglu"), an.cell("relu")
    assert sw.rank == ge.rank == 1 and sw.tied and ge.tied  # 0.0001 apart: not ranked 1 and 2
    assert re.rank == 3 and not re.tied
    assert sw.group == ge.group == "a" and re.group == "b"
    assert sw.rank_text == "1= (a)" and re.rank_text == "3 (b)"
    # two seeds decide nothing (issue 40, item 1): no cell is ranked, each says why, none reads "tied for best"
    two = {k: {s: v[s] for s in (0, 1)} for k, v in values.items()}
    rows = stats.analyse(_cells(two), []).cells
    assert {r.rank for r in rows} == {None} and {r.rank_text for r in rows} == {"untested (n=2)"}


def test_letters_of_overlapping_groups():
    # a ~ b, b ~ c, a vs c distinguishable: a "a", b "ab", c "b"
    assert stats.letters(3, {(0, 2)}) == ["a", "ab", "b"]
    assert stats.letters(3, set()) == ["", "", ""]
    assert stats.letters(3, {(0, 1), (0, 2), (1, 2)}) == ["a", "b", "c"]


def test_dashboard_writes_the_words_of_the_cli():
    import importlib

    charts = importlib.import_module("abl.dashboard.charts")
    assert list(charts.SIGNIFICANCE.domain) == list(stats.VERDICT_WORDS)
    for verdict in ("too few seeds to decide (n=2; at least 3 seeds per cell give a verdict)",
                    "did not learn (a)", "better", "not distinguishable", "baseline"):
        assert stats.verdict_word(verdict) in stats.VERDICT_WORDS
    assert stats.verdict_word("too few seeds to decide (n=2)") == stats.TOO_FEW
    from abl.analysis.verdicts import NOT_COMPARABLE

    assert stats.verdict_word(NOT_COMPARABLE) == stats.NOT_COMPARABLE  # a colour of its own, not a stray word
    for path in ("dashboard/views/compare.py", "dashboard/charts.py"):
        text = (ROOT / path).read_text()
        assert "n.s." not in text and "not significant" not in text and "stars(" not in text, path


def test_method_sentence_does_not_claim_a_correction_over_nothing():
    """The footer read "Holm correction over the 0 comparisons" when no comparison had a p-value (one seed)."""
    two = {"base": {0: 2.10}, "cell": {0: 2.056}, "other": {0: 2.2}}
    an = stats.analyse(_cells(two), stats.against_baseline(list(two), "base"))
    assert all(c.p_value is None for c in an.comparisons)
    assert "over the 0" not in an.method and "no comparison has a p-value" in an.method
    one = {"base": {0: 2.1, 1: 2.3, 2: 2.2}, "cell": {0: 2.0, 1: 2.2, 2: 2.12}}
    assert "over the 1 comparison that can be decided" in stats.analyse(_cells(one), [("cell", "base")]).method
