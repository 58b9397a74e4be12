"""Issue 41 item 5: probes beside the ladder. Does a measurement at a small size (a probe's accuracy, or the
small size's own loss) rank the variants as the largest size's loss does? Kendall's tau with a paired
bootstrap interval, on planted ladders (no training)."""

import numpy as np
import pytest

from abl.analysis.ladder import probe_agreement

SIZES = {"s": 1e10, "m": 1e11, "l": 1e12}
SEEDS = range(4)


def _ladder(value, noise=0.002, seed=0):
    """variant -> size -> (compute, {seed: value(variant, size) + noise})."""
    rng = np.random.default_rng(seed)
    return {v: {s: (c, {k: value(v, s) + noise * rng.standard_normal() for k in SEEDS}) for s, c in SIZES.items()}
            for v in ("a", "b", "c", "d")}


ORDER = {"a": 0, "b": 1, "c": 2, "d": 3}  # at the largest size a is best


def loss(v, s):
    return {"s": 3.0, "m": 2.5, "l": 2.0}[s] + 0.05 * ORDER[v]


def test_a_probe_that_ranks_as_the_largest_size_does_reads_so():
    acc = _ladder(lambda v, s: 0.9 - 0.1 * ORDER[v], seed=1)  # higher is better: a best
    rows = probe_agreement(_ladder(loss), {"mqar_accuracy": acc}, lower_is_better={"mqar_accuracy": False},
                           resamples=300)
    probe = [r for r in rows if r.probe == "mqar_accuracy"]
    assert [r.size for r in probe] == ["s", "m", "l"]
    for r in probe:
        assert r.tau == pytest.approx(1.0) and r.interval[0] > 0 and r.n == 4
        assert "ranks them as the largest size does" in r.sentence()
    # the smaller sizes' own loss is the reference row, never the largest size against itself
    ref = [r for r in rows if r.probe == "val_loss"]
    assert [r.size for r in ref] == ["s", "m"] and all(r.tau == pytest.approx(1.0) for r in ref)


def test_a_reversed_probe_reads_against_and_a_noisy_one_undetermined():
    rev = _ladder(lambda v, s: 0.5 + 0.1 * ORDER[v], seed=2)  # accuracy highest for the worst variant
    noisy = _ladder(lambda v, s: 0.5, noise=0.05, seed=3)  # no signal
    rows = probe_agreement(_ladder(loss), {"rev_accuracy": rev, "noise_accuracy": noisy},
                           lower_is_better={"rev_accuracy": False, "noise_accuracy": False}, resamples=300)
    for r in (r for r in rows if r.probe == "rev_accuracy"):
        assert r.tau == pytest.approx(-1.0) and r.interval[1] < 0
        assert "against the largest size's order" in r.sentence()
    noise = [r for r in rows if r.probe == "noise_accuracy"]
    assert noise and all(r.interval[0] <= 0 <= r.interval[1] for r in noise), [r.sentence() for r in noise]
    assert all("undetermined" in r.sentence() for r in noise)


def test_a_lower_is_better_probe_is_not_flipped():
    x4 = _ladder(lambda v, s: 4.0 + 0.1 * ORDER[v], seed=4)  # a loss: lower is better, a best
    rows = probe_agreement(_ladder(loss), {"val_loss_x4": x4}, lower_is_better={"val_loss_x4": True},
                           resamples=200)
    assert all(r.tau == pytest.approx(1.0) for r in rows if r.probe == "val_loss_x4")
