"""`profile`: a per-node FP16 sensitivity score for every candidate, without a search."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from bisector.app.job import Job, build_job
from bisector.app.options import Cache, Inputs, Tolerances, BackendChoice, split_options
from bisector.errors import UsageError
from bisector.files import ensure_dir
from bisector.search.judge import Judged

# The profile runs on the emulate backend: it needs every intermediate tensor of the FP32 reference.
_EMULATE = BackendChoice()


@dataclass
class ProfileResult:
    nodes: list[dict]            # per candidate, highest score first (profile.json's "nodes")
    highlight: frozenset[str]    # the plan shown (its FP32 nodes)
    plan_passed: bool
    meta: dict[str, Any]
    files: dict[str, Path]


def profile(model: str | Path, fp32: Iterable[str] = (), *, constraints: str | Path | None = None,
            output_dir: str | Path | None = None, png: bool = True, threads: int = 1,
            inputs: Inputs | None = None, tolerances: Tolerances | None = None, cache: Cache | None = None,
            **options: Any) -> ProfileResult:
    """Score every candidate's FP16 sensitivity (emulate; no search) and write profile.json (and profile.png)
    into `output_dir` when given. `fp32`/`constraints`: a plan to highlight and whose output errors to plot."""
    if threads < 0:
        raise UsageError(f"--threads {threads}: must be 0 or more")
    groups = split_options(options, (Inputs, Tolerances, Cache), Inputs=inputs, Tolerances=tolerances, Cache=cache)
    if output_dir is not None:
        ensure_dir(Path(output_dir))
    wanted = list(fp32)
    if constraints is not None:
        from bisector.artifacts.constraints import Constraints

        wanted += Constraints.read(Path(constraints)).fp32_nodes
    t0 = time.perf_counter()
    with build_job(Path(model), groups[Inputs], groups[Tolerances], _EMULATE, groups[Cache], threads=threads) as job:
        plan = job.plan(wanted)
        if not job.catalog.candidates:
            raise UsageError(f"{model}: no candidate node (no node computes in floating point): nothing to profile")
        t1 = time.perf_counter()
        for feeds in job.feeds_list:
            job.backend.reference(feeds)  # FP32 reference, node by node (builds the per-node sessions)
        t2 = time.perf_counter()
        from bisector.sensitivity import compute_scores

        nodes = compute_scores(job.catalog, job.backend, job.feeds_list, job.tolerance)
        t3 = time.perf_counter()
        meta = {"model": str(model), "model_sha256": job.catalog.sha256, "tolerances": job.tolerance.describe(),
                "inputs": job.inputs_info, "candidates": len(job.catalog.candidates), "pinned": job.catalog.pinned,
                "timings": {"setup": t1 - t0, "reference": t2 - t1, "scores": t3 - t2}}
        files, judged = {}, None
        if output_dir is not None:
            files, judged = write_profile_files(job, Path(output_dir), nodes, plan.fp32, meta, png=png)
        else:
            judged = job.judge(plan, keep=True)
        t4 = time.perf_counter()
    assert isinstance(judged, Judged)
    meta["timings"]["plan"] = t4 - t3
    return ProfileResult(nodes, plan.fp32, judged.verdict.passed, meta, files)


def write_profile_files(job: Job, out: Path, nodes: list[dict], highlight: frozenset[str], meta: dict,
                        png: bool = True) -> tuple[dict[str, Path], Judged]:
    """profile.json (+ profile.png: scores with `highlight` marked, and each output's error histogram for that
    plan). The plan is judged here, once, with its differences kept for the histograms."""
    from bisector.sensitivity import write_profile

    judged = job.judge(job.plan(highlight), keep=True)
    assert isinstance(judged, Judged)
    worst = judged.verdict
    meta = {**meta, "plan": {"fp32_nodes": sorted(highlight), "passed": worst.passed,
                             "outputs": {k: r.to_json() for k, r in worst.outputs.items()}}}
    files = {"profile_json": write_profile(out / "profile.json", nodes, meta)}
    if png:
        from bisector.artifacts.plot import render_profile_png

        errors = {name: np.concatenate([c[name].absdiff.ravel() for c in judged.comparisons])
                  for name in worst.outputs}
        files["profile_png"] = render_profile_png(
            nodes, highlight, out / "profile.png", errors,
            title=f"{job.catalog.path.name}: FP16 sensitivity per node ({len(nodes)} candidates; "
                  f"{'plan with ' + str(len(highlight)) + ' FP32' if highlight else 'errors: all-FP16 plan'})",
            tolerance={k: job.tolerance.atol.get(k) for k in errors})
    return files, judged
