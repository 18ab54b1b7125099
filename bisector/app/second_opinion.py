"""The final set judged a second way on `emulate`: every node of its FP16 cone run alone.

The emulator runs consecutive nodes as one fused ONNX Runtime session; ONNX Runtime fuses the FP32 operations of
such a block (a BatchNormalization folded into the Conv before it, an activation fused) and may then compute an
FP32 value one ulp away from the value the nodes give one at a time. Near FP16's resolution a later FP16 rounding
can then go the other way, and a set passes one way and fails the other: on PP-OCR's direction classifier at
1e-5, 0.3 x the tolerance through the blocks and 33 x node by node. Both are faithful emulations; a set whose
verdict depends on which one ran sits at the edge of the tolerance.

`check` (the default) judges the final set node by node too — one more run at a fused run's memory, none where no
FP32 node feeds another in the cone — and warns and records where it fails so. `search` then searches on from
such a set with a judge that asks both ways, so its final set passes both (1-minimal under that judge): robust to
the emulator's fusions (and to an ONNX Runtime upgrade that changes them), not to the GPU's. Measured on seven
such sets (docs/benchmarks.md, "Trust, thirtieth round"): the searched-on sets were larger (1.07-3.4 x), took
1.8-2.8 x the evaluations, and held on an H100's ORT-CUDA no more often (0 of 7, against 1 of 7) — hence not
the default. Nor does the check predict the GPU: at those tight tolerances 5 of 24 sets that passed both ways
held there, and 1 of 6 that did not. Searching on with the node-by-node judge alone only moved the edge: the
classifier's 28-node set from it failed through the blocks at 11 x.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from bisector.budget import Budget
from bisector.compare import finite_or_none
from bisector.fp16.plan import Plan
from bisector.search.driver import SearchResult, continued, run_search
from bisector.search.judge import Verdict, judge, summed_seconds
from bisector.search.oracle import Oracle

log = logging.getLogger("bisector")


@dataclass
class SecondOpinion:
    """What the node-by-node judge said of the search's set (`first`), and the verdict of the final set: the same
    verdict where the first held, else the both-ways judge's verdict of the set the search from it found."""

    first: Verdict
    final: Verdict
    extended: bool  # the search went on from the set with the both-ways judge
    evaluations: int  # evaluations of this check and of the search from it
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"judge": "emulate, every node of the FP16 cone run alone" if not self.extended else
                "emulate, through fused blocks and node by node (the worse of the two)",
                "passed": self.final.passed, "excess": finite_or_none(self.final.excess),
                "searched_set_passed": self.first.passed, "searched_set_excess": finite_or_none(self.first.excess),
                "extended": self.extended, "evaluations": self.evaluations}


class BothWays(Oracle):
    """An oracle whose verdict is the worse of the fused and the node-by-node judge: a plan passes only if it
    passes both ways. Not screened on batch items, no journal (its verdicts are not the fused judge's)."""

    def _judge(self, plan: Plan, lean: bool = True) -> Verdict:
        fused = super()._judge(plan, lean)
        if not fused.passed or not self.backend.node_by_node_differs(plan):
            return fused  # failing already, or the same bits node by node: the second run cannot change the verdict
        alone = judge(self.backend, plan, self.feeds_list, self.golden, self.tolerance, lean=lean,
                      run=self.backend.run_node_by_node)
        worse = max((fused, alone), key=lambda v: (not v.passed, v.excess))
        worse.seconds = summed_seconds(fused.seconds, alone.seconds)
        return worse


def available(backend: Any) -> bool:
    return callable(getattr(backend, "run_node_by_node", None))


def node_by_node_verdict(job: Any, plan: Plan, fused: Verdict) -> Verdict | None:
    """`plan` judged with every node of its FP16 cone run alone: `fused` (its verdict through the blocks) itself
    where no FP32 node feeds another in the cone (the same bits), a new verdict otherwise (one run per input set);
    None where the backend cannot run so (not emulate) or nothing runs in FP16 (both compute the reference)."""
    if not available(job.backend) or len(plan.fp32) == len(job.catalog.candidates):
        return None
    if not job.backend.node_by_node_differs(plan):
        return fused
    return job.judge(plan, run=job.backend.run_node_by_node, lean=True)


def second_opinion(job: Any, found: SearchResult, strategy: str, strategy_options: dict[str, Any] | None,
                   budget: Budget, max_evals: int | None, search: bool = False,
                   on_verdict: Callable[[Verdict], Any] | None = None,
                   progress: Callable[[dict], None] | None = None) -> tuple[SearchResult, SecondOpinion | None]:
    """Judge `found`'s set node by node; where it fails there, warn, and with `search` search on from it with the
    both-ways judge (extend, then shrink). Returns the final result and the record (None: not judged — another
    backend, nothing FP16, or no time left). `on_verdict`, `progress`: the search's observers, told of the search
    from the set as well. The result's `seconds` stay the first search's; the record's are this check's and the
    search's from it."""
    if not found.passed or budget.spent():
        return found, None
    t0 = time.perf_counter()
    first = node_by_node_verdict(job, Plan(frozenset(found.fp32), job.catalog.candidates), found.verdict)
    if first is None:
        return found, None
    if first.passed:  # (the fused verdict itself where both run the same bits: no evaluation)
        return found, SecondOpinion(first, first, False, int(first is not found.verdict), time.perf_counter() - t0)
    left = None if max_evals is None else max_evals - found.evaluations.get("new", 0)  # --max-evals is the command's
    if not search:
        what = ("it sits at the edge of the tolerance, where an ONNX Runtime that fuses otherwise can turn the "
                "verdict; only the hardware decides whether it holds there (--confirm-on ort-cuda, verify --backend); "
                "`--second-opinion search` searches on for a set that passes both ways")
    elif left is None or left > 0:
        what = "searching on from it for a set that passes both ways"
    else:
        what = "--max-evals leaves no evaluation to search on from it: reported as found"
    log.warning("the set of %d node(s) passes through the emulator's fused blocks (%.3g x the tolerance) but not "
                "with every node run alone (%.3g x): its verdict turns on FP32 rounding order; %s", len(found.fp32),
                found.verdict.excess, first.excess, what)
    if not search or (left is not None and left <= 0):
        return found, SecondOpinion(first, first, False, 1, time.perf_counter() - t0)
    oracle = BothWays(job.backend, job.catalog.candidates, job.feeds_list, job.golden.outputs, job.tolerance,
                      budget=Budget(max_evals=left, time_limit=budget.time_limit, started=budget.started),
                      on_verdict=on_verdict)
    result = run_search(oracle, strategy, strategy_options, start=found.fp32, progress=progress)
    record = SecondOpinion(first, result.verdict, True, 1 + oracle.total, time.perf_counter() - t0)
    return continued(found, result), record
