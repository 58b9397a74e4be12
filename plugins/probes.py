"""Capability probes (axis ``dataset``): synthetic tasks that separate mixers at tiny scale.

Each is an ``abl.Task``: examples of length ``model.context`` generated from
the seed (no download), with the positions that count marked; the loss and the
accuracy metrics are taken on them only (harness/data/tasks.py). They are datasets
to train on (``data.dataset = "mqar"``) and probes to evaluate any trained
model on (``eval.probes = ["mqar"]``).

- ``mqar``: multi-query associative recall, Zoology (Arora et al. 2023,
  "Zoology: Measuring and Improving Recall in Efficient Language Models",
  sec. 3 and its appendix on the synthetic MQAR data; reference generator
  ``zoology/data/multiquery_ar.py``);
- ``induction``: the induction-head task of H3 (Fu, Dao et al. 2023, sec. 3.1)
  as the Mamba paper trains it (Gu & Dao 2023, sec. 4.1.2 and appendix E.1);
- ``selective_copy``: the Mamba paper's selective copying (Gu & Dao 2023,
  sec. 3.1 fig. 2, sec. 4.1.1 and appendix E.1; the S4 repository's
  ``copying.py`` with ``variable=True``);
- ``copy``: plain copying of a random prefix, the classic copying task
  (Arjovsky et al. 2016) in the same layout (Mamba fig. 2 left; ``copying.py``
  with ``variable=False``);
- ``separator_reset``: two independent recall sequences joined by a separator,
  the second answered from itself alone: the state reset that selection allows
  (Gu & Dao 2023, sec. 3.5.2, "Boundary resetting").

Token ids are task-local: a task uses ids below its ``vocab_size`` and says
which ones are special in its docstring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Annotated, Any

import numpy as np

from abl import IGNORE_INDEX, Arg, Examples, Task, hookimpl


def _distinct(rng: np.random.Generator, n: int, k: int, size: int) -> np.ndarray:
    """``[n, size]``: per row, ``size`` distinct integers of [0, k) in random order
    (``np.random.choice(k, size, replace=False)`` row by row)."""
    return rng.random((n, k)).argsort(axis=1)[:, :size]


def _weighted_distinct(rng: np.random.Generator, p: np.ndarray, n: int, size: int) -> np.ndarray:
    """``[n, size]``: per row, ``size`` distinct indices drawn one after another with probabilities
    proportional to ``p`` among those not drawn yet (``np.random.choice(len(p), size, replace=False,
    p=p)``), by the Gumbel-top-k trick: the order of log p + Gumbel noise is that sequential draw."""
    gumbel = -np.log(-np.log(rng.random((n, len(p)))))
    return np.argsort(-(np.log(p) + gumbel), axis=1, kind="stable")[:, :size]


def _gap_probabilities(space: int, power_a: float) -> np.ndarray:
    """MQAR's query-gap law: P(g) proportional to a (g + 1)^(a - 1) over g in [0, space)."""
    p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    return p / p.sum()


@lru_cache(maxsize=256)
def _draw_order_probabilities(space: int, draws: int, power_a: float) -> np.ndarray:
    """``[space, draws]``: P(the i-th gap drawn is g), exactly, for ``draws`` gaps drawn one after another
    without replacement with probabilities proportional to the gap law (the generator's
    ``_weighted_distinct``).

    The Gumbel-top-k order is that of independent exponential arrival times of rates p_g (Efraimidis &
    Spirakis 2006, "Weighted random sampling with a reservoir", Inf. Process. Lett. 97(5)), so
    P(gap g is drawn i-th) = integral over t of p_g e^(-p_g t) P(exactly i other gaps arrived by t) dt,
    the inner probability a Poisson-binomial one: the counts among the gaps before g and among those
    after g (two running recursions), convolved. The integral is taken numerically (scipy's adaptive
    ``quad_vec``) to about 1e-10; cached, as it is asked for at every evaluation.
    """
    from scipy.integrate import quad_vec

    p = _gap_probabilities(space, power_a)

    def density(t: float) -> np.ndarray:
        stay = np.exp(-p * t)  # gap j not yet drawn by time t
        drawn = 1.0 - stay
        before = np.zeros((space + 1, draws))  # row g: P(exactly i of the gaps < g drawn by t)
        after = np.zeros((space + 1, draws))  # row g: the same among the gaps >= g
        before[0, 0] = after[space, 0] = 1.0
        for j in range(space):
            before[j + 1] = before[j] * stay[j]
            before[j + 1, 1:] += before[j, :-1] * drawn[j]
            k = space - 1 - j
            after[k] = after[k + 1] * stay[k]
            after[k, 1:] += after[k + 1, :-1] * drawn[k]
        count = np.zeros((space, draws))  # row g: P(exactly i of the gaps other than g drawn by t)
        for m in range(draws):
            count[:, m:] += before[:space, m:m + 1] * after[1:, :draws - m]
        return (p * stay)[:, None] * count

    return quad_vec(density, 0.0, np.inf, epsabs=1e-12, epsrel=1e-10)[0]


def _ints(values: Any) -> list[int]:
    return [int(v) for v in values]


# ---------------------------------------------------------------- MQAR


VOCAB = "vocabulary of the task (token ids below it); as a probe, cut to the model's when larger"


class MQAR(Task):
    """Multi-query associative recall (Zoology, Arora et al. 2023, sec. 3; ``multiquery_ar.py``).

    With N = ``num_kv_pairs``, T = ``model.context`` and V = ``vocab_size``:
    the first 2N tokens are N key-value pairs ``k1 v1 k2 v2 ...``, the keys
    distinct and drawn from [1, V/2), the values distinct and drawn from
    [V/2, V) (the vocabulary is split in two halves). Every key is then
    queried once in the remaining T - 2N tokens: the query of key i sits at
    offset 2 g_i of that region, the gaps g_1..g_N drawn without replacement
    from [0, (T - 2N) / 2) with P(g) proportional to a (g + 1)^(a - 1), a
    power law of parameter a = ``power_a`` (Zoology's default 0.01 puts most
    queries near the pairs; 1.0 is uniform). The target at a query's position
    is its key's value (the next token to predict); it is the only position
    that counts. Every other token is 0, replaced by a uniform draw from [0, V)
    when ``random_non_queries`` (Zoology's default).

    Zoology's constraints hold: T even, V > T, 4N <= T. The evaluation slices
    are the pair counts of ``eval_kv_pairs`` (empty: the training count), each
    recorded as ``accuracy_pairs_<N>``: accuracy by number of pairs.

    No-recall baseline: not 1/N. The gaps are drawn in key order from the
    power law, so the first key is mostly queried first and nearest the pairs,
    and a model that answers "the value of pair i" from the query's position
    alone, without matching the key, beats 1/N: 0.562 for 2 pairs and 0.386
    for 4 at context 16 (Zoology's default a = 0.01). ``no_recall_baseline``
    is that best position rule's accuracy, computed exactly from the gap law
    (``_draw_order_probabilities``), not estimated: the mean over the N keys
    of P(the rule names key i), the rule naming at each gap the key most
    likely queried there.
    """

    def __init__(self,
                 vocab_size: Annotated[int, Arg(VOCAB + "; keys from the lower half, values from the upper",
                                                min=4)] = 8192,
                 num_kv_pairs: Annotated[int, Arg("key-value pairs per training example", min=1)] = 8,
                 power_a: Annotated[float, Arg("alpha of the power law placing the queries (1.0 = uniform)",
                                               min=1e-6)] = 0.01,
                 random_non_queries: Annotated[bool, Arg("fill the non-query positions with random tokens, "
                                                         "not 0")] = True,
                 eval_kv_pairs: Annotated[Sequence[int], Arg("pair counts evaluated, one accuracy_pairs_<N> each "
                                                    "(empty: the training count)")] = ()):
        super().__init__(vocab_size, num_kv_pairs=int(num_kv_pairs), power_a=float(power_a),
                         random_non_queries=bool(random_non_queries), eval_kv_pairs=list(eval_kv_pairs))

    @property
    def num_kv_pairs(self) -> int:
        return int(self.params["num_kv_pairs"])

    def eval_pairs(self) -> list[int]:
        return _ints(self.params["eval_kv_pairs"]) or [self.num_kv_pairs]

    def slices(self) -> list[tuple[str, dict[str, Any]]]:
        return [(f"pairs_{n}", {"num_kv_pairs": n}) for n in self.eval_pairs()]

    def problems(self, seq_len: int) -> list[str]:
        v = self.vocab_size
        errs = []
        bad = [p for p in self.params["eval_kv_pairs"] if not isinstance(p, int) or isinstance(p, bool)]
        if bad:
            return [f"eval_kv_pairs must be a list of integers, got {self.params['eval_kv_pairs']!r}"]
        if seq_len % 2:
            errs.append(f"MQAR needs an even sequence length; model.context={seq_len}")
        if v <= seq_len:
            errs.append(f"MQAR needs vocab_size > the sequence length (Zoology); vocab_size={v}, "
                        f"model.context={seq_len}")
        if self.params["power_a"] <= 0:
            errs.append(f"power_a must be > 0, got {self.params['power_a']}")
        for n in dict.fromkeys([self.num_kv_pairs, *self.eval_pairs()]):
            if n < 1:
                errs.append(f"a number of key-value pairs must be >= 1, got {n}")
            elif 4 * n > seq_len:
                errs.append(f"{n} key-value pairs need a sequence of at least 4 x {n} = {4 * n} tokens "
                            f"(pairs, then queries); model.context={seq_len}")
            elif n > v // 2 - 1:
                errs.append(f"{n} distinct keys do not fit in the {v // 2 - 1} key tokens of vocab_size={v}")
        return errs

    def no_recall_baseline(self, seq_len: int, num_kv_pairs: int | None = None, **_: Any) -> float:
        pairs = self.num_kv_pairs if num_kv_pairs is None else int(num_kv_pairs)
        where = _draw_order_probabilities((seq_len - 2 * pairs) // 2, pairs, float(self.params["power_a"]))
        return float(where.max(axis=1).sum() / pairs)

    def generate(self, n: int, seq_len: int, rng: np.random.Generator, num_kv_pairs: int | None = None,
                 **_: Any) -> Examples:
        pairs = self.num_kv_pairs if num_kv_pairs is None else int(num_kv_pairs)
        v, t, a = self.vocab_size, seq_len, self.params["power_a"]
        half = v // 2
        keys = 1 + _distinct(rng, n, half - 1, pairs)  # [1, V/2)
        values = half + _distinct(rng, n, v - half, pairs)  # [V/2, V)
        ctx = 2 * pairs
        seq = np.zeros((n, t + 1), dtype=np.int64)  # one longer: inputs and next-token targets
        seq[:, 0:ctx:2] = keys
        seq[:, 1:ctx:2] = values
        gaps = _weighted_distinct(rng, _gap_probabilities((t - ctx) // 2, a), n, pairs)
        rows = np.arange(n)[:, None]
        seq[rows, ctx + 2 * gaps] = keys
        labels = np.full((n, t + 1), IGNORE_INDEX, dtype=np.int64)
        labels[rows, ctx + 2 * gaps + 1] = values
        inputs, targets = seq[:, :-1].copy(), labels[:, 1:].copy()
        if self.params["random_non_queries"]:
            zero = inputs == 0
            inputs[zero] = rng.integers(0, v, size=int(zero.sum()))
        return Examples(inputs, targets)


# ---------------------------------------------------------------- induction heads


class Induction(Task):
    """The induction-head task (H3, Fu, Dao et al. 2023, sec. 3.1; Mamba, Gu & Dao 2023, sec. 4.1.2
    and appendix E.1: vocabulary 16, the answer one token).

    With V = ``vocab_size``, k = ``induction_len``, T = ``model.context``: a
    sequence of S = T - k tokens drawn uniformly from [0, V - 1); trigger
    positions drawn uniformly from [0, S - 1 - k) (one with probability 1/2,
    else ``num_triggers`` of them, dropping any that would overlap the copy
    after an earlier one); the k tokens after the first trigger are the
    pattern, and every trigger becomes the special token V - 1 followed by the
    pattern. The sequence then ends with the special token and the pattern:
    the model sees ``... P c1 .. c(k-1)`` and must predict the pattern after
    the final P (teacher-forced for k > 1); those k positions count. (The
    reference generator, safari's ``generate_induction_head``, reserves a
    second special "noop" token it never uses; here every other id is a
    regular token.)

    No-recall baseline: 1/(V - 1). Each answer is a uniform draw from the
    V - 1 regular tokens wherever the trigger sits, so no rule that does not
    find the earlier trigger beats chance.
    """

    def __init__(self, vocab_size: Annotated[int, Arg(VOCAB + "; the last id is the trigger", min=3)] = 16,
                 induction_len: Annotated[int, Arg("tokens to copy after the final trigger", min=1)] = 1,
                 num_triggers: Annotated[int, Arg("triggers in half of the examples (the other half: one)",
                                                  min=1)] = 1):
        super().__init__(vocab_size, induction_len=int(induction_len), num_triggers=int(num_triggers))

    def problems(self, seq_len: int) -> list[str]:
        k, errs = self.params["induction_len"], []
        if self.vocab_size < 3:
            errs.append(f"induction needs vocab_size >= 3 (two regular tokens and the trigger), got "
                        f"{self.vocab_size}")
        if k < 1 or self.params["num_triggers"] < 1:
            errs.append("induction_len and num_triggers must be >= 1")
        elif seq_len - k - 1 - k < 1:
            errs.append(f"induction_len={k} needs model.context >= {2 * k + 2}, got {seq_len}")
        return errs

    def no_recall_baseline(self, seq_len: int, **_: Any) -> float:
        return 1.0 / (self.vocab_size - 1)

    def generate(self, n: int, seq_len: int, rng: np.random.Generator, **_: Any) -> Examples:
        v, k, t = self.vocab_size, self.params["induction_len"], seq_len
        trigger = v - 1
        s = t - k
        seq = rng.integers(0, v - 1, size=(n, s), dtype=np.int64)
        patterns = np.empty((n, k), dtype=np.int64)
        for i in range(n):
            count = 1 if rng.random() < 0.5 else self.params["num_triggers"]
            kept: list[int] = []
            for p in sorted(int(x) for x in rng.integers(0, s - (1 + k), size=count)):
                if not kept or p - kept[-1] > k:
                    kept.append(p)
            patterns[i] = seq[i, kept[0] + 1:kept[0] + 1 + k]
            for p in kept:
                seq[i, p] = trigger
                seq[i, p + 1:p + 1 + k] = patterns[i]
        full = np.concatenate([seq, np.full((n, 1), trigger, dtype=np.int64), patterns], axis=1)  # T + 1
        targets = np.full((n, t), IGNORE_INDEX, dtype=np.int64)
        targets[:, s:] = full[:, s + 1:]
        return Examples(full[:, :t].copy(), targets)


# ---------------------------------------------------------------- copying


class _Copying(Task):
    """Shared by ``copy`` and ``selective_copy`` (the S4 repository's ``copying.py``).

    With M = ``n_tokens``, V = ``vocab_size``, T = ``model.context``: M data
    tokens drawn uniformly from [1, V - 1) are placed among T - M positions
    whose other tokens are the noise token 0, then come M marker tokens
    V - 1. At the i-th marker the model must output the i-th data token; the M
    marker positions are the ones that count.

    No-recall baseline: copying plain data needs a memory of the data only;
    a model without one guesses among the V - 2 data tokens (1/(V - 2)).
    Selective copying probes selection by content, so its baseline is the
    best a time-invariant model does: copy, at the i-th marker, from the
    position where the i-th data token most often sits (a fixed lag; Gu & Dao
    2023, sec. 3.1, on why such models fail the task), else a guess.
    """

    variable = False  # True: the data tokens sit at random positions (selective copying)

    def __init__(self, vocab_size: Annotated[int, Arg(VOCAB + "; 0 is noise, the last id the marker", min=3)] = 16,
                 n_tokens: Annotated[int, Arg("data tokens to copy", min=1)] = 16):
        super().__init__(vocab_size, n_tokens=int(n_tokens))

    def problems(self, seq_len: int) -> list[str]:
        m, errs = self.params["n_tokens"], []
        if self.vocab_size < 3:
            errs.append(f"copying needs vocab_size >= 3 (noise, marker and a data token), got {self.vocab_size}")
        if m < 1:
            errs.append(f"n_tokens must be >= 1, got {m}")
        elif 2 * m > seq_len:
            errs.append(f"n_tokens={m} needs model.context >= 2 x {m} = {2 * m} (data, then markers), "
                        f"got {seq_len}")
        return errs

    def no_recall_baseline(self, seq_len: int, **_: Any) -> float:
        guess = 1.0 / (self.vocab_size - 2)
        if not self.variable:
            return guess
        m = self.params["n_tokens"]
        spots = seq_len - m
        # P(the i-th of m sorted distinct uniform positions of [0, spots) is x) = C(x, i) C(spots-1-x, m-1-i)
        # / C(spots, m); at the mode the copy is right, elsewhere (noise or another token) it is a guess
        hit = [max(math.comb(x, i) * math.comb(spots - 1 - x, m - 1 - i) for x in range(spots))
               / math.comb(spots, m) for i in range(m)]
        return float(np.mean([q + (1 - q) * guess for q in hit]))

    def generate(self, n: int, seq_len: int, rng: np.random.Generator, **_: Any) -> Examples:
        v, m, t = self.vocab_size, self.params["n_tokens"], seq_len
        tokens = rng.integers(1, v - 1, size=(n, m), dtype=np.int64)
        if self.variable:
            where = np.sort(_distinct(rng, n, t - m, m), axis=1)
        else:
            where = np.broadcast_to(np.arange(m), (n, m))
        inputs = np.zeros((n, t), dtype=np.int64)
        inputs[np.arange(n)[:, None], where] = tokens
        inputs[:, t - m:] = v - 1
        targets = np.full((n, t), IGNORE_INDEX, dtype=np.int64)
        targets[:, t - m:] = tokens
        return Examples(inputs, targets)


class Copy(_Copying):
    """Plain copying of a random prefix (Arjovsky et al. 2016; Mamba fig. 2 left): the M data tokens
    are the first M tokens, then T - 2M noise tokens, then the M markers."""

    variable = False


class SelectiveCopy(_Copying):
    """Selective copying (Gu & Dao 2023, sec. 3.1 fig. 2, sec. 4.1.1, appendix E.1: vocabulary 16 with
    the noise token, 16 data tokens): the M data tokens sit at uniformly random positions (kept in
    order) among the first T - M, so their spacing varies and a time-invariant model cannot copy
    them by a fixed lag."""

    variable = True


# ---------------------------------------------------------------- separator reset


class SeparatorReset(Task):
    """Two independent recall sequences joined by a separator; the queries after it are answered from
    the second sequence alone.

    Gu & Dao 2023 ("Mamba", arXiv:2312.00752), sec. 3.5.2, "Boundary resetting": where independent
    sequences are stitched together, an LTI model (S4) carries the first one's information into the
    second, while a selective model can reset its state at the boundary. With N = ``num_kv_pairs``,
    s = ``shared``, G = ``max_gap``, V = ``vocab_size``: id 0 is filler, 1 the separator, 2 the answer
    NONE, keys come from [3, 3 + K) and values from [3 + K, V), K = (V - 3) // 2. An example is

        p filler | A: N pairs k v | separator | B: N pairs k v | g filler | q queries, each k then a filler

    with p uniform (the separator moves) and g uniform in [0, G]. A and B each pair N distinct keys
    with distinct values; s of the keys are in both, B pairing them with new values. The q = 2N - s
    queries ask every key of A and B once, in random order, and only they count: a key B paired is
    answered with B's value, a key only A paired with NONE. The answers are never shown in the input.

    What each rule scores (exactly, over the draw):

    - without matching keys (the no-recall baseline): max(N - s, 1) / q, always answering NONE or
      always one of B's values;
    - matching keys by their latest occurrence but ignoring the separator: N / q, as a key seen
      once could be A's (NONE) or B's (its value) and only which side of the separator tells them
      apart (a shared key, seen twice, is B's by recency); B's queries start g tokens after its
      pairs, so the distance back to a pair tells the two sides apart only in part;
    - resetting at the separator: 1.

    The layout is this project's; the notes it comes from (a study of decoder-only transformers,
    footnote 26) ask for two independent sequences and a separator. These choices make it a test of
    resetting at tiny scale (measured: docs/variants.md, ablations/separator_reset.toml): the answers are
    not shown after their queries (with them shown, remembering which of B's values were answered
    already scores H_N / N without any key matching, and attention stayed on that shortcut), and
    B's queries start a random distance after its pairs (with B reusing all of A's keys and its
    queries right after its pairs, S4 solved it at 2 pairs); with ``shared`` < N, keys only A paired
    are answered NONE, which matching keys by recency cannot give.
    """

    FILLER, SEPARATOR, NONE = 0, 1, 2

    def __init__(self,
                 vocab_size: Annotated[int, Arg(VOCAB + "; 0 filler, 1 separator, 2 NONE, then keys and values",
                                                min=5)] = 64,
                 num_kv_pairs: Annotated[int, Arg("key-value pairs in each of the two segments", min=1)] = 4,
                 shared: Annotated[int, Arg("keys in both segments (the second pairs them with new values); the "
                                            "first segment's other keys are answered NONE after the separator",
                                            min=0)] = 2,
                 max_gap: Annotated[int, Arg("most filler tokens between the second segment's pairs and its "
                                             "queries", min=0)] = 8):
        super().__init__(vocab_size, num_kv_pairs=int(num_kv_pairs), shared=int(shared), max_gap=int(max_gap))

    def _ranges(self) -> tuple[int, int]:
        keys = (self.vocab_size - 3) // 2
        return keys, self.vocab_size - 3 - keys

    def _queries(self) -> int:
        return 2 * self.params["num_kv_pairs"] - self.params["shared"]

    def _width(self) -> int:
        n, gap = self.params["num_kv_pairs"], self.params["max_gap"]
        return 4 * n + 1 + gap + 2 * self._queries()

    def problems(self, seq_len: int) -> list[str]:
        n, shared, gap = self.params["num_kv_pairs"], self.params["shared"], self.params["max_gap"]
        if n < 1:
            return [f"num_kv_pairs must be >= 1, got {n}"]
        if not 0 <= shared <= n:
            return [f"shared must be in [0, num_kv_pairs = {n}], got {shared}"]
        if gap < 0:
            return [f"max_gap must be >= 0, got {gap}"]
        keys = self._ranges()[0]
        errs = []
        if keys < self._queries():  # then values >= keys >= q >= N too
            need = 3 + 2 * self._queries()
            errs.append(f"{self._queries()} distinct keys and {n} distinct values need vocab_size >= {need}, "
                        f"got {self.vocab_size}")
        if self._width() > seq_len:
            errs.append(f"{n} pairs, {shared} shared, max_gap {gap} need model.context >= 4 x {n} + 1 + {gap} + "
                        f"2 x {self._queries()} = {self._width()}, got {seq_len}")
        return errs

    def no_recall_baseline(self, seq_len: int, **_: Any) -> float:
        n, shared = self.params["num_kv_pairs"], self.params["shared"]
        return max(n - shared, 1) / self._queries()

    def generate(self, n: int, seq_len: int, rng: np.random.Generator, **_: Any) -> Examples:
        pairs, shared, max_gap = self.params["num_kv_pairs"], self.params["shared"], self.params["max_gap"]
        k_range, v_range = self._ranges()
        q = self._queries()
        keys = 3 + _distinct(rng, n, k_range, q)  # columns: A's only (N - s) | shared (s) | B's only (N - s)
        keys_a, keys_b = keys[:, :pairs], keys[:, pairs - shared:]
        values_a = 3 + k_range + _distinct(rng, n, v_range, pairs)
        values_b = 3 + k_range + _distinct(rng, n, v_range, pairs)
        answers = np.concatenate([np.full((n, pairs - shared), self.NONE), values_b], axis=1)  # per column
        order_a, order_b = _distinct(rng, n, pairs, pairs), _distinct(rng, n, pairs, pairs)
        asked = _distinct(rng, n, q, q)  # the query order
        start = rng.integers(0, seq_len - self._width() + 1, size=n)  # filler before A
        gaps = rng.integers(0, max_gap + 1, size=n)  # filler between B's pairs and its queries
        seq = np.full((n, seq_len + 1), self.FILLER, dtype=np.int64)
        labels = np.full((n, seq_len + 1), IGNORE_INDEX, dtype=np.int64)
        for i in range(n):
            a = int(start[i])
            seq[i, a:a + 2 * pairs:2], seq[i, a + 1:a + 2 * pairs:2] = keys_a[i, order_a[i]], values_a[i, order_a[i]]
            sep = a + 2 * pairs
            seq[i, sep] = self.SEPARATOR
            b = sep + 1
            seq[i, b:b + 2 * pairs:2], seq[i, b + 1:b + 2 * pairs:2] = keys_b[i, order_b[i]], values_b[i, order_b[i]]
            at = b + 2 * pairs + int(gaps[i]) + 2 * np.arange(q)  # the query positions; a filler follows each
            seq[i, at] = keys[i, asked[i]]
            labels[i, at + 1] = answers[i, asked[i]]
        return Examples(seq[:, :-1].copy(), labels[:, 1:].copy())


# ---------------------------------------------------------------- registration


@hookimpl
def register_components(register):
    # each task's signature declares its parameters (type, default, doc, bounds)
    register("dataset", "mqar", MQAR, doc="Multi-query associative recall (Zoology, Arora et al. 2023).",
             check=MQAR.config_check)
    register("dataset", "induction", Induction, doc="Induction heads (H3; Mamba sec. 4.1.2).",
             check=Induction.config_check)
    register("dataset", "selective_copy", SelectiveCopy, doc="Selective copying (Mamba sec. 3.1).",
             check=SelectiveCopy.config_check)
    register("dataset", "separator_reset", SeparatorReset,
             doc="Separator reset: two recall sequences joined by a separator (Mamba sec. 3.5.2).",
             check=SeparatorReset.config_check)
    register("dataset", "copy", Copy, doc="Copying a random prefix (Arjovsky et al. 2016).", check=Copy.config_check)
