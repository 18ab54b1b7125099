"""Screening a new plan on the batch item of the last failure (bisector.search.screen): the same verdicts as
judging whole batches, fewer whole-batch runs, and no screening where an item does not stand for its batch."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from bisector.backends.emulate.backend import EmulateBackend
from bisector.compare import Tolerance, compare_output
from bisector.model.catalog import Catalog
from bisector.search.judge import Verdict
from bisector.search.oracle import Oracle
from bisector.values import PerOutput

B, D = 6, 48


@pytest.fixture(autouse=True)
def _screen_small_tensors(monkeypatch):
    """These models' tensors are a few KB, below the size from which the emulator says screening pays
    (`EmulateBackend.screen_pays`): screening is tested on them with that floor at 0, and the floor itself below."""
    monkeypatch.setattr(EmulateBackend, "SCREEN_FROM_BYTES", 0)


def _model(mix_batch: bool = False) -> onnx.ModelProto:
    """x [B, D] -> MatMul, Tanh, MatMul, Add, MatMul (and, with `mix_batch`, + the mean over the batch)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32), f"w{i}")
             for i in range(3)]
    inits.append(numpy_helper.from_array(rng.standard_normal(D).astype(np.float32), "b"))
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h0"], name="mm0"),
             helper.make_node("Relu", ["h0"], ["t0"], name="relu"),
             helper.make_node("MatMul", ["t0", "w1"], ["h1"], name="mm1"),
             helper.make_node("Add", ["h1", "b"], ["h2"], name="add"),
             helper.make_node("MatMul", ["h2", "w2"], ["y" if not mix_batch else "h3"], name="mm2")]
    if mix_batch:
        inits.append(numpy_helper.from_array(np.array([0], np.int64), "axes"))
        nodes += [helper.make_node("ReduceMean", ["h3", "axes"], ["m"], name="batch_mean", keepdims=1),
                  helper.make_node("Add", ["h3", "m"], ["y"], name="mix")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", D])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _job(model: onnx.ModelProto, stat: str = "elemwise", sets: int = 1):
    rng = np.random.default_rng(1)
    feeds_list = []
    for _ in range(sets):
        x = rng.uniform(-1, 1, (B, D)).astype(np.float32)
        x[2] *= 6  # item 2 holds the largest values: FP16's absolute errors are largest there
        feeds_list.append({"x": x})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    golden = [{"y": sess.run(None, f)[0]} for f in feeds_list]
    cat = Catalog.from_model(model)
    return cat, feeds_list, golden


class Counting(EmulateBackend):
    """The emulator, counting its runs by the batch size they were given."""

    def __init__(self):
        super().__init__()
        self.batches: list[int] = []

    def run(self, plan, feeds, outputs=None):
        if plan.fp32 != frozenset(plan.candidates):  # not the FP32 reference (known, or a screen's own check)
            self.batches.append(int(np.shape(feeds["x"])[0]))
        return super().run(plan, feeds, outputs)


def _verdicts(cat, feeds_list, golden, tol, screen: bool, backend=None):
    backend = backend or Counting()
    backend.open(cat)
    oracle = Oracle(backend, cat.candidates, feeds_list, golden, tol, screen=screen)
    plans = [frozenset(c) for r in range(len(cat.candidates) + 1) for c in itertools.combinations(cat.candidates, r)]
    return [oracle.evaluate(p) for p in plans], backend, oracle


def _tolerance(stat: str = "elemwise") -> Tolerance:
    # nearly absolute: item 2's larger values fail first
    return Tolerance(atol=PerOutput(2e-3), rtol=PerOutput(1e-4), stat=PerOutput(stat))


def test_screened_search_gives_the_same_verdicts_with_fewer_whole_batch_runs():
    cat, feeds, golden = _job(_model())
    tol = _tolerance()
    whole, wb, _ = _verdicts(cat, feeds, golden, tol, screen=False)
    screened, sb, oracle = _verdicts(cat, feeds, golden, tol, screen=True)
    assert [v.passed for v in screened] == [v.passed for v in whole]
    fails = sum(not v.passed for v in whole)
    assert 3 <= fails < len(whole), "the case must have failing and passing plans"
    marked = [v for v in screened if v.screened is not None]
    assert marked and oracle.screen.screened == len(marked)
    assert all(not v.passed for v in marked)
    # item 2: where the errors are largest (item 3 in one plan); with its neighbour, as one MatMul row alone
    # takes another kernel in ONNX Runtime (not bit for bit the batch's: the screen's own check finds it)
    items = [v.screened for v in marked]
    assert set(items) <= {(0, 2, 2), (0, 3, 2)} and items.count((0, 2, 2)) > len(items) // 2
    by_plan = {v.fp32: v for v in whole}
    for v in marked:  # the item's excess: a lower bound of the batch's (here the same item is the worst)
        assert v.excess <= by_plan[v.fp32].excess
    # whole-batch runs: one per plan before; now none for a plan that failed on its item
    plans = len(whole) - 1  # the all-FP32 plan runs nothing: its outputs are the reference
    assert wb.batches.count(B) == plans
    assert sb.batches.count(B) == plans - len(marked)
    assert sb.batches.count(2) >= len(marked)


def test_an_item_that_does_not_stand_for_its_batch_is_not_screened():
    """A model that mixes its items (the mean over the batch): the FP32 run of one item differs from the batch's
    at that item, so every plan is judged whole, with the same verdicts."""
    cat, feeds, golden = _job(_model(mix_batch=True))
    tol = _tolerance()
    whole, _, _ = _verdicts(cat, feeds, golden, tol, screen=False)
    screened, sb, _ = _verdicts(cat, feeds, golden, tol, screen=True)
    assert [v.passed for v in screened] == [v.passed for v in whole]
    assert any(not v.passed for v in whole)
    assert all(v.screened is None for v in screened)
    assert sb.batches.count(B) == len(whole) - 1 and set(sb.batches) == {B}


def test_no_screening_for_statistics_over_the_batch_or_on_other_backends():
    cat, feeds, golden = _job(_model())
    screened, sb, oracle = _verdicts(cat, feeds, golden, _tolerance("mean"), screen=True)
    assert not oracle.screen.enabled and all(v.screened is None for v in screened)

    class NotSaid(Counting):
        screens_items = False

    screened, sb, oracle = _verdicts(cat, feeds, golden, _tolerance(), screen=True, backend=NotSaid())
    assert all(v.screened is None for v in screened) and set(sb.batches) == {B}


def test_the_first_failure_on_an_item_is_confirmed_on_the_whole_batch():
    """The first plan that fails on its item is judged whole as well (and reported whole); screening stops
    where the whole batch does not fail with at least the item's excess."""
    cat, feeds, golden = _job(_model())
    tol = _tolerance()
    screened, sb, oracle = _verdicts(cat, feeds, golden, tol, screen=True)
    first_fail = next(i for i, v in enumerate(screened) if not v.passed)
    confirmed = next(i for i, v in enumerate(screened) if i > first_fail and not v.passed)
    assert screened[confirmed].screened is None  # judged whole: the confirmation
    assert oracle.screen.enabled

    class Liar(Counting):  # a backend whose one-item runs fail where the batch passes
        def run(self, plan, feeds, outputs=None):
            out = super().run(plan, feeds, outputs)
            if np.shape(feeds["x"])[0] < B and plan.fp32 != frozenset(plan.candidates):
                out = {k: v + 1.0 for k, v in out.items()}
            return out

    whole, _, _ = _verdicts(cat, feeds, golden, tol, screen=False)
    lied, _, oracle = _verdicts(cat, feeds, golden, tol, screen=True, backend=Liar())
    assert not oracle.screen.enabled
    assert [v.passed for v in lied] == [v.passed for v in whole]
    assert all(v.screened is None for v in lied)


def test_several_unbatched_input_sets_judge_the_last_failing_set_first():
    cat, feeds, golden = _job(_model(), sets=3)
    feeds = [{k: v[2:3] for k, v in f.items()} for f in feeds]  # batch 1: the sets themselves are screened
    golden = [{k: v[2:3] for k, v in g.items()} for g in golden]
    tol = _tolerance()
    whole, _, _ = _verdicts(cat, feeds, golden, tol, screen=False)
    screened, _, _ = _verdicts(cat, feeds, golden, tol, screen=True)
    assert [v.passed for v in screened] == [v.passed for v in whole]
    assert any(v.screened is not None and v.screened[2] == 0 for v in screened)
    for a, b in zip(screened, whole):  # where the screen passed, the other sets were judged: the verdict is whole
        if a.screened is None:
            assert (a.worst_set, a.excess, a.failing) == (b.worst_set, b.excess, b.failing)


def test_a_screened_verdict_keeps_its_mark_in_the_journal():
    cat, feeds, golden = _job(_model())
    screened, _, _ = _verdicts(cat, feeds, golden, _tolerance(), screen=True)
    v = next(v for v in screened if v.screened is not None)
    back = Verdict.from_json(v.to_json())
    assert back.screened == v.screened and back.passed is False
    plain = next(v for v in screened if v.screened is None)
    assert "screened" not in plain.to_json() and Verdict.from_json(plain.to_json()).screened is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_the_comparison_says_where_its_worst_element_is(monkeypatch, dtype):
    monkeypatch.setattr("bisector.compare._CHUNK", 97)
    rng = np.random.default_rng(5)
    g = rng.standard_normal((7, 60)).astype(dtype)
    a = (g + rng.standard_normal(g.shape) * 1e-2).astype(dtype)
    a[4, 33] = g[4, 33] + 5  # the worst element
    r = compare_output("y", a, g, Tolerance(atol=PerOutput(1e-3), rtol=PerOutput(1e-3)))
    assert np.unravel_index(r.worst_index, g.shape) == (4, 33)
    a[1, 2] = np.nan  # NaN is worse than any number
    r = compare_output("y", a, g, Tolerance(atol=PerOutput(1e-3), rtol=PerOutput(1e-3)))
    assert np.unravel_index(r.worst_index, g.shape) == (1, 2)


def test_a_search_screens_and_finds_what_it_finds_judging_whole_batches(tmp_path, monkeypatch):
    """`bisector.precision` on a batched input: the same set and evaluations with screening as without it, some
    evaluations failed on one item (constraints.json's `evaluations.screened`), the final verdict judged whole."""
    import bisector

    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    x = np.random.default_rng(1).uniform(-1, 1, (B, D)).astype(np.float32)
    x[2] *= 6
    from bisector.model.inputs import save_inputs

    save_inputs(tmp_path / "inputs.json", [{"x": x}])
    kw = dict(load_inputs=[tmp_path / "inputs.json"], atol=2e-3, rtol=1e-4, no_cache=True)
    on = bisector.precision(str(path), output_dir=tmp_path / "on", **kw)
    monkeypatch.setattr(EmulateBackend, "screens_items", False)
    off = bisector.precision(str(path), output_dir=tmp_path / "off", **kw)
    assert on.fp32_nodes == off.fp32_nodes and on.passed and on.minimal
    a, b = on.constraints.evaluations, off.constraints.evaluations
    assert (a.total, a.new) == (b.total, b.new) and a.screened > 0 == b.screened
    assert on.verdict.screened is None
    import json

    saved = json.loads((tmp_path / "on" / "constraints.json").read_text())
    assert saved["evaluations"]["screened"] == a.screened


def test_a_strategy_asking_a_screened_sets_excess_gets_the_whole_batchs():
    """The `excess` hint (auto calibrates its predicted ranking on it) of a set that failed on one item is the
    whole batch's: the set is judged whole once for it, not counted as an evaluation, and the memo, history and
    journal keep the whole verdict."""
    from bisector.search.driver import _known_excess

    class Journal(dict):
        def lookup(self, plan):
            return None

        def record(self, plan, verdict):
            self[plan.fp32] = verdict

    cat, feeds, golden = _job(_model())
    tol = _tolerance()
    whole, _, _ = _verdicts(cat, feeds, golden, tol, screen=False)
    backend = Counting()
    backend.open(cat)
    journal = Journal()
    oracle = Oracle(backend, cat.candidates, feeds, golden, tol, screen=True, journal=journal)
    for v in whole:
        oracle.evaluate(v.fp32)
    marked = [v for v in oracle.history if v.screened is not None]
    assert marked
    new, count = oracle.new, oracle.screen.screened
    for v in marked:
        want = next(w for w in whole if w.fp32 == v.fp32)
        assert _known_excess(oracle, v.fp32) == want.excess
        assert oracle.verdicts[v.fp32].screened is None and journal[v.fp32].screened is None
    assert oracle.new == new and oracle.screen.screened == count - len(marked)
    assert all(v.screened is None for v in oracle.history) and len(oracle.history) == len(whole)


@pytest.mark.parametrize("hits, enabled", [(8, True), (7, False), (12, True), (0, False)])
def test_screening_stops_where_the_failures_spread_over_the_items(hits, enabled):
    """After 12 failing plans screened, screening goes on only while at least 60% failed on their screen: a
    screen that passes before a failing batch is a run for nothing."""
    from bisector.search.screen import MIN_OUTCOMES, Screen

    cat, feeds, golden = _job(_model())
    screen = Screen(Counting(), cat.candidates, feeds, golden, _tolerance())
    assert screen.enabled
    for k in range(MIN_OUTCOMES):
        screen._count(hit=k < hits)
    assert screen.enabled is enabled


def test_runs_on_a_part_of_the_batch_decide_thread_pools_as_the_batch_would():
    """A block session first run by a screen (one or two items of six) decides its intra-op pool from that run's
    time: the screen's runs tell the executor they are B/m times shorter than the batch's
    (`EmulateBackend.part_of_the_batch`), and the scale is back to 1 after them."""
    scales = []

    class Watching(Counting):
        def run(self, plan, feeds, outputs=None):
            if plan.fp32 != frozenset(plan.candidates):
                scales.append((int(np.shape(feeds["x"])[0]), self.executor.run_scale))
            return super().run(plan, feeds, outputs)

    cat, feeds, golden = _job(_model())
    backend = Watching()
    screened, _, _ = _verdicts(cat, feeds, golden, _tolerance(), screen=True, backend=backend)
    assert any(v.screened for v in screened)
    assert {s for n, s in scales if n == B} == {1.0}
    assert {s for n, s in scales if n < B} == {B / 2}  # two items judged first (one MatMul row is not exact)
    assert backend.executor.run_scale == 1.0


def test_the_progress_line_says_where_a_screened_plan_failed():
    from types import SimpleNamespace

    from bisector.cli.progress import _screened

    assert _screened(SimpleNamespace(screened=(0, 2, 1))) == " (on item 2)"
    assert _screened(SimpleNamespace(screened=(0, 6, 2))) == " (on items 6-7)"
    assert _screened(SimpleNamespace(screened=(1, 0, 0))) == " (on input set 1)"
    assert _screened(SimpleNamespace(screened=None)) == "" == _screened(SimpleNamespace())


def test_a_model_that_fixes_its_batch_is_judged_whole_without_noise(capfd):
    """A Reshape to a fixed batch: runs on fewer items fail. Each part size is tried once per input set, no ORT
    error reaches the terminal, and the verdicts are those of whole batches."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((D, D)) / 7).astype(np.float32), f"w{i}") for i in range(2)]
    inits += [numpy_helper.from_array(np.array([B, 2, D // 2], np.int64), "shp"),
              numpy_helper.from_array(np.array([B, D], np.int64), "shp2")]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h0"], name="mm0"),
             helper.make_node("Reshape", ["h0", "shp"], ["r"], name="fixed_batch"),
             helper.make_node("Relu", ["r"], ["rr"], name="relu"),
             helper.make_node("Reshape", ["rr", "shp2"], ["r2"], name="back"),
             helper.make_node("MatMul", ["r2", "w1"], ["y"], name="mm1")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", D])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    cat, feeds, golden = _job(model)
    tol = Tolerance(atol=PerOutput(1e-4), rtol=PerOutput(1e-4))
    whole, _, _ = _verdicts(cat, feeds, golden, tol, screen=False)
    capfd.readouterr()
    screened, sb, oracle = _verdicts(cat, feeds, golden, tol, screen=True)
    assert [v.passed for v in screened] == [v.passed for v in whole] and any(not v.passed for v in whole)
    assert all(v.screened is None for v in screened)
    assert sorted(oracle.screen._cannot) == sorted((id(feeds[0]), m) for m in (1, 2))
    assert "onnxruntime" not in capfd.readouterr().err


def test_a_resumed_search_reads_screened_verdicts_from_the_journal(tmp_path):
    """Screened failures journaled by a run that was killed come back as failures (pass/fail is the batch's);
    asking their excess judges them whole then, and this run's count of screened plans stays its own."""
    from bisector.search.driver import _known_excess
    from bisector.search.journal import SqliteJournal

    cat, feeds, golden = _job(_model())
    tol = _tolerance()
    whole, _, _ = _verdicts(cat, feeds, golden, tol, screen=False)
    first = SqliteJournal(tmp_path / "j.sqlite", {"k": 1})
    backend = Counting()
    backend.open(cat)
    oracle = Oracle(backend, cat.candidates, feeds, golden, tol, screen=True, journal=first)
    for v in whole:
        oracle.evaluate(v.fp32)
    marked = [v.fp32 for v in oracle.history if v.screened is not None]
    assert marked
    again = Oracle(Counting(), cat.candidates, feeds, golden, tol, screen=True,
                   journal=SqliteJournal(tmp_path / "j.sqlite", {"k": 1}))
    again.backend.open(cat)
    for v in whole:
        assert again.evaluate(v.fp32).passed == v.passed
    assert again.cached == len(whole) and again.new == 0
    want = {v.fp32: v.excess for v in whole}
    assert all(_known_excess(again, s) == want[s] for s in marked)
    assert again.screen.screened == 0


def test_a_batch_of_small_tensors_is_judged_whole_and_one_of_large_tensors_is_screened(monkeypatch, caplog):
    """Judging an item first saves compute, not the per-block calls: where the batch's block-boundary tensors
    average under SCREEN_FROM_BYTES (the default, 64 KiB) every plan is judged whole, with the same verdicts and
    one batch run per plan; a batch whose tensors are larger is screened as before. Decided from sizes alone."""
    import logging

    monkeypatch.setattr(EmulateBackend, "SCREEN_FROM_BYTES", 64 << 10)
    cat, feeds, golden = _job(_model())
    tol = _tolerance()
    whole, wb, _ = _verdicts(cat, feeds, golden, tol, screen=False)
    with caplog.at_level(logging.INFO, logger="bisector"):
        small, sb, oracle = _verdicts(cat, feeds, golden, tol, screen=True)
    assert [v.passed for v in small] == [v.passed for v in whole]
    assert not oracle.screen.enabled and oracle.screen.screened == 0
    assert sb.batches == wb.batches  # the whole batch, once per plan: no item runs
    assert "screening off" in caplog.text
    assert not sb.screen_pays(feeds[0])
    monkeypatch.setattr(EmulateBackend, "SCREEN_FROM_BYTES", 1024)  # these tensors: 6 x 48 x 4 = 1152 bytes
    assert sb.screen_pays(feeds[0])
    screened, _, oracle = _verdicts(cat, feeds, golden, tol, screen=True)
    assert [v.passed for v in screened] == [v.passed for v in whole] and oracle.screen.screened > 0
