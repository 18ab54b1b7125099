"""Strategies on synthetic oracles: correctness, 1-minimality, call counts, determinism, hints."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))

from strategy_oracles import (  # noqa: E402
    is_one_minimal,
    mismatched_pair,
    monotone,
    names,
    poisoned,
    random_culprits,
    random_function,
)

from bisector.strategies import BudgetExhausted, CountingOracle, Strategy, load_strategies  # noqa: E402
from bisector.strategies.auto import Auto  # noqa: E402
from bisector.strategies.bisect import Bisect  # noqa: E402
from bisector.strategies.ddmin import DDMin  # noqa: E402
from bisector.strategies.greedy import Greedy  # noqa: E402
from bisector.strategies.linear import Linear  # noqa: E402

MINIMAL = [Greedy, DDMin, Auto]
ALL = [Bisect, Linear, Greedy, DDMin, Auto]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_entry_points_load_every_builtin():
    found = load_strategies()
    assert {"bisect", "linear", "greedy", "ddmin", "auto"} <= set(found)
    for cls in found.values():
        assert isinstance(cls(), Strategy)


@pytest.mark.parametrize("cls", MINIMAL)
@FAST
@given(n=st.integers(1, 60), data=st.data())
def test_monotone_exact(cls, n, data):
    cands = names(n)
    culprits = frozenset(data.draw(st.lists(st.sampled_from(cands), unique=True, max_size=min(n, 8))))
    oracle = CountingOracle(monotone(culprits))
    assert cls().search(cands, oracle) == culprits


@pytest.mark.parametrize("cls", MINIMAL)
@FAST
@given(n=st.integers(2, 40), data=st.data())
def test_nonmonotone_poison_one_minimal(cls, n, data):
    cands = names(n)
    culprits = frozenset(data.draw(st.lists(st.sampled_from(cands), unique=True, max_size=min(n, 5))))
    a, b = data.draw(st.lists(st.sampled_from(cands), unique=True, min_size=2, max_size=2))
    kind = data.draw(st.sampled_from([poisoned, mismatched_pair]))
    base = kind(culprits, (a, b))
    everything = frozenset(cands)

    def f(s):  # all candidates FP32 passes by construction
        return s == everything or base(s)

    result = cls().search(cands, CountingOracle(f))
    assert is_one_minimal(f, result)


@pytest.mark.parametrize("cls", MINIMAL)
@FAST
@given(n=st.integers(1, 12), seed=st.integers(0, 10_000), p=st.sampled_from([0.2, 0.5, 0.8]))
def test_arbitrary_function_one_minimal(cls, n, seed, p):
    cands = names(n)
    f = random_function(cands, seed, p)
    result = cls().search(cands, CountingOracle(f))
    assert is_one_minimal(f, result)


@pytest.mark.parametrize("cls", ALL)
def test_all_fail_returns_everything(cls):
    cands = names(10)
    assert cls().search(cands, CountingOracle(lambda s: False)) == frozenset(cands)


@pytest.mark.parametrize("cls", ALL)
def test_all_fp16_passes_returns_empty(cls):
    assert cls().search(names(10), CountingOracle(lambda s: True)) == frozenset()


@pytest.mark.parametrize("cls", ALL)
def test_empty_candidates(cls):
    assert cls().search([], CountingOracle(lambda s: True)) == frozenset()


def _bound(n: int, k: int) -> float:
    return 1.3 * math.log2(math.comb(n, k)) + 2


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_auto_meets_call_bound_n128(k):
    cands = names(128)
    counts = []
    for seed in range(20):
        culprits = random_culprits(cands, k, seed * 101 + k)
        oracle = CountingOracle(monotone(culprits))
        assert Auto().search(cands, oracle) == culprits
        counts.append(oracle.distinct)
    mean = sum(counts) / len(counts)
    assert mean <= _bound(128, k), (k, mean, _bound(128, k))


@pytest.mark.parametrize(("n", "k"), [(512, 8), (1000, 8)])
def test_auto_ratio_holds_larger(n, k):
    cands = names(n)
    counts = []
    for seed in range(5):
        culprits = random_culprits(cands, k, seed * 7 + n)
        oracle = CountingOracle(monotone(culprits))
        assert Auto().search(cands, oracle) == culprits
        counts.append(oracle.distinct)
    assert sum(counts) / len(counts) <= _bound(n, k)


# ------------------------------------------------------------------ bisect / linear (Polygraphy semantics)
def _prefix_oracle(cands, last_needed):
    """Monotone in the prefix: passes iff the first last_needed+1 candidates are FP32."""
    need = frozenset(cands[: last_needed + 1])
    return lambda s: need <= s


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 33, 100])
def test_bisect_matches_polygraphy_k(n):
    cands = names(n)
    for last in range(n):
        oracle = CountingOracle(_prefix_oracle(cands, last))
        assert Bisect().search(cands, oracle) == frozenset(cands[: last + 1])
        assert oracle.distinct <= 2 + math.ceil(math.log2(max(n, 1)))
        lin = CountingOracle(_prefix_oracle(cands, last))
        assert Linear().search(cands, lin) == frozenset(cands[: last + 1])
        assert lin.distinct == last + 2


def test_bisect_edge_cases():
    cands = names(16)
    zero = CountingOracle(lambda s: True)
    assert Bisect().search(cands, zero) == frozenset() and zero.distinct == 1
    only_all = CountingOracle(lambda s: s == frozenset(cands))
    assert Bisect().search(cands, only_all) == frozenset(cands)
    assert frozenset(cands) in only_all.cache  # K=N is asked, so the driver knows it passes
    never = CountingOracle(lambda s: False)
    assert Bisect().search(cands, never) == frozenset(cands)


def test_bisect_reverse():
    cands = names(20)
    need = frozenset(cands[-5:])
    oracle = CountingOracle(lambda s: need <= s)
    assert Bisect(direction="reverse").search(cands, oracle) == need
    assert Linear(direction="reverse").search(cands, CountingOracle(lambda s: need <= s)) == need
    with pytest.raises(ValueError):
        Bisect(direction="sideways")


# ------------------------------------------------------------------ determinism, hints, budget
@pytest.mark.parametrize("cls", ALL)
def test_deterministic_call_sequence(cls):
    cands = names(50)
    f = poisoned(random_culprits(cands, 3, 5), (cands[3], cands[40]))
    runs = []
    for _ in range(2):
        oracle = CountingOracle(lambda s: s == frozenset(cands) or f(s))
        cls().search(cands, oracle)
        runs.append(oracle.calls)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("cls", ALL)
def test_unknown_hint_ignored(cls):
    cands = names(30)
    culprits = random_culprits(cands, 2, 3)
    plain = cls().search(cands, CountingOracle(monotone(culprits)))
    hinted = cls().search(cands, CountingOracle(monotone(culprits)), flavour="strawberry", budget=None)
    assert plain == hinted


def test_scores_reduce_auto_calls():
    cands = names(128)
    total_plain = total_scored = 0
    for seed in range(10):
        culprits = random_culprits(cands, 3, seed)
        scores = {n: (10.0 if n in culprits else 1.0 / (1 + i)) for i, n in enumerate(cands)}
        plain, scored = CountingOracle(monotone(culprits)), CountingOracle(monotone(culprits))
        assert Auto().search(cands, plain) == culprits
        assert Auto().search(cands, scored, scores=scores) == culprits
        total_plain += plain.distinct
        total_scored += scored.distinct
    assert total_scored < total_plain / 2


def test_uninformative_scores_cost_little():
    cands = names(128)
    extra = 0
    for seed in range(10):
        culprits = random_culprits(cands, 2, seed)
        scores = {n: float((i * 37) % 11) for i, n in enumerate(cands)}
        plain, scored = CountingOracle(monotone(culprits)), CountingOracle(monotone(culprits))
        assert Auto().search(cands, plain) == culprits
        assert Auto().search(cands, scored, scores=scores) == culprits
        extra += scored.distinct - plain.distinct
    assert extra / 10 <= 2


@pytest.mark.parametrize("cls", ALL)
def test_budget_propagates_and_progress_reports_best(cls):
    cands = names(64)
    culprits = random_culprits(cands, 3, 1)
    seen = []
    oracle = CountingOracle(monotone(culprits), budget=5)
    with pytest.raises(BudgetExhausted):
        cls().search(cands, oracle, budget=5, progress=seen.append)
    assert seen and all({"phase", "fp32_size", "best"} <= set(d) for d in seen)
    for d in seen:
        if d["best"] is not None:
            assert culprits <= d["best"]


@pytest.mark.parametrize("cls", MINIMAL)
def test_batch_hint_same_result(cls):
    cands = names(40)
    f = poisoned(random_culprits(cands, 3, 9), (cands[1], cands[2]))
    g = lambda s: s == frozenset(cands) or f(s)  # noqa: E731
    plain = cls().search(cands, CountingOracle(g))
    batched_oracle = CountingOracle(g)
    sizes = []

    def batch(sets):
        sizes.append(len(sets))
        return batched_oracle.batch(sets)

    batched = cls().search(cands, batched_oracle, batch=batch)
    assert is_one_minimal(g, batched) and is_one_minimal(g, plain)
    if cls is Auto:
        assert sizes  # the final single-removal checks go through batch


def test_group_testings_cached_log_binomials_are_the_direct_formulas_bit_for_bit():
    """`gt`'s posterior sums read lgamma from a cache and `_p_clean` inlines two `_log_comb`s: its decisions
    depend on these floats, so they must be the direct formulas' exact values, not approximations of them."""
    import math
    import random

    from strategies.gt import GroupTesting, _log_comb

    rng = random.Random(7)
    for _ in range(5000):
        n = rng.randint(0, 4000)
        k = rng.randint(-2, n + 2)
        direct = -math.inf if k < 0 or k > n else math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
        assert _log_comb(n, k) == direct
    g = GroupTesting()
    for _ in range(100):
        n = rng.randint(5, 1500)
        found = rng.randint(0, n // 2)
        u = rng.randint(1, n - found)
        post = g._posterior(n, found, u)
        for size in {1, u, rng.randint(1, u)}:
            direct = sum(w * math.exp(_log_comb(u - size, m) - _log_comb(u, m)) for m, w in post if m <= u - size)
            assert g._p_clean(post, u, size) == direct
