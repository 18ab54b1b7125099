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
from bisector.backends.ort_cuda import CPU_EP, CUDA_EP, OrtCudaBackend
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
