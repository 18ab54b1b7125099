"""What a search keeps of old verdicts: the comparisons it reads back, and every output's for the final set."""

from __future__ import annotations

import numpy as np

from bisector.compare import PerOutput, Tolerance
from bisector.search import oracle as oracle_mod
from bisector.search.oracle import Oracle

OUTPUTS = [f"out{i}" for i in range(6)]
NAMES = [f"n{i}" for i in range(12)]


class _Stub:
    """Six outputs; output i's error is 0.1 x (FP16 nodes among the first 2i + 2 candidates): the later outputs
    fail first, and a plan passes with few FP16 nodes at the front."""

    name = "stub"

    def __init__(self):
        self.runs = 0

    def run(self, plan, feeds, outputs=None):
        self.runs += 1
        return {o: np.full(3, 0.1 * sum(1 for n in NAMES[: 2 * i + 2] if n in plan.fp16), np.float32)
                for i, o in enumerate(OUTPUTS)}


def _oracle():
    tol = Tolerance(atol=PerOutput(0.25), rtol=PerOutput(0.0))
    golden = [{o: np.zeros(3, np.float32) for o in OUTPUTS}]
    backend = _Stub()
    return Oracle(backend, NAMES, [{}], golden, tol), backend


def _plans(count: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    seen, out = set(), []
    while len(out) < count:
        s = frozenset(x for x in NAMES if rng.random() < 0.7)
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def test_old_verdicts_keep_what_the_search_reads_and_the_recent_ones_keep_everything():
    oracle, _ = _oracle()
    plans = _plans(60)
    whole = {}
    for p in plans:
        v = oracle.evaluate(p)
        whole[p] = (v.passed, v.excess, list(v.failing), set(v.outputs))
    old = oracle.history[: -oracle_mod.KEEP_WHOLE]
    assert any(v.slimmed for v in old)  # the stub has passing outputs beside the worst: something was dropped
    for v in oracle.history:
        passed, excess, failing, outputs = whole[frozenset(v.fp32)]
        assert (v.passed, v.excess, v.failing) == (passed, excess, failing)  # what a search reads is unchanged
        if v.slimmed:  # the worst output's comparison alone (`excess` above), the failing ones by name
            assert len(v.outputs) == 1 and len(outputs) > 1
        else:
            assert set(v.outputs) == outputs
    for v in oracle.history[-oracle_mod.KEEP_WHOLE:]:
        assert not v.slimmed
    passing = [v for v in oracle.history if v.passed]
    smallest = min(passing, key=lambda v: len(v.fp32))
    assert not smallest.slimmed  # the likely answer stays whole


def test_the_final_set_is_reported_with_every_outputs_comparison_without_an_evaluation():
    oracle, backend = _oracle()
    plans = _plans(60, seed=1)
    for p in plans:
        oracle.evaluate(p)
    slimmed = next(v for v in oracle.history if v.slimmed)
    fp32, counted, runs = frozenset(slimmed.fp32), oracle.new, backend.runs
    final = oracle.confirm(fp32)
    assert not final.slimmed and set(final.outputs) == set(OUTPUTS)
    assert final.passed == slimmed.passed and final.excess == slimmed.excess
    assert oracle.new == counted and backend.runs == runs + 1  # judged again once, not counted
    assert oracle.verdicts[fp32] is final and any(v is final for v in oracle.history)
    assert not any(v is slimmed for v in oracle.history)
    assert oracle.confirm(fp32) is final and backend.runs == runs + 1  # and only once


def test_one_output_verdicts_are_never_slimmed():
    tol = Tolerance(atol=PerOutput(0.25), rtol=PerOutput(0.0))

    class One(_Stub):
        def run(self, plan, feeds, outputs=None):
            return {"y": np.full(3, 0.1 * len(plan.fp16), np.float32)}

    oracle = Oracle(One(), NAMES, [{}], [{"y": np.zeros(3, np.float32)}], tol)
    for p in _plans(40, seed=2):
        oracle.evaluate(p)
    assert not any(v.slimmed for v in oracle.history)


def test_weights_a_model_computes_with_constantofshape_are_held_once_not_folded_per_session():
    """A ConstantOfShape of a constant shape is a weight (`Catalog.fills`): the executor holds its value once and
    no session runs the node, so ONNX Runtime folds no copy of it into each cached variant. Before, each session
    held it twice (folded, then the Conv's own layout): light AlexNet's search held 2.8x one inference's memory.
    Now a session holds only the Conv's own copy."""
    from onnx import TensorProto, helper, numpy_helper

    from bisector.backends.emulate.backend import EmulateBackend
    from bisector.fp16.plan import Plan
    from bisector.model.catalog import Catalog

    shape = numpy_helper.from_array(np.array([64, 64, 3, 3], np.int64), "w_shape")  # 147 KB: shared, not inlined
    nodes = [helper.make_node("ConstantOfShape", ["w_shape"], ["w"], name="make_w",
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.01])),
             helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "light", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 8, 8])], [shape])
    cat = Catalog.from_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert "w" in cat.weights and cat.fills == {"w"} and "make_w" not in cat.candidates
    backend = EmulateBackend()
    backend.open(cat)
    backend.executor.copies_budget = 1 << 40  # what the sessions hold, not what the budget evicts, is asked here
    feeds = {"x": np.ones((1, 64, 8, 8), np.float32)}
    for plan in (Plan(frozenset(), cat.candidates), Plan(frozenset(cat.candidates), cat.candidates)):
        assert backend.run(plan, feeds, ["y"])["y"].shape == (1, 64, 8, 8)
    executor = backend.executor
    sessions = list(executor._sessions.values()) + list(executor._node_sessions.values())
    weight = 64 * 64 * 9 * 4
    assert sessions and max(getattr(s, "_bisector_copies", 0) for s in sessions) == weight  # the Conv's own only
    assert all(n.op_type != "ConstantOfShape" for b in executor.blocks for n in b.nodes)


def test_the_copies_budget_counts_the_weights_a_model_computes_from_constant_shapes():
    """A model whose Conv weights all come from ConstantOfShape (the light ResNet-50: ~100 MB of them) gets the
    copies budget a model with those weights as initializers gets; at the 32 MB floor it kept two block variants
    and rebuilt the others at every evaluation (6.6x slower). Nothing is run: the shape alone says the size."""
    from onnx import TensorProto, helper, numpy_helper

    from bisector.backends.emulate import executor as ex
    from bisector.model.catalog import Catalog

    shape = numpy_helper.from_array(np.array([1024, 1024, 3, 3], np.int64), "w_shape")  # 36 MiB of float32
    nodes = [helper.make_node("ConstantOfShape", ["w_shape"], ["w"], name="make_w",
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.01])),
             helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "light", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1024, 4, 4])], [shape])
    cat = Catalog.from_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    executor = ex.NodeExecutor(cat)
    weight = 1024 * 1024 * 9 * 4
    assert executor.copies_budget >= 2 * weight > ex.COPIES_BUDGET_MIN


def _conv_net(channels: int, side: int, convs: int = 4):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    nodes, inits, x = [], [], "x"
    for i in range(convs):
        w = (rng.standard_normal((channels, channels, 3, 3)) * 0.1).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        x = f"r{i}"
    graph = helper.make_graph(
        nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, side, side])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, channels, side, side])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _opened(model, side: int, channels: int):
    from bisector.backends.emulate.backend import EmulateBackend
    from bisector.model.catalog import Catalog

    cat = Catalog.from_model(model)
    backend = EmulateBackend(block_size=2)
    backend.open(cat)
    feeds = {"x": np.random.default_rng(4).uniform(-1, 1, (1, channels, side, side)).astype(np.float32)}
    return backend, cat, feeds


def test_a_small_models_cached_sessions_are_bounded_by_its_own_size():
    """The fixed floors of the session caches (MAX_SESSIONS variants, COPIES_BUDGET_MIN of ORT's weight copies)
    together are at most the model's own size (weights + the FP32 reference's tensors), half each: a 1.3 MB
    wake-word CNN held 128 variants and 25 MB of copies, 2.7x one plain inference, and each floor at the whole size
    held a 4.5 MB recogniser at 2.03x. A model past that size keeps the floors;
    a value set by hand stays; outputs are what an executor without bounds computes."""
    from bisector.backends.emulate import executor as ex
    from bisector.fp16.plan import Plan

    small, ch, side = _conv_net(128, 24), 128, 24  # 2.4 MB of weights, ~1 MB of boundary activations
    backend, cat, feeds = _opened(small, side, ch)
    fp16 = Plan(frozenset(), cat.candidates)
    out = backend.run(fp16, feeds)
    e = backend.executor
    share = (e.weight_bytes + e.reference_bytes) // 2
    assert 0 < e.reference_bytes and share < ex.MAX_SESSIONS * ex.SESSION_BYTES
    assert share // ex.SESSION_BYTES > ex.SESSIONS_PER_BLOCK * len(e.blocks)  # the size term is the one that binds
    assert e.max_sessions == max(ex.SESSIONS_PER_BLOCK * len(e.blocks), share // ex.SESSION_BYTES) < ex.MAX_SESSIONS
    conv = sum(e.weights[f"w{i}"].nbytes for i in range(4))
    assert 2 * conv <= e.copies_budget == max(2 * conv, share) < ex.COPIES_BUDGET_MIN
    rng = np.random.default_rng(5)
    names = list(cat.candidates)
    free, _, _ = _opened(small, side, ch)
    free.executor.max_sessions, free.executor.copies_budget = 1 << 20, 1 << 40  # by hand: kept
    for _ in range(40):  # more variants than the small caches keep: evicted and rebuilt, same answers
        plan = Plan(frozenset(n for n in names if rng.random() < 0.5), cat.candidates)
        got, want = backend.run(plan, feeds), free.run(plan, feeds)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    assert len(e._sessions) <= e.max_sessions and e.sessions_built > e.max_sessions
    assert free.executor.max_sessions == 1 << 20 and free.executor.copies_budget == 1 << 40
    np.testing.assert_array_equal(backend.run(fp16, feeds)[next(iter(out))], out[next(iter(out))])

    large, ch, side = _conv_net(384, 8, convs=8), 384, 8  # 42 MB of Conv weights: half past MAX_SESSIONS x SESSION_BYTES
    backend, cat, feeds = _opened(large, side, ch)
    backend.run(Plan(frozenset(), cat.candidates), feeds)
    e = backend.executor
    assert e.weight_bytes // 2 > ex.MAX_SESSIONS * ex.SESSION_BYTES
    assert e.max_sessions >= ex.MAX_SESSIONS and e.copies_budget >= min(ex.COPIES_BUDGET_MIN, e.weight_bytes)


def test_the_search_runs_without_pydantic_loaded_and_gives_its_heap_back_before_it(tmp_path):
    """pydantic (~6 MB resident) is needed only to write the artifacts, after the search has given its memory
    back; loaded while parsing the command line (typer 0.29 coerces every parameter through it), it counted in
    every search's peak. Once the search's backend closes, the freed heap goes back to the system
    (`heap.give_back_free_memory`) before pydantic and the artifacts load, so what they allocate does not sit on
    top of the search's peak (the MatMul/Tanh chain: 131 -> 127 MB at the end; docs/benchmarks.md, "Scale,
    thirty-first round"). A subprocess: the test process has pydantic loaded already."""
    import subprocess
    import sys
    from pathlib import Path

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "planted.onnx"
    script = (
        "import sys\n"
        "import bisector.app.precision as precision\n"
        "from bisector.backends.emulate.backend import EmulateBackend\n"
        "events = []\n"
        "def note(what):\n"
        "    events.append(what + ('+pydantic' if 'pydantic' in sys.modules else ''))\n"
        "close = EmulateBackend.close\n"
        "def closing(self):\n"
        "    if self.executor is not None:\n"
        "        note('close')\n"
        "    return close(self)\n"
        "EmulateBackend.close = closing\n"
        "give = precision.give_back_free_memory\n"
        "def giving():\n"
        "    note('give')\n"
        "    return give()\n"
        "precision.give_back_free_memory = giving\n"
        "from bisector.cli.main import main\n"
        f"rc = main(['precision', {str(fixture)!r}, '--fp16', '-o', {str(tmp_path / 'out')!r}, '--no-cache'])\n"
        "print('RC', rc, 'EVENTS', ' '.join(events), 'AFTER', 'pydantic' in sys.modules,\n"
        "      'TRIMMED', give() if sys.platform.startswith('linux') else True)\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RC"))
    assert line.startswith("RC 0 "), r.stdout + r.stderr
    events = line.split("EVENTS ")[1].split(" AFTER")[0].split()
    # every backend the search opened closed without pydantic; the heap was given back once, right after the
    # last of them, still without pydantic; the artifacts loaded it afterwards
    assert events[-2:] == ["close", "give"] and events.count("give") == 1, line
    assert not any(e.endswith("+pydantic") for e in events), line
    assert " AFTER True " in line, line
    assert line.endswith("TRIMMED True"), line  # glibc here: the heap was trimmed
