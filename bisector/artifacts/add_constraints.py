"""The `add_constraints.py` artifact and the per-layer precision strings (DESIGN §8).

`render_add_constraints` writes a self-contained script with `postprocess(network)`, the callable Polygraphy's
`--trt-npps add_constraints.py` invokes by default (Polygraphy calls it as `postprocess(network=network)`). It
marks every layer of the FP32 nodes `precision = float32` and `set_output_type(i, float32)` on float outputs,
matching layers the way TensorRT's ONNX parser names them (node name, `<node>_<k>` for further layers of a node,
`[ONNX Layer: <node> ...]` metadata). It fails loudly when a node matches no layer, and on TensorRT >= 11 (no
weak typing) it points at `model.mixed.onnx`. The node names are a Python literal list: nothing is exec'd.

`layer_precision_strings` gives the same set for Polygraphy `--layer-precisions` and trtexec
`--layerPrecisions` / `--layerOutputTypes`. Those flags match exact layer names only, so they cover each node's
*first* layer; layers the parser adds beyond it (`<node>_<k>`, helper layers) are covered by the script alone.
"""

from __future__ import annotations

import shlex
from typing import Mapping, Sequence

_TEMPLATE = '''\
"""Keep the layers of {count} ONNX node(s) of {model_name} in FP32 in a TensorRT 10 FP16 build (written by bisector {version}).

Use with Polygraphy:
    polygraphy run {model_q} --trt --onnxrt --fp16 --precision-constraints obey --trt-npps add_constraints.py
or call postprocess(network) yourself after parsing, then build with BuilderFlag.FP16 and
BuilderFlag.OBEY_PRECISION_CONSTRAINTS.

For each node below, every layer TensorRT's ONNX parser made from it (layer name == node name, `<node>_<k>`,
or metadata "[ONNX Layer: <node> ...]") gets precision float32 and float32 on its float outputs.
TensorRT 11 has no weak typing: build the strongly typed `model.mixed.onnx` written next to this file instead.
"""

import re

import tensorrt as trt

FP32_NODES = {nodes}

_METADATA = re.compile(r"^\\[ONNX Layer: (?P<name>.*?)(?: \\| .*)?\\]$", re.S)
_SUFFIXED = re.compile(r"^(?P<base>.*)_(?P<n>\\d+)$", re.S)


def _owner(layer, wanted):
    meta = getattr(layer, "metadata", "") or ""
    m = _METADATA.match(meta.strip())
    if m:  # the parser's record of the node: authoritative
        return m.group("name") if m.group("name") in wanted else None
    if layer.name in wanted:
        return layer.name
    m = _SUFFIXED.match(layer.name)
    if m and m.group("base") in wanted:
        return m.group("base")
    return None


def postprocess(network):
    major = int(trt.__version__.split(".")[0])
    if major >= 11 or not hasattr(trt.BuilderFlag, "FP16"):
        raise RuntimeError(
            "TensorRT " + trt.__version__ + " is strongly typed: layer precisions cannot be set. "
            "Build model.mixed.onnx (written next to this file) instead; it carries the FP32/FP16 split in the graph."
        )
    wanted = set(FP32_NODES)
    matched = set()
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        owner = _owner(layer, wanted)
        if owner is None:
            continue
        matched.add(owner)
        layer.precision = trt.float32
        for k in range(layer.num_outputs):
            if layer.get_output(k).dtype in (trt.float32, trt.float16):
                layer.set_output_type(k, trt.float32)
    missing = sorted(wanted - matched)
    if missing:
        raise RuntimeError(
            "add_constraints.py: these FP32 nodes match no layer of the network (was it parsed from a different "
            "model?): " + ", ".join(missing)
        )
    return network
'''


def _doc_safe(text: str) -> str:
    """Text that cannot end or break the generated docstring (escapes, newlines and quotes escaped)."""
    return repr(text)[1:-1].replace('"', '\\"')


def _literal_list(names: Sequence[str]) -> str:
    if not names:
        return "[]"
    return "[\n" + "".join(f"    {name!r},\n" for name in names) + "]"


def render_add_constraints(fp32_nodes: Sequence[str], model_name: str) -> str:
    """The text of add_constraints.py for this FP32 set (names sorted; a literal list, never exec'd data)."""
    from bisector import __version__

    names = sorted(set(fp32_nodes))
    return _TEMPLATE.format(
        count=len(names),
        model_name=_doc_safe(model_name),
        model_q=_doc_safe(shlex.quote(model_name)),
        version=__version__,
        nodes=_literal_list(names),
    )


def layer_precision_strings(fp32_nodes: Sequence[str],
                            float_outputs: Mapping[str, Sequence[bool]] | None = None) -> dict[str, object]:
    """Per-layer flags for Polygraphy and trtexec.

    Returns `polygraphy` (arguments for `--layer-precisions`, shell-quoted, with the `--fp16
    --precision-constraints obey` they need), `trtexec_layer_precisions`, `trtexec_layer_output_types`,
    `trtexec` (the three flags together), and `notes` (names that could not be expressed and why).

    trtexec splits its lists on ',' and treats "'" and '*' specially, so names with a comma or a single quote
    are left out (listed in notes) and a name with '*' is kept but noted (trtexec reads it as a wildcard).
    Polygraphy splits on the last ':', so colons are fine in both tools. `float_outputs` (node -> float-ness of
    each ONNX output) keeps nodes with an integer/bool output out of `--layerOutputTypes`, which would force
    fp32 on every output of the layer.
    """
    names = sorted(set(fp32_nodes))
    notes: list[str] = []
    poly = ["--fp16", "--precision-constraints", "obey", "--layer-precisions"]
    poly += [shlex.quote(f"{n}:float32") for n in names]
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
    prec = "--layerPrecisions=" + ",".join(trt_prec)
    outt = "--layerOutputTypes=" + ",".join(trt_out)
    notes.append("these flags name each node's first layer only; further layers TensorRT makes from a node "
                 "(`<node>_<k>`, helper layers) are covered by add_constraints.py alone")
    return {
        "polygraphy": " ".join(poly),
        "trtexec_layer_precisions": prec,
        "trtexec_layer_output_types": outt,
        "trtexec": " ".join(["--fp16", "--precisionConstraints=obey", shlex.quote(prec), shlex.quote(outt)]),
        "notes": notes,
    }
