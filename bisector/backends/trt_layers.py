"""TensorRT layers <-> ONNX nodes: the one home of the matching rule (DESIGN §2, §7).

`match_layers` decides which ONNX node owns each layer of a TensorRT network. It is used by the `tensorrt`
backend *and* copied verbatim (`inspect.getsource`) into every generated `add_constraints.py`, so the artifact
marks exactly the layers the backend marked. It is therefore plain Python with no imports at all, duck-typed
on the network (`num_layers`, `get_layer(i)`, `layer.name`, optional `layer.metadata`).

The rest of this module predicts the layers TensorRT's ONNX parser makes from a model (`predict_layers`) and
turns Polygraphy's `--layer-precisions NAME:PRECISION ...` into an FP32 node set (`layer_precisions_to_plan`).

How onnx-tensorrt names layers (ModelImporter / ImporterContext::registerLayer): every layer made for a node
is named by `generateUniqueName(node name)`: the first layer gets the node name, further ones `<node>_<k>` with
ONE counter for the whole network (so k is any number, and a node literally named `Add_1` may collide with
the second layer of `Add`); since TensorRT 10 each such layer also carries the metadata
`[ONNX Layer: <node> | ...]`. Helper layers registered without a node get other names (`ONNXTRT_*`) and no
metadata. Unnamed nodes are called `node_of_<first output>` (the catalog uses the same names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping

import onnx

from bisector.errors import UsageError
from bisector.model.graph import inner_nodes, subgraphs

if TYPE_CHECKING:  # pragma: no cover
    from bisector.model.catalog import Catalog

LAYER_PRECISIONS = ("float32", "float16")


# ---- THE matching rule (copied verbatim into add_constraints.py: no imports, no helpers outside it) ---------
def match_layers(network, nodes, aliases=None):
    """Layer indices of `network` per ONNX node name; nodes that own no layer are absent.

    `nodes` must be ALL node names of the model, not only the ones of interest: a layer named `Add_1` belongs
    to a node literally named `Add_1` when the model has one, and only otherwise to node `Add` (its `_<k>`
    suffix). `aliases` maps names of nodes inside If/Loop/Scan bodies to the top-level node that owns them.

    Rules, for each layer in network order:
    1. metadata `[ONNX Layer: <node>]` or `[ONNX Layer: <node> | ...]` naming a known node decides (a node
       name may itself contain " | ": the longest known prefix wins);
    2. otherwise the layer name equal to a node name;
    3. otherwise `<node>_<k>` (k decimal digits) for a node, the parser's name for further layers of a node;
       (2 and 3 also accept an aliased inner name, which counts for its owner);
    4. a layer none of these attribute (a helper registered without a node) that sits between two layers of
       the same node belongs to that node: the parser adds the layers of one node consecutively.
    """
    known = set(nodes)
    owner_of = {inner: outer for inner, outer in dict(aliases or {}).items() if outer in known}

    def resolve(name):
        if name in known:
            return name
        return owner_of.get(name)

    def from_metadata(text):
        head = "[ONNX Layer: "
        if not isinstance(text, str) or not text.startswith(head) or not text.endswith("]"):
            return None
        body = text[len(head):-1]
        owner = resolve(body)
        cut = body.rfind(" | ")
        while owner is None and cut >= 0:
            owner = resolve(body[:cut])
            cut = body.rfind(" | ", 0, cut)
        return owner

    def from_name(name):
        owner = resolve(name)
        if owner is None:
            base, sep, k = name.rpartition("_")
            if sep and k.isascii() and k.isdigit():
                owner = resolve(base)
        return owner

    owners = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        owner = from_metadata(getattr(layer, "metadata", None))
        if owner is None:
            owner = from_name(str(layer.name))
        owners.append(owner)
    last = None  # rule 4: (index, owner) of the last attributed layer
    for i, owner in enumerate(owners):
        if owner is None:
            continue
        if last is not None and last[1] == owner:
            for j in range(last[0] + 1, i):
                owners[j] = owner
        last = (i, owner)
    layers: dict[str, list[int]] = {}
    for i, owner in enumerate(owners):
        if owner is not None:
            layers.setdefault(owner, []).append(i)
    return layers


# ---- model-side inputs of the rule --------------------------------------------------------------------------
def parser_node_name(node: onnx.NodeProto) -> str:
    """The name onnx-tensorrt gives a node: its name, or `node_of_<first output>` when it has none."""
    return node.name or (f"node_of_{node.output[0]}" if node.output else "")


def subgraph_aliases(model: onnx.ModelProto) -> dict[str, str]:
    """Names of nodes inside If/Loop/Scan bodies -> the top-level node that owns them.

    onnx-tensorrt names the layers of a subgraph after the *inner* nodes; keeping the outer node FP32 means
    keeping its body FP32. Inner names equal to a top-level name are left out (the top-level node wins).
    """
    top = {n.name for n in model.graph.node}
    aliases: dict[str, str] = {}
    for node in model.graph.node:
        for n in inner_nodes(node):
            inner = parser_node_name(n)
            if inner and inner not in top:
                aliases.setdefault(inner, node.name)
    return aliases


@dataclass(frozen=True)
class PredictedLayer:
    """One layer as TensorRT's ONNX parser would make it: name, metadata, and the ONNX node it comes from."""

    name: str
    metadata: str
    node: str  # the node name the parser saw (an inner name for layers of a subgraph)
    owner: str  # the top-level node (catalog name) that owns it
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def predict_layers(catalog: "Catalog") -> list[PredictedLayer]:
    """One layer per node, named the way the parser names a node's first layer (its unique-name generator
    included), subgraph bodies right after the node that owns them. Constant nodes make no layer (the parser
    turns them into weights). Real builds may add further `<node>_<k>` layers; the matching rule covers them."""
    taken: set[str] = set()
    counter = [0]

    def unique(base: str) -> str:  # onnx-tensorrt's generateUniqueName: one counter for all names
        name = base
        while name in taken:
            name = f"{base}_{counter[0]}"
            counter[0] += 1
        taken.add(name)
        return name

    layers: list[PredictedLayer] = []

    def visit(nodes: Iterable[onnx.NodeProto], owner: str | None) -> None:
        for node in nodes:
            here = parser_node_name(node)
            top = owner if owner is not None else node.name
            if node.op_type != "Constant":
                layers.append(PredictedLayer(
                    name=unique(here), metadata=f"[ONNX Layer: {here}]", node=here, owner=top,
                    op_type=node.op_type, inputs=tuple(t for t in node.input if t),
                    outputs=tuple(t for t in node.output if t)))
            for g in subgraphs(node):
                visit(g.node, top)

    visit(catalog.model.graph.node, None)
    return layers


# ---- Polygraphy --layer-precisions -> plan ----------------------------------------------------------------
class _NamedLayers:
    """A network of bare layer names (no metadata), for matching names a user typed."""

    def __init__(self, names: list[str]) -> None:
        self._layers = [_Named(n) for n in names]

    @property
    def num_layers(self) -> int:
        return len(self._layers)

    def get_layer(self, i: int) -> "_Named":
        return self._layers[i]


@dataclass(frozen=True)
class _Named:
    name: str


def layer_precisions_to_plan(catalog: "Catalog", specs: Mapping[str, str]) -> frozenset[str]:
    """The FP32 node set that Polygraphy's `--layer-precisions NAME:float32 NAME:float16 ...` asks for.

    `specs` maps TensorRT layer names (as the ONNX parser names them: a node's first layer is the node name,
    further ones `<node>_<k>`) to "float32" or "float16". Each name is mapped to its node by `match_layers`;
    a node is FP32 when any of its layers is named float32. The result holds candidates only: pinned nodes
    are FP32 anyway and Constant/Shape/Cast nodes never round. Layers not named stay FP16, as in an `--fp16`
    build. A name that matches no node of the model, or a precision other than float32/float16, is a
    UsageError naming it.
    """
    aliases = subgraph_aliases(catalog.model)
    bad = sorted(f"{name}:{value}" for name, value in specs.items() if str(value) not in LAYER_PRECISIONS)
    if bad:
        raise UsageError(f"--layer-precisions: only float32 and float16 can be searched around, not: {', '.join(bad)}")
    names = list(specs)
    owners: dict[str, str] = {}
    for name in names:
        found = match_layers(_NamedLayers([name]), catalog.names, aliases)
        if found:
            owners[name] = next(iter(found))
    unknown = [n for n in names if n not in owners]
    if unknown:
        sample = ", ".join(repr(layer.name) for layer in predict_layers(catalog)[:5])
        raise UsageError(f"--layer-precisions names no layer of {catalog.path.name}: "
                         f"{', '.join(repr(n) for n in unknown)} (layers are named after ONNX nodes, e.g. {sample})")
    fp32 = {owners[n] for n in names if specs[n] == "float32"}
    return frozenset(fp32.intersection(catalog.candidates))


def float_output_flags(catalog: "Catalog", nodes: Iterable[str]) -> dict[str, list[bool]]:
    """node -> float-ness of each ONNX output (for `--layerOutputTypes`, which must skip integer outputs)."""
    return {n: [catalog.is_float(o) for o in catalog.nodes[n].output if o] for n in nodes if n in catalog.nodes}


UNJUDGED_IF = ("If whose branches computed FP32 in every verdict (FP16 inside them was not judged): kept FP32, "
               "branches included, so that the build is the plan that was judged")


def precision_nodes(catalog: "Catalog", fp32_nodes: Iterable[str],
                    unjudged: Iterable[str] = ()) -> tuple[list[str], dict[str, str]]:
    """The searched FP32 nodes (sorted) and the pinned nodes (name -> reason) every precision artifact sets.
    `unjudged`: If nodes whose branches the verdicts computed FP32 (constraints.json `unjudged_branches`); a
    TensorRT 10 build would otherwise run their branches in FP16, which no verdict covered."""
    fp32 = sorted(set(fp32_nodes))
    pinned = dict(catalog.pinned)
    pinned.update((n, UNJUDGED_IF) for n in unjudged)
    return fp32, {n: why for n, why in sorted(pinned.items()) if n not in fp32}
