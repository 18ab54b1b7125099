"""`auto`'s last step: pairs of nearest-miss removals, asked only where the answers show a non-monotone oracle."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from strategy_oracles import additive, additive_case, is_one_minimal, monotone, names, random_culprits  # noqa: E402

from bisector.strategies import CountingOracle, load_strategies  # noqa: E402
from bisector.strategies._util import Asker, pair_removals  # noqa: E402

AUTO = load_strategies()["auto"]


def _with_excess(passes, excess):
    passes.excess = excess
    return passes


def _twin_inputs(cands, culprits, a, b):
    """A sketch of Basic Pitch's CQT front end at 1e-2: the culprits must stay FP32, and `a` and `b` (two copies
    of one input that a later step compares) must share a precision: rounding one of them alone fails by a
    little (excess 1.1), missing a culprit by a lot (2 per culprit)."""
    def excess(s):
        s = frozenset(s)
        e = 0.5 + 2.0 * len(culprits - s)
        if (a in s) != (b in s):
            e += 0.6
        return e

    return _with_excess(lambda s: excess(s) <= 1.0, excess)


def test_a_pair_that_fails_alone_and_passes_together_is_found():
    cands = names(120)
    culprits = frozenset(cands[i] for i in (3, 40, 77, 101, 110, 115))
    a, b = cands[20], cands[90]  # in different groups of the search: each isolated as a "culprit"
    f = _twin_inputs(cands, culprits, a, b)
    results = {}
    for pairs in (0, 8):
        oracle = CountingOracle(f)
        # pairs_anyway: this oracle shows no other sign of being non-monotone (see the test of the gate below)
        r = AUTO(pairs=pairs, pairs_anyway=True).search(cands, oracle, excess=f.excess)
        results[pairs] = (r, oracle.distinct)
        assert oracle(r) and is_one_minimal(oracle, r)
    without, with_pairs = results[0][0], results[8][0]
    assert without == culprits | {a, b}  # 1-minimal: a or b alone back to FP16 fails
    assert with_pairs == culprits  # both back to FP16 together passes
    assert results[8][1] > results[0][1]  # and that took evaluations


def test_the_pairs_are_asked_once_the_answers_show_a_non_monotone_oracle():
    cands = names(120)
    culprits = frozenset(cands[i] for i in (3, 40, 77, 101, 110, 115))
    a, b = cands[20], cands[90]
    f = _twin_inputs(cands, culprits, a, b)
    for witnessed in (False, True):
        oracle = CountingOracle(f)
        ask = Asker(cands, oracle, {"excess": f.excess})
        found = culprits | {a, b}
        assert ask(found) and not any(ask(found - {x}) for x in found)
        if witnessed:  # a set that passed inside one that failed (more FP32, yet a failure)
            assert ask(culprits) and not ask(culprits | {a})
        assert ask.non_monotone is witnessed
        r = AUTO()._pairs(ask, found, cands)
        assert r == (culprits if witnessed else found)


def test_a_monotone_oracle_asks_no_pairs():
    cands = names(400)
    for k in (3, 12, 30):  # sparse, and past the switch to the ranked search
        culprits = random_culprits(cands, k, 11 * k)
        f = _with_excess(monotone(culprits), lambda s, c=culprits: 0.5 + len(c - frozenset(s)))
        calls = {}
        for pairs in (0, 8):
            oracle = CountingOracle(f)
            r = AUTO(pairs=pairs).search(cands, oracle, excess=f.excess)
            assert r == culprits
            calls[pairs] = oracle.calls
        assert calls[8] == calls[0]  # the very same sets in the same order: no witness, no pair asked


def test_pairs_need_the_excess_hint():
    cands = names(120)
    culprits = frozenset(cands[i] for i in (3, 40, 77, 101, 110, 115))
    f = _twin_inputs(cands, culprits, cands[20], cands[90])
    calls = {}
    for pairs in (0, 8):
        oracle = CountingOracle(f)
        AUTO(pairs=pairs, pairs_anyway=True).search(cands, oracle)  # no excess: nothing to rank the misses by
        calls[pairs] = oracle.calls
    assert calls[8] == calls[0]


def test_the_witness_of_a_non_monotone_oracle():
    cands = names(10)
    ask = Asker(cands, lambda s: len(s) != 5, {})
    ask(frozenset(cands[:6]))  # passes
    ask(frozenset(cands[:4]))  # passes, inside the first: what a monotone oracle does as well
    assert not ask.non_monotone
    ask(frozenset(cands[:5]))  # fails, and holds a set that passed (cands[:4]): more FP32, yet a failure
    assert ask.non_monotone


def test_pair_removals_asks_the_nearest_pairs_once_and_keeps_a_set_none_of_them_shrinks():
    cands = names(12)
    need = frozenset(cands[:6])
    weight = {x: 0.1 * (i + 1) for i, x in enumerate(cands)}  # cands[0] the nearest miss, cands[5] the farthest
    f = _with_excess(lambda s: need <= s, lambda s: 0.9 + sum(weight[x] for x in need - frozenset(s)))
    oracle = CountingOracle(f)
    ask = Asker(cands, oracle, {"excess": f.excess})
    assert ask(need) and not any(ask(need - {x}) for x in need)  # 1-minimal: 7 sets asked
    assert pair_removals(ask, need, lambda t: t, nearest=3) == need
    asked = [need - c for c in oracle.calls[7:]]
    assert asked == [frozenset(cands[:2]), frozenset((cands[0], cands[2])), frozenset(cands[1:3])]
    assert oracle.distinct == 10  # C(3, 2) new sets, in order of summed excess


def test_the_diffuse_estimate_prices_in_the_pairs_that_cost_something():
    """The estimate said once the prefix is known counts the last step's C(pairs, 2) tries (its cost where no
    pair passes), since the step comes after it; without the `excess` hint no pair is asked and none is counted,
    nor for a set larger than `pairs_max_set`."""
    cands, w, t = additive_case(200, 1.0, 0.2, 0)
    for hinted, max_set in ((True, 0), (False, 0), (True, 64)):
        said = {}
        for pairs in (0, 8):
            f = additive(w, t, jitter=0.2, seed=0)
            events: list[dict] = []
            hints = {"excess": f.excess} if hinted else {}
            AUTO(pairs=pairs, pairs_max_set=max_set).search(cands, CountingOracle(f), progress=events.append,
                                                           **hints)
            said[pairs] = next(d["estimate"] for d in events if "estimate" in d and d["estimate"].get("set_at_most"))
        assert said[8]["set_size"] > 64  # the prefix: larger than the default limit
        priced = hinted and max_set == 0
        assert said[8]["evaluations"] - said[0]["evaluations"] == (28 if priced else 0), (hinted, max_set, said)


def test_no_pairs_for_a_set_larger_than_the_limit():
    """Two nodes are under 3 % of a set over 64 members, and a pair that passes costs a new 1-minimality check of
    the whole set: the step leaves such sets alone by default (`pairs_max_set=0`: no limit)."""
    cands = names(300)
    culprits = frozenset(cands[i] for i in range(0, 280, 4))  # 70 culprits
    a, b = cands[101], cands[203]
    f = _twin_inputs(cands, culprits, a, b)
    results = {}
    for max_set in (64, 0):
        oracle = CountingOracle(f)
        results[max_set] = AUTO(pairs_anyway=True, pairs_max_set=max_set).search(cands, oracle, excess=f.excess)
        assert oracle(results[max_set]) and is_one_minimal(oracle, results[max_set])
    assert results[64] == culprits | {a, b}
    assert results[0] == culprits
