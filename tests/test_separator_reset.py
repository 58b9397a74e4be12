"""The separator-reset probe (plugins/probes.py SeparatorReset): its answers come from the second
segment alone, the first segment is a complete sequence of the same kind, and its no-recall baseline
is what a rule without key matching scores."""

import re

import numpy as np
import pytest

from abl.contracts.config import ConfigError
from abl.data.tasks import IGNORE_INDEX
from abl.grid.gridfile import expand
from abl.plugins.probes import SeparatorReset

T, N, V = 48, 4, 32


def _split(x):
    """(segment A, segment B) of one example, found by the separator."""
    sep = int(np.flatnonzero(x == SeparatorReset.SEPARATOR)[0])
    return x[sep - 4 * N:sep], x[sep + 1:sep + 1 + 4 * N], sep


def _recall(segment, key):
    """The value the segment's pairs give the key."""
    keys = list(segment[0:2 * N:2])
    return int(segment[1 + 2 * keys.index(key)])


@pytest.fixture(scope="module")
def examples():
    return SeparatorReset(vocab_size=V, num_kv_pairs=N).generate(200, T, np.random.default_rng(0))


def test_the_answers_come_from_the_second_segment_alone(examples):
    stale = hits = 0
    for x, y in zip(examples.inputs, examples.targets):
        a, b, sep = _split(x)
        assert (x == SeparatorReset.SEPARATOR).sum() == 1 and sep >= 4 * N
        counted = np.flatnonzero(y != IGNORE_INDEX)
        assert len(counted) == N and (counted > sep).all()  # only B's N queries count
        for t in counted:
            assert y[t] == _recall(b, x[t]) == x[t + 1]  # the value of B's pair, shown next (teacher forcing)
            hits += 1
            stale += y[t] == _recall(a, x[t])  # same keys: A paired it with another value, mostly
        # A is a whole sequence of the same kind: its queries are followed by their values
        for q in range(2 * N, 4 * N, 2):
            assert a[q + 1] == _recall(a, a[q])
        assert sorted(a[0:2 * N:2]) == sorted(b[0:2 * N:2])  # same_keys
    assert stale / hits < 0.2


def test_the_separator_moves_and_examples_are_deterministic_by_seed(examples):
    seps = {_split(x)[2] for x in examples.inputs}
    assert len(seps) > 5
    again = SeparatorReset(vocab_size=V, num_kv_pairs=N).generate(200, T, np.random.default_rng(0))
    assert np.array_equal(again.inputs, examples.inputs) and np.array_equal(again.targets, examples.targets)


def test_no_recall_baseline_is_the_elimination_rule(examples):
    """Picking among B's values not yet answered, with no key matching, scores H_N / N."""
    task = SeparatorReset(vocab_size=V, num_kv_pairs=N)
    rng = np.random.default_rng(1)
    right = total = 0
    for x, y in zip(examples.inputs, examples.targets):
        _, b, _ = _split(x)
        left = list(b[1:2 * N:2])
        for t in np.flatnonzero(y != IGNORE_INDEX):
            right += rng.choice(left) == y[t]
            total += 1
            left.remove(y[t])
    assert task.no_recall_baseline(T) == pytest.approx((1 + 1 / 2 + 1 / 3 + 1 / 4) / 4)
    assert right / total == pytest.approx(task.no_recall_baseline(T), abs=0.05)


def test_different_keys_option_draws_the_second_segments_keys_afresh():
    ex = SeparatorReset(vocab_size=64, num_kv_pairs=N, same_keys=False).generate(50, T, np.random.default_rng(2))
    same = [sorted(_split(x)[0][0:2 * N:2]) == sorted(_split(x)[1][0:2 * N:2]) for x in ex.inputs]
    assert not all(same)


@pytest.mark.parametrize("params,context,message", [({"num_kv_pairs": 4}, 32, "need model.context >= 8 x 4 + 1"),
                                                    ({"vocab_size": 8, "num_kv_pairs": 4}, 64, "vocab_size >= 10")])
def test_impossible_layouts_are_refused_before_training(registry, params, context, message):
    raw = {"model": {"d_model": 16, "n_heads": 2, "context": context}, "data": {"dataset": "separator_reset"},
           "dataset": {"separator_reset": params}}
    with pytest.raises(ConfigError, match=re.escape(message)):
        expand(raw, registry)
