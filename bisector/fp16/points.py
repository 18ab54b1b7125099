"""Which tensors a plan rounds (DESIGN §4), as one small value every consumer derives from.

The emulation (executor sessions), the sensitivity profile (each candidate alone in FP16) and the
mixed-precision writer ask the same questions of a `RoundingPoints`:

- `read(node, index, tensor)`: what an input of `node` holds —
  `EXACT` (an FP32 reader; a parameter that is a shape, index, bound or scale; a tensor an FP16 producer
  already stored in FP16), `ROUND` (an activation rounded to FP16 on its way in) or `WEIGHT` (a weight —
  initializer or Constant output — converted by `rules.weight_rule`);
- `stores(node)`: every float output of an FP16 node is stored in FP16;
- `rounds_output(node)`: whether storing changes the values (False for op families whose outputs are exact
  copies of FP16 inputs, `rules.op_rule`), so emulations may skip it.

Shape and Cast nodes are never candidates (catalog), hence never FP16, hence never round anything. Rounding
applies to FP32 tensors only: `read` takes the tensor's float-ness from the catalog unless the caller knows
it from the value (`is_float`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from bisector.fp16 import rules
from bisector.fp16.plan import Plan
from bisector.model.catalog import Catalog


class Read(Enum):
    EXACT = "exact"
    ROUND = "round"
    WEIGHT = "weight"

    # Hashed by identity (members are singletons), in C: the emulator's session keys hold a Read per node input
    # and are hashed on every block run (Enum's own __hash__, in Python, was 5% of a long search's time)
    __hash__ = object.__hash__


@dataclass(frozen=True, eq=False)
class RoundingPoints:
    catalog: Catalog
    fp16: frozenset[str]

    def read(self, node: str, index: int | None, tensor: str, is_float: bool | None = None) -> Read:
        """What input `tensor` of `node` (explicit input `index`, None for an outer-scope value) holds."""
        if node not in self.fp16:
            return Read.EXACT
        cat = self.catalog
        if not (cat.is_float(tensor) if is_float is None else is_float):
            return Read.EXACT
        if index is not None and cat.is_parameter(node, index):
            return Read.EXACT  # shapes, scales, bounds: never data
        if tensor in cat.weights:
            return Read.WEIGHT
        if self.stored(tensor):
            return Read.EXACT  # already stored in FP16 by its producer
        return Read.ROUND

    def stored(self, tensor: str) -> bool:
        """Is `tensor` an output of an FP16 node (so it holds FP16 values already)?"""
        return self.catalog.producers.get(tensor) in self.fp16

    def stores(self, node: str) -> bool:
        """Are `node`'s float outputs stored in FP16?"""
        return node in self.fp16

    def rounds_output(self, node: str) -> bool:
        """Does storing `node`'s float outputs in FP16 change their values (may the emulation not skip it)?"""
        return node in self.fp16 and not rules.op_rule(self.catalog.nodes[node].op_type).exact_outputs


def rounding_points(catalog: Catalog, plan: Plan | Iterable[str]) -> RoundingPoints:
    """The rounding points of `plan` (a Plan, or the set of FP16 node names)."""
    fp16 = plan.fp16 if isinstance(plan, Plan) else frozenset(plan)
    return RoundingPoints(catalog, fp16)


def single_node_twins(catalog: Catalog, candidates: Iterable[str]) -> dict[str, str]:
    """{candidate: an earlier candidate} where keeping only the first FP16 changes exactly the values that keeping
    only the second FP16 does (the predicted ranking runs one of them: bisector.search.vector_ranking).

    Node `j` reads one float activation `u` and no float weight, and only moves elements
    (`rules.commutes_with_rounding`); `u` is the one float output of candidate `i`, read by `j` alone and not a
    graph output; `i` is such a node too. Then `j` alone in FP16 reads round(u) = round(f(t)), and `i` alone in
    FP16 writes u = f(round(t)): the same elements, so every value downstream is the same. A chain of such nodes
    maps to its first member."""
    cands = list(candidates)
    members = set(cands)
    outputs = set(catalog.output_names)

    def one_float_read(name: str) -> str | None:
        node = catalog.nodes[name]
        if not rules.commutes_with_rounding(node.op_type, node.domain):
            return None
        reads = [(t, i) for t, i in catalog.reads(name)
                 if catalog.is_float(t) and not (i is not None and catalog.is_parameter(name, i))]
        if len(reads) != 1 or reads[0][0] in catalog.weights or reads[0][1] is None:
            return None
        return reads[0][0]

    twin: dict[str, str] = {}
    for j in cands:
        u = one_float_read(j)
        i = catalog.producers.get(u) if u is not None else None
        if i is None or i not in members or u in outputs or one_float_read(i) is None:
            continue
        if [o for o in catalog.nodes[i].output if o and catalog.is_float(o)] != [u]:
            continue
        if len(catalog.consumers.get(u, [])) != 1:
            continue
        twin[j] = twin.get(i, i)  # candidates are in topological order: i's own twin is known already
    return twin


class IdleFP32:
    """The FP32 members of a plan that keep nothing FP32 — the plan without them holds the same values — so a
    search asks and reports plans without them (`without`). Two rules:

    - a node whose FP16 outputs are exact on FP16 inputs (`rules.op_rule(...).exact_outputs`: Relu, MaxPool,
      Concat, Slice, ...; or `rules.copies_elements`: a nearest Resize, a Pad of zeros, ...) and whose every
      float data input an FP16 candidate writes: FP32 or FP16, it reads FP16 values and writes them unchanged.
      Not where an input is a weight (FP16 converts it), a graph input or a pinned node's output (FP16 rounds
      them), nor Dropout (it scales in training mode);
    - a node that only copies elements (`rules.copies_elements`) of float activations, whose every float output
      FP16 candidates alone read, as data: FP32, its readers round what it copied; FP16, it copies what it
      rounded — the same elements. Not where an output is a graph output.

    Together they cover a chain of element-moving nodes kept FP32 in part (the chains of `single_node_twins`):
    the members after an FP16 one by the first rule, those before it by the second. Both rules only ever find more idle members in a
    smaller set, so removing them until none is left gives one answer whatever the order."""

    def __init__(self, catalog: Catalog, candidates: Iterable[str]):
        cands = list(candidates)  # in topological order
        members = set(cands)
        outputs = set(catalog.output_names)
        readers, movers = [], []
        for j in cands:
            node = catalog.nodes[j]
            if node.domain not in ("", "ai.onnx"):
                continue
            data = [t for t, i in catalog.reads(j)
                    if catalog.is_float(t) and not (i is not None and catalog.is_parameter(j, i))]
            if not data or any(t in catalog.weights for t in data):
                continue
            producers = {catalog.producers.get(t) for t in data}
            copies = rules.copies_elements(node)
            exact = copies or (node.op_type != "Dropout" and rules.op_rule(node.op_type).exact_outputs)
            if exact and producers <= members:
                readers.append((j, frozenset(producers)))
            if copies:
                floats = [o for o in node.output if o and catalog.is_float(o)]
                uses = [use for o in floats for use in catalog.consumers.get(o, [])]
                if floats and uses and not outputs.intersection(floats) and all(
                        r.name in members and i is not None and not catalog.is_parameter(r.name, i) for r, i in uses):
                    movers.append((j, frozenset(r.name for r, _ in uses)))
        self.readers = tuple(readers)  # (node, the candidates that write its float data inputs), in order
        self.movers = tuple(reversed(movers))  # (node, the candidates that read its float outputs), last first

    def __bool__(self) -> bool:
        return bool(self.readers or self.movers)

    def without(self, fp32: Iterable[str]) -> frozenset[str]:
        """`fp32` less its idle members: a plan with the same values."""
        fp32 = frozenset(fp32)
        work = set(fp32)
        dropped = True
        while dropped:  # a removal may make another node idle, by either rule: until none is left
            dropped = False
            for rule in (self.readers, self.movers):
                for j, others in rule:
                    if j in work and others.isdisjoint(work):
                        work.discard(j)
                        dropped = True
        return fp32 if len(work) == len(fp32) else frozenset(work)
