"""Parts of a model that compute the same thing on other weights share one ONNX Runtime session.

A search builds a session per block variant and per node variant (`executor.NodeExecutor`). ORT's per-session
cost is fixed: ~1 ms to build and ~100–150 KB to keep, whatever the arithmetic. On a model of many small repeated
layers (a chain of 16 x 16 MatMuls, a small RNN unrolled, an MLP stack) that cost is the search: 300 cached block
sessions were a third of a 1200-node chain's peak, and the second opinion's node-by-node run built one session
per node on top (docs/benchmarks.md, "Scale, thirty-first round").

Such parts are the same graph up to names and weight values. Here a part is written in canonical form: every
tensor renamed by position, its float32 weights below 4 KB made graph inputs fed on each run (so their values
are not part of the session), everything else kept as it was. Two parts with the same canonical form run in one
session. Weights that ORT's optimisations read as constants stay in the session and in the key, value and all:
weights that are not float32 (a Reshape's shape, a Slice's axes) and float scalars (the constants a GELU or
LayerNorm fusion matches on). Not shared at all: parts with a Conv (its NCHWc kernel needs a constant weight),
with a subgraph (outer-scope names), or with a weight of 4 KB and up (fed per session already:
`weights.SHARE_MIN_BYTES`, under budgets the executor keeps per session).

Prepacking is off in every session the executor builds, so a MatMul reads a fed weight as it reads an
initializer: the same kernels and the same bits (tests/test_shared_parts.py checks this on random plans).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import onnx

from bisector.model import weights as weight_store
from bisector.model.graph import has_subgraph

# A float weight with at most this many elements stays a constant of the session, keyed by its value
KEYED_MAX_ELEMENTS = 1


@dataclass(frozen=True)
class SharedPart:
    """How one part (a block or node variant) runs in a shared session.

    `digest` names the session; `feeds` pairs each canonical activation input with the part's own tensor name;
    `fed` holds the weights fed on every run (canonical name -> the executor's array: the model's own or its
    converted copy, never a new one); `outputs` are the canonical names of the part's outputs, in its order."""

    digest: bytes
    feeds: tuple[tuple[str, str], ...]
    fed: Mapping[str, np.ndarray]
    outputs: tuple[str, ...]

    def feed(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The shared session's feed for the part's own `values` (by the part's tensor names)."""
        out = {c: values[t] for c, t in self.feeds}
        out.update(self.fed)
        return out


@dataclass(frozen=True)
class Canonical:
    """A part in canonical form, what its shared session is built from (only on a session cache miss)."""

    part: SharedPart
    nodes: list[onnx.NodeProto]
    inputs: dict[str, Any]  # canonical name -> the value fed (activations) or the weight (fed weights)
    shapes: dict[str, tuple[int, ...]]  # the fed weights' shapes, declared (an initializer's shape is known too)
    kept: dict[str, np.ndarray]  # weights that stay in the session as initializers


def shareable_weight(value: Any) -> bool:
    """A weight a shared session may take as an input: a float32 array below SHARE_MIN_BYTES (above it the
    executor feeds it already, with budgets of its own) with more than KEYED_MAX_ELEMENTS elements."""
    return (isinstance(value, np.ndarray) and value.dtype == np.float32 and value.size > KEYED_MAX_ELEMENTS
            and value.nbytes < weight_store.SHARE_MIN_BYTES)


def canonical(nodes: list[onnx.NodeProto], weights: Mapping[str, np.ndarray], *, feed: Mapping[str, Any],
              outputs: list[str]) -> Canonical | None:
    """`nodes` and `weights` as `NodeExecutor.compose` gives them (Cast pairs in place), reading `feed`, in canonical form; None for a part
    that does not share (a Conv, a subgraph, a weight of 4 KB and up). A part without weights shares too: every
    Tanh of a model runs in one session per rounding variant."""
    if any(n.op_type in weight_store.BUILD_ONLY_OPS or has_subgraph(n) for n in nodes):
        return None
    fed_names = [t for t, v in weights.items() if shareable_weight(v)]
    if any(np.asarray(v).nbytes >= weight_store.SHARE_MIN_BYTES for v in weights.values()):
        return None
    names: dict[str, str] = {"": ""}
    feeds = []
    for i, t in enumerate(feed):
        names[t] = f"i{i}"
        feeds.append((f"i{i}", t))
    fed = {}
    for i, t in enumerate(fed_names):
        names[t] = f"w{i}"
        fed[f"w{i}"] = weights[t]
    kept = {}
    fed_set = set(fed_names)
    for i, t in enumerate(t for t in weights if t not in fed_set):
        names[t] = f"c{i}"
        kept[f"c{i}"] = np.asarray(weights[t])
    out_nodes = []
    for k, node in enumerate(nodes):
        c = onnx.NodeProto()
        c.CopyFrom(node)
        c.name, c.doc_string = f"n{k}", ""
        for j, t in enumerate(node.input):
            if t not in names:  # not fed, not a weight, not made before: a name the part leaves open
                return None
            c.input[j] = names[t]
        for j, t in enumerate(node.output):
            if t and t not in names:
                names[t] = f"t{len(names)}"
            c.output[j] = names[t] if t else ""
        out_nodes.append(c)
    if any(o not in names for o in outputs):
        return None
    h = hashlib.sha256()
    for c in out_nodes:
        h.update(c.SerializeToString(deterministic=True))
    for cname, t in feeds:
        h.update(f"|{cname}:{type_key(feed[t])}".encode())
    for cname, v in fed.items():
        h.update(f"|{cname}:{v.dtype}:{v.shape}".encode())
    for cname, v in kept.items():
        h.update(f"|{cname}:{v.dtype}:{v.shape}:".encode())
        h.update(np.ascontiguousarray(v).tobytes())
    canon_outputs = tuple(names[o] for o in outputs)
    h.update(("|out:" + ",".join(canon_outputs)).encode())
    part = SharedPart(h.digest(), tuple(feeds), fed, canon_outputs)
    inputs = {c: feed[t] for c, t in feeds}
    inputs.update(fed)
    return Canonical(part, out_nodes, inputs, {c: tuple(v.shape) for c, v in fed.items()}, kept)


def type_key(value: Any) -> str:
    """A fed value's type as a key: a tensor's dtype, or a sequence of its first tensor's."""
    if isinstance(value, (list, tuple)):
        return "seq(" + (str(np.asarray(value[0]).dtype) if value else "") + ")"
    return str(np.asarray(value).dtype)
