"""`verify`: one evaluation of a recorded constraint set, judged exactly as recorded — the cheap nightly check."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bisector.app.job import build_job
from bisector.app.second_opinion import node_by_node_verdict
from bisector.app.options import BackendChoice, Cache, Inputs, Tolerances, split_options
from bisector.errors import UsageError
from bisector.search.driver import removable
from bisector.search.judge import Verdict

if TYPE_CHECKING:
    from bisector.artifacts.constraints import Constraints

log = logging.getLogger("bisector")


@dataclass
class VerifyResult:
    passed: bool
    fp32_nodes: list[str]
    verdict: Verdict
    missing_nodes: list[str]
    not_minimal_without: list[str]
    evaluations: int
    model_changed: bool
    # emulate: the set judged again with every node of its FP16 cone run alone (bisector.app.second_opinion);
    # None where not judged so. Reported, not part of `passed`: the search recorded its set on the fused judge,
    # and a set that fails node by node was said to sit at the edge of the tolerance then.
    node_by_node: Verdict | None = None

    def node_by_node_json(self) -> dict | None:
        from bisector.compare import finite_or_none

        v = self.node_by_node
        return None if v is None else {"passed": v.passed, "excess": finite_or_none(v.excess),
                                       "failing_outputs": sorted(v.failing)}


def verify(model: str | Path, constraints: str | Path, *, check_minimal: bool = False, second_opinion: bool = True,
           inputs: Inputs | None = None, tolerances: Tolerances | None = None, backend: BackendChoice | None = None,
           cache: Cache | None = None, **options: Any) -> VerifyResult:
    """Judge the recorded `fp32_nodes` again. Tolerances and generated-input settings default to what the
    constraints recorded (options given here override them); inputs recorded as files must be given again (or
    still be where they were, with the same digest) — never quietly replaced by generated ones.
    `second_opinion` (emulate): also judge the set with every node of its FP16 cone run alone (`node_by_node`;
    a failure there is warned about, not a failed verify)."""
    from bisector.artifacts.constraints import Constraints

    recorded = Constraints.read(Path(constraints))
    if tolerances is None:  # each tolerance option not given here is the recorded one
        given = {f.name: options.pop(f.name) for f in dataclasses.fields(Tolerances) if f.name in options}
        tolerances = dataclasses.replace(Tolerances.recorded(recorded.tolerances), **given)
    groups = split_options(options, Inputs=inputs or _recorded_inputs(recorded, options),
                           Tolerances=tolerances, BackendChoice=backend, Cache=cache)
    with build_job(Path(model), groups[Inputs], groups[Tolerances], groups[BackendChoice], groups[Cache]) as job:
        cat = job.catalog
        _check_same_inputs(recorded, job.inputs_info, constraints)
        changed = recorded.model_sha256 != cat.sha256
        if changed:
            log.warning("the model changed since the search (sha256 %s... -> %s...)", recorded.model_sha256[:12],
                        cat.sha256[:12])
        missing = cat.unknown(recorded.fp32_nodes)
        kept = frozenset(n for n in recorded.fp32_nodes if n in cat.candidates)
        # the set's own verdict comes first, before any failure: judged whole; the removals of --check-minimal,
        # expected to fail, may fail on one batch item (bisector.search.screen)
        oracle = job.oracle(screen=True)
        verdict = oracle.evaluate(kept)
        nbn = node_by_node_verdict(job, job.plan(kept), verdict) if second_opinion and verdict.passed else None
        if nbn is not None and not nbn.passed:
            log.warning("the set passes through the emulator's fused blocks (%.3g x the tolerance) but not with "
                        "every node run alone (%.3g x): its verdict turns on FP32 rounding order, so it sits at "
                        "the edge of the tolerance; judge it where it will run (--backend), or search with "
                        "`--second-opinion search` for a set that passes both ways", verdict.excess, nbn.excess)
        extra = removable(oracle, kept) if check_minimal and verdict.passed else []
    passed = verdict.passed and not missing and not extra
    nbn_runs = nbn is not None and nbn is not verdict  # its own evaluation, not the fused verdict's bits
    return VerifyResult(passed, sorted(kept), verdict, missing, extra, oracle.total + nbn_runs, changed, nbn)


def _recorded_inputs(recorded: Constraints, options: dict) -> Inputs | None:
    """The recorded generated-input settings (seed, ranges, shapes, iterations), unless the caller gives inputs."""
    info = recorded.inputs
    given = {f.name for f in dataclasses.fields(Inputs)} & {k for k, v in options.items() if v}
    if given & {"load_inputs", "data_loader_script"}:
        return None
    if info.get("source") == "script":  # not run from the file's say-so: a constraints.json may come from elsewhere
        raise UsageError(f"the constraints were found with inputs from the data loader script {info.get('script')}: "
                         "pass it with --data-loader-script (generated inputs would judge something else)")
    if info.get("source") == "file":
        files = [Path(p) for p in info.get("files", [])]
        if files and all(p.is_file() for p in files):
            return Inputs(load_inputs=files)
        raise UsageError(f"the constraints were found with inputs loaded from {info.get('files')}, which are not "
                         "there now: pass them with --load-inputs (generated inputs would judge something else)")
    if info.get("source") != "generated":
        return None
    try:  # the recorded values are checked by Inputs like flags; here only their JSON shape
        base = {"val_range": {k: tuple(v) for k, v in info.get("val_range", {}).items()},
                "input_shapes": {k: tuple(v) for k, v in info.get("shapes", {}).items()},
                "seed": int(info.get("seed", 1)), "iterations": int(info.get("iterations", 1))}
    except (TypeError, ValueError, AttributeError) as exc:
        raise UsageError(f"the constraints' recorded inputs are malformed ({exc}): {info!r:.200}") from None
    for k in given:
        base.pop(k, None)
    return Inputs(**base, **{k: options.pop(k) for k in list(options) if k in given})


def _check_same_inputs(recorded: Constraints, used: dict, path) -> None:
    digest = recorded.inputs.get("digest")
    if recorded.inputs.get("source") == "file" and used.get("source") == "file" and digest and digest != used["digest"]:
        raise UsageError(f"the input files given differ from those {path} was found with (digest "
                         f"{used['digest'][:12]}... vs recorded {digest[:12]}...)")
