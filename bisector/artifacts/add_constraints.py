"""The `add_constraints.py` artifact and the per-layer precision strings (DESIGN §8).

`render_add_constraints` writes a self-contained script with `postprocess(network)`, the callable Polygraphy's
`--trt-npps add_constraints.py` invokes by default (Polygraphy calls it as `postprocess(network=network)`). It
marks every layer of the FP32 nodes *and of the pinned nodes* (never lowered by the search, so FP32 in the
verified plan) `precision = float32` and `set_output_type(i, float32)` on float outputs. Layers are matched to
nodes by `bisector.backends.trt_layers.match_layers`, whose source is copied into the script verbatim, with the
model's node names and subgraph owners as literals beside it: the script marks exactly the layers the
`tensorrt` backend marked. It fails loudly when an FP32 node matches no layer (a pinned node without a layer
is fine: the parser computed it while parsing), and on TensorRT >= 11 (no weak typing) it points at
`model.mixed.onnx`. All data are Python literals: nothing is exec'd.

`layer_precision_strings` gives the same nodes for Polygraphy `--layer-precisions` and trtexec
`--layerPrecisions` / `--layerOutputTypes`. Those flags match exact layer names only, so they cover each node's
*first* layer; layers the parser adds beyond it (`<node>_<k>`, helper layers) are covered by the script alone.
When no layer needs FP32 the flags are omitted, not left empty: Polygraphy's `--layer-precisions` takes one or
more values (argparse `nargs="+"`) and trtexec rejects an empty `--layerPrecisions=` spec.
"""

from __future__ import annotations

import inspect
import shlex
from typing import TYPE_CHECKING, Mapping, Sequence

from bisector.backends.trt_layers import float_output_flags, match_layers, precision_nodes, subgraph_aliases

if TYPE_CHECKING:  # pragma: no cover
    from bisector.model.catalog import Catalog

_TEMPLATE = '''\
"""Keep the layers of {count} ONNX node(s) of {model_name} in FP32 in a TensorRT 10 FP16 build (written by bisector {version}).

{count_fp32} node(s) found by the search and {count_pinned} pinned node(s) (never lowered to FP16, so FP32 in the verified plan;
or If nodes whose branches every verdict computed in FP32: the reason says which).

Use with Polygraphy:
    polygraphy run {model_q} --trt --onnxrt --fp16 --precision-constraints obey --trt-npps add_constraints.py
or call postprocess(network) yourself after parsing, then build with BuilderFlag.FP16 and
BuilderFlag.OBEY_PRECISION_CONSTRAINTS.

Every layer TensorRT's ONNX parser made from a node of FP32_NODES or PINNED_NODES gets precision float32 and
float32 on its float outputs. Layers are matched to nodes by match_layers below (bisector's own rule, the one its
TensorRT backend uses): layer metadata "[ONNX Layer: <node>]", else the layer name, else "<node>_<k>" when no node
of the model has that name. TensorRT 11 has no weak typing: build the strongly typed `model.mixed.onnx` written
next to this file instead.
"""

import tensorrt as trt

# The nodes the search keeps in FP32 (constraints.json "fp32_nodes"). Each must match at least one layer.
FP32_NODES = {fp32}

# Pinned nodes: never lowered to FP16 by the search (node -> reason), so FP32 in the verified plan as well; and
# If nodes whose branches the verdicts computed in FP32 (FP16 inside them was not judged).
# A pinned node that matches no layer is fine: the parser computed it while parsing (e.g. static shape math).
PINNED_NODES = {pinned}


def postprocess(network):
    major = int(trt.__version__.split(".")[0])
    if major >= 11 or not hasattr(trt.BuilderFlag, "FP16"):
        raise RuntimeError(
            "TensorRT " + trt.__version__ + " is strongly typed: layer precisions cannot be set. "
            "Build model.mixed.onnx (written next to this file) instead; it carries the FP32/FP16 split in the graph."
        )
    layers = match_layers(network, NODE_NAMES, SUBGRAPH_OWNERS)
    missing = [node for node in FP32_NODES if node not in layers]
    if missing:
        raise RuntimeError(
            "add_constraints.py: these FP32 nodes match no layer of the network, so their precision cannot be "
            "set (was it parsed from a different model?): " + ", ".join(repr(node) for node in missing)
        )
    floats = (trt.float32, trt.float16, getattr(trt, "bfloat16", trt.float16))
    for node in FP32_NODES + sorted(PINNED_NODES):
        for i in layers.get(node, []):
            layer = network.get_layer(i)
            layer.precision = trt.float32
            for k in range(layer.num_outputs):
                if layer.get_output(k).dtype in floats:
                    layer.set_output_type(k, trt.float32)
    return network


# ---- bisector's node -> layer rule, copied verbatim from bisector/backends/trt_layers.py ----------------------
{matcher}

# ---- the model's node names: the rule needs all of them (a node named "Add_1" is not a layer of node "Add") ---
NODE_NAMES = {names}

# Nodes inside If/Loop/Scan bodies -> the top-level node that owns them (their layers count for the owner).
SUBGRAPH_OWNERS = {owners}
'''


def _doc_safe(text: str) -> str:
    """Text that cannot end or break the generated docstring (escapes, newlines and quotes escaped)."""
    return repr(text)[1:-1].replace('"', '\\"')


def _literal_list(names: Sequence[str]) -> str:
    if not names:
        return "[]"
    return "[\n" + "".join(f"    {name!r},\n" for name in names) + "]"


def _literal_dict(items: Mapping[str, str]) -> str:
    if not items:
        return "{}"
    return "{\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in items.items()) + "}"


def matcher_source() -> str:
    """The source of `match_layers`, exactly as the script carries it."""
    return inspect.getsource(match_layers).rstrip() + "\n"


def render_add_constraints(fp32_nodes: Sequence[str], model_name: str, node_names: Sequence[str], *,
                           pinned: Mapping[str, str] | None = None,
                           subgraph_owners: Mapping[str, str] | None = None) -> str:
    """The text of add_constraints.py for this FP32 set.

    `node_names` are ALL node names of the model (the matching rule needs them), `pinned` the catalog's pinned
    nodes with their reasons, `subgraph_owners` the names of nodes inside subgraphs -> their top-level node.
    Everything is a Python literal (sorted), never exec'd data.
    """
    from bisector import __version__

    names = sorted(set(fp32_nodes))
    pins = {n: str(why) for n, why in sorted((pinned or {}).items()) if n not in names}
    return _TEMPLATE.format(
        count=len(names) + len(pins),
        count_fp32=len(names),
        count_pinned=len(pins),
        model_name=_doc_safe(model_name),
        model_q=_doc_safe(shlex.quote(model_name)),
        version=__version__,
        fp32=_literal_list(names),
        pinned=_literal_dict(pins),
        matcher=matcher_source(),
        names=_literal_list(list(node_names)),
        owners=_literal_dict(dict(sorted((subgraph_owners or {}).items()))),
    )


def add_constraints_for(catalog: "Catalog", fp32_nodes: Sequence[str], unjudged: Sequence[str] = ()) -> str:
    """`render_add_constraints` with everything the script needs taken from the catalog (`unjudged`: If nodes
    whose branches no verdict computed in FP16, kept FP32 like pinned nodes; `precision_nodes`)."""
    fp32, pinned = precision_nodes(catalog, fp32_nodes, unjudged)
    return render_add_constraints(fp32, catalog.path.name, catalog.names, pinned=pinned,
                                  subgraph_owners=subgraph_aliases(catalog.model))


def layer_precision_strings(fp32_nodes: Sequence[str],
                            float_outputs: Mapping[str, Sequence[bool]] | None = None,
                            pinned: Mapping[str, str] | None = None) -> dict[str, object]:
    """Per-layer flags for Polygraphy and trtexec.

    Returns `polygraphy` (arguments for `--layer-precisions`, shell-quoted, with the `--fp16
    --precision-constraints obey` they need), `polygraphy_args` (the same as an argv list),
    `trtexec_layer_precisions`, `trtexec_layer_output_types`, `trtexec` (the flags together), `layer_precisions`
    (layer name -> "float32"), `fp32_nodes` (the searched set), `pinned` (pinned node -> reason; they are in
    every flag too, since the verified plan keeps them FP32) and `notes` (what could not be expressed and why).
    An empty flag is never emitted: with nothing to keep in FP32 the strings are just `--fp16` (and a
    trtexec_* entry is "" meaning "omit the flag").

    trtexec splits its lists on ',' and treats "'" and '*' specially, so names with a comma or a single quote
    are left out (listed in notes) and a name with '*' is kept but noted (trtexec reads it as a wildcard).
    Polygraphy splits on the last ':', so colons are fine in both tools. `float_outputs` (node -> float-ness of
    each ONNX output) keeps nodes with an integer/bool output out of `--layerOutputTypes`, which would force
    fp32 on every output of the layer.
    """
    searched = sorted(set(fp32_nodes))
    pins = {n: str(why) for n, why in sorted((pinned or {}).items()) if n not in searched}
    names = sorted(set(searched).union(pins))
    notes: list[str] = []
    poly_args = ["--fp16"]
    if names:
        poly_args += ["--precision-constraints", "obey", "--layer-precisions"] + [f"{n}:float32" for n in names]
    trt_prec, trt_out = [], []
    for n in names:
        if "," in n or "'" in n:
            notes.append(f"{n!r}: trtexec cannot express a layer name with ',' or \"'\"; use add_constraints.py")
            continue
        if "*" in n:
            notes.append(f"{n!r}: trtexec reads '*' as a wildcard, so this entry may match other layers too")
        trt_prec.append(f"{n}:fp32")
        outs = (float_outputs or {}).get(n)
        if outs is not None and not all(outs):
            notes.append(f"{n!r}: has non-float outputs; left out of --layerOutputTypes (precision still set)")
            continue
        trt_out.append(f"{n}:fp32")
    prec = "--layerPrecisions=" + ",".join(trt_prec) if trt_prec else ""
    outt = "--layerOutputTypes=" + ",".join(trt_out) if trt_out else ""
    trtexec = ["--fp16"] + (["--precisionConstraints=obey"] if prec else []) + [f for f in (prec, outt) if f]
    if not names:
        notes.append("no layer needs FP32: --layer-precisions (Polygraphy takes one or more values) and "
                     "--layerPrecisions/--layerOutputTypes (trtexec rejects an empty spec) are omitted; "
                     "a plain --fp16 build is the verified plan")
    else:
        notes.append("these flags name each node's first layer only; further layers TensorRT makes from a node "
                     "(`<node>_<k>`, helper layers) are covered by add_constraints.py alone")
    if pins:
        notes.append(f"{len(pins)} pinned node(s) (never lowered by the search, so FP32 in the verified plan; or If "
                     f"nodes whose branches every verdict computed in FP32: see `pinned` for each reason) are "
                     f"included: {', '.join(repr(n) for n in pins)}")
    return {
        "polygraphy": " ".join(shlex.quote(a) for a in poly_args),
        "polygraphy_args": poly_args,
        "trtexec_layer_precisions": prec,
        "trtexec_layer_output_types": outt,
        "trtexec": " ".join(shlex.quote(a) for a in trtexec),
        "layer_precisions": {n: "float32" for n in names},
        "fp32_nodes": searched,
        "pinned": pins,
        "notes": notes,
    }


def layer_precision_strings_for(catalog: "Catalog", fp32_nodes: Sequence[str],
                                unjudged: Sequence[str] = ()) -> dict[str, object]:
    """`layer_precision_strings` with the pinned nodes and output types taken from the catalog."""
    fp32, pinned = precision_nodes(catalog, fp32_nodes, unjudged)
    return layer_precision_strings(fp32, float_outputs=float_output_flags(catalog, fp32 + list(pinned)),
                                   pinned=pinned)
