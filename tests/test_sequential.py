"""Seeds until decided (issue 41, item 4): the group-sequential test holds its error rate under repeated looks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from abl.analysis import sequential as sq
from abl.analysis.stats.ttest import paired


def _reject_rate_null(design, paths=6000, seed=7, repeated_naive=False):
    """Simulate fresh null sequences (not the calibration's) and look at every planned look."""
    rng = np.random.default_rng(seed)
    d = rng.standard_normal((paths, design.max_seeds)) * 0.03  # a loss difference's scale: sd 0.03 nats
    rejected = 0
    for row in d:
        for j, n in enumerate(design.looks):
            if repeated_naive:
                p = paired(dict(enumerate(row[:n])), dict(enumerate(np.zeros(n))))["p"]
                if p < design.alpha:
                    rejected += 1
                    break
            else:
                look = sq.decide(dict(enumerate(row[:n])), dict(enumerate(np.zeros(n))), design)
                if look.decision in (sq.BETTER, sq.WORSE):
                    rejected += 1
                    break
    return rejected / paths


def test_false_positive_rate_under_the_null_stays_at_alpha_with_repeated_looks():
    design = sq.plan(sq.looks_for(10), 0.05)
    rate = _reject_rate_null(design)
    se = math.sqrt(0.05 * 0.95 / 6000)
    assert rate <= 0.05 + 3 * se, rate
    assert rate >= 0.05 - 4 * se, rate  # not needlessly conservative either
    # the same looks with a plain t-test at each: the inflation the design exists to prevent
    naive = _reject_rate_null(design, repeated_naive=True)
    assert naive > 0.09, naive


def test_planted_effect_is_found_with_fewer_seeds_than_a_fixed_design_of_the_same_power():
    effect = 1.0  # mean difference of one sd of the per-seed differences
    fixed = sq.seeds_needed(1.0, effect, alpha=0.05)
    assert fixed is not None
    design = sq.plan(sq.looks_for(fixed + 2), 0.05)
    oc = sq.operating_characteristics(design, effect, paths=20_000, seed=3)
    assert oc.reject >= 0.8, oc  # at least the fixed design's power
    assert oc.expected_seeds < fixed, (oc.expected_seeds, fixed)


def test_bounds_decrease_towards_the_fixed_design_and_spend_alpha_in_full():
    design = sq.plan((3, 4, 5, 6, 8, 10), 0.05)
    finite = [b for b in design.bounds if math.isfinite(b)]
    assert finite == sorted(finite, reverse=True)
    assert design.spent[-1] == pytest.approx(0.05)
    assert all(b >= a for a, b in zip(design.spent, design.spent[1:]))
    # the last bound is above the fixed design's critical t (some alpha was spent earlier), but not by much
    from scipy import stats as sps
    assert sps.t.ppf(0.975, 9) < design.bounds[-1] < sps.t.ppf(0.995, 9)


def test_decide_uses_the_last_planned_look_and_names_the_decision():
    design = sq.plan((3, 5, 8), 0.05)
    a = {s: 1.0 + 0.001 * s for s in range(6)}  # 6 seeds: looked at as the 5-seed look
    b = {s: 1.5 + 0.002 * (s % 2) for s in range(6)}
    look = sq.decide(a, b, design)
    assert look.seeds == 5 and look.decision == sq.BETTER and "better at 5 seeds" in look.sentence()
    noise = np.random.default_rng(0).standard_normal(8) * 0.1
    last = sq.decide(dict(enumerate(noise)), dict(enumerate(np.zeros(8))), design)
    assert last.seeds == 8 and last.decision in (sq.SAME, sq.BETTER, sq.WORSE)
    early = sq.decide(dict(enumerate(noise[:3])), dict(enumerate(np.zeros(3))), design)
    assert early.decision in (sq.CONTINUE, sq.BETTER, sq.WORSE)
    with pytest.raises(sq.SequentialPlanError):
        sq.decide({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0}, design)


def test_bad_looks_are_refused():
    for looks in [(), (2, 3), (4, 4), (5, 4)]:
        with pytest.raises(sq.SequentialPlanError):
            sq.plan(looks)


def test_a_family_of_comparisons_shares_alpha():
    one, three = sq.family_plan(1, 8), sq.family_plan(3, 8)
    assert three.alpha == pytest.approx(0.05 / 3)
    assert three.bounds[-1] > one.bounds[-1]
