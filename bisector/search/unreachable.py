"""Outputs whose tolerance no FP16 value meets, and the nodes that must therefore stay FP32.

Issue 15, nineteenth round (docs/benchmarks.md). An FP16 node stores its outputs in FP16 (DESIGN §4), and the
ops that only copy or select (Reshape, Transpose, Gather, Relu, ...) pass FP16 values on unchanged. So where an
output's golden value has no FP16 value within the tolerance — a classifier's probability 0.99987 at atol = rtol
= 1e-4: the FP16 values beside it are 0.99951 and 1.0 — every plan that computes that output in FP16 fails,
whatever else it keeps FP32. The node computing it (and any copying node between it and the output) belongs to
every passing set: the search keeps it FP32 from the start instead of spending about log2 N evaluations to
isolate it, and the user hears why before the search starts.

Where half the FP16 spacing exceeds the tolerance but a passing FP16 value exists, pass or fail depends on the
side the computed value rounds to: the verdicts near such outputs behave like coin tosses (on PP-OCR's 2-class
classifier at 1e-4 the same search with its 1-minimality check in nine orders returned sets of 6 to 23 nodes).
That share is reported (`coarse`) with the unreachable elements.

Only elementwise checks (a mean or quantile can absorb one element), float outputs, finite golden values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from bisector.compare import elementwise_ok

_CHUNK = 1 << 18

# Ops whose float output 0 is made of values of their input 0 (copies, selections, sign changes): an FP16 value in
# gives an FP16 value out, so an FP16 tensor upstream of one of them reaches the output unchanged
_THROUGH = frozenset(
    "Identity Reshape Transpose Flatten Squeeze Unsqueeze Slice Gather GatherElements GatherND Split Tile Expand "
    "MaxPool GlobalMaxPool ReduceMax ReduceMin Neg Abs Relu Dropout DepthToSpace SpaceToDepth TopK".split())


@dataclass
class Unreachable:
    """One output: `elements` of `total` golden values (all input sets) have no FP16 value within the tolerance;
    `coarse` of them (a share) have an FP16 neighbour outside it (pass or fail decided by rounding direction);
    `example`: the first unreachable value, its FP16 neighbours below and above and the allowed deviation;
    `nodes`: the candidates that must stay FP32 for the output to pass (empty where none can be named)."""

    output: str
    elements: int
    total: int
    coarse: float
    example: tuple[float, float, float, float] | None = None
    nodes: list[str] = field(default_factory=list)
    kept: bool = False  # the search kept `nodes` FP32 from the start (backends that store FP16 values)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"elements": self.elements, "of": self.total, "coarse_share": round(self.coarse, 6),
                               "nodes": list(self.nodes), "kept_from_start": self.kept}
        if self.example is not None:
            g, lo, hi, allowed = self.example
            out["example"] = {"golden": g, "fp16_below": lo, "fp16_above": hi, "allowed_deviation": allowed}
        return out

    def message(self) -> str:
        names = ", ".join(repr(n) for n in self.nodes)
        where = (f"the search keeps {names} FP32 from the start" if self.kept
                 else f"{names} must stay FP32 wherever this output is stored in FP16")
        text = (f"output {self.output!r}: {self.elements} of {self.total} value{'s' if self.total != 1 else ''} "
                f"{'has' if self.elements == 1 else 'have'} no FP16 value within the tolerance")
        if self.example is not None:
            g, lo, hi, allowed = self.example
            text += f" (golden {g:.9g}: the FP16 values beside it are {lo:.9g} and {hi:.9g}, allowed ±{allowed:.3g})"
        return (text + f", so every plan computing it in FP16 fails: {where}. "
                "Near FP16's resolution the verdicts depend on rounding direction and the FP32 set found varies with "
                "the search's order; a tolerance above half the FP16 spacing at the outputs avoids both.")


def unreachable_outputs(golden: Sequence[Mapping[str, np.ndarray]], tolerance: Any) -> dict[str, Unreachable]:
    """Per float output with an elementwise check: its unreachable and coarse elements over every input set
    (outputs with neither are left out)."""
    counts: dict[str, list] = {}
    for gold in golden:
        for name, g in gold.items():
            g = np.asarray(g)
            if not np.issubdtype(g.dtype, np.floating) or g.dtype == np.float16:
                continue  # an FP16 golden is FP16 values already
            if tolerance.stat.get(name) != "elemwise":
                continue
            atol, rtol, m = tolerance.atol.get(name), tolerance.rtol.get(name), tolerance.margin
            c = counts.setdefault(name, [0, 0, 0, None])
            flat = g.reshape(-1)
            for lo in range(0, flat.size, _CHUNK):
                part = flat[lo:lo + _CHUNK]
                below, above = _fp16_neighbours(part)
                finite = np.isfinite(part)
                ok_lo = elementwise_ok(below, part, atol, rtol, m)
                ok_hi = elementwise_ok(above, part, atol, rtol, m)
                none = finite & ~ok_lo & ~ok_hi
                c[0] += int(np.count_nonzero(none))
                c[1] += int(np.count_nonzero(finite & ~(ok_lo & ok_hi)))
                c[2] += int(part.size)
                if c[3] is None and none.any():
                    i = int(np.flatnonzero(none)[0])
                    gi = float(part[i])
                    allowed = max(atol, rtol * abs(gi)) * m
                    c[3] = (gi, float(below[i]), float(above[i]), allowed)
    return {name: Unreachable(name, n, total, coarse / max(total, 1), example)
            for name, (n, coarse, total, example) in counts.items() if n or coarse}


def _fp16_neighbours(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The largest FP16 value <= g and the smallest >= g (as float32; ±inf past the FP16 range)."""
    with np.errstate(all="ignore"):
        h = g.astype(np.float16)  # round to nearest: one of the two
        hf = h.astype(g.dtype)
        below = np.where(hf <= g, h, np.nextafter(h, np.float16(-np.inf))).astype(np.float32)
        above = np.where(hf >= g, h, np.nextafter(h, np.float16(np.inf))).astype(np.float32)
    return below, above


def fp32_for_output(catalog: Any, output: str) -> list[str]:
    """The candidates that must be FP32 for `output` to hold a non-FP16 value: its producer and, through copying
    ops (`_THROUGH`, and Casts between float types), the producers up to the first node that computes. A node
    outside the candidates on the way (pinned: FP32 anyway) adds nothing; the walk stops at the computing node."""
    chain: list[str] = []
    tensor, seen = output, set()
    while tensor in catalog.producers:
        name = catalog.producers[tensor]
        if name in seen:
            break
        seen.add(name)
        node = catalog.nodes[name]
        if name in catalog.candidates:
            chain.append(name)
        copies = node.op_type in _THROUGH and (tensor == node.output[0] or node.op_type == "Split")
        casts = node.op_type == "Cast" and catalog.is_float(node.input[0])
        if not node.input or not (copies or casts):
            break  # the node that computes the value: the chain ends here
        tensor = node.input[0]
    return chain
