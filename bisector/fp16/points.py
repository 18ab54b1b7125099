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

