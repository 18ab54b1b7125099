"""Resuming a plan from the latest plan's tensors at a cut between blocks (bisector.backends.emulate.plan_states):
the same bits as a run from the reference, on plans like a search's (a passing set, then that set less one
member at a time), on a model whose skip connections and mid-chain output cross several cuts."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from bisector.backends.emulate.backend import EmulateBackend
from bisector.backends.emulate.plan_states import PlanStates
from bisector.fp16.plan import Plan
from bisector.model.catalog import Catalog


def _skip_model(n: int = 24, width: int = 8):
    """MatMul/Tanh pairs with two long skip connections (r0 read at the middle and at the end) and a graph output
    made in the middle: tensors that cross many cuts, and an output made long before the last block."""
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("Relu", ["x"], ["r0"], name="relu")]
    inits, h = [], "r0"
    for i in range(n):
        w = (np.eye(width) + rng.normal(0, 0.05, (width, width))).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [h, f"w{i}"], [f"m{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"tanh{i}"))
        h = f"t{i}"
        if i == n // 2:
            nodes.append(helper.make_node("Add", [h, "r0"], ["mid"], name="skip_mid"))
            nodes.append(helper.make_node("Identity", ["mid"], ["early"], name="early_out"))
            h = "mid"
    nodes.append(helper.make_node("Add", [h, "r0"], ["y"], name="skip_end"))
    graph = helper.make_graph(
        nodes, "skips", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, width])],
        [helper.make_tensor_value_info("early", TensorProto.FLOAT, [2, width]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, width])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _search_like_plans(cat: Catalog, seed: int) -> list[Plan]:
    """Random plans, then a passing-set-like plan and that set less each member in turn (a 1-minimality check),
    with an acceptance now and then (the set shrinks, as a check's does)."""
    rng = np.random.default_rng(seed)
    cands = list(cat.candidates)
    plans = [Plan(frozenset(c for c in cands if rng.random() < p), cat.candidates) for p in (0.2, 0.8, 0.5)]
    fp32 = [c for c in cands if rng.random() < 0.4]
    kept = set(fp32)
    for m in rng.permutation(fp32):
        trial = kept - {m}
        plans.append(Plan(frozenset(c for c in cands if c not in trial), cat.candidates))
        if rng.random() < 0.3:
            kept = trial
    return plans


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_resumed_runs_give_the_bits_of_runs_from_the_reference(monkeypatch, seed):
    cat = Catalog.from_model(_skip_model())
    x = {"x": np.random.default_rng(seed).uniform(-1, 1, (2, 8)).astype(np.float32)}
    plans = _search_like_plans(cat, seed)
    monkeypatch.setenv("BISECTOR_PLAN_STATES", "0")
    plain = EmulateBackend(block_size=4)
    plain.open(cat)
    assert plain.executor.plan_states is None
    expected = [plain.run(p, x) for p in plans]
    monkeypatch.setenv("BISECTOR_PLAN_STATES", "1")
    resuming = EmulateBackend(block_size=4)
    resuming.open(cat)
    got = [resuming.run(p, x) for p in plans]
    states = resuming.executor.plan_states
    assert states is not None and states.resumed > len(plans) // 3  # most of the check resumed from a cut
    for e, g in zip(expected, got):
        assert set(e) == set(g)
        for name in e:
            np.testing.assert_array_equal(e[name], g[name], err_msg=name)


def test_a_run_on_other_inputs_does_not_resume_from_a_plan_of_these(monkeypatch):
    cat = Catalog.from_model(_skip_model())
    rng = np.random.default_rng(3)
    x1 = {"x": rng.uniform(-1, 1, (2, 8)).astype(np.float32)}
    x2 = {"x": rng.uniform(-1, 1, (2, 8)).astype(np.float32)}
    plans = _search_like_plans(cat, 4)[3:8]
    be = EmulateBackend(block_size=4)
    be.open(cat)
    be.run(plans[0], x1)
    resumed = be.executor.plan_states.resumed
    on_x2 = be.run(plans[1], x2)  # the kept plan is x1's: no resuming from it
    assert be.executor.plan_states.resumed == resumed
    fresh = EmulateBackend(block_size=4)
    fresh.open(cat)
    for name, value in fresh.run(plans[1], x2).items():
        np.testing.assert_array_equal(on_x2[name], value)


class _Reference(dict):
    """A reference that can be weakly referenced, as the executor's ReferenceStore can."""


def test_cuts_are_spaced_so_that_what_crosses_them_fits_the_budget():
    # six blocks in a chain, each output 100 bytes, the last a graph output; block 0's output also read by block 5
    blocks = [([f"n{i}"], [f"t{i - 1}"] + (["t0"] if i == 5 else []) if i else ["x"], [f"t{i}"]) for i in range(6)]
    ref = _Reference({f"t{i}": np.zeros(25, np.float32) for i in range(6)})
    whole = PlanStates(blocks, ["t5"], budget=10_000)
    layout = whole.layout(ref)
    assert layout is not None and layout.cuts == [1, 2, 3, 4, 5]
    assert layout.kept == {"t0", "t1", "t2", "t3", "t4"}  # t5 is made after every cut
    spaced = PlanStates(blocks, ["t5"], budget=250)
    layout = spaced.layout(ref)
    assert layout is not None and layout.cuts == [3]  # step 3: t0 (read at 5) and t2 cross it
    assert layout.kept == {"t0", "t2"}
    assert PlanStates(blocks, ["t5"], budget=50).layout(ref) is None


def test_a_kept_plan_resumes_at_the_last_cut_before_the_first_difference():
    blocks = [([f"n{i}"], [f"t{i - 1}"] if i else ["x"], [f"t{i}"]) for i in range(6)]
    ref = _Reference({f"t{i}": np.zeros(4, np.float32) for i in range(6)})
    states = PlanStates(blocks, ["t5"], budget=10_000)
    states.layout(ref)
    kept = {f"t{i}": np.full(4, i, np.float32) for i in range(5)}
    every = frozenset(f"n{i}" for i in range(6))
    states.store(ref, every, kept)
    cut, seed, inherited = states.start(ref, every - {"n3"})
    assert cut == 3 and set(seed) == {"t2"} and set(inherited) == {"t0", "t1", "t2"}
    assert states.start(ref, every - {"n3"}) is None  # handed over: the run keeps its own in its place
    states.store(ref, every, kept)
    assert states.start(ref, every - {"n0"}) is None  # differs in the first block: the reference is as near
    states.store(ref, every, kept)
    assert states.start(_Reference(ref), every - {"n3"}) is None  # another reference's plan


def test_the_ranking_and_the_runs_after_the_search_do_not_hold_the_latest_plan():
    """The kept plan's tensors are let go where nothing resumes from them: on entering the ranking's one-off
    plans (whose own peak would stack on them), the runs after the search, and the node-by-node second opinion."""
    cat = Catalog.from_model(_skip_model())
    x = {"x": np.random.default_rng(5).uniform(-1, 1, (2, 8)).astype(np.float32)}
    plans = _search_like_plans(cat, 6)
    be = EmulateBackend(block_size=4)
    be.open(cat)
    states = be.executor.plan_states

    def kept() -> bool:
        return states._state is not None

    be.run(plans[0], x)
    assert kept()
    with be.one_off_plans():
        assert not kept()
        be.run(plans[1], x)  # a one-off plan keeps nothing
        assert not kept()
    be.run(plans[2], x)
    assert kept()
    with be.once_after_search():
        assert not kept()
    be.run(plans[3], x)
    be.run_node_by_node(plans[4], x)
    assert not kept()
    be.run(plans[5], x)
    be.drop_plan_states()
    assert not kept()
