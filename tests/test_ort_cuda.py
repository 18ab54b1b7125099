"""`ort-cuda` on a machine without a GPU (CI): a clear exit 2, and a canary that catches a silently-FP32 backend.

The real-GPU behaviour (canary passes, searches, CPU-fallback report) is verified on the device machine by
scripts/device/validate.py; see docs/verification.md.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from bisector.backends import backend_factory
from bisector.backends.ort_cuda import CPU_EP, CUDA_EP, REPEAT_CHECKS, OrtCudaBackend
from bisector.backends.canary import canary_model, run_canary
from bisector.model.catalog import Catalog
from bisector.errors import BackendFailure, UsageError
from bisector.fp16.mixed import build_mixed_model
from bisector.fp16.plan import Plan

from .conftest import SEED, main_cli

HAS_CUDA_EP = CUDA_EP in ort.get_available_providers()


@pytest.fixture
def no_cuda_provider(monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["AzureExecutionProvider", CPU_EP])


def test_cli_without_cuda_provider_exits_2_with_clear_message(no_cuda_provider, tmp_path, capsys, cache_dir):
    code = main_cli("precision", SEED, "--fp16", "--atol", "1e-1", "--val-range", "x:[1,2]", "--backend", "ort-cuda",
                    "-o", tmp_path / "out", "--cache-dir", cache_dir)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "ort-cuda" in err and "CUDA execution provider" in err
    assert "pip install onnxruntime-gpu" in err and "--backend emulate" in err
    assert "Traceback" not in err


def test_factory_raises_usage_error_without_cuda_provider(no_cuda_provider):
    with pytest.raises(UsageError) as e:
        backend_factory("ort-cuda", device_id=0, strict=True, threads=4)()
    assert e.value.exit_code == 2


@pytest.mark.skipif(HAS_CUDA_EP, reason="the CUDA provider is really installed here")
def test_cuda_provider_listed_but_no_gpu_is_usage_error(monkeypatch):
    """onnxruntime-gpu on a machine without a GPU: ORT quietly falls back to the CPU; we must refuse instead."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA_EP, CPU_EP])
    monkeypatch.setattr(ort, "preload_dlls", lambda *a, **k: None, raising=False)
    b = OrtCudaBackend()
    with pytest.raises(UsageError, match="CUDA provider"):
        b.open(Catalog.from_model(canary_model()))


def test_canary_mixed_model_really_stores_fp16():
    """The canary's Identity node all-FP16 in the mixed model reads and writes a real FP16 tensor."""
    cat = Catalog.from_model(canary_model())
    m = build_mixed_model(cat, Plan.all_fp16(cat.candidates))
    onnx.checker.check_model(m)
    store = next(n for n in m.graph.node if n.name == "canary_store")
    assert list(store.input) == ["x__fp16"] and list(store.output) == ["stored__fp16"]
    casts = {n.output[0]: n for n in m.graph.node if n.op_type == "Cast"}
    assert casts["x__fp16"].attribute[0].i == onnx.TensorProto.FLOAT16
    assert casts["stored"].attribute[0].i == onnx.TensorProto.FLOAT
    inferred = onnx.shape_inference.infer_shapes(m)
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    assert types["stored__fp16"] == onnx.TensorProto.FLOAT16


def test_canary_catches_backend_that_silently_runs_fp32():
    """ORT's CPU provider runs the FP16 graph in FP32 (DESIGN §4): exactly the failure the canary must catch."""
    with pytest.raises(BackendFailure, match="canary failed.*FP32") as e:
        run_canary(lambda: OrtCudaBackend(providers=[CPU_EP]))
    assert e.value.exit_code == 3


def test_stand_in_records_cpu_placement():
    """Node placement comes from ORT's profile of the first run: with a CPU stand-in every node is on the CPU."""
    cat = Catalog.from_model(canary_model())
    b = OrtCudaBackend(providers=[CPU_EP])
    b.open(cat)
    x = np.array([65505.5, 1.25, 1.5, 1.75], dtype=np.float32)
    plan = Plan.all_fp16(cat.candidates)
    out = b.run(plan, {"x": x})
    assert out["stored"][0] == 65504.0 and out["stored"].dtype == np.float32
    out2 = b.run(plan, {"x": x})  # cached session, not profiled again
    np.testing.assert_array_equal(out["sub_out"], out2["sub_out"])
    assert len(b._sessions) == 1
    d = b.describe()
    assert d["backend"] == "ort-cuda" and d["onnxruntime"] == ort.__version__
    fallback = set(d["cpu_fallback_nodes"].split(","))
    assert {"canary_add", "canary_sub"} <= fallback
    assert set(b.cpu_fallback[plan.key()]["fp16_nodes"]) >= {"canary_add", "canary_sub"}
    # a named intermediate tensor can be read out, even one that exists only as FP16 in the mixed model
    add = b.run(plan, {"x": x}, outputs=["add_out"])
    assert add["add_out"].dtype == np.float32
    b.close()


def test_session_cache_is_bounded():
    cat = Catalog.from_model(canary_model())
    b = OrtCudaBackend(providers=[CPU_EP], session_cache_size=2, switch=False)
    b.open(cat)
    x = {"x": np.ones(4, np.float32)}
    for fp32 in ([], ["canary_add"], ["canary_sub"], ["canary_add", "canary_sub"]):
        b.run(Plan(frozenset(fp32), cat.candidates), x)
    assert len(b._sessions) == 2


def test_cuda_provider_options_disable_tf32():
    """ORT's CUDA provider computes FP32 MatMul/Conv in TF32 by default; an FP32-kept node must be real FP32
    (with TF32 on, even the all-FP32 plan of a 512-wide MLP failed atol 3e-4 on an H100: docs/verification.md)."""
    b = OrtCudaBackend(providers=[CPU_EP])
    b._forced_providers = None  # look at what a real GPU session would be given
    cuda = b._providers(allow_cpu=False)
    assert cuda == [(CUDA_EP, {"device_id": "0", "use_tf32": "0"})]
    assert b._providers(allow_cpu=True)[-1] == CPU_EP


def test_extra_cuda_options_from_environment(monkeypatch):
    from bisector.backends.ort_cuda import OPTIONS_ENV, extra_cuda_options

    monkeypatch.delenv(OPTIONS_ENV, raising=False)
    assert extra_cuda_options() == {}
    monkeypatch.setenv(OPTIONS_ENV, " cudnn_conv_algo_search=HEURISTIC , arena_extend_strategy=kSameAsRequested")
    assert extra_cuda_options() == {"cudnn_conv_algo_search": "HEURISTIC", "arena_extend_strategy": "kSameAsRequested"}
    for bad in ("cudnn_conv_algo_search", "use_tf32=1", "=x"):
        monkeypatch.setenv(OPTIONS_ENV, bad)
        with pytest.raises(UsageError):
            extra_cuda_options()


def test_switch_mode_one_session_for_every_plan_and_the_same_outputs(monkeypatch):
    """BISECTOR_ORT_CUDA_SWITCH=1: the switch model is loaded once; each plan is a run with its flags, giving what
    the plan's own mixed-model session gives (CPU stand-in), and CPU placement is reported for every plan."""
    cat = Catalog.load(SEED)
    from bisector.model.inputs import generate_inputs

    feeds = generate_inputs(cat, {"x": (1, 2)})[0]
    per_plan = OrtCudaBackend(providers=[CPU_EP], graph_optimization="disable", switch=False)
    monkeypatch.setenv("BISECTOR_ORT_CUDA_SWITCH", "1")
    switch = OrtCudaBackend(providers=[CPU_EP], graph_optimization="disable")
    assert switch.switch and not per_plan.switch
    for b in (per_plan, switch):
        b.open(cat)
    cands = list(cat.candidates)
    plans = [Plan(frozenset(cands) - {n}, cat.candidates) for n in cands] + [Plan.all_fp16(cat.candidates)]
    for plan in plans:
        a, b = per_plan.run(plan, feeds), switch.run(plan, feeds)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
        assert set(switch.cpu_fallback[plan.key()]["fp16_nodes"]) == set(per_plan.cpu_fallback[plan.key()]["fp16_nodes"])
    assert len(switch.session_times) == 1 and len(per_plan.session_times) == len(plans)
    assert switch.describe()["mode"] == "switch-where" and "mode" not in per_plan.describe()


def test_switch_is_the_default_and_the_environment_chooses(monkeypatch):
    monkeypatch.delenv("BISECTOR_ORT_CUDA_SWITCH", raising=False)
    b = OrtCudaBackend(providers=[CPU_EP])
    assert b.switch and b.switch_kind == "where"
    monkeypatch.setenv("BISECTOR_ORT_CUDA_SWITCH", "0")
    assert not OrtCudaBackend(providers=[CPU_EP]).switch
    monkeypatch.setenv("BISECTOR_ORT_CUDA_SWITCH", "if")
    assert OrtCudaBackend(providers=[CPU_EP]).switch_kind == "if"
    monkeypatch.setenv("BISECTOR_ORT_CUDA_SWITCH", "yes please")
    with pytest.raises(UsageError, match="BISECTOR_ORT_CUDA_SWITCH"):
        OrtCudaBackend(providers=[CPU_EP])


def test_sequence_values_switch_and_per_plan_models_agree():
    """The sequences construct (nodes that read or write a sequence are pinned FP32): the switch model and each
    plan's own mixed model give the same outputs (CPU stand-in), on random plans."""
    from pathlib import Path

    from bisector.model.inputs import generate_inputs

    cat = Catalog.load(Path(__file__).parents[1] / "fixtures" / "constructs" / "sequences.onnx")
    feeds = generate_inputs(cat, {"x": (-1.0, 1.0)})[0]
    per_plan = OrtCudaBackend(providers=[CPU_EP], graph_optimization="disable", switch=False)
    switch = OrtCudaBackend(providers=[CPU_EP], graph_optimization="disable")
    for b in (per_plan, switch):
        b.open(cat)
    rng = np.random.default_rng(1)
    plans = [Plan(frozenset(c for c in cat.candidates if rng.random() < 0.5), cat.candidates) for _ in range(10)]
    for plan in plans + [Plan.all_fp16(cat.candidates)]:
        a, b = per_plan.run(plan, feeds), switch.run(plan, feeds)
        np.testing.assert_array_equal(a["y"], b["y"])
    # the planted weight (1e5, clamped to 65504 in FP16) makes all-FP16 differ from all-FP32 far beyond rounding
    fp32 = switch.run(Plan(frozenset(cat.candidates), cat.candidates), feeds)["y"]
    assert np.abs(switch.run(Plan.all_fp16(cat.candidates), feeds)["y"] - fp32).max() > 0.05


ENCODER = SEED.parent / "exported" / "encoder.onnx"
ENCODER_RANGES = {"ids": (0, 999), "mask": (1, 1)}


def _encoder_feeds(batch: int, seed: int):
    from bisector.model.inputs import generate_inputs

    cat = Catalog.load(ENCODER)
    return cat, generate_inputs(cat, ENCODER_RANGES, {"ids": (batch, 32), "mask": (batch, 32)}, seed=seed)[0]


def _bound_and_per_plan(cat):
    """The switch model's bound runs (the CUDA-graph path on the CPU stand-in) and a session per plan, both open."""
    bound = OrtCudaBackend(providers=[CPU_EP], graph_optimization="disable", graph=True)
    per_plan = OrtCudaBackend(providers=[CPU_EP], graph_optimization="disable", switch=False)
    for b in (bound, per_plan):
        b.open(cat)
    return bound, per_plan


def test_bound_runs_give_each_plan_what_its_mixed_model_gives():
    """The switch model's bound runs (the CUDA-graph path, here on the CPU stand-in: every step but the capture):
    plans and input sets of one shape alternate through the same buffers, a second shape gets its own; each run
    gives the bits of the plan's own mixed model, and the first runs of each shape were checked against plain
    runs of the same session."""
    from bisector.backends.ort_cuda_graph import CHECK_RUNS

    cat, feeds_a = _encoder_feeds(1, 1)
    feeds_b = _encoder_feeds(1, 2)[1]
    feeds_c = _encoder_feeds(2, 3)[1]
    assert not np.array_equal(feeds_a["ids"], feeds_b["ids"])
    bound, per_plan = _bound_and_per_plan(cat)
    assert not OrtCudaBackend(providers=[CPU_EP]).graph  # a stand-in runs plainly unless asked
    cands = list(cat.candidates)
    rng = np.random.default_rng(5)
    plans = [Plan(frozenset(c for c in cands if rng.random() < 0.5), cat.candidates) for _ in range(6)]
    plans += [Plan.all_fp16(cat.candidates), Plan(frozenset(cands), cat.candidates)]
    runs = 0
    for i, plan in enumerate(plans * 2):
        feeds = (feeds_a, feeds_b, feeds_c)[i % 3]
        a, b = per_plan.run(plan, feeds), bound.run(plan, feeds)
        runs += 1
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    runner = next(iter(bound._sessions.values()))._bisector_graph
    assert runner.failed is None and len(runner._signatures) == 2
    # per shape: one plain run to learn the outputs, then CHECK_RUNS bound runs each checked by a plain one; and
    # the session's first REPEAT_CHECKS plans run once more, plainly (the backend's determinism check)
    plain = 2 + 2 * CHECK_RUNS + REPEAT_CHECKS
    assert runner.bound_runs == runs - 2 and runner.plain_runs == plain
    d = bound.describe()
    assert d["cuda_graph"] == "on" and d["cuda_graph_runs"] == f"{runs - 2} bound, {plain} plain"
    assert "run_to_run" not in d  # the CPU provider's runs repeat bit for bit
    assert len(bound.session_times) == 1


def test_a_replay_that_differs_turns_graphs_off_and_the_plain_run_answers(monkeypatch, caplog):
    """Were a replay to give other bits than the plain run of the same session, its result is not used: the
    plain one is, graphs stay off for the rest of the search, and describe() says why."""
    from bisector.backends import ort_cuda_graph

    real = ort_cuda_graph._Bound.run

    def off_by_one_ulp(self, feed, flags):
        return [np.nextafter(v, np.inf).astype(v.dtype) if v.dtype.kind == "f" else v for v in real(self, feed, flags)]

    monkeypatch.setattr(ort_cuda_graph._Bound, "run", off_by_one_ulp)
    cat, feeds = _encoder_feeds(1, 1)
    bound, per_plan = _bound_and_per_plan(cat)
    plans = [Plan.all_fp16(cat.candidates), Plan(frozenset(list(cat.candidates)[:5]), cat.candidates)] * 2
    with caplog.at_level("WARNING", logger="bisector"):
        for plan in plans:
            a, b = per_plan.run(plan, feeds), bound.run(plan, feeds)
            for k in a:
                np.testing.assert_array_equal(a[k], b[k])
    runner = next(iter(bound._sessions.values()))._bisector_graph
    assert runner.failed and "differed" in runner.failed and runner.bound_runs == 0
    assert bound.describe()["cuda_graph"].startswith("off: a replayed run differed")
    assert "CUDA graphs off" in caplog.text


def test_a_run_from_another_thread_goes_the_plain_way():
    """ORT keeps a captured graph per thread and the buffers are the runner's: a run from a thread other than the
    one that made the runner does not touch them."""
    import threading

    cat, feeds = _encoder_feeds(1, 1)
    bound = OrtCudaBackend(providers=[CPU_EP], graph_optimization="disable", graph=True)
    bound.open(cat)
    plan = Plan.all_fp16(cat.candidates)
    mine = [bound.run(plan, feeds) for _ in range(3)]
    runner = next(iter(bound._sessions.values()))._bisector_graph
    before = (runner.bound_runs, runner.plain_runs)
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(bound.run(plan, feeds)))
    t.start()
    t.join()
    assert (runner.bound_runs, runner.plain_runs) == (before[0], before[1] + 1)
    for k in mine[0]:
        np.testing.assert_array_equal(theirs[0][k], mine[-1][k])


def test_graph_setting_from_the_environment(monkeypatch):
    monkeypatch.setenv("BISECTOR_ORT_CUDA_GRAPH", "2")
    with pytest.raises(UsageError, match="BISECTOR_ORT_CUDA_GRAPH"):
        OrtCudaBackend(providers=[CPU_EP])
    monkeypatch.setenv("BISECTOR_ORT_CUDA_GRAPH", "0")
    assert not OrtCudaBackend(providers=[CPU_EP], graph=None).graph
    monkeypatch.setenv("BISECTOR_ORT_CUDA_SWITCH", "0")  # a session per plan: no switch model to replay
    b = OrtCudaBackend(providers=[CPU_EP], graph=True)
    assert not b._uses_graph() and "cuda_graph" not in b.describe()


def test_graph_session_tries_every_node_on_the_gpu_then_shape_nodes_on_the_cpu(monkeypatch):
    """The graph session's attempts on a GPU machine (ORT's side faked): first every node on the CUDA provider;
    where ORT refuses (shape arithmetic it keeps on the CPU: YOLOv8n), again with CPU fallback and the first run
    profiled for placement; where both fail, the plain switch session and the reason in describe()."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA_EP, CPU_EP])
    cat = Catalog.load(SEED)
    calls = []
    real = ort.InferenceSession

    def fake_session(data, options, providers):
        calls.append(providers)
        if len(calls) == 1 or refuse_all:
            raise RuntimeError("This session contains graph nodes that are assigned to the default CPU EP")
        return real(data, providers=[CPU_EP])

    b = OrtCudaBackend()
    b.catalog = cat
    monkeypatch.setattr(b.ort, "InferenceSession", fake_session)
    refuse_all = False
    sess = b._graph_session(tuple(cat.output_names))
    assert [[p if isinstance(p, str) else p[0] for p in c] for c in calls] == [[CUDA_EP], [CUDA_EP, CPU_EP]]
    assert all(c[0][1]["enable_cuda_graph"] == "1" and c[0][1]["use_tf32"] == "0" for c in calls)
    assert sess._bisector_profile and b._switch_cpu is None and b.graph_off is None
    assert sess._bisector_graph.device == "cuda"
    calls.clear()
    refuse_all = True
    b2 = OrtCudaBackend()
    b2.catalog = cat
    assert b2._graph_session(tuple(cat.output_names)) is None and len(calls) == 2
    assert b2.graph_off.startswith("off: This session contains graph nodes")


@pytest.mark.parametrize("graph", [False, True])
def test_runs_that_differ_between_repeats_are_reported_once(graph, monkeypatch, caplog):
    """Where two runs of one plan in one session differ (ORT-CUDA's kernels on Magika), the user hears it once,
    with how far apart, and constraints.json's backend block records it; a session whose runs repeat says
    nothing (the other tests). Simulated here by a session whose every other run adds 1e-3 to its outputs."""
    cat, feeds = _encoder_feeds(1, 1)
    b = OrtCudaBackend(providers=[CPU_EP], graph_optimization="disable", graph=graph)
    b.open(cat)
    plan = Plan.all_fp16(cat.candidates)
    sess = b._session(plan, tuple(cat.output_names))
    real, calls = sess.run, [0]

    def flaky(*a, **kw):
        calls[0] += 1
        out = real(*a, **kw)
        return [v + np.float32(1e-3) if calls[0] % 2 == 0 and v.dtype == np.float32 else v for v in out]

    monkeypatch.setattr(sess, "run", flaky)
    with caplog.at_level("WARNING", logger="bisector"):
        for p in (plan, Plan(frozenset(list(cat.candidates)[:3]), cat.candidates), plan):
            b.run(p, feeds)
    assert caplog.text.count("not deterministic on this model") == 1
    assert abs(float(b.describe()["run_to_run"]) - 1e-3) < 2e-4
    if graph:  # the graph's own check saw it too, and says it is the session, not the graph
        runner = sess._bisector_graph
        assert runner.failed is None or "own plain runs differ" in runner.failed


def test_apart_measures_the_largest_difference_and_treats_nan_and_shape_as_different():
    from bisector.backends.ort_cuda import _apart

    a = np.array([1.0, np.nan, 3.0], np.float32)
    assert _apart(a, a.copy()) == 0.0
    assert _apart(a, np.array([1.0, np.nan, 3.5], np.float32)) == pytest.approx(0.5)
    assert _apart(a, np.array([1.0, 2.0, 3.0], np.float32)) == float("inf")
    assert _apart(a, a[:2]) == float("inf")
    assert _apart(np.array([np.inf, 1.0]), np.array([-np.inf, 1.0])) == float("inf")
    assert _apart(np.array([np.inf, 1.0]), np.array([np.inf, 1.5])) == pytest.approx(0.5)
    assert _apart(np.array([1, 2]), np.array([1, 3])) == float("inf")


def test_an_input_changed_in_place_is_copied_in_again():
    """The bound buffers skip the copy only for the same read-only array: a writeable feed changed in place
    between two runs (its owner reusing the array) gives the new values' outputs, not the old ones."""
    cat, feeds = _encoder_feeds(1, 1)
    bound, plain = _bound_and_per_plan(cat)
    plan = Plan.all_fp16(cat.candidates)
    from bisector.backends.ort_cuda_graph import CHECK_RUNS

    feeds = {k: np.array(v) for k, v in feeds.items()}
    for _ in range(2 + CHECK_RUNS):  # past the checked runs: nothing but the copy rule stands between
        bound.run(plan, feeds)
    runner = next(iter(bound._sessions.values()))._bisector_graph
    assert not any(b.checks_left for b in runner._signatures.values())
    feeds["ids"][...] = (feeds["ids"] + 7) % 1000  # the same array object, other values
    a, b = bound.run(plan, feeds), plain.run(plan, feeds)
    assert runner.failed is None
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    frozen = {k: v.copy() for k, v in feeds.items()}
    for v in frozen.values():
        v.flags.writeable = False
    bound.run(plan, frozen)
    before = {k: id(v) for k, v in runner._signatures[next(iter(runner._signatures))].fed.items()}
    bound.run(plan, frozen)  # the same read-only arrays: nothing copied again
    after = {k: id(v) for k, v in runner._signatures[next(iter(runner._signatures))].fed.items()}
    assert before == after == {k: id(v) for k, v in frozen.items()}


def test_buffers_that_cannot_be_bound_turn_graphs_off_and_the_search_goes_on(monkeypatch, caplog):
    """Binding the buffers can fail (no GPU memory left for them, an ORT that refuses a binding): the run still
    answers, from the plain run it made first, and the rest of the search runs plainly."""
    from bisector.backends import ort_cuda_graph

    def refuse(self, *a, **kw):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(ort_cuda_graph._Bound, "__init__", refuse)
    cat, feeds = _encoder_feeds(1, 1)
    bound, plain = _bound_and_per_plan(cat)
    plan = Plan.all_fp16(cat.candidates)
    with caplog.at_level("WARNING", logger="bisector"):
        for _ in range(2):
            a, b = bound.run(plan, feeds), plain.run(plan, feeds)
            for k in a:
                np.testing.assert_array_equal(a[k], b[k])
    assert bound.describe()["cuda_graph"] == "off: could not bind the buffers: out of memory"
    assert caplog.text.count("CUDA graphs off") == 1
