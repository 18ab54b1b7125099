"""The strongly typed mixed-precision ONNX of a plan (`model.mixed.onnx`; TensorRT 11, TensorRT-RTX, ort-cuda).

FP16 nodes get real FP16 tensors; Casts sit at the boundaries; weights read by FP16 nodes become FP16 copies
converted by the rule of `fp16.convert_weight` (the same rule the emulation applies), while FP32 readers keep the
exact original. Graph inputs and outputs keep their types.

Naming: the FP16 version of a float tensor `t` is always `t__fp16` (the producer's own output when the producer
is FP16, else a Cast or a converted initializer). The FP32 name `t` stays valid wherever an FP32 reader, a
subgraph or a graph output needs it (a Cast back when the producer is FP16), so nothing outside FP16 regions is
renamed — subgraphs of If/Loop/Scan that read outer-scope values keep working untouched.
"""

from __future__ import annotations

import copy

import onnx
from onnx import TensorProto, helper, numpy_helper

from bisector.model.catalog import Catalog
from bisector.fp16.rules import convert_weight, round_activation
from bisector.model.optable import op_schema
from bisector.fp16.plan import Plan

FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16
_ANY_TYPE_READERS = frozenset({"Shape", "Size", "Cast", "CastLike"})


def fp16_name(tensor: str) -> str:
    return f"{tensor}__fp16"


def build_mixed_model(catalog: Catalog, plan: Plan | frozenset[str]) -> onnx.ModelProto:
    """The mixed-precision model: `plan` (or an FP32 set) FP32, every other candidate FP16."""
    if not isinstance(plan, Plan):
        plan = Plan(frozenset(plan), catalog.candidates)
    fp16_nodes = plan.fp16
    src = catalog.model
    model = onnx.ModelProto()
    model.CopyFrom(src)
    # IR < 4 (opset <= 8 era) requires every initializer to be a graph input; the FP16 weight copies are not, and
    # IR 4 lifts that rule without changing anything else the model means.
    model.ir_version = max(model.ir_version, 4)
    graph = model.graph
    del graph.node[:]
    del graph.value_info[:]  # stale after retyping; consumers re-infer

    weights = {i.name: i for i in src.graph.initializer}
    constants = {n.output[0]: n for n in src.graph.node if n.op_type == "Constant"}
    graph_outputs = {o.name for o in src.graph.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in src.graph.node:
        for t in catalog.node_inputs(n.name):
            readers.setdefault(t, []).append(n)

    created: set[str] = set()  # names of the FP16 tensors that exist already (`t__fp16`, `t__fp16_param`)
    new_inits: list[onnx.TensorProto] = []

    def ensure_fp16(t: str, out_nodes: list[onnx.NodeProto], parameter: bool = False) -> str:
        is_weight = t in weights or t in constants
        # A parameter that ONNX types as T (Clip bounds) is rounded like an activation, not clamped like a
        # weight: then min(x, round(b)) == round(min(x, b)) for FP16 x, which is what the emulation computes.
        name = f"{t}__fp16_param" if (parameter and is_weight) else fp16_name(t)
        if name in created:
            return name
        created.add(name)
        if is_weight:
            value = numpy_helper.to_array(weights[t]) if t in weights else _constant_array(constants[t])
            converted = round_activation(value).astype("float16") if parameter else convert_weight(value)
            new_inits.append(numpy_helper.from_array(converted, name))
        else:
            out_nodes.append(helper.make_node("Cast", [t], [name], to=FLOAT16, name=f"{t}__cast_to_fp16"))
        return name

    for node in src.graph.node:
        emitted: list[onnx.NodeProto] = []
        if node.name not in fp16_nodes:
            new = copy.deepcopy(node)
            if node.op_type in _ANY_TYPE_READERS:
                # Shape/Size/Cast read any type: they take the FP16 tensor itself (same values, and no Cast back
                # is needed just for them — what AutoCast does too).
                for i, t in enumerate(node.input):
                    if t and fp16_name(t) in created and catalog.producers.get(t) in fp16_nodes:
                        new.input[i] = fp16_name(t)
            emitted.append(new)
            graph.node.extend(emitted)
            continue
        in_fp16, out_fp16 = _fp16_slots(catalog, node)
        new = copy.deepcopy(node)
        for i, t in enumerate(node.input):
            if t and in_fp16[i] and catalog.is_float(t):
                new.input[i] = ensure_fp16(t, emitted, parameter=catalog.is_parameter(node.name, i))
        # Outer-scope values an FP16 If reads are stored in FP16: its subgraphs read them through a Cast back to
        # FP32 (the subgraphs compute FP32, as in the emulation); nothing is retyped inside them.
        outer = [t for t in catalog.outer_inputs.get(node.name, ()) if catalog.is_float(t)]
        if outer:
            _round_outer_reads(new, {t: ensure_fp16(t, emitted) for t in outer})
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
                new.output[i] = f"{t}__fp32_compute"
                stored.append(helper.make_node("Cast", [new.output[i]], [fp16_name(t)], to=FLOAT16,
                                               name=f"{t}__store_fp16"))
            created.add(fp16_name(t))
            producer_outputs.append(t)
        emitted.append(new)
        emitted.extend(stored)
        for t in producer_outputs:
            needs_fp32 = t in graph_outputs or any(
                (r.name not in fp16_nodes and r.op_type not in _ANY_TYPE_READERS)
                or (r.name in fp16_nodes and not _reads_fp16(catalog, r, t))
                or (r.op_type in _ANY_TYPE_READERS and t not in r.input)  # an outer-scope read in a subgraph
                for r in readers.get(t, [])
            )
            if needs_fp32:
                emitted.append(helper.make_node("Cast", [fp16_name(t)], [t], to=FLOAT, name=f"{t}__cast_to_fp32"))
        graph.node.extend(emitted)

    graph.initializer.extend(new_inits)
    _drop_unused(model)
    return model


def _fp16_slots(catalog: Catalog, node: onnx.NodeProto) -> tuple[list[bool], list[bool]]:
    """Which inputs/outputs of an FP16 node carry FP16 tensors in the mixed model.

    Data inputs whose type parameter admits float16 become FP16; a parameter input becomes FP16 only when ONNX
    ties its type to a converted data input (Clip bounds share T with the data); Resize scales stay FP32.
    """
    schema = op_schema(node.op_type, node.domain, catalog.opset if node.domain in ("", "ai.onnx") else None)
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
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            local = {t: f"{t}__fp16_in_{node.name}_{attr.name}" for t in fp16_of}
            _rename_free(g, local)
            casts = [helper.make_node("Cast", [fp16_of[t]], [local[t]], to=FLOAT, name=f"{local[t]}__cast")
                     for t in fp16_of]
            nodes = casts + list(g.node)
            del g.node[:]
            g.node.extend(nodes)


def _rename_free(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    """Rename reads of outer-scope names in `graph` and its nested subgraphs (ONNX forbids shadowing)."""
    bound = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    m = {k: v for k, v in mapping.items() if k not in bound}
    for n in graph.node:
        for i, t in enumerate(n.input):
            if t in m:
                n.input[i] = m[t]
        for a in n.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                _rename_free(g, m)
    for o in graph.output:
        if o.name in m:
            # a branch that returns an outer value as is: return the rounded copy instead
            o.name = m[o.name]


def _reads_fp16(catalog: Catalog, reader: onnx.NodeProto, t: str) -> bool:
    ins, _ = _fp16_slots(catalog, reader)
    return all(ins[i] for i, x in enumerate(reader.input) if x == t) and t in reader.input


def _constant_array(node: onnx.NodeProto):
    """The value of a Constant node (read here: the emulate backend's reader sits above this layer)."""
    import numpy as np

    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        if isinstance(value, onnx.TensorProto):
            return numpy_helper.to_array(value)
        if attr.name in ("value_float", "value_floats"):
            return np.asarray(value, dtype=np.float32)
        if attr.name in ("value_int", "value_ints"):
            return np.asarray(value, dtype=np.int64)
    raise ValueError(f"Constant node {node.name!r}: no numeric value attribute")


def _drop_unused(model: onnx.ModelProto) -> None:
    """Remove initializers and Constant nodes nobody reads any more (weights now only read as FP16)."""
    graph = model.graph
    used = _graph_reads(graph)  # subgraphs included: a branch may read an outer initializer
    keep = [i for i in graph.initializer if i.name in used]
    dropped = {i.name for i in graph.initializer} - {i.name for i in keep}
    del graph.initializer[:]
    graph.initializer.extend(keep)
    # IR 3 models list every initializer as a graph input too: a dropped weight must not stay behind as a
    # required input without its value
    inputs = [i for i in graph.input if i.name not in dropped]
    del graph.input[:]
    graph.input.extend(inputs)
    nodes = [n for n in graph.node if not (n.op_type == "Constant" and n.output[0] not in used)]
    del graph.node[:]
    graph.node.extend(nodes)


def _graph_reads(graph: onnx.GraphProto) -> set[str]:
    """Every name a graph (and its subgraphs) reads, plus its outputs."""
    names = {o.name for o in graph.output}
    for n in graph.node:
        names.update(n.input)
        for a in n.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                names.update(_graph_reads(g))
    return names
