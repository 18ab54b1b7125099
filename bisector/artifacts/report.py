"""`report.md`: what a person reads after a search — the set, why, how to use it, and what it cost."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bisector.model.catalog import Catalog
from bisector.text import markdown_code as code
from bisector.text import markdown_text as text

if TYPE_CHECKING:
    from bisector.artifacts.constraints import Constraints

# Every string that comes from the model or the command line (file, node, op and output names, reasons) goes
# through `code` or `text`: a name with `|`, backticks, HTML or escape sequences stays data in report.md.


def render_report(catalog: Catalog, c: Constraints, strings: dict, extra: str = "") -> str:
    ops = {n: catalog.nodes[n].op_type for n in c.fp32_nodes if n in catalog.nodes}
    loose = _fp16_recurrent_on_storage_rules(catalog, c)
    name = catalog.path.name
    status = "PASSED" if c.passed else "FAILED"
    lines = [
        f"# bisector report: {text(name)}",
        "",
        f"- Result: **{status}** with {len(c.fp32_nodes)} of {c.candidates} candidate nodes in FP32"
        + (" (1-minimal)" if c.minimal else " (not proven minimal" + (f": {text(c.stop_reason)}" if c.stop_reason else "") + ")"),
        f"- Backend: {code(c.backend.get('backend', '?'))} ({text(', '.join(f'{k} {v}' for k, v in c.backend.items() if k != 'backend'))})",
        *(["- **Judged on the CPU emulator only.** At tight tolerances, where the error is diffuse, its sets held "
           "on a GPU's ORT-CUDA in 6 of 30 measured real-model cases at the default `--margin 0.9`, in 11 with "
           "`--fp16-arithmetic gpu`, in 12 with `--margin 0.7` (sets 1.3 x larger) and in 21 with `--margin 0.5` "
           "(sets 1.9 x larger; docs/benchmarks.md, "
           "\"Trust, thirtieth round\"): judge the set where it will run, with `--confirm-on ort-cuda` or "
           "`--backend tensorrt --start-from constraints.json` (both extend it where it fails)."]
          if c.backend.get("backend") == "emulate" and not c.confirmed_on else []),
        *_second_opinion_lines(c.node_by_node),
        *_held_out_lines(c.held_out),
        f"- Strategy: {code(c.strategy)}; evaluations: {c.evaluations.total} ({c.evaluations.new} new, "
        f"{c.evaluations.cached} from the journal)"
        + (f"; {c.evaluations.emulator_runs} single-node emulator runs for the predicted ranking"
           if c.evaluations.emulator_runs else "")
        + (f"; {c.evaluations.screened} failed on the batch item(s) judged first" if c.evaluations.screened else ""),
        f"- Golden outputs: {text(c.golden.source)}; inputs: {text(c.inputs.get('source'))} ({c.inputs.get('sets')} set(s))",
        f"- Tolerances: {code(c.tolerances)}",
        f"- Model sha256: `{c.model_sha256}`",
        *(["- **Recurrent nodes in FP16 judged with FP32 math inside:** "
           + ", ".join(f"{code(n)} ({text(catalog.nodes[n].op_type)})" for n in loose)
           + ". ORT-CUDA's FP16 kernels compute every step in half precision (an LSTM alone: 3.3 x the emulated "
           "excess on an H100; TensorRT not measured): `--fp16-arithmetic gpu` computes the common forms that way, "
           "and `--confirm-on` judges the set where it will run."]
          if loose else []),
        *(["- **Not judged: FP16 inside If branches.** "
           + ", ".join(f"{code(n)} ({k} nodes inside)" for n, k in c.unjudged_branches.items())
           + ": each If was lowered as one unit and its branches computed FP32 in every verdict. So every artifact "
           "builds what was judged: `model.mixed.onnx` keeps the branches FP32, and `add_constraints.py` and the "
           "layer-precision flags keep these If nodes FP32, branches included (a plain TensorRT 10 FP16 build "
           "would run them in FP16, which nothing judged). `--backend tensorrt` judges FP16 inside them."]
          if c.unjudged_branches else []),
        *(["- **Outputs finer than FP16:** " + "; ".join(
            f"{code(k)}: {v['elements']} of {v['of']} values have no FP16 value within the tolerance"
            + (f" (kept FP32 from the start: {', '.join(code(n) for n in v['nodes'])})" if v.get('kept_from_start')
               else f" ({', '.join(code(n) for n in v['nodes'])} must be FP32 where it is stored in FP16)"
               if v['nodes'] else "")
            for k, v in c.fp16_unreachable.items() if v["elements"])
           + ". Near FP16's resolution pass or fail depends on rounding direction: the set found varies with the "
           "search's order."] if any(v["elements"] for v in c.fp16_unreachable.values()) else []),
        "",
        "## Nodes to keep in FP32",
        "",
    ]
    if c.fp32_nodes:
        lines += ["| node | op |", "|---|---|"] + [f"| {code(n)} | {text(ops.get(n, '?'))} |" for n in c.fp32_nodes]
    else:
        lines.append("None: the whole model meets the tolerance in FP16.")
    lines += ["", f"## Final comparison (worst of {c.inputs.get('sets', 1)} input set(s): set {c.worst_input_set})", "",
              "| output | passed | stat | required abs | required rel | max abs | median abs |", "|---|---|---|---|---|---|---|"]
    lean = False
    for out, r in c.outputs.items():
        req = r.get("required_tolerance", {})
        median = r.get("abs", {}).get("median")
        lean = lean or bool(r.get("lean"))
        lines.append(
            f"| {code(out)} | {'yes' if r.get('passed') else 'NO'} | {text(r.get('stat'))} | {req.get('abs', float('nan')):.4g} | "
            f"{req.get('rel', float('nan')):.4g} | {r.get('abs', {}).get('max', float('nan')):.4g} | "
            f"{'not computed' if median is None else format(median, '.4g')} |"
        )
    if lean:  # the search's own (lean) verdict: judging the set again in full was skipped, the time limit spent
        lines += ["", "The summaries of this comparison (medians, the output's statistics) were not computed: the "
                      "`--time-limit` was spent before the reported set could be judged again in full."]
    lines += [
        "",
        "## Using the result",
        "",
        "- TensorRT 10 (weak typing) with Polygraphy:",
        "  " + code(f"polygraphy run {name} --trt --fp16 --precision-constraints obey --trt-npps add_constraints.py",
                    table=False),
        "  or " + code(f"polygraphy run {name} --trt {strings.get('polygraphy', '')}", table=False) if c.fp32_nodes else "",
        "- trtexec: " + code(f"trtexec --onnx={name} {strings.get('trtexec', '')}", table=False) if c.fp32_nodes else "",
        *(f"  - note: {text(n)}" for n in strings.get("notes", []) if c.fp32_nodes),
        "- TensorRT 11 / TensorRT-RTX (strongly typed): build `model.mixed.onnx` (precision lives in the graph).",
        "",
    ]
    if c.pinned:
        lines += ["## Pinned nodes (not candidates, always FP32)", "", "| node | reason |", "|---|---|"]
        lines += [f"| {code(n)} | {text(why)} |" for n, why in c.pinned.items()] + [""]
    if c.timings:
        lines += ["## Timings (seconds)", "", "| phase | seconds |", "|---|---|"]
        lines += [f"| {text(k)} | {v:.3f} |" for k, v in c.timings.items()] + [""]
    if extra:
        lines += [extra, ""]
    return "\n".join(line for line in lines if line is not None) + "\n"


def _held_out_lines(held: dict | None) -> list[str]:
    """What the final set did on the input sets the search did not use (bisector.app.held_out)."""
    if not held:
        return []
    grown = _grown_lines(held)
    x = "inf" if held.get("excess") is None else f"{held['excess']:.3g}"
    seeds = held.get("seeds") or [None, None]
    which = f"seed {seeds[0]}" if seeds[0] == seeds[1] else f"seeds {seeds[0]}-{seeds[1]}"
    if held.get("passed") is None:
        return grown + ["- Held-out inputs: the set it grew to is not judged on input sets the search did not use "
                        "(the time or evaluations ran out)."]
    if held.get("passed"):
        return grown + [f"- Held-out inputs: passes on {held.get('input_sets')} generated input set(s) the search "
                        f"did not use ({which}; {x} x the tolerance)."]
    if grown:
        return grown + [f"- **Fitted to the searched inputs:** fails on {held.get('failed_sets')} of "
                        f"{held.get('input_sets')} generated input set(s) the search did not use ({which}; {x} x the "
                        "tolerance), after growing as often as `--grow-inputs` allowed. More rounds, real inputs "
                        "(`--load-inputs`) or a looser tolerance are the way on."]
    return [f"- **Fitted to the searched inputs:** fails on {held.get('failed_sets')} of {held.get('input_sets')} "
            f"generated input set(s) the search did not use ({which}; {x} x the tolerance). The error its FP16 "
            "nodes leave stays within the tolerance on the inputs searched, not on others. For a set that holds: "
            "search with more headroom and let the input sets it fails on join the search (`--margin 0.5 "
            "--grow-inputs 3`: on an H100 such sets held on input sets no search saw in 7 of 9 measured cases; "
            "docs/benchmarks.md, \"Held-out inputs, second round\"), search on real inputs (`--load-inputs`), or "
            "loosen the tolerance."]


def _grown_lines(held: dict) -> list[str]:
    """`--grow-inputs`: how the set changed as the input sets it failed on joined the search."""
    rounds = held.get("grown") or []
    if not rounds:
        return []
    steps = "; ".join(f"failed on seeds {r['seeds'][0]}-{r['seeds'][1]}: {r['set_before']} -> {r['set_after']} "
                      f"node(s) (+{r['added']}, -{r['dropped']}; {r['evaluations']} evaluations)" for r in rounds)
    return [f"- Grown on held-out inputs (`--grow-inputs`): searched on {held.get('searched_input_sets')} input sets "
            f"in the end. {steps}."]


def _second_opinion_lines(nbn: dict | None) -> list[str]:
    """What the node-by-node judge said (bisector.app.second_opinion)."""
    if not nbn:
        return []
    x = lambda v: "inf" if v is None else f"{v:.3g}"  # noqa: E731 (None: an unjudgeable excess)
    if nbn.get("extended"):
        return [f"- **The search's set failed with every node run alone** ({x(nbn.get('searched_set_excess'))} x the "
                "tolerance, though it passed through the emulator's fused blocks): its verdict turned on FP32 rounding "
                "order. The search went on from it with a judge that asks both ways; the final set "
                + ("passes both" if nbn.get("passed") else "did not come to pass both (budget)")
                + f" ({x(nbn.get('excess'))} x, {nbn.get('evaluations')} evaluations)."]
    if not nbn.get("passed"):
        return [f"- **Fails with every node run alone** ({x(nbn.get('excess'))} x the tolerance, though it passes "
                "through the emulator's fused blocks): its verdict turns on FP32 rounding order, so the set sits at "
                "the edge of the tolerance, where an ONNX Runtime that fuses otherwise can turn the verdict. Only "
                "the hardware decides whether it holds there (`--confirm-on ort-cuda`, `verify --backend`); "
                "`--second-opinion search` searches on for a set that passes both ways (robust to the emulator's "
                "fusions, not to the GPU's)."]
    return [f"- Second opinion: passes with every node of its FP16 cone run alone too ({x(nbn.get('excess'))} x the "
            "tolerance)."]


def _fp16_recurrent_on_storage_rules(catalog: Catalog, c: Constraints) -> list[str]:
    """The recurrent nodes the result leaves FP16 that the emulator judged with FP32 math inside (app.job's
    `warn_recurrent` says why that matters)."""
    if c.backend.get("backend") != "emulate" or c.confirmed_on:
        return []
    from bisector.fp16.recurrent import stepwise_missing
    from bisector.model.optable import model_opset

    gpu = "gpu-recurrent" in str(c.backend.get("rules", ""))
    fp32 = set(c.fp32_nodes)
    return [n for n in stepwise_missing(catalog.nodes, catalog.candidates, model_opset(catalog.model), gpu)
            if n not in fp32]
