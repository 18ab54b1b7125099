"""The strongly typed mixed-precision ONNX of a plan (`model.mixed.onnx`; TensorRT 11, TensorRT-RTX, ort-cuda).

Derived from the plan's rounding points (`fp16.points`), like the emulation: what the emulation rounds with a
Cast pair is here a real FP16 tensor; weights read by FP16 nodes become FP16 copies converted by
`rules.weight_rule`, while FP32 readers keep the exact original. Graph inputs and outputs keep their types.

Naming (`fp16.casts`): the FP16 version of a float tensor `t` is always `t__fp16` (the producer's own output when
the producer is FP16, else a Cast or a converted initializer). The FP32 name `t` stays valid wherever an FP32
reader, a subgraph or a graph output needs it (a Cast back when the producer is FP16), so nothing outside FP16
regions is renamed — subgraphs of If/Loop/Scan that read outer-scope values keep working untouched.
"""

from __future__ import annotations

import copy
import math
from typing import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from bisector.fp16 import fastcast, rules
from bisector.fp16.casts import FLOAT, FLOAT16, cast, fp16_name, raw_name, rounded_name
from bisector.fp16.plan import Plan
from bisector.fp16.points import Read, RoundingPoints, rounding_points
from bisector.model import weights as weight_store
from bisector.model.optable import with_default_opset
from bisector.model.catalog import Catalog
from bisector.model.graph import copy_without_initializers, graph_reads, rename_free, subgraphs

_ANY_TYPE_READERS = frozenset({"Shape", "Size", "Cast", "CastLike"})
SMALL_BATCH = 1024  # small FP16 copies converted together (`_convert_small`)


def build_mixed_model(catalog: Catalog, plan: Plan | frozenset[str]) -> onnx.ModelProto:
    """The mixed-precision model: `plan` (or an FP32 set) FP32, every other candidate FP16."""
    model, values = build_mixed_detached(catalog, plan)
    return weight_store.materialize(model, values)


def build_mixed_detached(catalog: Catalog, plan: Plan | frozenset[str],
                         rounded: Mapping[str, np.ndarray] | None = None) -> tuple[onnx.ModelProto, dict]:
    """The mixed model with its large weights as stubs (`bisector.model.weights`), and their values: the
    catalog's own arrays for FP32 weights, `FP16Copy`s (converted when read with `np.asarray`) for the FP16
    ones. A writer streams them to an external data file without a protobuf copy of the weights
    (`artifacts.write`). `rounded`: weights already rounded by the weight rule (FP16 arrays, or FP32 arrays of FP16
    values: the emulate backend's copies from the search), used instead of applying the rule again."""
    if not isinstance(plan, Plan):
        plan = Plan(frozenset(plan), catalog.candidates)
    src = catalog.model
    model = copy_without_initializers(src)  # weights are added at the end: only those still read
    # IR < 4 (opset <= 8 era) requires every initializer to be a graph input; the FP16 weight copies are not, and
    # IR 4 lifts that rule without changing anything else the model means.
    model.ir_version = max(model.ir_version, 4)
    graph = model.graph
    del graph.node[:]
    del graph.value_info[:]  # stale after retyping; consumers re-infer
    emit = NodeWriter(catalog, rounding_points(catalog, plan), detached=True, rounded=rounded)
    for node in src.graph.node:
        graph.node.extend(emit.node(node))  # copies each node: `emit.node` may hand back the source's own
    if any(n.domain in ("", "ai.onnx") for n in graph.node):  # the Casts added: an opset for them
        imports = with_default_opset(model)
        del model.opset_import[:]
        model.opset_import.extend(imports)
    _add_used_initializers(model, list(src.graph.initializer) + emit.new_inits, catalog.fills)
    values = {**catalog.weight_arrays, **emit.new_values}
    return model, {i.name: values[i.name] for i in graph.initializer if weight_store.is_stub(i)}


def fp16_form(catalog: Catalog, node: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Candidate `node` alone in FP16, as the mixed model of any plan computes it: the Casts of its inputs to
    FP16 (from their FP32 names: exact when the producer stored FP16 already), the node itself, and the Casts of
    its float outputs back to their FP32 names; plus the converted weights it reads. (ort-cuda's switch model.)"""
    fp16 = frozenset({node})
    emit = NodeWriter(catalog, rounding_points(catalog, fp16), all_outputs_fp32=True)
    return emit.node(catalog.nodes[node]), emit.new_inits


class FP16Copy:
    """The FP16 copy of a weight an FP16 node reads, converted on demand (`np.asarray(copy)`, each time: nothing
    is kept): by `rules.weight_rule`, or rounded like an activation where ONNX types the weight as a parameter
    (`as_param`). Shape, dtype and size are known without converting."""

    dtype = np.dtype(np.float16)

    def __init__(self, value: np.ndarray, as_param: bool = False, rounded: np.ndarray | None = None):
        # rounded: `value` through the weight rule already (an FP16 array, or FP16 values in FP32: its FP16 form
        # is exact)
        self.value, self.as_param, self.rounded = value, as_param, None if as_param else rounded
        self.shape = tuple(np.shape(value))
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        value = self.value
        if self.rounded is not None:
            out = self.rounded if self.rounded.dtype == np.float16 else fastcast.to_half(self.rounded)
        elif self.as_param:
            out = rules.round_activation(value).astype("float16")
        else:
            out = rules.weight_rule(value)
        return out if dtype is None else out.astype(dtype)


class NodeWriter:
    """Writes the nodes of the mixed model one source node at a time under `points` (FP16 tensors are created
    once and shared by every FP16 reader; converted weights collect in `new_inits`)."""

    def __init__(self, catalog: Catalog, points: RoundingPoints, all_outputs_fp32: bool = False,
                 detached: bool = False, rounded: Mapping[str, np.ndarray] | None = None):
        self.catalog, self.points = catalog, points
        self.rounded = rounded or {}  # weights rounded by the rule already (build_mixed_detached)
        # detached: large converted weights become stubs, their arrays in `new_values` (else TensorProtos)
        self.detached = detached
        self.new_values: dict[str, FP16Copy] = {}
        self.graph_outputs = set(catalog.output_names)
        self.created: set[str] = set()  # names of the FP16 tensors that exist already
        self._inits: list[onnx.TensorProto | None] = []
        self._pending: list[tuple[int, str, FP16Copy]] = []  # small copies converted together (`new_inits`)
        self.all_outputs_fp32 = all_outputs_fp32  # every float output also under its FP32 name
        self._slots: dict[str, tuple[list[bool], list[bool]]] = {}
        self._slots_by_form: dict[tuple, tuple[list[bool], list[bool]]] = {}

    @property
    def new_inits(self) -> list[onnx.TensorProto]:
        """The converted weights (TensorProtos, or stubs of detached ones), in the order they were first read."""
        self._convert_pending()
        return self._inits  # type: ignore[return-value]

    def _convert_pending(self) -> None:
        for k, name, array in _convert_small(self._pending):
            self._inits[k] = _fp16_tensor(array, name)
        self._pending = []

    def ensure_fp16(self, t: str, out_nodes: list[onnx.NodeProto], read: Read) -> str:
        """The FP16 tensor an FP16 reader reads for `t` (created on first use)."""
        catalog, points = self.catalog, self.points
        # A weight read as a parameter that ONNX types as T (Clip bounds) is rounded like an activation, not
        # clamped like a weight: then min(x, round(b)) == round(min(x, b)) for FP16 x, what the emulation computes.
        as_param = read is Read.EXACT and t in catalog.weights and not points.stored(t)
        name = f"{fp16_name(t)}_param" if as_param else fp16_name(t)
        if name in self.created:
            return name
        self.created.add(name)
        if t in catalog.fills:
            # a constant fill read in FP16: the same node filling the converted value (a converted initializer
            # would write out the whole tensor the source model computes from a shape)
            fill = catalog.nodes[catalog.producers[t]]
            value = np.asarray(FP16Copy(np.asarray(catalog.value(t)).reshape(-1)[:1], as_param, None))
            out_nodes.append(helper.make_node("ConstantOfShape", [fill.input[0]], [name],
                                              name=f"{fill.name}__fp16", value=numpy_helper.from_array(value)))
        elif t in catalog.weights:
            value = catalog.value(t)  # an initializer's or a Constant's
            deferred = FP16Copy(value, as_param, self.rounded.get(t))
            if self.detached and deferred.nbytes >= weight_store.DETACH_MIN_BYTES:
                # converted when written (`np.asarray`): a writer streams one weight at a time, and can convert
                # the next while it writes this one (artifacts.write)
                self.new_values[name] = deferred
                self._inits.append(weight_store.stub(name, helper.np_dtype_to_tensor_dtype(deferred.dtype),
                                                     deferred.shape))
            else:
                self._pending.append((len(self._inits), name, deferred))
                self._inits.append(None)
                if len(self._pending) >= SMALL_BATCH:  # what waits stays small (the copies and their sources)
                    self._convert_pending()
        else:
            out_nodes.append(cast(t, name, FLOAT16))
        return name

    def node(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        """`node` as the mixed model writes it: a copy (FP32, or FP16 with its Casts and converted weights)."""
        catalog, points = self.catalog, self.points
        emitted: list[onnx.NodeProto] = []
        if node.name not in points.fp16:
            new = node  # unchanged: the caller's graph.node.extend copies it
            if node.op_type in _ANY_TYPE_READERS:
                # Shape/Size/Cast read any type: they take the FP16 tensor itself (same values, and no Cast back
                # is needed just for them — what AutoCast does too).
                for i, t in enumerate(node.input):
                    if t and fp16_name(t) in self.created and points.stored(t):
                        if new is node:
                            new = copy.deepcopy(node)
                        new.input[i] = fp16_name(t)
            return [new]
        new = copy.deepcopy(node)
        in_fp16, out_fp16 = self.slots(node)
        for t, i in catalog.reads(node.name):
            if i is not None and in_fp16[i] and catalog.is_float(t):
                new.input[i] = self.ensure_fp16(t, emitted, points.read(node.name, i, t))
        # Outer-scope values an FP16 If reads are stored in FP16: its subgraphs read them through a Cast back to
        # FP32 (the subgraphs compute FP32, as in the emulation); nothing is retyped inside them.
        outer = {t: self.ensure_fp16(t, emitted, points.read(node.name, None, t))
                 for t, i in catalog.reads(node.name) if i is None and catalog.is_float(t)}
        if outer:
            _round_outer_reads(new, outer)
        producer_outputs, stored = [], []
        for i, t in enumerate(node.output):
            if not (t and catalog.is_float(t)):
                continue
            if out_fp16[i]:
                new.output[i] = fp16_name(t)
            else:
                # ONNX does not let this node produce FP16 from what it reads (Range from FP32 bounds that must
                # not be rounded, If whose type comes from its subgraphs, ConstantOfShape, ...): it computes
                # FP32 and its output is stored in FP16 right after, exactly the emulation's rule.
                new.output[i] = raw_name(t)
                stored.append(cast(raw_name(t), fp16_name(t), FLOAT16))
            self.created.add(fp16_name(t))
            producer_outputs.append(t)
        emitted.append(new)
        emitted.extend(stored)
        for t in producer_outputs:
            if (self.all_outputs_fp32 or t in self.graph_outputs
                    or any(self._needs_fp32(r, idx) for r, idx in catalog.consumers.get(t, []))):
                emitted.append(cast(fp16_name(t), t, FLOAT))
        return emitted

    def slots(self, node: onnx.NodeProto) -> tuple[list[bool], list[bool]]:
        """`_fp16_slots` of `node`, once per node (asked again for each of its producers' outputs)."""
        got = self._slots.get(node.name)
        if got is None:
            # Nodes of one form (op, domain, opset, arity, which inputs are parameters) have the same slots
            catalog = self.catalog
            # (the schema follows from op and domain: the model has one opset per domain)
            form = (node.op_type, node.domain, len(node.input), len(node.output),
                    tuple(catalog.is_parameter(node.name, i) for i in range(len(node.input))))
            got = self._slots_by_form.get(form)
            if got is None:
                got = self._slots_by_form[form] = _fp16_slots(catalog, node)
            self._slots[node.name] = got
        return got

    def _needs_fp32(self, reader: onnx.NodeProto, index: int | None) -> bool:
        """Does `reader` read the FP32 name of a tensor produced FP16, in slot `index` (None: from a subgraph)?"""
        if reader.op_type in _ANY_TYPE_READERS:
            return index is None  # reads the FP16 tensor itself, unless from inside a subgraph
        if reader.name not in self.points.fp16:
            return True
        return index is None or not self.slots(reader)[0][index]


def _convert_small(pending: list[tuple[int, str, FP16Copy]]) -> list[tuple[int, str, np.ndarray]]:
    """The small FP16 copies' arrays, (index, name, array), bit for bit `np.asarray(copy)` of each. Copies the
    search rounded already (FP32 arrays of FP16 values) are converted as one array, and so are those the built-in
    weight rule converts from FP32 (the rule is elementwise): a model of many small weights (a 20 000-node chain,
    20 000 scalars) spent more on one call each than on the rest of the mixed model's build (docs/benchmarks.md,
    "Scale, nineteenth round")."""
    out, batches = [], {"rounded": [], "rule": []}
    elementwise = rules.weight_rule_is_elementwise("fp16")
    for k, name, c in pending:
        if c.rounded is not None and c.rounded.dtype == np.float16:
            out.append((k, name, c.rounded))
        elif c.rounded is not None and c.rounded.dtype == np.float32:
            batches["rounded"].append((k, name, c, c.rounded))
        elif c.rounded is None and not c.as_param and elementwise and np.asarray(c.value).dtype == np.float32:
            batches["rule"].append((k, name, c, np.asarray(c.value)))
        else:
            out.append((k, name, np.asarray(c)))
    for kind, items in batches.items():
        if not items:
            continue
        flat = np.concatenate([a.reshape(-1) for *_, a in items])
        converted = fastcast.to_half(flat) if kind == "rounded" else rules.weight_rule(flat)
        start = 0
        for k, name, c, a in items:
            out.append((k, name, converted[start:start + a.size].reshape(c.shape)))
            start += a.size
    return out


def _fp16_tensor(array: np.ndarray, name: str) -> onnx.TensorProto:
    """`numpy_helper.from_array` for an FP16 array (its raw little-endian bytes), without its per-call overhead."""
    if array.dtype != np.float16:
        return numpy_helper.from_array(array, name)
    t = onnx.TensorProto(name=name, data_type=onnx.TensorProto.FLOAT16, dims=array.shape)
    t.raw_data = np.ascontiguousarray(array, dtype="<f2").tobytes()
    return t


def _fp16_slots(catalog: Catalog, node: onnx.NodeProto) -> tuple[list[bool], list[bool]]:
    """Which inputs/outputs of an FP16 node carry FP16 tensors in the mixed model.

    Data inputs whose type parameter admits float16 become FP16; a parameter input becomes FP16 only when ONNX
    ties its type to a converted data input (Clip bounds share T with the data); Resize scales stay FP32.
    """
    schema = catalog.schema(node.name)
    n_in, n_out = len(node.input), len(node.output)
    if schema is None:
        return [not catalog.is_parameter(node.name, i) for i in range(n_in)], [True] * n_out
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}

    def formal(params, i):
        return params[min(i, len(params) - 1)].type_str if params else ""

    converted_params: set[str] = set()
    ins = []
    for i in range(n_in):
        tp = formal(schema.inputs, i)
        ok = "tensor(float16)" in allowed.get(tp, ())
        is_data = not catalog.is_parameter(node.name, i)
        ins.append(ok and is_data)
        if ok and is_data:
            converted_params.add(tp)
    ins = [x or (formal(schema.inputs, i) in converted_params) for i, x in enumerate(ins)]
    outs = []
    for i in range(n_out):
        tp = formal(schema.outputs, i)
        ok = "tensor(float16)" in allowed.get(tp, ())
        outs.append(ok and tp in converted_params)  # an output is FP16 only through an FP16 input of its type
    return ins, outs


def _round_outer_reads(node: onnx.NodeProto, fp16_of: dict[str, str]) -> None:
    """Make `node`'s subgraphs read each outer-scope value `t` through `Cast(fp16_of[t], to=FLOAT)`."""
    for k, g in enumerate(subgraphs(node)):
        local = {t: f"{rounded_name(t)}_{node.name}_{k}" for t in fp16_of}
        rename_free(g, local)
        nodes = [cast(fp16_of[t], local[t], FLOAT) for t in fp16_of] + list(g.node)
        del g.node[:]
        g.node.extend(nodes)


def _add_used_initializers(model: onnx.ModelProto, initializers: list[onnx.TensorProto],
                           fills: frozenset[str] = frozenset()) -> None:
    """Add the initializers something still reads, and drop Constant nodes and constant fills (`fills`: their
    outputs) nobody reads any more (weights now only read as FP16)."""
    graph = model.graph
    used = graph_reads(graph)  # subgraphs included: a branch may read an outer initializer
    graph.initializer.extend(i for i in initializers if i.name in used)
    # IR 3 models list every initializer as a graph input too: a weight not read any more must not stay behind as
    # a required input without its value
    dropped = {i.name for i in initializers} - used
    inputs = [i for i in graph.input if i.name not in dropped]
    del graph.input[:]
    graph.input.extend(inputs)
    nodes = [n for n in graph.node if not ((n.op_type == "Constant" or (len(n.output) == 1 and n.output[0] in fills))
                                           and n.output[0] not in used)]
    del graph.node[:]
    graph.node.extend(nodes)
