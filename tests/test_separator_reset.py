"""The separator-reset probe (plugins/probes.py SeparatorReset): after the separator, a query is
answered from the second segment alone (B's value, or NONE for a key only the first segment paired),
the answers are never shown, and the rules that skip what the probe tests score what the docstring
says: no key matching max(N - s, 1) / q, key matching that ignores the separator N / q, a reset 1."""

import re

import numpy as np
import pytest

from abl.contracts.config import ConfigError
from abl.data.tasks import IGNORE_INDEX
from abl.grid.gridfile import expand
from abl.plugins.probes import SeparatorReset

T, N, G, V = 48, 4, 8, 32
SHARED = [0, 1, 2, 4]  # 0: B unrelated to A; N: B reuses every key (no NONE)


def _sep(x):
    return int(np.flatnonzero(x == SeparatorReset.SEPARATOR)[0])


def _pairs(x, lo, hi):
    """{key: value} of the pairs k v in x[lo:hi]."""
    return {int(x[t]): int(x[t + 1]) for t in range(lo, hi, 2)}


def _segments(x):
    sep = _sep(x)
    return _pairs(x, sep - 2 * N, sep), _pairs(x, sep + 1, sep + 1 + 2 * N), sep


def _latest(x, t, key, since=0):
    """The token after the latest occurrence of key in x[since:t] (a pair's value), or NONE."""
    hits = [u for u in range(since, t) if x[u] == key]
    return int(x[hits[-1] + 1]) if hits else SeparatorReset.NONE


def _task(shared):
    return SeparatorReset(vocab_size=V, num_kv_pairs=N, shared=shared, max_gap=G)


@pytest.fixture(scope="module", params=SHARED)
def case(request):
    """(shared, q, examples)"""
    shared = request.param
    return shared, 2 * N - shared, _task(shared).generate(300, T, np.random.default_rng(0))


def _queries(examples):
    for x, y in zip(examples.inputs, examples.targets):
        for t in np.flatnonzero(y != IGNORE_INDEX):
            yield x, int(t), int(y[t])


def test_every_key_is_asked_once_after_the_separator_and_answered_from_the_second_segment(case):
    shared, q, examples = case
    nones = 0
    for x, y in zip(examples.inputs, examples.targets):
        a, b, sep = _segments(x)
        assert (x == SeparatorReset.SEPARATOR).sum() == 1
        assert len(a) == len(b) == N and len(set(a) & set(b)) == shared
        assert len(set(a.values())) == len(set(b.values())) == N  # distinct values within a segment
        counted = np.flatnonzero(y != IGNORE_INDEX)
        assert len(counted) == q and (counted > sep + 2 * N).all()
        assert sorted(int(x[t]) for t in counted) == sorted(set(a) | set(b))
        for t in counted:
            assert y[t] == b.get(int(x[t]), SeparatorReset.NONE)
            nones += y[t] == SeparatorReset.NONE
    assert nones == (N - shared) * len(examples.inputs)


def test_the_answers_are_never_shown(case):
    """With each answer shown after its query (teacher forcing), remembering which of B's values were
    answered already scored H_N / N with no key matching, and attention stayed on that shortcut."""
    _, q, examples = case
    for x, y in zip(examples.inputs, examples.targets):
        first_query = int(np.flatnonzero(y != IGNORE_INDEX)[0])
        assert not set(x[first_query:].tolist()) & (set(_segments(x)[1].values()) | {SeparatorReset.NONE})
        assert (x[first_query + 1::2][:q - 1] == SeparatorReset.FILLER).all()


def test_a_rule_that_ignores_the_separator_scores_n_over_q_and_one_that_resets_scores_1(case):
    """Key matching by the latest occurrence scores N / q when it ignores the separator (a key seen once
    is A's or B's) and 1 when it only looks after the separator: below shared = N, what the probe tests is
    the reset; at shared = N recency alone answers."""
    _, q, examples = case
    recency = reset = total = 0
    for x, t, answer in _queries(examples):
        recency += _latest(x, t, x[t]) == answer
        reset += _latest(x, t, x[t], since=_sep(x)) == answer
        total += 1
    assert recency / total == pytest.approx(N / q)
    assert reset == total


def test_no_recall_baseline_is_the_best_rule_without_key_matching(case):
    """Without matching the query's key, the best answer is a constant: NONE, or any one of B's values
    (here the first pair's); the better of the two, scored on the data, is the declared baseline."""
    shared, _, examples = case
    always_none = first_value = total = 0
    for x, t, answer in _queries(examples):
        always_none += answer == SeparatorReset.NONE
        first_value += answer == x[_sep(x) + 2]
        total += 1
    assert max(always_none, first_value) / total == pytest.approx(_task(shared).no_recall_baseline(T), abs=0.03)


def test_the_separator_and_the_queries_move_and_examples_are_deterministic_by_seed(case):
    shared, q, examples = case
    seps = {_sep(x) for x in examples.inputs}
    gaps = {int(np.flatnonzero(y != IGNORE_INDEX)[0]) - _sep(x) for x, y in zip(examples.inputs, examples.targets)}
    assert len(seps) == T - (4 * N + 1 + G + 2 * q) + 1 and len(gaps) == G + 1
    again = _task(shared).generate(300, T, np.random.default_rng(0))
    assert np.array_equal(again.inputs, examples.inputs) and np.array_equal(again.targets, examples.targets)


@pytest.mark.parametrize("params,context,message", [
    ({"num_kv_pairs": 4}, 36, "need model.context >= 4 x 4 + 1 + 8 + 2 x 6 = 37"),
    ({"vocab_size": 12, "num_kv_pairs": 4}, 64, "need vocab_size >= 15"),
    ({"num_kv_pairs": 2, "shared": 3}, 64, "shared must be in [0, num_kv_pairs = 2]"),
])
def test_impossible_layouts_are_refused_before_training(registry, params, context, message):
    raw = {"model": {"d_model": 16, "n_heads": 2, "context": context}, "data": {"dataset": "separator_reset"},
           "dataset": {"separator_reset": params}}
    with pytest.raises(ConfigError, match=re.escape(message)):
        expand(raw, registry)
