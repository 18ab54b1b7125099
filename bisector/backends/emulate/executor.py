"""Evaluates plans without building a session per plan (DESIGN §4: a session per candidate costs 12–53
inferences on real models).

The model is cut once into small ORT sessions that are built on first use and kept for every later plan:
- one session per node (and rounding variant: Cast pairs on the inputs/outputs a plan rounds), and
- one fused session per *block* of consecutive nodes, used when every node of the block is FP32 in the plan,
  so FP32 stretches keep ORT's fusions and layouts instead of paying per-node overhead.
Weights are embedded as initializers (ORT pre-packs them), exact or FP16-converted per variant.

Evaluating a plan recomputes only the forward cone of its FP16 nodes; every other tensor is the FP32 reference
run's own array. Rounding is a Cast(FLOAT16)->Cast(FLOAT) pair inside the node's session — what cast-pair
emulation of the whole graph would do, at ORT's vectorised cast speed.
"""

from __future__ import annotations

import hashlib
import time
from typing import Callable, Mapping

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from bisector.model.catalog import Catalog
from bisector.model.inputs import feeds_digest  # noqa: F401  (its home is the model layer; re-exported here)
from bisector.errors import BackendFailure
from bisector.fp16.arithmetic import split_bias_epilogue

# Tensors of these ONNX element types are what FP16 storage changes.
_NP_TO_ONNX = {np.dtype(k): v for k, v in {
    np.float32: onnx.TensorProto.FLOAT, np.float16: onnx.TensorProto.FLOAT16, np.float64: onnx.TensorProto.DOUBLE,
    np.int64: onnx.TensorProto.INT64, np.int32: onnx.TensorProto.INT32, np.int16: onnx.TensorProto.INT16,
    np.int8: onnx.TensorProto.INT8, np.uint8: onnx.TensorProto.UINT8, np.uint16: onnx.TensorProto.UINT16,
    np.uint32: onnx.TensorProto.UINT32, np.uint64: onnx.TensorProto.UINT64, np.bool_: onnx.TensorProto.BOOL,
}.items()}

# (node name, explicit input index or None for outer-scope values, tensor, array) -> (array, round to FP16?)
InputHook = Callable[[str, int | None, str, np.ndarray], tuple[np.ndarray, bool]]


class NodeExecutor:
    """One ORT session per node of `catalog.model`, built lazily and kept for every later plan."""

    def _round_half(self, v: np.ndarray) -> np.ndarray:
        return _round_bf16(v) if self.half == onnx.TensorProto.BFLOAT16 else _round_fp16(v)

    def __init__(self, catalog: Catalog, threads: int = 0, block_size: int = 8, arithmetic: str = "storage",
                 half: int = onnx.TensorProto.FLOAT16):
        self.catalog = catalog
        self.arithmetic = arithmetic  # bisector.fp16.arithmetic: "storage" (DESIGN §4) or "gpu"
        self.half = half  # the reduced storage type of the rounding Casts: FLOAT16, or BFLOAT16 for --bf16
        self.blocks = _partition(catalog, block_size)
        self._sessions: dict[tuple, ort.InferenceSession] = {}
        self._opts = ort.SessionOptions()
        # ALL enables the NCHWc layout kernels (Conv is several times faster with them). Spinning is off:
        # hundreds of per-node sessions each keep a thread pool, and spinning pools starve each other.
        self._opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
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
        self.build_seconds = 0.0  # time spent building sessions (a one-time cost per node variant and block)

    # ---- whole-model runs ------------------------------------------------------------------------------------
    def run_reference(self, feeds: Mapping[str, np.ndarray], boundary_only: bool = False) -> dict[str, np.ndarray]:
        """Every tensor of the model computed in FP32 (weights and graph inputs included).

        `boundary_only`: just the tensors that cross block boundaries (and graph outputs), computed with the
        fused all-FP32 block sessions — all that fused plan evaluation reads, at about one inference's cost."""
        env: dict[str, np.ndarray] = dict(self.weights)
        env.update({k: np.asarray(v) for k, v in feeds.items()})
        if boundary_only:
            for block in self.blocks:
                values = [env[t] for t in block.inputs]
                if block.fusable:
                    specs = tuple(((tuple((False, "exact" if t in self.weights else None, None)
                                          for t in _nonempty(n.input))), (False,) * len(_nonempty(n.output)))
                                  for n in block.nodes)
                    env.update(zip(block.outputs, self._run_block(block, values, specs)))
                else:
                    for node in block.nodes:
                        outs = self.run_node(node, [env[t] for t in self.catalog.node_inputs(node.name)])
                        env.update(zip(_nonempty(node.output), outs))
            return env
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
        round_outputs: Callable[[str], bool],
        fused: bool = True,
    ) -> dict[str, np.ndarray]:
        """Recompute the nodes in `recompute` and everything downstream of a changed tensor.

        `read_input(node, index, tensor, value)` returns `(value, round_it)`: the array the node reads (a
        pre-converted weight, say) and whether to round it to FP16 on the way in; `round_outputs(node)` whether
        its float outputs are stored as FP16. Rounding runs inside the node's ORT session as a Cast pair
        (vectorised, several times faster than numpy's float16 conversion). With `fused`, each touched block runs
        as one session (a variant per rounding pattern, built once) and its block-internal tensors are not
        returned (fused=False runs node by node and returns every tensor).
        Returns only the recomputed tensors; all others equal `reference`.
        """
        changed: dict[str, np.ndarray] = {}
        for block in self.blocks:
            touched = any(n.name in recompute for n in block.nodes) or any(t in changed for t in block.inputs)
            if not touched:
                continue
            if fused and block.fusable:
                values = [changed[t] if t in changed else reference[t] for t in block.inputs]
                specs = tuple(self._spec(n, reference, read_input, round_outputs) for n in block.nodes)
                changed.update(zip(block.outputs, self._run_block(block, values, specs)))
                continue
            # Node by node. With a boundary-only reference (fused mode) block-internal values are not stored, so
            # every node of a touched block runs, producing them; otherwise only the cone is recomputed.
            for node in block.nodes:
                self._run_in_cone(node, reference, recompute, read_input, round_outputs, changed, force=fused)
        return changed

    def _spec(self, node, reference, read_input, round_outputs) -> tuple:
        """How one node runs under the plan: (input rounded?, weight version, output rounded?) per slot.
        Block-internal tensors may be missing from a boundary-only reference: their dtype is all that matters."""
        explicit_idx = [i for i, t in enumerate(node.input) if t]
        ins = []
        for pos, t in enumerate(_nonempty(node.input)):
            value = reference[t] if t in reference else self._placeholder(t)
            v, round_it = read_input(node.name, explicit_idx[pos], t, value)
            weight = None if t not in self.weights else ("exact" if v is self.weights[t] else "converted")
            ins.append((bool(round_it) and v.dtype == np.float32, weight, v if weight == "converted" else None))
        outs = tuple(round_outputs(node.name) and self._is_float32(o, reference) for o in _nonempty(node.output))
        return tuple(ins), outs

    def _is_float32(self, tensor: str, reference: Mapping[str, np.ndarray]) -> bool:
        if tensor in reference:
            return reference[tensor].dtype == np.float32
        return self.catalog.tensor_types.get(tensor, onnx.TensorProto.FLOAT) == onnx.TensorProto.FLOAT

    def _placeholder(self, tensor: str) -> np.ndarray:
        return np.empty(0, np.float32 if self._is_float32(tensor, {}) else np.int64)

    def _run_in_cone(self, node, reference, recompute, read_input, round_outputs, changed, force=False) -> None:
        name = node.name
        inputs = self.catalog.node_inputs(name)
        if not force and name not in recompute and not any(t in changed for t in inputs):
            return
        explicit_idx = [i for i, t in enumerate(node.input) if t]
        values, rounded = [], []
        for pos, t in enumerate(inputs):
            v = changed[t] if t in changed else reference[t]
            idx = explicit_idx[pos] if pos < len(explicit_idx) else None
            v, round_it = read_input(name, idx, t, v)
            if round_it and idx is None:  # outer-scope value of a subgraph: no Cast can reach inside
                v, round_it = self._round_half(v), False
            values.append(v)
            rounded.append(bool(round_it))
        out_names = _nonempty(node.output)
        round_out = tuple(round_outputs(name) and self._is_float32(o, reference) for o in out_names)
        outs = self.run_node(node, values, tuple(rounded), round_out)
        changed.update(zip(out_names, outs))

    # ---- one node --------------------------------------------------------------------------------------------
    def run_node(self, node: onnx.NodeProto, values: list[np.ndarray], round_in: tuple[bool, ...] = (),
                 round_out: tuple[bool, ...] = ()) -> list[np.ndarray]:
        inputs = self.catalog.node_inputs(node.name)
        round_in = round_in or (False,) * len(inputs)
        feed: dict[str, np.ndarray] = {}
        for t, v in zip(inputs, values):
            if t not in self.weights:
                feed.setdefault(t, v)
        # A weight is embedded in the session; which version (exact or FP16-converted) is part of the key.
        versions = tuple(("exact" if v is self.weights[t] else "converted") if t in self.weights else str(v.dtype)
                         for t, v in zip(inputs, values))
        key = (node.name, versions, round_in, round_out)
        sess = self._sessions.get(key)
        if sess is None:
            sess = self._sessions[key] = self._build(node, inputs, values, round_in, round_out)
        try:
            return sess.run(None, feed)
        except Exception as exc:
            raise BackendFailure(f"ONNX Runtime failed to run node {node.name!r} ({node.op_type}): {exc}") from None

    def _build(self, node: onnx.NodeProto, inputs: list[str], values: list[np.ndarray],
               round_in: tuple[bool, ...], round_out: tuple[bool, ...]):
        dtypes = {}
        for t, v in zip(inputs, values):
            dtypes.setdefault(t, np.dtype(v.dtype))
        core = onnx.NodeProto()
        core.CopyFrom(node)
        nodes = []
        explicit_idx = [i for i, t in enumerate(node.input) if t]
        for pos, (t, r) in enumerate(zip(inputs, round_in)):
            if r and dtypes[t] == np.float32 and pos < len(explicit_idx):
                half, back = f"{t}__in{pos}_fp16", f"{t}__in{pos}_rounded"
                nodes.append(helper.make_node("Cast", [t], [half], to=self.half))
                nodes.append(helper.make_node("Cast", [half], [back], to=onnx.TensorProto.FLOAT))
                core.input[explicit_idx[pos]] = back
        out_names = _nonempty(node.output)
        casts = []
        for j, o in enumerate(out_names):
            if j < len(round_out) and round_out[j]:
                raw, half = f"{o}__raw", f"{o}__fp16"
                core.output[list(node.output).index(o)] = raw
                casts.append(helper.make_node("Cast", [raw], [half], to=self.half))
                casts.append(helper.make_node("Cast", [half], [o], to=onnx.TensorProto.FLOAT))
        nodes.extend(self._arithmetic(core, any(round_out)))
        nodes.extend(casts)
        first = {}
        for t, v in zip(inputs, values):
            first.setdefault(t, v)
        return self._session(nodes, f"node {node.name!r} ({node.op_type})",
                             {t: v for t, v in first.items() if t not in self.weights},
                             {t: v for t, v in first.items() if t in self.weights}, out_names)

    def _arithmetic(self, core: onnx.NodeProto, fp16: bool) -> list[onnx.NodeProto]:
        """`core` as the emulation computes it: unchanged (storage rules), or, for an FP16 node under
        --fp16-arithmetic gpu, split where the GPU kernel rounds inside the layer (bisector.fp16.arithmetic)."""
        if self.arithmetic == "gpu" and fp16 and core.output and core.output[0]:
            split = split_bias_epilogue(core, core.output[0], self._weight_rank)
            if split is not None:
                return split
        return [core]

    def _weight_rank(self, tensor: str) -> int | None:
        base = tensor[: -len("__w16")] if tensor.endswith("__w16") else tensor
        w = self.weights.get(base)
        return None if w is None else int(np.ndim(w))

    def _session(self, nodes, what: str, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
                 outputs: list[str]) -> ort.InferenceSession:
        model = self.catalog.model
        graph = helper.make_graph(
            nodes,
            "bisector_part",
            [helper.make_tensor_value_info(t, _NP_TO_ONNX[np.dtype(v.dtype)], None) for t, v in inputs.items()],
            [onnx.ValueInfoProto(name=o) for o in outputs],
            initializer=[onnx.numpy_helper.from_array(np.asarray(v), t) for t, v in weights.items()],
        )
        part = helper.make_model(graph, opset_imports=_with_default_opset(model), ir_version=min(model.ir_version, 10))
        t0 = time.perf_counter()
        try:
            sess = ort.InferenceSession(part.SerializeToString(), self._opts, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise BackendFailure(f"ONNX Runtime cannot build {what} on its own: {exc}") from None
        self.sessions_built += 1
        self.build_seconds += time.perf_counter() - t0
        return sess

    def run_graph(self, key: tuple, nodes: list[onnx.NodeProto], inputs: Mapping[str, np.ndarray],
                  weights: Mapping[str, np.ndarray], outputs: list[str]) -> list[np.ndarray]:
        """Any set of (renamed) node copies as one session, built once per `key` (used by `profile`)."""
        sess = self._sessions.get(key)
        if sess is None:
            sess = self._sessions[key] = self._session(nodes, f"{key[0]} graph", inputs, weights, outputs)
        try:
            return sess.run(outputs, dict(inputs))
        except Exception as exc:
            raise BackendFailure(f"ONNX Runtime failed to run the {key[0]} graph: {exc}") from None

    def _run_block(self, block: "_Block", values: list[np.ndarray], specs: tuple) -> list[np.ndarray]:
        key = ("block", block.index, tuple((tuple(r[:2] for r in ins), outs) for ins, outs in specs))
        sess = self._sessions.get(key)
        if sess is None:
            sess = self._sessions[key] = self._build_block(block, values, specs)
        try:
            return sess.run(None, {t: v for t, v in zip(block.inputs, values) if t not in self.weights})
        except Exception as exc:
            raise BackendFailure(f"ONNX Runtime failed to run block {block.index}: {exc}") from None

    def _build_block(self, block: "_Block", values: list[np.ndarray], specs: tuple) -> ort.InferenceSession:
        """The block's nodes in one session, with Cast pairs where the plan rounds and FP16-converted weights
        for FP16 readers; FP32 stretches inside it keep ORT's fusions."""
        nodes: list[onnx.NodeProto] = []
        weights: dict[str, np.ndarray] = {}
        rounded_alias: dict[str, str] = {}
        for node, (ins, outs) in zip(block.nodes, specs):
            core = onnx.NodeProto()
            core.CopyFrom(node)
            explicit_idx = [i for i, t in enumerate(node.input) if t]
            for pos, (t, (round_it, weight, converted)) in enumerate(zip(_nonempty(node.input), ins)):
                slot = explicit_idx[pos]
                if weight == "exact":
                    weights[t] = self.weights[t]
                elif weight == "converted":
                    core.input[slot] = f"{t}__w16"
                    weights[f"{t}__w16"] = converted
                elif round_it:
                    alias = rounded_alias.get(t)
                    if alias is None:
                        alias = rounded_alias[t] = f"{t}__rounded"
                        nodes.append(helper.make_node("Cast", [t], [f"{t}__half"], to=self.half))
                        nodes.append(helper.make_node("Cast", [f"{t}__half"], [alias], to=onnx.TensorProto.FLOAT))
                    core.input[slot] = alias
            casts = []
            for j, o in enumerate(_nonempty(node.output)):
                if outs[j]:
                    core.output[list(node.output).index(o)] = f"{o}__raw"
                    casts.append(helper.make_node("Cast", [f"{o}__raw"], [f"{o}__half"], to=self.half))
                    casts.append(helper.make_node("Cast", [f"{o}__half"], [o], to=onnx.TensorProto.FLOAT))
            nodes.extend(self._arithmetic(core, any(outs)))
            nodes.extend(casts)
        feed = {t: v for t, v in zip(block.inputs, values) if t not in self.weights}
        return self._session(nodes, f"block {block.index} ({block.nodes[0].name}..{block.nodes[-1].name})",
                             feed, weights, list(block.outputs))


class _Block:
    """Consecutive non-Constant nodes; inputs read from outside, outputs read outside (or graph outputs)."""

    def __init__(self, index: int, nodes: list[onnx.NodeProto], inputs: list[str], outputs: list[str],
                 fusable: bool):
        self.index, self.nodes, self.inputs, self.outputs = index, nodes, inputs, outputs
        self.fusable = fusable


def _partition(catalog: Catalog, size: int) -> list[_Block]:
    nodes = [n for n in catalog.model.graph.node if n.op_type != "Constant"]
    chunks = [nodes[i : i + size] for i in range(0, len(nodes), max(size, 1))]
    readers: dict[str, set[int]] = {}
    for ci, chunk in enumerate(chunks):
        for n in chunk:
            for t in catalog.node_inputs(n.name):
                readers.setdefault(t, set()).add(ci)
    graph_outputs = {o.name for o in catalog.model.graph.output}
    blocks = []
    for ci, chunk in enumerate(chunks):
        produced = {o for n in chunk for o in n.output if o}
        inputs = list(dict.fromkeys(t for n in chunk for t in catalog.node_inputs(n.name) if t not in produced))
        outputs = [o for n in chunk for o in n.output
                   if o and (o in graph_outputs or readers.get(o, set()) - {ci})]
        blocks.append(_Block(ci, chunk, inputs, outputs, len(chunk) > 1 and not any(_unfusable(catalog, n) for n in chunk)))
    return blocks


def _unfusable(catalog: Catalog, node: onnx.NodeProto) -> bool:
    """Nodes a multi-node session would run differently from a one-node session:
    - subgraph nodes read outer-scope values no Cast in the block can reach;
    - native FP16 tensors: ORT runs an FP16 op that lacks a CPU kernel between casts it inserts and then removes
      fp16->fp32 / fp32->fp16 pairs across neighbours, silently skipping the op's FP16 storage (measured on the
      casts fixture, at every optimisation level). Alone in its session the op's output stays FP16."""
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return True
    return any(catalog.tensor_types.get(t) in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
               for t in list(node.input) + list(node.output) if t)


def _round_bf16(v: np.ndarray) -> np.ndarray:
    from bisector.fp16.rules import round_activation_bf16

    return round_activation_bf16(v) if v.dtype == np.float32 else v


def _round_fp16(v: np.ndarray) -> np.ndarray:
    from bisector.fp16.rules import round_activation

    return round_activation(v) if v.dtype == np.float32 else v


def _with_default_opset(model: onnx.ModelProto) -> list:
    """The model's opsets, plus the default domain (Cast) when a model imports only custom domains."""
    imports = list(model.opset_import)
    if not any(i.domain in ("", "ai.onnx") for i in imports):
        imports.append(helper.make_opsetid("", 13))
    return imports


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


class Overlay(dict):
    """Changed tensors over the reference, without copying the reference."""

    def __init__(self, changed: dict, reference: Mapping):
        super().__init__(changed)
        self._reference = reference

    def __missing__(self, key):
        return self._reference[key]

    def __contains__(self, key):
        return dict.__contains__(self, key) or key in self._reference

    def keys(self):  # type: ignore[override]
        return list(self._reference.keys())

    def get(self, key, default=None):
        return self[key] if key in self else default
