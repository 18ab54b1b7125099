"""`evaluate`: one configuration (an FP32 set) judged against golden, every input set, Polygraphy-style."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from bisector.app.job import build_job
from bisector.app.options import BackendChoice, Cache, Inputs, Tolerances, split_options
from bisector.compare import OutputComparison
from bisector.errors import UsageError
from bisector.fp16.plan import Plan
from bisector.model.catalog import Catalog
from bisector.search.judge import Judged, Verdict

log = logging.getLogger("bisector")


@dataclass
class EvaluateResult:
    """One plan's judgement: the verdict (worst set), and per input set every compared tensor, in topological
    order (graph outputs, plus intermediate tensors with `mark_all`)."""

    plan: Plan
    verdict: Verdict
    comparisons: list[dict[str, OutputComparison]]
    first_divergence: list[str]
    catalog: Catalog

    @property
    def passed(self) -> bool:
        return self.verdict.passed


def evaluate(model: str | Path, fp32: Iterable[str] = (), *, constraints: str | Path | None = None,
             mark_all: bool = False, save_outputs: str | Path | None = None, inputs: Inputs | None = None,
             tolerances: Tolerances | None = None, backend: BackendChoice | None = None, cache: Cache | None = None,
             **options: Any) -> EvaluateResult:
    """Judge one plan: `fp32` nodes (and a constraints.json's `fp32_nodes`) in FP32, every other candidate FP16.

    `mark_all`: compare every intermediate float tensor with the FP32 reference too (emulate only) and trace the
    first divergence. `save_outputs`: this plan's outputs as Polygraphy RunResults JSON."""
    from bisector.artifacts.report_text import first_divergence
    from bisector.files import write_text_atomic
    from bisector.model.polyjson import run_results_many, runner_name

    groups = split_options(options, Inputs=inputs, Tolerances=tolerances, BackendChoice=backend, Cache=cache)
    if mark_all and groups[BackendChoice].backend != "emulate":
        raise UsageError("--mark-all needs --backend emulate (other backends expose only graph outputs)")
    wanted = list(fp32)
    if constraints is not None:
        from bisector.artifacts.constraints import Constraints

        wanted += Constraints.read(Path(constraints)).fp32_nodes
    with build_job(Path(model), groups[Inputs], groups[Tolerances], groups[BackendChoice], groups[Cache]) as job:
        cat = job.catalog
        pinned = [n for n in wanted if n in cat.pinned]
        if pinned:
            log.warning("already FP32 (pinned, not candidates): %s", pinned)
        plan = job.plan(wanted)
        expected = run = None
        if mark_all:
            references = [job.backend.reference(feeds) for feeds in job.feeds_list]
            names = [t for n in cat.model.graph.node if n.op_type != "Constant" for t in n.output
                     if t and t not in cat.output_names and t in references[0] and not cat.is_sequence(t)
                     and references[0][t].dtype.kind in "fb"]  # tensors only: a sequence value is not compared
            expected = [{t: ref[t] for t in names} for ref in references]
            run = lambda p, feeds, want: job.backend.run_all(p, feeds)  # noqa: E731
        judged = job.judge(plan, keep=True, expected=expected, run=run)
        assert isinstance(judged, Judged)
        order = [t for n in cat.model.graph.node for t in n.output]
        comparisons = [{k: c[k] for k in sorted(c, key=lambda t: order.index(t) if t in order else len(order))}
                       for c in judged.comparisons]
        trace = [first_divergence(cat, c) for c in comparisons] if mark_all else []
        if save_outputs is not None:
            # Both runners, named as Polygraphy names them: the FP32 reference (golden) and this plan's outputs,
            # each with its provenance, so the file can never pass off reduced-precision outputs as golden.
            golden_name = job.golden.runner or runner_name("onnxrt-runner")
            reduced = "fp32" if not plan.fp16 else "fp16"
            write_text_atomic(Path(save_outputs), run_results_many([
                (golden_name, [{k: o[k] for k in cat.output_names} for o in job.golden.outputs],
                 [0.0] * len(job.golden.outputs), {"precision": "fp32", "role": "reference",
                                                   "source": job.golden.source}),
                (runner_name("trt-runner"), judged.outputs, judged.runtimes,
                 {"precision": reduced, "role": "reduced", "backend": job.backend.name,
                  "fp32_nodes": sorted(plan.fp32)}),
            ]))
        return EvaluateResult(plan, judged.verdict, comparisons, trace, cat)
