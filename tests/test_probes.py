"""The probe tasks (plugins/probes.py): shapes, answers recoverable from the context (an oracle
solver gets 100%), determinism by seed, and a loss mask that covers exactly the answer positions."""

from __future__ import annotations

import numpy as np
import pytest

from abl.data.corpus import DataError
from abl.data.tasks import IGNORE_INDEX, Examples
from abl.plugins.probes import MQAR, Copy, Induction, SelectiveCopy

T = 64


def mqar_oracle(x: np.ndarray, t: int, pairs: int) -> int:
    """The value paired with the key at position t, read from the key-value prefix."""
    keys = list(x[0:2 * pairs:2])
    return int(x[1 + 2 * keys.index(x[t])])


def induction_oracle(x: np.ndarray, t: int, vocab: int, k: int) -> int:
    """The token after the first trigger, as far into the pattern as position t is past the last trigger."""
    trig = vocab - 1
    first = int(np.flatnonzero(x == trig)[0])
    last = int(np.flatnonzero(x == trig)[-1])
    return int(x[first + 1 + (t - last)])


def copy_oracle(x: np.ndarray, t: int, m: int, vocab: int) -> int:
    """The i-th non-noise token before the markers, at the i-th marker."""
    data = x[:len(x) - m]
    return int(data[data != 0][t - (len(x) - m)]) if (data != 0).sum() == m else -1


CASES = {
    "mqar": (MQAR(vocab_size=256, num_kv_pairs=8), lambda ex, i, t: mqar_oracle(ex.inputs[i], t, 8)),
    "mqar_uniform_no_noise": (MQAR(vocab_size=128, num_kv_pairs=16, power_a=1.0, random_non_queries=False),
                              lambda ex, i, t: mqar_oracle(ex.inputs[i], t, 16)),
    "induction": (Induction(vocab_size=16), lambda ex, i, t: induction_oracle(ex.inputs[i], t, 16, 1)),
    "induction_k3": (Induction(vocab_size=16, induction_len=3, num_triggers=3),
                     lambda ex, i, t: induction_oracle(ex.inputs[i], t, 16, 3)),
    "selective_copy": (SelectiveCopy(vocab_size=16, n_tokens=8),
                       lambda ex, i, t: copy_oracle(ex.inputs[i], t, 8, 16)),
}


def answer_positions(name: str, task, ex: Examples) -> np.ndarray:
    """Where the answers are, derived from the task's definition (not from the targets)."""
    n, t = ex.inputs.shape
    pos = np.zeros((n, t), dtype=bool)
    if isinstance(task, MQAR):
        # with random filler a key can reappear by chance, so the queries are told by the definition:
        # every key once, at an even offset of the query region; without filler they are the non-zeros
        pairs = task.num_kv_pairs
        for i in range(n):
            q = np.flatnonzero(ex.mask[i])
            assert len(q) == pairs and ((q - 2 * pairs) % 2 == 0).all() and (q >= 2 * pairs).all()
            assert sorted(ex.inputs[i, q].tolist()) == sorted(ex.inputs[i, 0:2 * pairs:2].tolist())
            pos[i, q] = True
            if not task.params["random_non_queries"]:
                assert (np.flatnonzero(ex.inputs[i, 2 * pairs:]) + 2 * pairs == q).all()
    elif isinstance(task, Induction):
        k = task.params["induction_len"]
        pos[:, t - k:] = True
    else:
        m = task.params["n_tokens"]
        pos[:, t - m:] = True
    return pos


@pytest.mark.parametrize("name", list(CASES) + ["copy"])
def test_shapes_and_vocab(name):
    task = Copy(vocab_size=16, n_tokens=8) if name == "copy" else CASES[name][0]
    ex = task.generate(32, T, np.random.default_rng(0))
    assert ex.inputs.shape == ex.targets.shape == (32, T)
    assert ex.inputs.dtype == ex.targets.dtype == np.int64
    assert ex.inputs.min() >= 0 and ex.inputs.max() < task.vocab_size
    answers = ex.targets[ex.mask]
    assert answers.min() >= 0 and answers.max() < task.vocab_size
    assert task.problems(T) == []


@pytest.mark.parametrize("name", list(CASES))
def test_oracle_solves_every_answer_from_the_context(name):
    task, oracle = CASES[name]
    ex = task.generate(64, T, np.random.default_rng(1))
    rows, cols = np.nonzero(ex.mask)
    assert len(rows) > 0
    predicted = np.array([oracle(ex, i, t) for i, t in zip(rows, cols)])
    assert (predicted == ex.targets[rows, cols]).all()


def test_copy_oracle():
    task = Copy(vocab_size=16, n_tokens=8)
    ex = task.generate(64, T, np.random.default_rng(1))
    assert (ex.targets[:, T - 8:] == ex.inputs[:, :8]).all()  # the prefix, in order
    assert (ex.inputs[:, 8:T - 8] == 0).all() and (ex.inputs[:, T - 8:] == 15).all()
    assert (ex.inputs[:, :8] >= 1).all() and (ex.inputs[:, :8] <= 14).all()


def test_selective_copy_spacing_varies():
    ex = SelectiveCopy(vocab_size=16, n_tokens=8).generate(64, T, np.random.default_rng(2))
    where = [tuple(np.flatnonzero(row[:T - 8])) for row in ex.inputs]
    assert all(len(w) == 8 for w in where)  # data tokens are never 0, so each is found
    assert len(set(where)) > 50  # random positions, not a fixed layout


@pytest.mark.parametrize("name", list(CASES) + ["copy"])
def test_loss_mask_covers_exactly_the_answer_positions(name):
    task = Copy(vocab_size=16, n_tokens=8) if name == "copy" else CASES[name][0]
    ex = task.generate(32, T, np.random.default_rng(3))
    assert (ex.mask == answer_positions(name, task, ex)).all()
    assert (ex.targets[~ex.mask] == IGNORE_INDEX).all()


@pytest.mark.parametrize("name", list(CASES) + ["copy"])
def test_deterministic_by_seed(name):
    task = Copy(vocab_size=16, n_tokens=8) if name == "copy" else CASES[name][0]
    a = task.generate(16, T, np.random.default_rng(7))
    b = task.generate(16, T, np.random.default_rng(7))
    c = task.generate(16, T, np.random.default_rng(8))
    assert (a.inputs == b.inputs).all() and (a.targets == b.targets).all()
    assert not (a.inputs == c.inputs).all()


def test_mqar_definition_details():
    """Zoology's layout: distinct keys from [1, V/2), distinct values from [V/2, V), every key queried
    once, queries at even offsets of the query region, and the power law on the gaps."""
    v, n_pairs = 256, 8
    task = MQAR(vocab_size=v, num_kv_pairs=n_pairs, random_non_queries=False)
    ex = task.generate(200, T, np.random.default_rng(4))
    keys, values = ex.inputs[:, 0:16:2], ex.inputs[:, 1:16:2]
    assert ((keys >= 1) & (keys < v // 2)).all() and ((values >= v // 2) & (values < v)).all()
    assert all(len(set(r)) == n_pairs for r in keys) and all(len(set(r)) == n_pairs for r in values)
    assert (ex.mask.sum(axis=1) == n_pairs).all()
    q_rows, q_cols = np.nonzero(ex.mask)
    assert ((q_cols - 16) % 2 == 0).all()
    assert (ex.inputs[~ex.mask & (np.arange(T) >= 16)] == 0).all()  # no noise: zeros between queries


def test_mqar_power_law_gap_distribution():
    """With a = 1 the gaps are uniform; with a small a they follow p(g) ~ (g + 1)^(a - 1):
    the observed first-draw frequencies match that law."""
    space = (T - 2) // 2
    for a in (1.0, 0.3):
        task = MQAR(vocab_size=128, num_kv_pairs=1, power_a=a, random_non_queries=False)
        ex = task.generate(20_000, T, np.random.default_rng(5))
        gaps = (np.nonzero(ex.mask)[1] - 2) // 2
        observed = np.bincount(gaps, minlength=space) / len(gaps)
        p = a * np.arange(1, space + 1) ** (a - 1)
        p /= p.sum()
        assert np.abs(observed - p).max() < 0.01, a


def test_mqar_slices_are_pair_counts():
    task = MQAR(vocab_size=128, num_kv_pairs=4, eval_kv_pairs=[2, 8])
    assert task.slices() == [("pairs_2", {"num_kv_pairs": 2}), ("pairs_8", {"num_kv_pairs": 8})]
    ex = task.generate(4, T, np.random.default_rng(0), num_kv_pairs=8)
    assert (ex.mask.sum(axis=1) == 8).all()
    assert MQAR(vocab_size=128, num_kv_pairs=4).slices() == [("pairs_4", {"num_kv_pairs": 4})]


@pytest.mark.parametrize("task,context,needle", [
    (MQAR(vocab_size=64, num_kv_pairs=4), 64, "vocab_size > the sequence length"),
    (MQAR(vocab_size=256, num_kv_pairs=20), 64, "at least 4 x 20"),
    (MQAR(vocab_size=256, num_kv_pairs=4, eval_kv_pairs=[4, 32]), 64, "at least 4 x 32"),
    (MQAR(vocab_size=256, num_kv_pairs=4), 63, "even sequence length"),
    (SelectiveCopy(vocab_size=16, n_tokens=40), 64, "n_tokens=40"),
    (Induction(vocab_size=16, induction_len=40), 64, "induction_len=40"),
])
def test_problems_are_reported(task, context, needle):
    assert any(needle in e for e in task.problems(context))
    with pytest.raises(DataError, match="."):
        task.check(context)


def test_with_vocab_and_fingerprint():
    task = MQAR(vocab_size=8192, num_kv_pairs=4)
    small = task.with_vocab(256)
    assert small.vocab_size == 256 and small.num_kv_pairs == 4
    assert small.fingerprint != task.fingerprint
    assert MQAR(vocab_size=8192, num_kv_pairs=4).fingerprint == task.fingerprint
