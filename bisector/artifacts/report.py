"""`report.md`: what a person reads after a search — the set, why, how to use it, and what it cost."""

from __future__ import annotations

from bisector.model.catalog import Catalog
from bisector.artifacts.constraints import Constraints


def render_report(catalog: Catalog, c: Constraints, strings: dict, extra: str = "") -> str:
    ops = {n: catalog.nodes[n].op_type for n in c.fp32_nodes if n in catalog.nodes}
    status = "PASSED" if c.passed else "FAILED"
    lines = [
        f"# bisector report: {catalog.path.name}",
        "",
        f"- Result: **{status}** with {len(c.fp32_nodes)} of {c.candidates} candidate nodes in FP32"
        + (" (1-minimal)" if c.minimal else " (not proven minimal" + (f": {c.stop_reason}" if c.stop_reason else "") + ")"),
        f"- Backend: `{c.backend.get('backend', '?')}` ({', '.join(f'{k} {v}' for k, v in c.backend.items() if k != 'backend')})",
        f"- Strategy: `{c.strategy}`; evaluations: {c.evaluations.total} ({c.evaluations.new} new, {c.evaluations.cached} from the journal)",
        f"- Golden outputs: {c.golden.source}; inputs: {c.inputs.get('source')} ({c.inputs.get('sets')} set(s))",
        f"- Tolerances: `{c.tolerances}`",
        f"- Model sha256: `{c.model_sha256}`",
        "",
        "## Nodes to keep in FP32",
        "",
    ]
    if c.fp32_nodes:
        lines += ["| node | op |", "|---|---|"] + [f"| `{n}` | {ops.get(n, '?')} |" for n in c.fp32_nodes]
    else:
        lines.append("None: the whole model meets the tolerance in FP16.")
    lines += ["", f"## Final comparison (worst of {c.inputs.get('sets', 1)} input set(s): set {c.worst_input_set})", "",
              "| output | passed | stat | required abs | required rel | max abs | median abs |", "|---|---|---|---|---|---|---|"]
    for name, r in c.outputs.items():
        req = r.get("required_tolerance", {})
        lines.append(
            f"| `{name}` | {'yes' if r.get('passed') else 'NO'} | {r.get('stat')} | {req.get('abs', float('nan')):.4g} | "
            f"{req.get('rel', float('nan')):.4g} | {r.get('abs', {}).get('max', float('nan')):.4g} | {r.get('abs', {}).get('median', float('nan')):.4g} |"
        )
    lines += [
        "",
        "## Using the result",
        "",
        "- TensorRT 10 (weak typing) with Polygraphy:",
        f"  `polygraphy run {catalog.path.name} --trt --fp16 --precision-constraints obey --trt-npps add_constraints.py`",
        f"  or `polygraphy run {catalog.path.name} --trt {strings.get('polygraphy', '')}`" if c.fp32_nodes else "",
        f"- trtexec: `trtexec --onnx={catalog.path.name} {strings.get('trtexec', '')}`" if c.fp32_nodes else "",
        *(f"  - note: {n}" for n in strings.get("notes", []) if c.fp32_nodes),
        "- TensorRT 11 / TensorRT-RTX (strongly typed): build `model.mixed.onnx` (precision lives in the graph).",
        "",
    ]
    if c.pinned:
        lines += ["## Pinned nodes (not candidates, always FP32)", "", "| node | reason |", "|---|---|"]
        lines += [f"| `{n}` | {why} |" for n, why in c.pinned.items()] + [""]
    if c.timings:
        lines += ["## Timings (seconds)", "", "| phase | seconds |", "|---|---|"]
        lines += [f"| {k} | {v:.3f} |" for k, v in c.timings.items()] + [""]
    if extra:
        lines += [extra, ""]
    return "\n".join(line for line in lines if line is not None) + "\n"
