"""Packed sets: plans a search remembers, as bit masks that read as frozensets of names (bisector.packed_sets)."""

from __future__ import annotations

import pickle
import tracemalloc

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bisector.compare import PerOutput, Tolerance
from bisector.packed_sets import PackedSet, SetMemo, Universe
from bisector.search.oracle import Oracle
from strategies._util import Asker

NAMES = [f"n{i}" for i in range(23)] + ["with space", "quote'\"", "ünï", ""]


@settings(max_examples=200, deadline=None)
@given(st.sets(st.sampled_from(NAMES)), st.sets(st.sampled_from(NAMES)))
def test_a_packed_set_reads_as_the_frozenset_it_packs(a, b):
    u = Universe(NAMES)
    p, f, g = u.pack(a), frozenset(a), frozenset(b)
    assert isinstance(p, PackedSet)
    assert sorted(p) == sorted(f) and len(p) == len(f)
    assert all((x in p) == (x in f) for x in NAMES + ["elsewhere", 3, None])
    assert p == f and f == p and not p != f and not f != p and hash(p) == hash(f)
    assert (p == g) == (f == g) and (u.pack(b) == p) == (f == g)
    assert (p | g) == (f | g) and (g | p) == (g | f) and (p & g) == (f & g) and (p - g) == (f - g)
    assert (g - p) == (g - f) and (p ^ g) == (f ^ g)
    assert (p <= g) == (f <= g) and (p < g) == (f < g) and (p >= g) == (f >= g)
    assert p.issubset(g) == f.issubset(g) and p.issuperset(g) == f.issuperset(g)
    assert p.union(g) == f.union(g) and p.difference(g) == f.difference(g) and p.intersection(g) == f.intersection(g)
    assert {f: "v"}[p] == "v" and {p: "v"}[f] == "v"
    back = pickle.loads(pickle.dumps(p))
    assert type(back) is frozenset and back == f


def test_names_outside_the_universe_stay_a_frozenset():
    u = Universe(["a", "b"])
    got = u.pack({"a", "z"})
    assert type(got) is frozenset and got == {"a", "z"}
    memo = SetMemo(u)
    memo[{"a", "z"}] = 1
    memo[{"a"}] = 2
    assert memo[frozenset({"z", "a"})] == 1 and memo[u.pack({"a"})] == 2 and len(memo) == 2
    assert sorted(map(sorted, memo)) == [["a"], ["a", "z"]]
    assert frozenset({"b"}) not in memo and memo.get({"b"}) is None


class _Stub:
    """A backend whose output error grows with the number of FP16 nodes: a plan passes with at most 3 of them."""

    name = "stub"

    def run(self, plan, feeds, outputs=None):
        return {"y": np.full(4, 0.1 * len(plan.fp16), np.float32)}


def _sets(n_cands: int, n_sets: int, size: int):
    rng = np.random.default_rng(0)
    names = [f"node_{i}" for i in range(n_cands)]
    return names, [frozenset(rng.choice(names, size, replace=False).tolist()) for _ in range(n_sets)]


def test_a_search_holds_its_asked_sets_as_bits_not_as_frozensets():
    """A diffuse search of a 1200-node model asked 3399 sets of ~1100 nodes: as frozensets the oracle's memo,
    its verdicts and the strategy's memo held ~300 MB of them (two frozensets per set asked). 300 such sets must
    cost the oracle and an Asker, verdicts included (~5 KB each), well under one frozenset copy of them."""
    names, sets = _sets(1200, 300, 1100)
    tol = Tolerance(atol=PerOutput(0.35), rtol=PerOutput(0.0))
    golden = [{"y": np.zeros(4, np.float32)}]
    oracle = Oracle(_Stub(), names, [{}], golden, tol)
    ask = Asker(names, oracle.passes, {})
    one_copy = sum(__import__("sys").getsizeof(s) for s in sets)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        answers = [ask(sorted(s)) for s in sets]  # each set built anew, as a strategy builds the sets it asks
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert answers == [len(s) >= 1197 for s in sets]  # fails unless at most 3 nodes are FP16
    assert len(oracle.history) == len(ask.memo) == 300
    assert held < one_copy / 4, (held, one_copy)
    # what the oracle remembers reads as the sets asked
    assert [v.fp32 for v in oracle.history] == sets
    assert all(oracle.verdicts[s] is v for s, v in zip(sets, oracle.history))
    assert ask(sets[5]) == answers[5] and len(oracle.history) == 300  # asked again: memo hits, no evaluation


def test_the_best_passing_set_is_a_frozenset_among_the_smallest_by_candidate_order():
    names = [f"n{i}" for i in range(10)]
    tol = Tolerance(atol=PerOutput(0.35), rtol=PerOutput(0.0))
    oracle = Oracle(_Stub(), names, [{}], [{"y": np.zeros(4, np.float32)}], tol)
    for s in ({"n9", "n8", "n7", "n6", "n5", "n4", "n3"}, {"n0", "n1", "n2", "n3", "n4", "n5", "n9"},
              {"n0", "n1", "n2", "n3", "n4", "n5", "n6"}, set(names[:6])):
        oracle.evaluate(frozenset(s))
    best = oracle.best_passing()
    assert type(best) is frozenset and best == frozenset(names[:7])
