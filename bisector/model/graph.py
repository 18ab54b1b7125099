"""Graph walking, in one place: subgraphs of If/Loop/Scan, outer-scope reads, consumer maps, Constant values.

Plain functions over the ONNX protobuf that every other module shares (catalog, emulate executor, mixed writer,
sensitivity profile, TensorRT layer matching); none of them walks subgraphs or builds a consumer map itself.
onnx-graphsurgeon and onnx-ir would each need a conversion of the whole model (and of its weights) on every load
for the handful of walks below, so this stays a small module on the protobuf the rest of the code holds.
"""

from __future__ import annotations

import heapq
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np
import onnx

from bisector.errors import BackendFailure

_GRAPH_ATTRS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


# ---- subgraphs -------------------------------------------------------------------------------------------------
def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The node's own subgraphs (If branches, Loop/Scan bodies), not nested ones."""
    out: list[onnx.GraphProto] = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def is_product(node: onnx.NodeProto, weights) -> bool:
    """A MatMul of two computed tensors (an attention's Q x Kᵀ), not of a tensor by a weight: its output can be
    far larger than its inputs (the executor's row tiles, `emulate.tiling`, start there)."""
    return (node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and len(node.input) > 1
            and bool(node.output) and node.input[0] not in weights and node.input[1] not in weights)


def has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in _GRAPH_ATTRS for a in node.attribute)


def stored_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor the graph stores: initializers and tensor attributes (a Constant's value), subgraphs included."""
    yield from graph.initializer
    yield from attribute_tensors(graph)


def attribute_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """The tensors the graph's nodes hold in attributes (a Constant's value), and everything its subgraphs store."""
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
        for g in subgraphs(node):
            yield from stored_tensors(g)


def inner_nodes(node: onnx.NodeProto) -> Iterator[onnx.NodeProto]:
    """Every node inside the node's subgraphs, nested ones included, depth first."""
    for g in subgraphs(node):
        for n in g.node:
            yield n
            yield from inner_nodes(n)


def outer_scope_inputs(node: onnx.NodeProto) -> tuple[str, ...]:
    """Names a node's subgraphs read from the enclosing scope (free variables), in first-use order."""
    free: list[str] = []

    def visit(graph: onnx.GraphProto, bound: set[str]) -> None:
        bound = bound | {i.name for i in graph.input} | {i.name for i in graph.initializer}
        for n in graph.node:
            for t in n.input:
                if t and t not in bound and t not in free:
                    free.append(t)
            for g in subgraphs(n):
                visit(g, bound)
            bound |= set(n.output)
        for o in graph.output:
            if o.name not in bound and o.name not in free:
                free.append(o.name)

    for g in subgraphs(node):
        visit(g, set())
    return tuple(free)


def sort_topologically(graph: onnx.GraphProto) -> int:
    """Put the graph's nodes, and its subgraphs' recursively, in topological order, in place; returns how many
    graphs were reordered (0: all were in order, nothing changed).

    ONNX requires that order, but ONNX Runtime and TensorRT's parser sort a graph themselves, so files out of
    order run and ship: onnxconverter-common's FP16 conversion with `keep_io_types` appends its input Casts after
    the nodes that read them (@imgly/background-removal-data's IS-Net model on npm is one). Every walk here reads
    nodes in file order. The sort is stable (Kahn's algorithm, ties by file position): a graph in order keeps it.
    A node with a subgraph depends on the producers of what its subgraph reads from outside. Names no node of the
    graph produces (inputs, initializers, the enclosing scope's) are available from the start. A cycle raises
    ValueError (the caller names the model)."""
    moved = 0
    for node in graph.node:
        for g in subgraphs(node):
            moved += sort_topologically(g)
    nodes = list(graph.node)
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for t in node.output:
            if t:
                producer.setdefault(t, i)
    needs: list[set[int]] = []
    in_order = True
    for i, node in enumerate(nodes):
        reads = list(node.input) + (list(outer_scope_inputs(node)) if has_subgraph(node) else [])
        deps = {producer[t] for t in reads if t in producer} - {i}
        needs.append(deps)
        in_order = in_order and all(d < i for d in deps)
    if in_order:
        return moved
    readers: dict[int, list[int]] = {}
    waiting = [len(d) for d in needs]
    for i, deps in enumerate(needs):
        for d in deps:
            readers.setdefault(d, []).append(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for r in readers.get(i, ()):
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    if len(order) < len(nodes):
        stuck = next(nodes[i] for i in range(len(nodes)) if waiting[i] > 0)
        raise ValueError(f"the graph{' ' + repr(graph.name) if graph.name else ''} has a cycle: node "
                         f"{stuck.name or stuck.op_type!r} depends on its own outputs")
    copies = []
    for i in order:  # copied before the field is cleared: the messages in `nodes` belong to it
        c = onnx.NodeProto()
        c.CopyFrom(nodes[i])
        copies.append(c)
    del graph.node[:]
    graph.node.extend(copies)
    return moved + 1


def graph_reads(graph: onnx.GraphProto) -> set[str]:
    """Every name a graph (and its subgraphs) reads, plus its outputs."""
    names = {o.name for o in graph.output}
    for n in graph.node:
        names.update(n.input)
        for g in subgraphs(n):
            names.update(graph_reads(g))
    return names


def rename_free(graph: onnx.GraphProto, mapping: Mapping[str, str]) -> None:
    """Rename reads of outer-scope names in `graph` and its nested subgraphs (ONNX forbids shadowing)."""
    bound = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    m = {k: v for k, v in mapping.items() if k not in bound}
    for n in graph.node:
        for i, t in enumerate(n.input):
            if t in m:
                n.input[i] = m[t]
        for g in subgraphs(n):
            rename_free(g, m)
    for o in graph.output:
        if o.name in m:  # a branch that returns an outer value as is
            o.name = m[o.name]


# ---- reads and consumers ---------------------------------------------------------------------------------------
def node_reads(node: onnx.NodeProto, outer: Sequence[str] = ()) -> list[tuple[str, int | None]]:
    """(tensor, explicit input index) for each non-empty input, then (tensor, None) for each outer-scope read."""
    return [(t, i) for i, t in enumerate(node.input) if t] + [(t, None) for t in outer]


def consumers(nodes: Sequence[onnx.NodeProto], outer: Mapping[str, Sequence[str]] | None = None,
              ) -> dict[str, list[tuple[onnx.NodeProto, int | None]]]:
    """tensor -> (reader, explicit input index or None for an outer-scope read), readers in the given order.

    A node that reads a tensor in several slots appears once per slot."""
    out: dict[str, list[tuple[onnx.NodeProto, int | None]]] = {}
    for node in nodes:
        for t, i in node_reads(node, (outer or {}).get(node.name, ())):
            out.setdefault(t, []).append((node, i))
    return out


# ---- values ----------------------------------------------------------------------------------------------------
def constant_value(node: onnx.NodeProto) -> np.ndarray:
    """The value of a Constant node."""
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


def constant_fills(graph: onnx.GraphProto, constants: Iterable[str]) -> dict[str, onnx.NodeProto]:
    """ConstantOfShape nodes whose shape is a constant (an initializer's or a Constant's value), by output name:
    each computes a constant tensor, so they are weights (DESIGN §4) as a Constant is. Graph outputs are left
    as nodes.

    Why: exporters write large constant tensors this way (the onnx package's "light" models build every weight
    with one). ONNX Runtime folds each into every session that holds it, a copy per cached block variant: a
    search on light AlexNet held 2.8x one inference's memory (docs/benchmarks.md, "Scale, twenty-third round").
    TensorRT folds them into weights as well, so they are not layers whose precision a user could set."""
    known = set(constants)
    outputs = {o.name for o in graph.output}
    return {n.output[0]: n for n in graph.node
            if n.op_type == "ConstantOfShape" and n.domain in ("", "ai.onnx") and len(n.input) == 1
            and n.input[0] in known and len(n.output) == 1 and n.output[0] and n.output[0] not in outputs}


def fill_spec(node: onnx.NodeProto, shape: np.ndarray) -> tuple[tuple[int, ...], np.ndarray]:
    """(dims, value as a one-element array) of what a ConstantOfShape node computes for `shape` (its `value`,
    float32 0 when absent)."""
    value = np.zeros(1, np.float32)
    for attr in node.attribute:
        if attr.name == "value":
            value = onnx.numpy_helper.to_array(attr.t).reshape(-1)[:1]
    dims = tuple(int(d) for d in np.asarray(shape).reshape(-1))
    if any(d < 0 for d in dims) or value.size != 1:
        raise BackendFailure(f"ConstantOfShape node {node.name!r} cannot fill shape {dims} with {value.tolist()}")
    return dims, value


def weight_values(graph: onnx.GraphProto, skip=()) -> dict[str, np.ndarray]:
    """Initializers (but those in `skip`) and Constant node outputs by name (DESIGN §4: a Constant is a weight)."""
    values = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer if i.name not in skip}
    values.update({n.output[0]: constant_value(n) for n in graph.node if n.op_type == "Constant"})
    return values


def copy_without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with an empty initializer list (the weights are neither copied nor serialised).

    Field by field, never touching `model`: taking its initializers out and putting them back copied every
    weight into `model`'s protobuf arena, which frees nothing until the whole model goes, so each call grew
    the catalog by the size of its weights (a 1.27 GB model held 2.7 GB after loading, docs/benchmarks.md)."""
    return copy_without(model, ("initializer",))


def copy_without(model: onnx.ModelProto, graph_fields: tuple[str, ...]) -> onnx.ModelProto:
    """A copy of `model` whose graph lacks `graph_fields` (e.g. initializer, node), for the caller to fill."""
    out = onnx.ModelProto()
    _copy_fields(model, out, skip=("graph",))
    _copy_fields(model.graph, out.graph, skip=graph_fields)
    return out


def _copy_fields(src, dst, skip: tuple[str, ...]) -> None:
    for field, value in src.ListFields():
        if field.name in skip:
            continue
        if field.is_repeated:
            getattr(dst, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def weightless_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model without value_info and without the bytes of large initializers and large Constant nodes (dims
    and types kept, as initializer stubs), so that shape inference neither trusts stale value_info nor copies and
    serialises the weights (a model of 1 GB of weights would otherwise cost several GB of peak memory here, and
    one beyond 2 GB cannot be serialised; exporters such as paddle2onnx put every weight in a Constant node: a
    recogniser's 11 MB of them cost 58 MB of peak memory in shape inference)."""
    light = copy_without(model, ("initializer", "node", "value_info"))
    for init in model.graph.initializer:
        if init.ByteSize() > _STUB_BYTES:
            _add_stub(light.graph, init.name, init.data_type, init.dims)
        else:
            light.graph.initializer.add().CopyFrom(init)
    for node in model.graph.node:
        value = _large_constant(node)
        if value is not None:  # shape inference reads a Constant's type and dims: an initializer stub says both
            _add_stub(light.graph, node.output[0], value.data_type, value.dims)
        else:
            light.graph.node.add().CopyFrom(node)
    return light


_STUB_BYTES = 4096  # smaller tensors are kept whole: shape parameters (Reshape's shape, Resize's scales) are tiny


def constant_tensor(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The tensor of a plain Constant node (default domain, one output, a `value` attribute alone), else None."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.output) != 1 or not node.output[0]:
        return None
    if len(node.attribute) != 1 or node.attribute[0].name != "value":
        return None
    return node.attribute[0].t


def _large_constant(node: onnx.NodeProto) -> onnx.TensorProto | None:
    t = constant_tensor(node)
    return t if t is not None and t.ByteSize() > _STUB_BYTES else None


def _add_stub(graph: onnx.GraphProto, name: str, data_type: int, dims) -> None:
    stub = graph.initializer.add()
    stub.name, stub.data_type = name, data_type
    stub.dims.extend(dims)
    stub.data_location = onnx.TensorProto.EXTERNAL
    stub.external_data.add(key="location", value="__not_loaded__")


def unique_node_names(nodes: Iterable[onnx.NodeProto]) -> list[str]:
    """A unique, stable name per node: its own, else TensorRT's parser name `node_of_<first output>` (else
    `<op>_<i>`), with `_<k>` added to repeats. The nodes are not changed."""
    nodes = list(nodes)
    taken = {n.name for n in nodes if n.name}
    seen: set[str] = set()
    names = []
    for i, node in enumerate(nodes):
        name = node.name
        if not name or name in seen:
            base = name or (f"node_of_{node.output[0]}" if node.output and node.output[0] else f"{node.op_type}_{i}")
            name, k = base, 1
            while name in seen or (name != node.name and name in taken):
                name = f"{base}_{k}"
                k += 1
        seen.add(name)
        names.append(name)
    return names


def nonempty(names) -> list[str]:
    return [n for n in names if n]
