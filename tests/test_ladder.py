"""Does it hold at scale (issue 41, item 5): planted crossovers are recovered, planted non-crossings are not invented."""

from __future__ import annotations

import math

import numpy as np
import pytest

from abl.analysis import ladder as ld

COMPUTES = [1e13, 1e14, 1e15, 1e16]


def _ladder(laws, *, seeds=5, noise=0.004, seed=0):
    """Losses from known power laws L = exp(log_a) C^-b plus seed noise (shared per seed and size, as data order is)."""
    rng = np.random.default_rng(seed)
    out = {v: {} for v in laws}
    for c in COMPUTES:
        common = rng.standard_normal(seeds) * noise  # what a seed's data order does to every variant
        for v, (log_a, b) in laws.items():
            own = rng.standard_normal(seeds) * noise * 0.5
            out[v][f"size{COMPUTES.index(c)}"] = (c, {s: float(math.exp(log_a - b * math.log(c)) + common[s] + own[s])
                                                     for s in range(seeds)})
    return out


def _crossing(l1, l2):
    return math.exp((l1[0] - l2[0]) / (l1[1] - l2[1]))


def test_a_planted_crossover_is_recovered_within_its_interval():
    # "wide" is worse small and better large (a steeper law); the true fits cross at about 3.2e14
    laws = {"narrow": (math.log(9.0), 0.060), "wide": (math.log(9.0) + 0.01 * 33.4, 0.070)}
    true = _crossing(laws["narrow"], laws["wide"])
    assert COMPUTES[0] < true < COMPUTES[-1]
    res = ld.analyse_ladder(_ladder(laws), resamples=500)
    pair = res.pairs[0]
    assert pair.verdict == ld.FLIPS, pair.sentence()
    assert pair.in_range and pair.crossing_interval is not None
    lo, hi = pair.crossing_interval
    assert lo <= true <= hi, (lo, true, hi)
    assert pair.crossing == pytest.approx(true, rel=1.0)
    assert "flips near" in pair.sentence()


def test_a_planted_non_crossing_reads_no_crossing_in_range():
    laws = {"a": (math.log(9.0), 0.060), "b": (math.log(9.3), 0.060)}  # parallel: b worse by ~3% everywhere
    res = ld.analyse_ladder(_ladder(laws), resamples=500, target=1e18)
    pair = res.pairs[0]
    assert pair.verdict == ld.HOLDS, pair.sentence()
    assert not pair.in_range
    assert "no crossing in range" in pair.sentence()
    # the prediction at a compute beyond the ladder keeps the sign, with an interval that says so
    lo, hi = pair.predicted_interval
    assert pair.predicted_delta < 0 and hi < 0


def test_undecided_sizes_give_undetermined_not_a_verdict():
    laws = {"a": (math.log(9.0), 0.060), "b": (math.log(9.0), 0.060)}  # no difference at all
    res = ld.analyse_ladder(_ladder(laws, noise=0.01), resamples=200)
    assert res.pairs[0].verdict == ld.UNDETERMINED
    assert "not decided" in res.pairs[0].reason or "cross" in res.pairs[0].reason


def test_rank_agreement_across_sizes_with_an_interval():
    laws = {"a": (math.log(9.0), 0.060), "b": (math.log(9.4), 0.060), "c": (math.log(9.8), 0.060)}
    res = ld.analyse_ladder(_ladder(laws), resamples=300)
    assert res.rank_agreement == pytest.approx(1.0)
    lo, hi = res.rank_interval
    assert lo <= 1.0 <= hi + 1e-12
    assert len(res.pairs) == 3 and all(p.verdict == ld.HOLDS for p in res.pairs)


def test_a_ladder_with_a_missing_size_is_refused():
    data = _ladder({"a": (0.0, 0.05), "b": (0.1, 0.05)})
    del data["b"]["size1"]
    with pytest.raises(ld.LadderError, match="no runs at size size1"):
        ld.analyse_ladder(data)
    with pytest.raises(ld.LadderError):
        ld.analyse_ladder({"a": data["a"]})
