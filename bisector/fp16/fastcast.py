"""FP32 -> FP16 (and back) conversion through ONNX Runtime's Cast kernel.

numpy converts to float16 element by element in C (no F16C): 4-5 ns per value, which made weight conversion
most of a large model's search (1.27 GB of weights: ~9 s of conversions). ORT's CPU Cast uses the hardware
conversion instructions: 10-25x faster, and bit-identical (IEEE round-to-nearest-even, overflow to inf,
underflow to ±0 — the same as numpy; tests/test_fp16_rules.py compares them). Callers decide what to do about
overflow and underflow; this module only converts. Falls back to numpy where ORT cannot run the Cast.
"""

from __future__ import annotations

import threading

import numpy as np

_SESSIONS: dict[tuple[str, bool], object] = {}
_LOCK = threading.Lock()
_LOCAL = threading.local()


class on_this_thread:
    """Within this block, conversions on this thread run on it alone (a one-thread session: ORT then computes on
    the caller's thread, not on its pool's), so that a background thread's lowered priority covers them."""

    def __enter__(self) -> None:
        _LOCAL.alone = True

    def __exit__(self, *exc) -> None:
        _LOCAL.alone = False


def _session(kind: str):
    # On the shared pool (bisector.ort_pool) no session may keep a thread of its own: there the conversions of a
    # background thread run on the pool too (ORT converts a weight in milliseconds: little for the search to share)
    from bisector import ort_pool

    key = (kind, bool(getattr(_LOCAL, "alone", False)) and not ort_pool.shared())
    sess = _SESSIONS.get(key)
    if sess is None:
        with _LOCK:
            sess = _SESSIONS.get(key)
            if sess is None:
                import onnxruntime as ort
                from onnx import TensorProto, helper

                from bisector import ort_pool
                from bisector.cores import usable_cores

                nodes = [helper.make_node("Cast", ["a"], ["h" if kind == "round" else "y"], to=TensorProto.FLOAT16)]
                out = TensorProto.FLOAT16
                if kind == "round":
                    nodes.append(helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT))
                    out = TensorProto.FLOAT
                graph = helper.make_graph(nodes, "fastcast", [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)],
                                          [helper.make_tensor_value_info("y", out, None)])
                model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
                opts = ort_pool.session_options(1 if key[1] else usable_cores())
                opts.log_severity_level = 3
                opts.enable_cpu_mem_arena = False  # an arena would keep the largest weight's buffers for good
                # the Cast pair is the point: no optimiser may fold it away
                opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
                sess = _SESSIONS[key] = ort.InferenceSession(model.SerializeToString(), opts,
                                                              providers=["CPUExecutionProvider"])
    return sess


# Below this many values numpy converts faster than a session run costs (~5 us; numpy 1.2 us for 256 values):
# a 5000-node model with a small constant per node converted each through ORT spent 0.15 s writing its mixed model.
NUMPY_BELOW = 2048


def _run(kind: str, a: np.ndarray) -> np.ndarray | None:
    if a.dtype != np.float32 or a.size < NUMPY_BELOW:
        return None
    try:
        out = _session(kind).run(None, {"a": np.ascontiguousarray(a)})[0]
    except Exception:  # noqa: BLE001 - an ORT without the kernel or the shape: numpy below, same values
        return None
    return out.reshape(a.shape)  # a 0-d array comes back with shape (1,)


def to_half(a: np.ndarray) -> np.ndarray:
    """`a.astype(float16)` for an FP32 array."""
    out = _run("half", a)
    if out is None:
        with np.errstate(over="ignore", invalid="ignore"):
            return a.astype(np.float16)
    return out


def round_half(a: np.ndarray) -> np.ndarray:
    """`a.astype(float16).astype(float32)` for an FP32 array."""
    out = _run("round", a)
    if out is None:
        with np.errstate(over="ignore", invalid="ignore"):
            return a.astype(np.float16).astype(np.float32)
    return out
