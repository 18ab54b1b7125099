"""Mechanisms behind bounded memory and per-evaluation cost on large models (the targets themselves are checked by
bench/scale.py, not by timed tests): spilled reference tensors, large fused blocks with cached specs, one arena."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from bisector.backends.emulate.backend import EmulateBackend
from bisector.backends.emulate.executor import auto_block_size
from bisector.fp16.plan import Plan
from bisector.model.catalog import Catalog

from .conftest import PLANTED

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from scale import chain_model  # noqa: E402


def _plans(cat: Catalog, n: int, seed: int = 0) -> list[Plan]:
    rng = np.random.default_rng(seed)
    return [Plan(frozenset(c for c in cat.candidates if rng.random() < p), cat.candidates)
            for p in np.linspace(0.05, 0.95, n)]


def test_spilled_reference_tensors_give_identical_outputs(monkeypatch):
    cat = Catalog.load(PLANTED)
    x = {"x": np.random.default_rng(0).uniform(0, 1, (1, 4, 16, 16)).astype(np.float32)}
    plain = EmulateBackend()
    plain.open(cat)
    expected = [plain.run(p, x)["y"] for p in _plans(cat, 6)]
    monkeypatch.setenv("BISECTOR_ARRAY_SWAP_THRESHOLD_MB", "0")
    spilled = EmulateBackend()
    spilled.open(cat)
    got = [spilled.run(p, x)["y"] for p in _plans(cat, 6)]
    boundary = next(iter(spilled._boundaries.values()))
    assert boundary.spilled_bytes > 0 and not boundary.spilled_bytes > plain_boundary_bytes(plain)
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(e, g)


def test_the_reference_run_reads_only_older_tensors_back_from_its_file(monkeypatch):
    """Run with every tensor spilled, the FP32 reference passes each block's outputs to the block right after it
    from memory; only tensors read further on (a skip connection) come back from the file. The reference is
    the same, bit for bit, as one held in memory."""
    from onnx import TensorProto, helper

    from bisector.backends.emulate.reference import ReferenceStore

    nodes = [helper.make_node("Relu", ["x"], ["r0"], name="relu")]
    prev = "r0"
    for i in range(8):
        nodes.append(helper.make_node("Tanh", [prev], [f"t{i}"], name=f"tanh{i}"))
        prev = f"t{i}"
    nodes.append(helper.make_node("Add", [prev, "r0"], ["y"], name="skip"))
    graph = helper.make_graph(nodes, "skip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 64])])
    cat = Catalog.from_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    x = {"x": np.random.default_rng(1).uniform(-2, 2, (1, 64, 64)).astype(np.float32)}
    held = EmulateBackend(block_size=2)
    held.open(cat)
    want = held.executor.run_reference(x, boundary_only=True)
    monkeypatch.setenv("BISECTOR_ARRAY_SWAP_THRESHOLD_MB", "0")
    spilled = EmulateBackend(block_size=2)
    spilled.open(cat)
    reads: list[str] = []
    get = ReferenceStore.__getitem__

    def counting(self, name):
        if name in self._spilled:
            reads.append(name)
        return get(self, name)

    monkeypatch.setattr(ReferenceStore, "__getitem__", counting)
    got = spilled.executor.run_reference(x, boundary_only=True)
    assert len(spilled.executor.blocks) >= 4 and got.spilled_bytes > 0
    assert reads == ["r0"]  # the skip connection, read by the last block; every other input came from memory
    for k in want:
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))


def plain_boundary_bytes(backend: EmulateBackend) -> int:
    ref = next(iter(backend._boundaries.values()))
    assert ref.spilled_bytes == 0  # the planted fixture's tensors are below the default 1 MiB threshold
    return sum(np.asarray(ref[k]).nbytes for k in ref if k not in backend.executor.weights)


def test_reference_store_keeps_large_tensors_out_of_the_process(monkeypatch, tmp_path):
    from bisector.backends.emulate.reference import ReferenceStore, spill_threshold

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    store = ReferenceStore(1 << 20)
    big = np.random.default_rng(0).standard_normal((3, 512, 512)).astype(np.float32)  # 3 MiB: spilled
    small = np.arange(10, dtype=np.int64)
    store["big"], store["small"] = big, small
    assert store.spilled_bytes == big.nbytes and store["small"] is small
    assert store.dtype_of("big") == np.float32 and store.dtype_of("missing") is None
    got = store["big"]
    np.testing.assert_array_equal(got, big)
    assert got is not store["big"]  # a fresh copy per read: nothing held between evaluations
    assert list(tmp_path.iterdir()) == []  # the file is unlinked at once: a killed search leaves nothing
    monkeypatch.setenv("BISECTOR_ARRAY_SWAP_THRESHOLD_MB", "-1")
    assert spill_threshold() is None
    monkeypatch.delenv("BISECTOR_ARRAY_SWAP_THRESHOLD_MB")
    assert spill_threshold() == 128 << 10


def test_reference_store_holds_in_memory_when_the_disk_refuses(monkeypatch):
    import os

    from bisector.backends.emulate.reference import ReferenceStore

    def full(*_a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    store = ReferenceStore(0)
    a = np.ones((64, 64), np.float32)
    store["a"] = a
    assert store.spilled_bytes == 0 and store["a"] is a


def test_fused_evaluation_keeps_only_live_tensors():
    """run_changed drops a recomputed tensor once no later block reads it; the outputs are unchanged."""
    from bisector.fp16.points import rounding_points

    model, planted = chain_model(200, width=16)
    cat = Catalog.from_model(model)
    be = EmulateBackend(block_size=16)
    be.open(cat)
    x = {"x": np.random.default_rng(2).uniform(1, 2, (1, 16)).astype(np.float32)}
    plan = Plan(frozenset(), cat.candidates)  # everything FP16: every block recomputed
    ref = be._boundary_reference(x)
    changed = be.executor.run_changed(ref, rounding_points(cat, plan), fused=True)
    assert set(changed) == set(cat.output_names)
    np.testing.assert_allclose(be.run(plan, x)["y"], be.run_all(plan, x)["y"], rtol=1e-6, atol=1e-6)
    every = be.executor.run_changed(be.reference(x), rounding_points(cat, plan), fused=False)
    assert len(every) > len(be.executor.blocks)  # node by node returns every tensor, as run_all needs


def test_large_blocks_with_cached_specs_agree_with_node_by_node():
    model, planted = chain_model(300, width=16)
    cat = Catalog.from_model(model)
    be = EmulateBackend(block_size=64)
    be.open(cat)
    assert len(be.executor.blocks) == 5
    x = {"x": np.random.default_rng(1).uniform(1, 2, (1, 16)).astype(np.float32)}
    plans = _plans(cat, 5) + [Plan(frozenset(planted), cat.candidates)]
    for plan in plans:
        np.testing.assert_allclose(be.run(plan, x)["y"], be.run_all(plan, x)["y"], rtol=1e-6, atol=1e-6)
    built = be.executor.sessions_built
    for plan in plans:  # the same plans again: specs and sessions come from the caches
        be.run(plan, x)
    assert be.executor.sessions_built == built


def test_sessions_share_one_arena():
    cat = Catalog.load(PLANTED)
    be = EmulateBackend()
    be.open(cat)
    assert be.executor._opts.get_session_config_entry("session.use_env_allocators") == "1"


@pytest.mark.parametrize("nodes,size", [(30, 8), (2048, 8), (2049, 9), (20000, 79)])
def test_auto_block_size(nodes, size):
    assert auto_block_size(nodes) == size


def test_session_variants_are_bounded_and_evicted_ones_rebuild_identically():
    model, _ = chain_model(300, width=16)
    cat = Catalog.from_model(model)
    x = {"x": np.random.default_rng(2).uniform(1, 2, (1, 16)).astype(np.float32)}
    plans = _plans(cat, 8, seed=3)
    free = EmulateBackend(block_size=16)
    free.open(cat)
    expected = [free.run(p, x)["y"] for p in plans]
    tight = EmulateBackend(block_size=16)
    tight.open(cat)
    tight.executor.max_sessions = 6
    for _ in range(2):
        for p, e in zip(plans, expected):
            np.testing.assert_array_equal(tight.run(p, x)["y"], e)
            assert len(tight.executor._sessions) <= 6


def test_usable_cores_follows_affinity_and_cgroup_quota(tmp_path, monkeypatch):
    import os

    from bisector import cores

    read_quota = cores._cgroup_quota
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    monkeypatch.setattr(cores, "_cgroup_quota", lambda: None)
    assert cores.usable_cores() == 8
    monkeypatch.setattr(cores, "_cgroup_quota", lambda: 2.5)  # "250000 100000": 3 CPUs' worth of threads
    assert cores.usable_cores() == 3
    quota = tmp_path / "cpu.max"
    quota.write_text("200000 100000\n")
    assert read_quota(quota) == 2.0
    quota.write_text("max 100000\n")
    assert read_quota(quota) is None
    assert read_quota(tmp_path / "missing") is None


def test_emulate_sessions_take_their_threads_from_the_affinity_mask(monkeypatch):
    """ORT's default would pin one thread per physical core and ignore taskset; the executor sets the count."""
    from bisector.backends.emulate import executor as ex
    from bisector.model.catalog import Catalog

    from .conftest import PLANTED

    monkeypatch.setattr(ex, "usable_cores", lambda: 3)
    assert ex.NodeExecutor(Catalog.load(PLANTED))._opts.intra_op_num_threads == 3
    assert ex.NodeExecutor(Catalog.load(PLANTED), threads=1)._opts.intra_op_num_threads == 1


def test_artifacts_time_is_recorded_and_a_spent_time_limit_skips_the_mixed_model(tmp_path, monkeypatch):
    """Issue 14: post-search work is counted in the reported timings and bounded by --time-limit (the mixed ONNX
    of a model above BISECTOR_MIXED_SKIP_MB; tests/test_trust.py: a small model's is still written)."""
    import json

    from bisector.app import precision as precision_module

    from bisector.app.api import precision
    from bisector.app.options import options_from_flags

    from .conftest import PLANTED, planted_spec

    flags = options_from_flags(planted_spec()["args"])
    full = tmp_path / "full"
    precision(PLANTED, output_dir=full, no_cache=True, **flags)
    c = json.loads((full / "constraints.json").read_text())
    assert c["timings"]["artifacts"] > 0 and (full / "model.mixed.onnx").exists()

    monkeypatch.setattr(precision_module, "MIXED_SKIP_BYTES", 1000)  # the planted model is larger
    out = tmp_path / "limited"
    out.mkdir()
    (out / "model.mixed.onnx").write_bytes(b"stale mixed model of an earlier run")
    r = precision(PLANTED, output_dir=out, no_cache=True, time_limit=1e-6, **flags)
    assert r.stop_reason and (out / "constraints.json").exists()
    assert not (out / "model.mixed.onnx").exists()  # never a stale model beside new constraints
    assert "model.mixed.onnx was not written" in (out / "report.md").read_text()
    assert json.loads((out / "constraints.json").read_text())["timings"]["artifacts"] >= 0


def test_no_mixed_skips_the_mixed_model_and_says_why(tmp_path):
    """`--no-mixed`: every artifact but model.mixed.onnx (a stale one removed), and report.md says why."""
    from typer.testing import CliRunner

    from bisector.cli.main import app

    from .conftest import PLANTED, planted_spec

    out = tmp_path / "out"
    out.mkdir()
    (out / "model.mixed.onnx").write_bytes(b"stale mixed model of an earlier run")
    r = CliRunner().invoke(app, ["precision", str(PLANTED), "--fp16", *planted_spec()["args"], "-o", str(out),
                                 "--no-cache", "--no-mixed", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert (out / "constraints.json").exists() and (out / "add_constraints.py").exists()
    assert not (out / "model.mixed.onnx").exists()
    assert "model.mixed.onnx was not written: --no-mixed was given" in (out / "report.md").read_text()


def test_session_variants_share_the_weights_instead_of_copying_them(tmp_path):
    """Issue 14: every rounding-pattern variant of a block runs on the executor's one copy of each weight (ORT
    uses our buffer: add_initializer, prepacking off). Copied per session, 8 variants of a block reading a 32 MB
    weight would add ~256 MB."""
    import itertools

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from bisector.backends.emulate.backend import EmulateBackend
    from bisector.fp16.plan import Plan
    from bisector.model.catalog import Catalog

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((2048, 4096)).astype(np.float32), "W")
    c = numpy_helper.from_array(np.asarray(0.5, np.float32), "c")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "c"], ["m"], name="mul"), helper.make_node("Add", ["m", "c"], ["y"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2048])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4096])], initializer=[w, c])
    path = tmp_path / "big_weight.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    cat = Catalog.load(path)
    be = EmulateBackend()
    be.open(cat)
    feeds = {"x": np.ones((1, 2048), np.float32)}

    def rss_mb() -> float:
        return next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmRSS")) / 1024

    be.run(Plan(frozenset(cat.candidates), cat.candidates), feeds)  # the FP32 reference
    be.run(Plan(frozenset(), cat.candidates), feeds)  # the FP16-converted weight exists from here on
    before, built = rss_mb(), be.executor.sessions_built
    plans = [frozenset(s) for r in (1, 2, 3) for s in itertools.combinations(["relu", "mul", "add"], r)]
    for fp32 in plans:  # mm stays FP16: every variant reads the converted W
        be.run(Plan(fp32, cat.candidates), feeds)
    assert be.executor.sessions_built - built >= 4  # really new variants of the block
    assert rss_mb() - before < 100, f"{rss_mb() - before:.0f} MB for {be.executor.sessions_built - built} variants"


def test_stubbed_check_catches_what_the_checker_catches():
    """Mixed models are checked with their stubbed weights as typed graph inputs (the checker would serialise a
    copy of every weight); the check still refuses a broken graph."""
    import numpy as np
    import onnx
    import pytest
    from onnx import TensorProto, helper

    from bisector.artifacts import write
    from bisector.model import weights

    node = helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
                          initializer=[weights.stub("W", TensorProto.FLOAT, [64, 64])])
    good = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    write._check_without_external_data(good)
    bad = onnx.ModelProto()
    bad.CopyFrom(good)
    bad.graph.node[0].input[1] = "missing"
    with pytest.raises(onnx.checker.ValidationError):
        write._check_without_external_data(bad)
    full = weights.materialize(bad, {"W": np.ones((64, 64), np.float32)})
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(full)


def test_serialized_model_parses_to_the_materialized_model():
    """`weights.Serialized` writes what `materialize(...).SerializeToString()` would mean: stubs of every numpy
    type beside inline initializers, in their order, and the model's other fields."""
    import io

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from bisector.model import weights

    rng = np.random.default_rng(0)
    odd = 'q"\n[/]' + "x" * 10000  # a hostile weight name: quotes, newline, brackets, 10k characters
    values = {odd: rng.standard_normal((30, 100)).astype(np.float32), "h": rng.standard_normal(5000).astype(np.float16),
              "b": rng.integers(0, 2, 6000).astype(bool), "i": rng.integers(-9, 9, (2, 3, 700)).astype(np.int64),
              "e": np.zeros((0, 4), np.float32)}
    inits = [weights.stub(odd, TensorProto.FLOAT, [30, 100]), numpy_helper.from_array(np.array([1, 2], np.int64), "s"),
             weights.stub("h", TensorProto.FLOAT16, [5000]), weights.stub("b", TensorProto.BOOL, [6000]),
             weights.stub("i", TensorProto.INT64, [2, 3, 700]), weights.stub("e", TensorProto.FLOAT, [0, 4])]
    g = helper.make_graph([helper.make_node("Identity", [odd], ["y"], name="n")], "g", [],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9, doc_string="d")
    model.metadata_props.add(key="k", value="v")
    stream = weights.Serialized(model, values)
    f = io.BytesIO()
    stream.write(f)
    parsed = onnx.ModelProto()
    parsed.ParseFromString(f.getvalue())
    expected = weights.materialize(model, values)
    assert len(f.getvalue()) == len(stream) == expected.ByteSize()
    assert parsed == expected
    assert [i.name for i in parsed.graph.initializer] == [odd, "s", "h", "b", "i", "e"]
    np.testing.assert_array_equal(numpy_helper.to_array(parsed.graph.initializer[3]), values["b"])


def test_mixed_model_is_written_without_a_serialised_copy_of_its_weights(tmp_path):
    """model.mixed.onnx goes from the arrays to the file: no Python bytes of the weights (the materialised
    protobuf's raw_data and its serialisation were two of them: 2 x 32 MB traced here)."""
    import tracemalloc

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from bisector.artifacts import write
    from bisector.model.catalog import Catalog

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((2048, 4096)).astype(np.float32), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2048])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4096])], initializer=[w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tmp_path / "m.onnx")
    catalog = Catalog.load(tmp_path / "m.onnx")
    tracemalloc.start()
    try:
        files = write.mixed_model_files(catalog, frozenset({"mm"}), tmp_path / "mixed.onnx")  # FP32: the catalog's array
        for path, fill in files:
            with open(path, "wb") as f:
                fill(f)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [p.name for p, _ in files] == ["mixed.onnx"]
    assert peak < 8 << 20, f"{peak / 2**20:.0f} MB traced while writing 32 MB of weights"
    back = onnx.load(str(tmp_path / "mixed.onnx"))
    np.testing.assert_array_equal(numpy_helper.to_array(back.graph.initializer[0]), catalog.value("W"))


def test_glibc_heap_threshold_is_fixed_where_glibc_runs():
    import ctypes.util
    import platform

    from bisector.heap import keep_large_blocks_mapped

    expected = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc" and bool(ctypes.util.find_library("c"))
    assert keep_large_blocks_mapped() is expected


def test_converted_weights_are_bounded_and_evaluations_unchanged():
    """Sessions holding FP16-rounded weights beyond the budget are evicted, and the rounded copies go with them;
    every output is what an unbounded executor computes."""
    from .conftest import FIXTURES

    cat = Catalog.load(FIXTURES / "exported" / "cnn.onnx")
    x = {cat.input_names[0]: np.random.default_rng(3).uniform(-1, 1, (1, 3, 64, 64)).astype(np.float32)}
    plans = _plans(cat, 8) + [Plan(frozenset(), cat.candidates)]
    free = EmulateBackend()
    free.open(cat)
    expected = [free.run(p, x) for p in plans]
    assert len(free.executor._converted) > 2  # unbounded: every rounded weight stays
    bounded = EmulateBackend()
    bounded.open(cat)
    bounded.executor.converted_budget = 1  # nothing may stay beyond the newest session
    for p, e in zip(plans, expected):
        got = bounded.run(p, x)
        for k in e:
            np.testing.assert_array_equal(got[k], e[k])
        ex = bounded.executor
        assert ex._converted_held <= max(ex.converted_budget, max(
            (getattr(s, "_bisector_converted", 0) for s in ex._sessions.values()), default=0))
    import gc

    gc.collect()
    # rounded copies live only while a cached session reads them
    assert len(bounded.executor._converted) < len(free.executor._converted)
    assert bounded.executor.sessions_built > free.executor.sessions_built  # evicted variants were rebuilt


def test_recently_used_rounded_weights_outlive_evicted_variants(monkeypatch):
    """A diffuse search evicts block variants all the time; the FP16-rounded weights they read stay alive (up to
    half the converted budget, bytes counted once) instead of being rounded again for the next variant."""
    from bisector.backends.emulate import executor as ex
    from .conftest import FIXTURES

    calls = []
    real = ex.rules.round_weight_as
    monkeypatch.setattr(ex.rules, "round_weight_as", lambda *a: calls.append(1) or real(*a))
    cat = Catalog.load(FIXTURES / "exported" / "cnn.onnx")
    x = {cat.input_names[0]: np.random.default_rng(3).uniform(-1, 1, (1, 3, 64, 64)).astype(np.float32)}
    plans = _plans(cat, 6) * 2
    counts = {}
    for label, budget in (("kept", None), ("not kept", 1)):
        be = EmulateBackend()
        be.open(cat)
        be.executor.max_sessions = 2  # every plan evicts the variants of the one before
        if budget is not None:
            be.executor.converted_budget = budget
        calls.clear()
        for p in plans:
            be.run(p, x)
        counts[label] = len(calls)
        weights = {t for n in cat.candidates for t, _ in cat.reads(n) if t in be.executor.weights}
        if budget is None:
            assert be.executor._recent_bytes <= be.executor.converted_recent_bytes
        be.close()
    assert counts["kept"] <= len(weights) < counts["not kept"]


@pytest.mark.skipif(__import__("bisector.cores", fromlist=["usable_cores"]).usable_cores() < 2,
                    reason="one usable core: no session has pool threads to count")
def test_sessions_on_small_tensors_keep_no_idle_threads(monkeypatch):
    """Each ORT session owns its intra-op pool; hundreds of block sessions on small tensors used to leave hundreds
    of idle threads (thousands on a 16-core host). They run on the caller's thread alone now."""
    import os

    monkeypatch.setenv("BISECTOR_NUMPY_BLOCKS", "0")  # the chain's blocks as sessions (else numpy runs them)

    model, _ = chain_model(600, width=16)
    cat = Catalog.from_model(model)
    be = EmulateBackend(block_size=8)
    be.open(cat)
    x = {"x": np.random.default_rng(4).uniform(1, 2, (1, 16)).astype(np.float32)}
    before = len(os.listdir("/proc/self/task"))
    for plan in _plans(cat, 6):
        be.run(plan, x)
    assert be.executor.sessions_built > 60
    assert len(os.listdir("/proc/self/task")) - before < 10


@pytest.mark.skipif(__import__("bisector.cores", fromlist=["usable_cores"]).usable_cores() < 2,
                    reason="one usable core: no session ever gets a pool")
def test_sessions_get_an_intra_op_pool_only_when_their_first_run_is_long(monkeypatch):
    """Block sessions start on the caller's thread; one whose first run takes POOL_FROM_SECONDS gets a pool
    (idle pools cost ~64 KB per thread per session). The results are the same bits either way."""
    import os

    from bisector.backends.emulate import executor as ex

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import gc

    import scale

    model, _ = scale.transformer_model(2, 128, 160, heads=2)  # 80 KB activations: past the small-tensor rule
    cat = Catalog.from_model(model)
    x = {"x": np.random.default_rng(5).uniform(-1, 1, (1, 160, 128)).astype(np.float32)}
    results, threads = {}, {}
    from bisector.fp16 import rules

    rules.round_weight(np.ones(1 << 16, np.float32))  # the process-wide cast sessions (and their pools) exist first
    rules.weight_rule(np.ones(1 << 16, np.float32))  # (fed weights' FP16 copies)
    for name, seconds in (("never", float("inf")), ("always", 0.0)):
        monkeypatch.setattr(ex, "POOL_FROM_SECONDS", seconds)
        be = EmulateBackend(block_size=8)
        be.open(cat)
        before = len(os.listdir("/proc/self/task"))
        results[name] = [be.run(plan, x) for plan in _plans(cat, 4)]
        threads[name] = len(os.listdir("/proc/self/task")) - before
        be.close()
        del be
        gc.collect()
    assert threads["never"] == 0
    assert threads["always"] >= 5
    for a, b in zip(results["never"], results["always"]):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.skipif(__import__("bisector.cores", fromlist=["usable_cores"]).usable_cores() < 2,
                    reason="one usable core: no session ever gets a pool")
def test_a_session_keeps_one_thread_where_its_pool_would_change_its_bits(monkeypatch):
    """MLAS splits a MatMul's inner sum across threads where the output is small against it (16 x 2048 x 64):
    on two threads its last bits differ from one thread's. A block whose first run was long is rebuilt with a
    pool only where the pooled session gives the first run's bits again, so every run of it agrees."""
    import onnx
    from onnx import TensorProto, helper

    from bisector.backends.emulate import executor as ex

    monkeypatch.setattr(ex, "POOL_FROM_SECONDS", 0.0)  # every session's first run is "long"
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.standard_normal((2048, 64)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"), helper.make_node("Tanh", ["y"], ["z"], name="t")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 2048])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [16, 64])], [w])
    cat = Catalog.from_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    x = {"x": rng.standard_normal((16, 2048)).astype(np.float32)}
    be = EmulateBackend(threads=2)
    be.open(cat)
    if be.executor.shared_pool:
        pytest.skip("sessions on the shared pool: none starts on one thread")
    runs = [be.executor.run_reference(x, boundary_only=True)["z"] for _ in range(3)]
    be.close()
    for r in runs[1:]:
        np.testing.assert_array_equal(r.view(np.uint32), runs[0].view(np.uint32))


def test_sessions_on_large_inputs_and_weights_start_with_their_pool(monkeypatch):
    """A block whose inputs and weights are both large runs long on its first run anyway: its session is built
    once, with a pool, instead of once on the caller's thread and again with a pool (a short search of a
    weight-heavy model paid ~1/3 of its search for the rebuilds). Lighter blocks still start on one thread."""
    from bisector.backends.emulate import executor as ex

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import scale

    monkeypatch.setattr(ex, "POOL_FROM_SECONDS", float("inf"))  # the first-run rule alone would never pool
    model, _ = scale.transformer_model(1, 512, 64, heads=2)  # 128 KB activations, 1 MB weights per MatMul
    cat = Catalog.from_model(model)
    x = {"x": np.random.default_rng(5).uniform(-1, 1, (1, 64, 512)).astype(np.float32)}
    be = EmulateBackend(block_size=4, threads=2)
    be.open(cat)
    be.run(Plan(frozenset(), cat.candidates), x)
    pooled = [s for s in be.executor._sessions.values() if s.get_session_options().intra_op_num_threads != 1]
    single = [s for s in be.executor._sessions.values() if s.get_session_options().intra_op_num_threads == 1]
    assert pooled and single  # the MatMul blocks pooled from the start, the rest (LayerNorm, softmax...) not
    assert be.executor.sessions_built == len(be.executor._sessions)  # none built twice
    be.close()


def test_sessions_on_inputs_of_several_mb_start_with_their_pool(monkeypatch):
    """Feature maps of several MB make every run of a block long even where its weights are small (a text
    detector at 960 x 1920: 29 MB maps, 2-40 KB Conv weights): such sessions start with their pool instead of
    a first run on one thread and a rebuild (that detector's search: 10.1 -> 8.2 s). Smaller ones do not."""
    from bisector.backends.emulate import executor as ex

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import emulate_speed

    monkeypatch.setattr(ex, "POOL_FROM_SECONDS", float("inf"))  # the first-run rule alone would never pool
    monkeypatch.setenv("BISECTOR_POOLED_INPUT_MB", "1")
    model, _ = emulate_speed.build_model(2, 96, 32)  # 1.2 MB maps (32 x 96 x 96), 36 KB weights
    cat = Catalog.from_model(model)
    be = EmulateBackend(block_size=4, threads=2)
    be.open(cat)
    be.run(Plan(frozenset(), cat.candidates), {"x": np.random.default_rng(4).uniform(0, 1, (1, 3, 96, 96)).astype(np.float32)})
    threads = {s.get_session_options().intra_op_num_threads for s in be.executor._sessions.values()}
    assert 2 in threads  # the blocks reading a map over 1 MB (the head, on pooled features, stays single)
    assert be.executor.sessions_built == len(be.executor._sessions)  # none built twice
    be.close()
    monkeypatch.setenv("BISECTOR_POOLED_INPUT_MB", "8")  # now every map is below the threshold
    be.open(cat)
    be.run(Plan(frozenset(), cat.candidates), {"x": np.random.default_rng(4).uniform(0, 1, (1, 3, 96, 96)).astype(np.float32)})
    assert {s.get_session_options().intra_op_num_threads for s in be.executor._sessions.values()} == {1}
    be.close()
    del be
    import gc

    gc.collect()  # the pooled sessions' threads go now, not during a later test that counts threads


def test_a_session_built_on_part_of_the_batch_starts_with_the_pool_the_batch_needs(monkeypatch):
    """A screen's item or the ranking's sample builds the block sessions the whole batch then runs: their inputs
    count at the batch's size, so a session whose batch input passes the threshold starts with its pool instead
    of being built again after the batch's first run (a 16-image classifier: 216 sessions built twice)."""
    from bisector.backends.emulate import executor as ex

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import emulate_speed

    monkeypatch.setattr(ex, "POOL_FROM_SECONDS", float("inf"))  # the first-run rule alone would never pool
    monkeypatch.setenv("BISECTOR_POOLED_INPUT_MB", "1")
    model, _ = emulate_speed.build_model(2, 48, 32)  # 288 KB maps (32 x 48 x 48) per item
    cat = Catalog.from_model(model)
    x = np.random.default_rng(4).uniform(0, 1, (1, 3, 48, 48)).astype(np.float32)
    for scale, pooled in ((1.0, False), (8.0, True)):  # one item of one, one item of eight (2.3 MB maps)
        be = EmulateBackend(block_size=4, threads=2)
        be.open(cat)
        with be.part_of_the_batch(scale):
            be.run(Plan(frozenset(), cat.candidates), {"x": x})
        threads = {s.get_session_options().intra_op_num_threads for s in be.executor._sessions.values()}
        assert (2 in threads) is pooled, (scale, threads)
        be.close()
        del be
    import gc

    gc.collect()  # the pooled sessions' threads go now, not during a later test that counts threads


@pytest.mark.parametrize("storage", ["fp16", "bf16"])
def test_fed_weights_are_held_as_fp16_and_widened_in_the_session(storage):
    """Under FP16 storage a weight fed to a block session is its FP16 copy (half the bytes of an FP32 array of
    FP16 values), widened by a Cast inside the session; the held-bytes budget counts those halves. Under BF16
    storage fed weights stay FP32 arrays. The mixed model's writer gets the halves as they are (same values as
    the weight rule's)."""
    from bisector.fp16 import rules

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import scale

    tf, _ = scale.transformer_model(1, 128, 32, heads=2)
    cat = Catalog.from_model(tf)
    x = {"x": np.random.default_rng(2).uniform(-1, 1, (1, 32, 128)).astype(np.float32)}
    be = EmulateBackend(block_size=4, storage=storage)
    be.open(cat)
    be.run(Plan(frozenset(), cat.candidates), x)  # all FP16: every weight read rounded
    ex = be.executor
    fed = {t: v for s in ex._sessions.values() for t, v in s._bisector_fed.items() if v is not ex.weights.get(t)}
    assert fed
    want = np.float16 if storage == "fp16" else np.float32
    assert all(v.dtype == want for v in fed.values())
    assert ex._converted_held == sum(s._bisector_converted for s in ex._sessions.values()) > 0
    if storage == "fp16":
        rounded = be.rounded_weights()
        for t, v in fed.items():
            name = t.removesuffix("__fp16")
            np.testing.assert_array_equal(v, rules.weight_rule(ex.weights[name]))
            assert rounded[name] is v
    be.close()


def test_weights_are_fed_except_where_a_kernel_needs_a_constant(monkeypatch):
    """Block sessions get large weights as inputs fed from our arrays (ORT copies an external initializer while
    it builds a session: ~5 ms per block of an 8 x 768 transformer); Conv weights stay initializers (NCHWc).
    Same bits as with every weight an initializer."""
    from bisector.model import weights as weight_store

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import scale

    import emulate_speed

    tf, _ = scale.transformer_model(1, 128, 32, heads=2)
    conv, _ = emulate_speed.build_model(2, 16, 32)  # 32 channels: 36 KB Conv weights, past the inline size
    cases = [(tf, {"x": np.random.default_rng(2).uniform(-1, 1, (1, 32, 128)).astype(np.float32)}),
             (conv, {"x": np.random.default_rng(3).uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)})]
    for model, x in cases:
        cat = Catalog.from_model(model)
        results = {}
        for mode, constant_ops in (("fed", weight_store.BUILD_ONLY_OPS), ("initializers", None)):
            if constant_ops is None:  # every op as if its kernel needed a constant: the old way
                monkeypatch.setattr(weight_store, "BUILD_ONLY_OPS", frozenset(o.op_type for o in model.graph.node))
            be = EmulateBackend(block_size=4)
            be.open(cat)
            results[mode] = [be.run(plan, x) for plan in _plans(cat, 3)]
            fed = {t for s in be.executor._sessions.values() for t in s._bisector_fed}
            if mode == "fed":
                readers = {t: n.op_type for n in model.graph.node for t in n.input}
                assert all(readers[t.removesuffix("__rounded").removesuffix("__fp16")] not in ("Conv", "ConvTranspose") for t in fed)
                if any(n.op_type == "Conv" for n in model.graph.node):
                    assert any(s._bisector_shared for s in be.executor._sessions.values())
                else:
                    assert fed
            else:
                assert not fed
            be.close()
            monkeypatch.undo()
        for a, b in zip(results["fed"], results["initializers"]):
            for k in a:
                np.testing.assert_array_equal(a[k], b[k])


def test_block_variants_are_bounded_per_block_and_apart_from_node_sessions(monkeypatch):
    """A diffuse search makes a new variant of most blocks per plan; ~150 KB each, they are kept up to two per
    block or a quarter of the weights' worth (at least MAX_SESSIONS, or the model's own size in sessions' worth where
    that is less). Node-level runs (`run_all`, `profile`) keep theirs apart: they evict no block."""
    from bisector.backends.emulate import executor as ex

    monkeypatch.setenv("BISECTOR_NUMPY_BLOCKS", "0")  # the chain's blocks as sessions (else numpy runs them)
    # a session per block variant (the chain's twin blocks would otherwise share a few: tests/test_shared_parts.py)
    monkeypatch.setenv("BISECTOR_SHARE_PARTS", "0")

    model, _ = chain_model(1200, width=16)
    cat = Catalog.from_model(model)
    be = EmulateBackend(block_size=8)
    be.open(cat)
    weights = sum(v.nbytes for v in be.executor.weights.values())
    limit = max(min(ex.MAX_SESSIONS, weights // ex.SESSION_BYTES), ex.SESSIONS_PER_BLOCK * len(be.executor.blocks),
                int(ex.SESSIONS_WEIGHT_SHARE * weights) // ex.SESSION_BYTES)
    assert be.executor.max_sessions == limit < 1024
    x = {"x": np.random.default_rng(6).uniform(1, 2, (1, 16)).astype(np.float32)}
    for plan in _plans(cat, 8, seed=7):
        be.run(plan, x)
    assert be.executor.sessions_built > limit  # the plans needed more variants than are kept
    assert len(be.executor._sessions) <= limit
    blocks = dict(be.executor._sessions)
    be.run_all(_plans(cat, 1, seed=8)[0], x)
    assert len(be.executor._node_sessions) > 0
    assert all(be.executor._sessions.get(k) is s for k, s in blocks.items())


def test_sessions_copies_of_conv_weights_are_bounded_and_evaluations_unchanged():
    """ORT keeps its own copy of a Conv weight in each session (NCHWc layout): cached block variants are kept
    within `copies_budget` of such copies (two copies of the model's Conv weights by default), and every output
    is what an unbounded executor computes."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import emulate_speed

    model, _ = emulate_speed.build_model(4, 16, 64)  # 144 KB Conv weights each
    cat = Catalog.from_model(model)
    x = {"x": np.random.default_rng(9).uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)}
    plans = _plans(cat, 8, seed=3)
    free = EmulateBackend(block_size=4)
    free.open(cat)
    conv = sum(free.executor.weights[n.input[1]].nbytes for n in cat.model.graph.node if n.op_type == "Conv")
    assert free.executor.copies_budget == max(free.executor.copies_budget, 2 * conv)  # two copies by default
    free.executor.copies_budget = 1 << 40
    expected = [free.run(p, x) for p in plans]
    held_free = free.executor._copies_held
    bounded = EmulateBackend(block_size=4)
    bounded.open(cat)
    bounded.executor.copies_budget = 300 << 10  # about two sessions' worth
    for p, e in zip(plans, expected):
        got = bounded.run(p, x)
        for k in e:
            np.testing.assert_array_equal(got[k], e[k])
        ex = bounded.executor
        assert ex._copies_held <= max(ex.copies_budget, max(
            (getattr(s, "_bisector_copies", 0) for s in ex._sessions.values()), default=0))
        assert ex._copies_held == sum(getattr(s, "_bisector_copies", 0) for s in ex._sessions.values())
    assert held_free > bounded.executor.copies_budget  # unbounded, the variants held more copies than that


def _elementwise_model(seed: int, nodes: int = 40, width: int = 16):
    """Random DAG of Add/Sub/Mul/Div/Neg/Abs/Identity on [2, width] tensors: broadcast [width] and scalar
    weights, values past FP16's range, zeros to divide by, negative zeros."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits, made, live = [], [], ["x"]
    special = np.array([0.0, -0.0, 7e4, -7e4, 1e-9, 3.0], np.float32)
    for i in range(nodes):
        op = ["Add", "Sub", "Mul", "Div", "Neg", "Abs", "Identity"][rng.integers(7)]
        a = live[rng.integers(max(0, len(live) - 4), len(live))]
        if op in ("Neg", "Abs", "Identity"):
            ins = [a]
        elif rng.random() < 0.5:
            shape = [(), (width,), (2, width)][rng.integers(3)]
            w = rng.standard_normal(shape).astype(np.float32) * np.float32(10.0 ** rng.integers(-3, 5))
            if w.size and rng.random() < 0.3:
                w.flat[rng.integers(w.size)] = special[rng.integers(special.size)]
            inits.append(numpy_helper.from_array(np.asarray(w, np.float32), f"w{i}"))
            ins = [a, f"w{i}"] if rng.random() < 0.7 else [f"w{i}", a]
        else:
            ins = [a, live[rng.integers(len(live))]]
        made.append(helper.make_node(op, ins, [f"t{i}"], name=f"n{i} {op}"))
        live.append(f"t{i}")
    outs = [helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in live[-3:]]
    g = helper.make_graph(made, "ew", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, width])], outs,
                          initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("storage", ["fp16", "bf16"])
def test_elementwise_blocks_in_numpy_are_the_sessions_bits(monkeypatch, storage):
    """Blocks of float32 Add/Sub/Mul/Div/Neg/Abs/Identity on small tensors run in numpy instead of a session
    per variant: the same bits as the sessions (and, all FP32, as one whole-model ORT session) on random graphs
    with broadcasting, overflow past FP16, division by zero and negative zeros, under random plans."""
    import onnxruntime as ort

    from bisector.backends.emulate import executor as ex

    calls = []
    real = ex.NodeExecutor._run_block_numpy
    monkeypatch.setattr(ex.NodeExecutor, "_run_block_numpy", lambda self, *a: calls.append(1) or real(self, *a))

    def same(a: np.ndarray, b: np.ndarray) -> None:
        """Bit for bit, but a NaN's sign (numpy's Neg flips it, ORT's kernels may not: a NaN either way)."""
        nan = np.isnan(a)
        np.testing.assert_array_equal(nan, np.isnan(b))
        np.testing.assert_array_equal(np.where(nan, 0, a).view(np.uint32), np.where(nan, 0, b).view(np.uint32))

    for seed in range(6):
        model = _elementwise_model(seed)
        cat = Catalog.from_model(model)
        x = {"x": (np.random.default_rng(seed).standard_normal((2, 16)) * 300).astype(np.float32)}
        x["x"][0, :3] = [0.0, -0.0, 7e4]
        plans = [Plan(frozenset(cat.candidates), cat.candidates)] + _plans(cat, 5, seed)
        results = {}
        for label, env in (("numpy", "1"), ("sessions", "0")):
            monkeypatch.setenv("BISECTOR_NUMPY_BLOCKS", env)
            calls.clear()
            backend = EmulateBackend(block_size=8, storage=storage)
            backend.open(cat)
            results[label] = [backend.run(p, x) for p in plans]
            assert bool(calls) == (env == "1") and (env == "0" or backend.executor.sessions_built <= 1)
            backend.close()
        for a, b in zip(results["numpy"], results["sessions"]):
            for k in a:
                same(a[k], b[k])
        whole = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        for k, v in zip(cat.output_names, whole.run(cat.output_names, x)):
            same(results["numpy"][0][k], v)


def test_a_golden_outputs_summary_is_computed_once_while_it_lives(monkeypatch):
    """The comparator summarises a golden output (min/max/mean/median: its median alone a quarter of a comparison)
    once per array, not per plan: golden arrays are read-only (Golden makes them so), the kept summary is the one
    it would compute, and it goes with the array. A writeable array is summarised each time."""
    import gc

    from bisector import compare
    from bisector.model.golden import Golden

    calls = []
    real = compare.summary
    monkeypatch.setattr(compare, "summary", lambda a, overwrite=False: calls.append(a) or real(a, overwrite))
    rng = np.random.default_rng(3)
    g = rng.standard_normal((4, 1000)).astype(np.float32)
    golden = Golden([{"y": g}], "computed", 1, 0.0)
    assert not g.flags.writeable  # reference data cannot change under a search
    tol = compare.Tolerance()
    before = len(compare._GOLDEN_SUMMARIES)
    first = compare.compare_output("y", g + np.float32(1e-3), g, tol)
    n_first = len(calls)
    second = compare.compare_output("y", g * np.float32(1.001), g, tol)
    assert n_first == 4 and len(calls) == 7  # abs, rel and actual again; not the golden
    assert first.golden == second.golden == real(g)
    assert len(compare._GOLDEN_SUMMARIES) == before + 1
    calls.clear()  # it held the arrays
    del golden, g, first, second
    gc.collect()
    assert len(compare._GOLDEN_SUMMARIES) == before  # gone with the array

    w = rng.standard_normal(100).astype(np.float32)
    calls.clear()
    compare.compare_output("y", w, w, tol)
    compare.compare_output("y", w, w, tol)
    assert len(calls) == 8


def test_arena_shrink_changes_no_result_and_waits_for_growth(monkeypatch):
    """The shared arena gives memory back after block runs with inputs that large once the process has grown past
    its level: by default the guard's (GUARD x its peak before the search, inputs of GUARD_FROM_MB or more), with
    BISECTOR_ARENA_SHRINK_MB=M from M MB at SHRINK_ABOVE x, never with M < 0. The outputs are the same bit for bit,
    and a process that has not grown never shrinks."""
    import bisector.backends.emulate.executor as ex

    cat = Catalog.load(PLANTED)
    x = {"x": np.random.default_rng(1).uniform(0, 1, (1, 4, 16, 16)).astype(np.float32)}
    plans = _plans(cat, 6, seed=2)
    calls: list[bool] = []
    real = ex.NodeExecutor._run

    def spy(self, key, sess, outputs, feed, shrink=False):
        calls.append(shrink)
        return real(self, key, sess, outputs, feed, shrink)

    def backend(grown: bool) -> EmulateBackend:
        be = EmulateBackend(block_size=16)
        be.open(cat)
        if grown:
            be.executor._shrink_above = 0  # the process counts as grown past the level
        calls.clear()
        return be

    monkeypatch.setattr(ex.NodeExecutor, "_run", spy)
    monkeypatch.delenv("BISECTOR_ARENA_SHRINK_MB", raising=False)
    plain = backend(grown=False)
    expected = [plain.run(p, x)["y"] for p in plans]
    assert calls and not any(calls)  # the guard: the planted model's search never grows past GUARD x its peak
    grown = backend(grown=True)
    for p in plans:
        grown.run(p, x)
    assert calls and not any(calls)  # grown, but its blocks' inputs (4 KB) are under GUARD_FROM_MB
    monkeypatch.setattr(ex, "GUARD_FROM_MB", 0.0)
    got = [backend(grown=True).run(p, x)["y"] for p in plans]
    assert calls and all(calls)
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(e, g)
    monkeypatch.setenv("BISECTOR_ARENA_SHRINK_MB", "0")
    for p in plans:
        backend(grown=False).run(p, x)
    assert calls and not any(calls)  # every block run qualifies by size, but the process has not grown
    got = [backend(grown=True).run(p, x)["y"] for p in plans]
    assert calls and all(calls)
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(e, g)
    monkeypatch.setenv("BISECTOR_ARENA_SHRINK_MB", "-1")  # never
    off = backend(grown=True)
    for p in plans:
        off.run(p, x)
    assert calls and not any(calls)


def test_the_arena_guard_sits_above_the_level_where_fed_weights_go_back(monkeypatch):
    """The levels are factors of the process's peak before the search: fed weights' pages go back past
    SHRINK_ABOVE x it, the arena's chunks past GUARD x it by default (a later, rarer step: each shrink costs the
    next runs their allocations), past SHRINK_ABOVE x it with BISECTOR_ARENA_SHRINK_MB."""
    import bisector.backends.emulate.executor as ex

    monkeypatch.setattr(ex, "_peak_rss_bytes", lambda: 400 << 20)
    monkeypatch.delenv("BISECTOR_ARENA_SHRINK_MB", raising=False)
    be = EmulateBackend(block_size=16)
    be.open(Catalog.load(PLANTED))
    assert be.executor._release_above == pytest.approx(ex.SHRINK_ABOVE * (400 << 20))
    assert be.executor._shrink_above == pytest.approx(ex.GUARD * (400 << 20))
    assert be.executor._shrink_above > be.executor._release_above
    assert be.executor._shrink_from == ex.GUARD_FROM_MB * 2**20
    monkeypatch.setenv("BISECTOR_ARENA_SHRINK_MB", "2")
    be2 = EmulateBackend(block_size=16)
    be2.open(Catalog.load(PLANTED))
    assert be2.executor._shrink_above == pytest.approx(ex.SHRINK_ABOVE * (400 << 20))
    assert be2.executor._shrink_from == 2 * 2**20
    monkeypatch.setenv("BISECTOR_ARENA_SHRINK_MB", "lots")  # not a number: the guard, as unset
    be3 = EmulateBackend(block_size=16)
    be3.open(Catalog.load(PLANTED))
    assert be3.executor._shrink_above == pytest.approx(ex.GUARD * (400 << 20))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the peak is recorded where ru_maxrss is in KiB")
def test_the_golden_inference_peak_travels_with_the_cache_to_the_emulators_levels(tmp_path, monkeypatch):
    """A search on cached goldens guards memory at the level of the process that computed them (its peak just after
    the FP32 reference run, where that run set it), not at what this process's imports took: the arena guard
    would otherwise shrink after every large block run of every cached rerun. A stored value that is not a positive integer is ignored,
    and the outputs are still used (it sets a memory level, never a verdict)."""
    import bisector.backends.emulate.executor as ex
    from bisector.app.job import open_job

    from bisector.model import golden

    flags = dict(val_range=["x:[0,1]"], atol=0.1, cache_dir=tmp_path / "cache")
    import types

    real = golden.heap
    peaks = iter([300 << 20, 300 << 20])  # before and after the reference run: this run did not set the peak
    monkeypatch.setattr(golden, "heap", types.SimpleNamespace(peak_rss_bytes=lambda: next(peaks)))
    earlier = open_job(PLANTED, canary=False, **{**flags, "cache_dir": tmp_path / "other"})
    assert earlier.golden.source == "computed" and earlier.golden.peak_bytes is None
    earlier.close()
    (entry,) = (tmp_path / "other" / "golden").glob("*.npz")
    with np.load(entry) as data:
        assert "__peak__" not in data.files
    peaks = iter([100 << 20, 200 << 20])  # it did
    monkeypatch.setattr(golden, "heap", types.SimpleNamespace(peak_rss_bytes=lambda: next(peaks)))
    first = open_job(PLANTED, canary=False, **flags)
    assert first.golden.source == "computed" and first.golden.peak_bytes == 200 << 20
    first.close()
    monkeypatch.setattr(golden, "heap", real)
    (entry,) = (tmp_path / "cache" / "golden").glob("*.npz")
    with np.load(entry) as data:
        arrays = dict(data)
    assert int(arrays["__peak__"]) == first.golden.peak_bytes
    for stored, expected in ((1 << 40, 1 << 40), ("lots", None), (-5, None)):
        arrays["__peak__"] = np.array(stored)
        np.savez(entry, **arrays)
        job = open_job(PLANTED, canary=False, **flags)
        try:
            assert job.golden.source == "cache" and job.golden.peak_bytes == expected
            level = job.backend.executor._shrink_above
            if expected:
                assert level == pytest.approx(ex.GUARD * expected)
            else:  # unknown: this process's own peak so far
                assert level == pytest.approx(ex.GUARD * ex._peak_rss_bytes(), rel=0.2) and level < 1 << 40
        finally:
            job.close()


def test_an_api_search_runs_before_pydantic_is_imported(tmp_path):
    """pydantic (constraints.json's and the batch config's models, ~10 MB resident) is imported by the Python API
    once a search is over, not before: its memory is not part of the search's peak. (The CLI loads it anyway:
    typer 0.29 coerces every parameter through pydantic.) The result's constraints are still validated."""
    import json
    import subprocess

    script = (
        "import sys\n"
        "import bisector.app.precision as p\n"
        "seen = []\n"
        "run = p.run_search\n"
        "def spy(*a, **k):\n"
        "    seen.append(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core')))\n"
        "    out = run(*a, **k)\n"
        "    seen.append(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core')))\n"
        "    return out\n"
        "p.run_search = spy\n"
        "import bisector\n"
        f"r = bisector.precision({str(PLANTED)!r}, atol=1e-1, val_range={{'x': (0, 1)}},\n"
        f"                       output_dir={str(tmp_path / 'out')!r}, mixed=False)\n"
        "print('SEEN', repr(seen), r.passed, type(r.constraints).__module__)\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("SEEN "))
    seen = eval(line[5:line.index("]]") + 2])
    assert seen == [[], []]
    assert line.endswith("True bisector.artifacts.constraints")
    assert json.loads((tmp_path / "out" / "constraints.json").read_text())["fp32_nodes"]


def test_golden_outputs_do_not_keep_the_reference_sessions_arena(monkeypatch, tmp_path):
    """ONNX Runtime's outputs point into its session's memory arena; the golden outputs, kept for the whole
    search, are copies of their own (the arena and every activation buffer of the reference run go with the
    session), or memory-mapped files past the swap threshold. Values unchanged."""
    import onnxruntime as ort

    from bisector.model.golden import run_reference_model

    cat = Catalog.load(PLANTED)
    x = {"x": np.random.default_rng(0).uniform(0, 1, (1, 4, 16, 16)).astype(np.float32)}
    plain = ort.InferenceSession(str(PLANTED), providers=["CPUExecutionProvider"]).run(None, x)
    # (ORT 1.2x gives views: plain[0].flags.owndata is False; should that change, the copy is merely redundant)
    got = run_reference_model(cat, [x])[0]
    assert all(v.flags.owndata for v in got.values())
    np.testing.assert_array_equal(next(iter(got.values())), plain[0])
    monkeypatch.setenv("BISECTOR_ARRAY_SWAP_THRESHOLD_MB", "0")
    spilled = run_reference_model(cat, [x])[0]
    assert all(isinstance(v, np.memmap) for v in spilled.values())
    np.testing.assert_array_equal(next(iter(spilled.values())), plain[0])


def test_blocks_hold_at_most_a_budget_of_conv_weights_and_evaluate_the_same(monkeypatch):
    """A session copies its Conv weights while it is built (NCHWc), so a block's variant costs its Conv weights'
    bytes each time a plan makes a new one: a block holds at most BLOCK_CONST_BYTES of them (a node above it
    alone), besides at most `size` nodes. The ResNet-50-shaped CNN's diffuse search: 14.0 -> 11.4-12.2 s with
    4 MB (docs/benchmarks.md, "Scale, twenty-third round"). Outputs are the same bits as node by node."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import emulate_speed

    from bisector.backends.emulate import executor as ex

    model, _ = emulate_speed.build_model(4, 16, 64)  # 144 KB Conv weights each
    cat = Catalog.from_model(model)
    convs = {n.name for n in cat.model.graph.node if n.op_type == "Conv"}
    sizes = ex._build_only_bytes(cat, list(cat.model.graph.node))
    assert set(sizes) == convs and sorted(sizes.values()) == [6912] + [147456] * 4  # the stem's, then 64x64x3x3
    monkeypatch.setattr(ex, "BLOCK_CONST_BYTES", 300_000)  # two Convs' weights per block at most
    be = EmulateBackend(block_size=64)
    be.open(cat)
    blocks = be.executor.blocks
    assert max(sum(n.op_type == "Conv" for n in b.nodes) for b in blocks) == 2
    assert [n.name for b in blocks for n in b.nodes] == [n.name for n in cat.model.graph.node if n.op_type != "Constant"]
    monkeypatch.setattr(ex, "BLOCK_CONST_BYTES", 100_000)  # below one Conv's: each Conv still gets a block
    assert all(sum(n.op_type == "Conv" for n in c) <= 1 for c in ex._chunks(list(cat.model.graph.node), 64, sizes))
    x = {"x": np.random.default_rng(4).uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)}
    for plan in _plans(cat, 6, seed=5):
        fused, single = be.run(plan, x), be.run_all(plan, x)
        for k in cat.output_names:
            assert np.array_equal(fused[k], single[k], equal_nan=True)


def test_the_vae_decoder_bench_model_runs_and_its_fused_blocks_agree_node_by_node():
    """bench/scale.py's VAE decoder (issue 14 names diffusion VAEs; twenty-seventh round): torch's GroupNorm
    pattern (a Reshape whose target is a Shape node's output, across block boundaries), nearest upsampling and a
    self-attention. Its output is 2^(levels-1) times the latent; fused block variants give the same bits as the
    node-by-node run for random plans."""
    import onnx
    import scale

    model = scale.vae_decoder_model(latent=8, channels=(8, 4), groups=4, blocks=1)
    onnx.checker.check_model(model)
    cat = Catalog.from_model(model)
    z = {"z": np.random.default_rng(3).uniform(-1, 1, (1, 4, 8, 8)).astype(np.float32)}
    be = EmulateBackend(block_size=5)
    be.open(cat)
    for plan in _plans(cat, 5, seed=3):
        fused = be.run(plan, z)["image"]
        assert fused.shape == (1, 3, 16, 16)
        np.testing.assert_array_equal(fused, be.run_all(plan, z)["image"])
    be.close()


def test_a_search_on_the_vae_decoder_bench_model_passes_and_is_one_minimal(tmp_path):
    """At 3e-3 all-FP16 fails on the small decoder (18 of its nodes stay FP32, ~110 evaluations): a real search."""
    import bisector
    import onnx
    import scale

    path = tmp_path / "vae.onnx"
    onnx.save(scale.vae_decoder_model(latent=8, channels=(8, 4), groups=4, blocks=1), path)
    r = bisector.precision(path, atol=3e-3, rtol=3e-3, val_range={"z": (-1, 1)}, no_cache=True)
    assert r.passed and r.minimal and r.fp32_nodes


def test_block_runs_skip_the_session_wrappers_checks_and_give_the_wrappers_results(monkeypatch):
    """Block runs call ONNX Runtime's inner runner (the wrapper's per-call checks were 7% of a chain's search): the
    same outputs as the wrapper's `run`, for every plan; a session without the inner runner gets the wrapper."""
    import bisector.backends.emulate.executor as ex

    cat = Catalog.load(PLANTED)
    x = {"x": np.random.default_rng(3).uniform(0, 1, (1, 4, 16, 16)).astype(np.float32)}
    plans = _plans(cat, 5, seed=4)
    inner, wrapped = [], []
    real = ex._ort_run

    def spy(sess, outputs, feed, options):
        (inner if getattr(sess, "_sess", None) is not None else wrapped).append(1)
        return real(sess, outputs, feed, options)

    monkeypatch.setattr(ex, "_ort_run", spy)
    fast = EmulateBackend()
    fast.open(cat)
    got = [fast.run(p, x)["y"] for p in plans]
    assert inner and not wrapped

    class Wrapper:  # a session as an ORT without `_sess` would give it: the public `run`, no inner runner
        def __init__(self, sess):
            self.sess = sess

        def __getattr__(self, name):  # what the executor set on the session (fed weights, ...)
            if name == "_sess":
                raise AttributeError(name)
            return getattr(self.sess, name)

        def run(self, outputs, feed, options=None):
            wrapped.append(1)
            return self.sess.run(outputs, feed, options)

    build = ex.NodeExecutor._session
    monkeypatch.setattr(ex.NodeExecutor, "_session", lambda self, *a, **k: Wrapper(build(self, *a, **k)))
    slow = EmulateBackend()
    slow.open(cat)
    inner.clear()
    expected = [slow.run(p, x)["y"] for p in plans]
    assert wrapped
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(e, g)


def test_memory_readings_are_reused_for_a_moment_only(monkeypatch):
    """The arena guard's readings of resident memory (asked around every block run) are reused for
    MEMORY_FRESH_S, then read again: a level crossed is seen at the next reading, not never."""
    import bisector.backends.emulate.executor as ex

    reads = []
    level = [100]

    def peak() -> int:
        reads.append(1)
        return level[0]

    monkeypatch.setattr(ex, "_peak_rss_bytes", peak)
    monkeypatch.setattr(ex, "_rss_bytes", lambda: level[0])
    monkeypatch.setattr(ex, "_READINGS", [(-float("inf"), 0), (-float("inf"), 0)])
    monkeypatch.setattr(ex, "MEMORY_FRESH_S", 0.2)
    assert not ex._grown_past(150)
    level[0] = 200
    assert not ex._grown_past(150)  # the reading from a moment ago
    assert len(reads) == 1
    import time

    time.sleep(0.25)
    assert ex._grown_past(150)  # read again
    assert len(reads) == 2


def test_block_specs_hash_once_and_key_the_caches_as_plain_tuples():
    """A block variant's specs hash once (they key the session caches on every block run) and are the same key as
    the plain tuple of the same specs (a reference run builds plain ones)."""
    from bisector.backends.emulate.executor import _Specs
    from bisector.fp16.points import Read

    plain = (((Read.ROUND, Read.WEIGHT), (True,)), ((Read.EXACT,), (False,)))
    specs = _Specs(plain)
    assert specs == plain and hash(specs) == hash(plain)
    cache = {("block", 3, plain): "session"}
    assert cache[("block", 3, specs)] == "session"
    assert ("block", 3, _Specs(plain[:1])) not in cache
