"""One model for every plan: each candidate chooses FP16 or FP32 at run time (ort-cuda's switch mode, issue 14).

A plan's mixed model (`fp16.mixed`) needs a new ONNX Runtime session per plan, and on a GPU the first run of each
session searches cuDNN algorithms for every convolution (0.5–2 s per plan on a 77-Conv detector). The switch
model is built and loaded once: every candidate node `n` becomes

    If(cond = graph input "bisector_fp16_<k>")
        then: n in FP16 exactly as every mixed model writes it (`mixed.fp16_form`: Casts of its inputs to FP16,
              the node with FP16 weights converted by the same rule, Casts of its float outputs back to FP32)
        else: n unchanged (FP32)

so a plan is one `run()` with one boolean per candidate. Tensors between nodes are FP32 everywhere; an FP16 value
cast to FP32 and back to FP16 is exact, so a plan computes what its mixed model computes, node for node. What
differs: ONNX Runtime cannot fuse across the If boundaries (a mixed model's FP16 Conv+Add may become one kernel
that rounds once); `tests/test_switch.py` checks equality with the mixed models with fusions off.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from bisector.fp16.mixed import fp16_form
from bisector.model.catalog import Catalog
from bisector.model.graph import copy_without_initializers, graph_reads, rename_free, subgraphs

FLAG_PREFIX = "bisector_fp16_"


def build_switch_model(catalog: Catalog, kind: str = "where",
                       share_casts: bool = True) -> tuple[onnx.ModelProto, dict[str, str]]:
    """The switch model and its flag inputs: {candidate node name: bool graph input that makes it FP16}.

    `kind`: "where" (default) computes both forms of every candidate and selects with `Where(flag, fp16, fp32)`
    — twice the arithmetic, no control flow; "if" runs only the chosen form inside `If` — less arithmetic, but
    each If subgraph costs ONNX Runtime's CUDA provider its own stream state (measured on an H100: 45 GB of GPU
    memory for a 303-node detector, 15 ms per run against 3.2 ms for the FP32 model).

    `share_casts=False`: each FP16 form keeps its own Casts of its inputs (the same values; `_select`)."""
    if kind not in ("where", "if"):
        raise ValueError(f"switch model kind {kind!r}: where or if")
    src = catalog.model
    model = copy_without_initializers(src)
    model.ir_version = max(model.ir_version, 4)
    graph = model.graph
    del graph.node[:]
    del graph.value_info[:]
    candidates = set(catalog.candidates)
    flags: dict[str, str] = {}
    taken = {i.name for i in src.graph.input} | {t for n in src.graph.node for t in n.output}
    inits: dict[str, TensorProto] = {i.name: i for i in src.graph.initializer}
    casts: dict[bytes, str] = {}  # an FP16 form's Cast of a graph tensor -> the one every reader shares (`_select`)
    for node in src.graph.node:
        if node.name not in candidates:
            graph.node.append(node)
            continue
        flag = _unique(f"{FLAG_PREFIX}{len(flags)}", taken)
        flags[node.name] = flag
        graph.input.append(helper.make_tensor_value_info(flag, TensorProto.BOOL, []))
        then_nodes, new_inits = fp16_form(catalog, node.name)
        for init in new_inits:
            inits.setdefault(init.name, init)  # one converted copy per weight, read by every branch that needs it
        if kind == "if":
            graph.node.append(_switch(node, then_nodes, flag, taken))
        else:
            graph.node.extend(_select(node, then_nodes, flag, taken, catalog.tensor_types,
                                      casts if share_casts else {}))
    used = graph_reads(graph)  # subgraphs included: the branches read the converted weights
    graph.initializer.extend(catalog.materialized(i) for name, i in inits.items() if name in used)
    return model, flags


def _switch(node: onnx.NodeProto, then_nodes: list[onnx.NodeProto], flag: str, taken: set[str]) -> onnx.NodeProto:
    """`If(flag)` choosing between `then_nodes` (FP16) and `node` (FP32); both branches yield `node`'s outputs."""
    outputs = [t for t in node.output if t]
    branches = []
    for tag, body in (("fp16", then_nodes), ("fp32", [node])):
        rename = {t: _unique(f"{t}__switch_{tag}", taken) for t in outputs}
        nodes = []
        for n in body:
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.output[:] = [rename.get(t, t) for t in n.output]
            copy.input[:] = [rename.get(t, t) for t in n.input]
            nodes.append(copy)
        produced = {t for n in nodes for t in n.output}
        missing = [t for t in outputs if rename[t] not in produced]
        if missing:  # fp16_form casts every float output back; anything else is a bug in it
            raise ValueError(f"switch model: the {tag} branch of {node.name!r} does not produce {missing}")
        branches.append(helper.make_graph(nodes, f"{node.name}__{tag}", [],
                                          [onnx.ValueInfoProto(name=rename[t]) for t in outputs]))
    return helper.make_node("If", [flag], outputs, name=f"{node.name}__switch", then_branch=branches[0],
                            else_branch=branches[1])


def _select(node: onnx.NodeProto, fp16_nodes: list[onnx.NodeProto], flag: str, taken: set[str],
            types: dict[str, int], casts: dict[bytes, str]) -> list[onnx.NodeProto]:
    """Both forms of `node` side by side, every output chosen by `Where(flag, fp16 form, fp32 form)`.

    `casts`: the FP16 forms' Casts of graph tensors written so far. Every FP16 reader of a tensor casts it the same
    way, so one Cast serves them all (a residual's or a SiLU's input is read twice): a kernel fewer per extra
    reader in every run (107 of ddddocr detector's 386 Casts to FP16), the same values."""
    outputs = [t for t in node.output if t]
    out: list[onnx.NodeProto] = []
    renamed = {}
    for tag, body in (("fp16", fp16_nodes), ("fp32", [node])):
        rename = {t: _unique(f"{t}__switch_{tag}", taken) for t in outputs}
        made = dict.fromkeys(t for n in body for t in n.output if t)  # ordered: the names `_unique` gives are stable
        shared: dict[str, str] = {}  # this form's Casts of graph tensors -> the name every reader uses
        reused: set[str] = set()  # those an earlier reader wrote
        for n in body if tag == "fp16" else ():
            if n.op_type == "Cast" and len(n.input) == 1 and n.input[0] not in made and n.output[0] not in rename:
                key = n.input[0].encode("utf-8", "surrogatepass") + b"\0" + b"".join(
                    a.SerializeToString() for a in sorted(n.attribute, key=lambda a: a.name))
                if key in casts:
                    reused.add(n.output[0])
                else:
                    casts[key] = _unique(f"{n.output[0]}__{node.name}", taken)
                shared[n.output[0]] = casts[key]
        # the FP16 form's own intermediate names (t__fp16, casts) are per node: keep them unique in the graph
        inner = {t: shared.get(t) or _unique(f"{t}__{node.name}", taken) if tag == "fp16" else t
                 for t in made if t not in rename}
        for n in body:
            if n.output and n.output[0] in reused:
                continue  # an earlier reader's Cast computes it
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.output[:] = [rename.get(t, inner.get(t, t)) for t in n.output]
            copy.input[:] = [rename.get(t, inner.get(t, t)) for t in n.input]
            for g in subgraphs(copy):  # an FP16 If reads the FP16 values of its outer-scope inputs
                rename_free(g, inner)
            if tag == "fp16":  # node names are unique in a graph too (the Casts of one input repeat per reader)
                copy.name = _unique(f"{n.name or node.name}__switch_fp16", taken)
            out.append(copy)
        renamed[tag] = rename
    for t in outputs:
        a, b = renamed["fp16"][t], renamed["fp32"][t]
        name = _unique(f"{node.name}__switch_{t}", taken)
        if types.get(t) == TensorProto.BOOL:  # ONNX Runtime has no Where for bool: (flag and a) or (not flag and b)
            pick_a, pick_b, not_flag = (_unique(f"{name}_{k}", taken) for k in ("a", "b", "not"))
            out += [helper.make_node("And", [flag, a], [pick_a], name=pick_a),
                    helper.make_node("Not", [flag], [not_flag], name=not_flag),
                    helper.make_node("And", [not_flag, b], [pick_b], name=pick_b),
                    helper.make_node("Or", [pick_a, pick_b], [t], name=name)]
        else:
            out.append(helper.make_node("Where", [flag, a, b], [t], name=name))
    return out


def _unique(name: str, taken: set[str]) -> str:
    base, k = name, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name
