"""Polygraphy-style text for one comparison, and the first-divergence trace of `run --mark-all`."""

from __future__ import annotations

from typing import Mapping

from bisector.model.catalog import Catalog
from bisector.compare import OutputComparison, histogram
from bisector.text import one_line


def _stats(s: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={v:.5g}" for k, v in s.items())


def format_comparison(r: OutputComparison) -> str:
    lines = [
        f"[I] Comparing '{one_line(r.name)}'",
        f"        Tolerance: [abs={r.atol:g}, rel={r.rtol:g}] | Checking {r.stat} error",
        f"        actual | Stats: {_stats(r.actual)}",
        f"        golden | Stats: {_stats(r.golden)}",
    ]
    if r.reason:
        lines.append(f"        {r.reason}")
    else:
        lines += [
            f"        Minimum Required Tolerance: {r.stat} error | [abs={r.required_abs:.5g}] OR [rel={r.required_rel:.5g}]",
            f"        Absolute Difference | Stats: {_stats(r.abs)}",
            f"        Relative Difference | Stats: {_stats(r.rel)}",
        ]
        if r.stat == "elemwise":
            lines.append(f"        Mismatched elements: {r.mismatches} / {r.size}")
        if not r.passed and r.absdiff is not None:
            lines += ["        ---- Absolute difference histogram ----", histogram(r.absdiff)]
    lines.append(f"[{'I' if r.passed else 'E'}]     {'PASSED' if r.passed else 'FAILED'} | Output: '{one_line(r.name)}'")
    return "\n".join(lines)


def first_divergence(catalog: Catalog, results: Mapping[str, OutputComparison], limit: int = 3) -> str:
    """The first tensors, in topological order, whose error exceeds tolerance, with their producing nodes."""
    producers = catalog.producers
    failing = [t for n in catalog.model.graph.node for t in n.output if t in results and not results[t].passed]
    if not failing:
        return "First divergence: none (every compared tensor is within tolerance)"
    lines = ["First divergence (topological order):"]
    for t in failing[:limit]:
        node = catalog.nodes[producers[t]]
        r = results[t]
        lines.append(f"  {t} <- node {node.name} ({node.op_type}): needs abs {r.required_abs:.4g} / rel {r.required_rel:.4g}"
                     f"{_origin(catalog, node.name, results)}")
    return "\n".join(lines)


def _origin(catalog: Catalog, node: str, results: Mapping[str, OutputComparison]) -> str:
    """'introduced here' when every compared input of the node is within tolerance, else where it came from."""
    bad = [t for t in catalog.node_inputs(node) if t in results and not results[t].passed]
    if not bad:
        return "  [introduced here]"
    return "  [inherits " + ", ".join(f"{t} from {catalog.producers.get(t, '?')}" for t in bad) + "]"
