"""Runs a model node by node, one small ONNX Runtime session per node, so that a plan can be evaluated without
building a new session for it (DESIGN §4: a session per candidate costs 12–53 inferences on real models).

Each node's session is built once, on first use, from the dtypes it actually receives. Evaluating a plan then
recomputes only the nodes whose inputs differ from the FP32 reference run (the forward cone of its FP16 nodes);
every other tensor is the reference's own array. Rounding happens in numpy between nodes, by the rules of
`fp16.py`, which is exactly what cast pairs in the graph would do.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Mapping

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from .catalog import Catalog
from .errors import BackendFailure

# Tensors of these ONNX element types are what FP16 storage changes.
_NP_TO_ONNX = {np.dtype(k): v for k, v in {
    np.float32: onnx.TensorProto.FLOAT, np.float16: onnx.TensorProto.FLOAT16, np.float64: onnx.TensorProto.DOUBLE,
    np.int64: onnx.TensorProto.INT64, np.int32: onnx.TensorProto.INT32, np.int16: onnx.TensorProto.INT16,
    np.int8: onnx.TensorProto.INT8, np.uint8: onnx.TensorProto.UINT8, np.uint16: onnx.TensorProto.UINT16,
    np.uint32: onnx.TensorProto.UINT32, np.uint64: onnx.TensorProto.UINT64, np.bool_: onnx.TensorProto.BOOL,
}.items()}

# (node name, explicit input index or None for outer-scope values, tensor, array) -> array the node reads
InputHook = Callable[[str, int | None, str, np.ndarray], np.ndarray]


def feeds_digest(feeds: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(feeds):
        a = np.ascontiguousarray(feeds[name])
        h.update(name.encode())
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


class NodeExecutor:
    """One ORT session per node of `catalog.model`, built lazily and kept for every later plan."""

    def __init__(self, catalog: Catalog, threads: int = 0):
        self.catalog = catalog
        self._sessions: dict[tuple, ort.InferenceSession] = {}
        self._opts = ort.SessionOptions()
        self._opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        self._opts.log_severity_level = 3
        if threads:
            self._opts.intra_op_num_threads = threads
        self._initializers = {
            i.name: onnx.numpy_helper.to_array(i) for i in catalog.model.graph.initializer
        }
        self._constants = {}
        for node in catalog.model.graph.node:
            if node.op_type == "Constant":
                self._constants[node.output[0]] = _constant_value(node)
        self.weights: dict[str, np.ndarray] = {**self._initializers, **self._constants}
        self.sessions_built = 0

    # ---- whole-model runs ------------------------------------------------------------------------------------
    def run_reference(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every tensor of the model computed in FP32 (weights and graph inputs included)."""
        env: dict[str, np.ndarray] = dict(self.weights)
        env.update({k: np.asarray(v) for k, v in feeds.items()})
        for node in self.catalog.model.graph.node:
            if node.op_type == "Constant":
                continue
            inputs = self.catalog.node_inputs(node.name)
            outs = self.run_node(node, [env[t] for t in inputs])
            env.update(zip(_nonempty(node.output), outs))
        return env

    def run_changed(
        self,
        reference: Mapping[str, np.ndarray],
        recompute: frozenset[str],
        read_input: InputHook,
        write_output: Callable[[str, str, np.ndarray], np.ndarray],
    ) -> dict[str, np.ndarray]:
        """Recompute the nodes in `recompute` and everything downstream of a changed tensor.

        `read_input` decides what a recomputed node reads (rounded or not); `write_output` what it stores.
        Returns only the tensors that were recomputed; all others equal `reference`.
        """
        changed: dict[str, np.ndarray] = {}
        for node in self.catalog.model.graph.node:
            if node.op_type == "Constant":
                continue
            name = node.name
            inputs = self.catalog.node_inputs(name)
            if name not in recompute and not any(t in changed for t in inputs):
                continue
            n_explicit = len([t for t in node.input if t])
            explicit_idx = [i for i, t in enumerate(node.input) if t]
            values = []
            for pos, t in enumerate(inputs):
                v = changed[t] if t in changed else reference[t]
                idx = explicit_idx[pos] if pos < n_explicit else None
                values.append(read_input(name, idx, t, v))
            outs = self.run_node(node, values)
            for o, v in zip(_nonempty(node.output), outs):
                changed[o] = write_output(name, o, v)
        return changed

    # ---- one node --------------------------------------------------------------------------------------------
    def run_node(self, node: onnx.NodeProto, values: list[np.ndarray]) -> list[np.ndarray]:
        inputs = self.catalog.node_inputs(node.name)
        unique = list(dict.fromkeys(inputs))
        feed = dict(zip(inputs, values))
        key = (node.name, tuple(str(feed[t].dtype) for t in unique))
        sess = self._sessions.get(key)
        if sess is None:
            sess = self._sessions[key] = self._build(node, unique, feed)
        try:
            return sess.run(None, {t: feed[t] for t in unique})
        except Exception as exc:
            raise BackendFailure(f"ONNX Runtime failed to run node {node.name!r} ({node.op_type}): {exc}") from None

    def _build(self, node: onnx.NodeProto, inputs: list[str], feed: Mapping[str, np.ndarray]):
        model = self.catalog.model
        graph = helper.make_graph(
            [node],
            f"node_{node.name}",
            [helper.make_tensor_value_info(t, _NP_TO_ONNX[np.dtype(feed[t].dtype)], None) for t in inputs],
            [onnx.ValueInfoProto(name=o) for o in _nonempty(node.output)],
        )
        single = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=min(model.ir_version, 10))
        try:
            sess = ort.InferenceSession(single.SerializeToString(), self._opts, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise BackendFailure(
                f"ONNX Runtime cannot build node {node.name!r} ({node.op_type}) on its own: {exc}"
            ) from None
        self.sessions_built += 1
        return sess


def _nonempty(names) -> list[str]:
    return [n for n in names if n]


def _constant_value(node: onnx.NodeProto) -> np.ndarray:
    for attr in node.attribute:
        if attr.name == "value":
            return onnx.numpy_helper.to_array(attr.t)
        if attr.name == "value_float":
            return np.array(attr.f, dtype=np.float32)
        if attr.name == "value_floats":
            return np.array(list(attr.floats), dtype=np.float32)
        if attr.name == "value_int":
            return np.array(attr.i, dtype=np.int64)
        if attr.name == "value_ints":
            return np.array(list(attr.ints), dtype=np.int64)
        if attr.name == "value_string":
            return np.array(attr.s.decode())
        if attr.name == "value_strings":
            return np.array([s.decode() for s in attr.strings])
    raise BackendFailure(f"Constant node {node.name!r} has an attribute we cannot read")
