"""One job: catalog, inputs, golden, backend (canary checked), and the oracle and judge over them.

Every API function builds its pieces here from the typed option groups, in the order of DESIGN §2.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bisector.backends import backend_factory
from bisector.backends.base import Backend
from bisector.backends.canary import run_canary
from bisector.model.catalog import Catalog, check_comparable_outputs
from bisector.compare import Tolerance
from bisector.errors import UsageError
from bisector.model.golden import Golden, default_cache_dir, get_golden
from bisector.model.inputs import generate_inputs, inputs_digest, load_inputs, save_inputs
from bisector.budget import Budget
from bisector.search.oracle import Oracle
from bisector.search.judge import Judged, Verdict, judge
from bisector.fp16.plan import Plan
from bisector.fp16.points import IdleFP32
from bisector.model.polyjson import Feeds
from bisector.app.options import BackendChoice, Cache, Inputs, Tolerances

log = logging.getLogger("bisector")


@dataclass
class Job:
    catalog: Catalog
    feeds_list: list[Feeds]
    golden: Golden
    tolerance: Tolerance
    backend: Backend
    inputs_info: dict[str, Any]
    cache_dir: Path | None = None

    def journal(self, resume: bool = True):
        """The SQLite journal for this job's key, or None when caching is off (--no-cache)."""
        if self.cache_dir is None:
            return None
        from bisector import __version__
        from bisector.search.journal import SqliteJournal

        description = {
            "model_sha256": self.catalog.sha256, "inputs": self.inputs_info["digest"],
            "golden": golden_digest(self.golden),
            # what decides verdicts, not what a search observes along the way (ort-cuda's CPU-fallback record,
            # whether its runs were CUDA-graph replays: the same session's kernels, checked bit for bit; and how far
            # apart two runs of one plan came)
            "backend": {k: v for k, v in self.backend.describe().items()
                        if not k.startswith(("cpu_fallback", "cuda_graph", "run_to_run"))},
            "tolerances": self.tolerance.describe(), "bisector": __version__,
            # a plan is stored as its FP32 nodes: what the others mean depends on which nodes are candidates (the
            # twenty-third round made constant fills weights, no longer candidates)
            "candidates": hashlib.sha256("\n".join(self.catalog.candidates).encode("utf-8", "surrogatepass")).hexdigest(),
        }
        return SqliteJournal(self.cache_dir / "journal.sqlite", description, resume=resume)

    def oracle(self, budget: Budget | None = None, journal=None, on_verdict=None, screen: bool = False,
               idle: bool = False, inputs: tuple[list[Feeds], list[Feeds]] | None = None) -> Oracle:
        """`screen`: failing plans may be judged on one batch item (a search's oracle; bisector.search.screen).
        `idle`: a search's oracle, which judges a set without its idle FP32 members (`points.IdleFP32`: the same
        values); without, every set is judged as given (verify). `inputs`: other input sets and their golden
        outputs than the job's (the held-out inputs' growth, bisector.app.held_out)."""
        feeds_list, golden = inputs if inputs is not None else (self.feeds_list, self.golden.outputs)
        return Oracle(self.backend, self.catalog.candidates, feeds_list, golden, self.tolerance,
                      journal=journal, budget=budget, on_verdict=on_verdict, screen=screen,
                      idle=IdleFP32(self.catalog, self.catalog.candidates) if idle else None)

    def plan(self, fp32) -> Plan:
        """A plan keeping `fp32` (node names; pinned ones are FP32 anyway) in FP32. Unknown names: UsageError."""
        wanted = list(fp32)
        unknown = self.catalog.unknown(wanted)
        if unknown:
            raise UsageError(f"node(s) not in the model: {unknown}")
        return Plan(frozenset(n for n in wanted if n in self.catalog.candidates), self.catalog.candidates)

    def judge(self, plan: Plan, **kw) -> Verdict | Judged:
        return judge(self.backend, plan, self.feeds_list, self.golden.outputs, self.tolerance, **kw)

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def build_job(model: Path, inputs: Inputs, tolerances: Tolerances, backend: BackendChoice, cache: Cache,
              canary: bool = True, **backend_extra: Any) -> Job:
    """Catalog, inputs, golden, backend (canary checked): in the order of DESIGN §2, every option already typed
    and checked by its group, so a typo costs nothing."""
    tolerance = tolerances.tolerance()
    make_backend = backend_factory(backend.backend, **backend.backend_options(inputs.input_shapes, **backend_extra))
    catalog = Catalog.load(model)
    check_comparable_outputs(catalog.model.graph, catalog.tensor_types)
    from bisector.files import protect

    protect(model, "the input model")  # no output of ours (--save-inputs, --json, -o, ...) may overwrite an input
    for p in inputs.load_inputs:
        protect(p, "an input file (--load-inputs)")
    protect(inputs.load_outputs, "the golden outputs file (--load-outputs)")
    for flag, per in (("--atol", tolerance.atol), ("--rtol", tolerance.rtol), ("--check-error-stat", tolerance.stat)):
        unknown = sorted(set(per.per_output) - set(catalog.names) - set(catalog.output_names) - _all_tensors(catalog))
        if unknown:
            raise UsageError(f"{flag} names unknown output(s) {unknown}; the model's outputs are {catalog.output_names}")

    feeds_list, info = feeds_for(catalog, inputs)
    for feeds in feeds_list:  # nothing may change an input set in place: its golden outputs were computed from it
        for value in feeds.values():  # (and ort-cuda's GPU copy of it is copied again only where it could change)
            if isinstance(value, np.ndarray):
                value.flags.writeable = False

    cache_dir = None if cache.no_cache else (cache.cache_dir or default_cache_dir())
    golden = get_golden(catalog, feeds_list, cache_dir, inputs.load_outputs)
    if not any(a.size for outs in golden.outputs for a in outs.values()):  # every plan would pass, vacuously
        shapes = ", ".join(f"{k}{list(a.shape)}" for k, a in golden.outputs[0].items())
        raise UsageError(f"every graph output holds 0 values for these inputs ({shapes}): nothing to judge; give "
                         "inputs (--input-shapes, --load-inputs) for which the outputs are not empty")

    if canary:
        run_canary(make_backend)
    made = make_backend()
    made.open(catalog)
    expect = getattr(made, "expect_inference_peak", None)  # the emulator's memory levels (arena guard)
    if callable(expect):
        expect(golden.peak_bytes)
    warn_unsplit_branches(catalog, unjudged_branches(catalog, made))
    warn_recurrent(catalog, made)
    return Job(catalog, feeds_list, golden, tolerance, made, info, cache_dir)


def unjudged_branches(catalog: Catalog, backend: Backend) -> dict[str, int]:
    """If candidates whose branches this backend computes FP32 in every plan -> their computing nodes."""
    return {} if getattr(backend, "judges_branches", False) else dict(catalog.unsplit_branches)


def warn_unsplit_branches(catalog: Catalog, unsplit: dict[str, int]) -> None:
    """Say so when FP16 arithmetic inside If branches is not judged: a verdict there holds for the mixed model
    (branches FP32) but not for a build that runs the branches in FP16 (TensorRT 10 with add_constraints.py)."""
    if not unsplit:
        return
    inside = sum(unsplit.values())
    share = inside / max(1, inside + len(catalog.candidates) - len(unsplit))
    from bisector.text import one_line

    names = ", ".join(f"{one_line(n)}'s branches ({k} nodes)" for n, k in list(unsplit.items())[:5])
    log.warning("FP16 inside If branches is not judged: %s%s compute FP32 in every plan (each If is lowered as one "
                "unit), %.0f%% of the model's computing nodes. The artifacts build what is judged: model.mixed.onnx keeps "
                "the branches FP32 and add_constraints.py / the layer-precision flags keep those If nodes FP32. To "
                "judge FP16 inside them: --backend tensorrt, or a model without the If (its condition folded into a "
                "constant).",
                names, f" and {len(unsplit) - 5} more If nodes" if len(unsplit) > 5 else "", 100 * share)


def warn_recurrent(catalog: Catalog, backend: Backend) -> None:
    """Say so when the emulator judges recurrent nodes in FP16 with less error than GPUs give them. ORT-CUDA's FP16
    LSTM, GRU and RNN (cuDNN) compute every step in half precision: with one LSTM alone in FP16 an H100 gave 3.3 x
    the storage rules' excess on a real recogniser (docs/verification.md, "Sixteenth round"; rounding only the
    state at each step, with FP32 math, changed the emulated error by under 1%, so the math is what counts).
    The gpu arithmetic mode computes their common forms that way (bisector.fp16.recurrent); TensorRT's recurrent
    layers were not measured."""
    if getattr(backend, "name", None) != "emulate":
        return
    from bisector.fp16.recurrent import stepwise_missing, supported
    from bisector.model.optable import model_opset
    from bisector.text import one_line

    gpu = getattr(backend, "arithmetic", "storage") == "gpu"
    opset = model_opset(catalog.model)
    loose = stepwise_missing(catalog.nodes, catalog.candidates, opset, gpu)
    if not loose:
        return
    names = ", ".join(f"{one_line(n)} ({catalog.nodes[n].op_type})" for n in loose[:5])
    more = f" and {len(loose) - 5} more" if len(loose) > 5 else ""
    fixable = not gpu and any(supported(catalog.nodes[n], opset) for n in loose)
    log.warning("Recurrent nodes in FP16 may be judged with less error than a GPU gives them: %s%s compute in FP32 "
                "with FP16 inputs and outputs here, where ORT-CUDA's FP16 kernels compute every step in half "
                "precision (an LSTM alone: 3.3x the emulated excess on an H100; TensorRT not measured). %sJudge the "
                "set where it will run (--confirm-on, or verify --backend).",
                names, more, "--fp16-arithmetic gpu computes them step by step. " if fixable else "")


def feeds_for(catalog: Catalog, inputs: Inputs) -> tuple[list[Feeds], dict[str, Any]]:
    """The input sets (script, files, or Polygraphy's data loader) and what describes them; saved if asked."""
    if inputs.data_loader_script:
        from bisector.model.inputs import load_data_script

        feeds_list = load_data_script(inputs.data_loader_script, catalog)
        info = {"source": "script", "script": str(inputs.data_loader_script)}
    elif inputs.load_inputs:
        if inputs.val_range or inputs.input_shapes:
            log.warning("--load-inputs given: --val-range/--input-shapes are ignored")
        feeds_list = load_inputs(inputs.load_inputs, catalog)
        info = {"source": "file", "files": [str(p) for p in inputs.load_inputs]}
    else:
        feeds_list = generate_inputs(catalog, inputs.val_range, inputs.input_shapes, seed=inputs.seed,
                                     iterations=inputs.iterations)
        info = {"source": "generated", "seed": inputs.seed, "iterations": inputs.iterations,
                "val_range": {k or "*": list(v) for k, v in inputs.val_range.items()} or {"*": [0.0, 1.0]},
                "shapes": {k: list(v.shape) for k, v in feeds_list[0].items()}}
    info["sets"] = len(feeds_list)
    info["digest"] = inputs_digest(feeds_list)
    if inputs.save_inputs is not None:
        save_inputs(inputs.save_inputs, feeds_list)
    return feeds_list, info


def open_job(model: str | Path, *, canary: bool = True, backend_extra: dict[str, Any] | None = None,
             **options: Any) -> Job:
    """A job from flat keyword options (`atol=0.1`, `val_range=["x:[1,2]"]`, `backend="emulate"`), for scripts
    and tests that judge plans directly."""
    from bisector.app.options import split_options

    g = split_options(options, (Inputs, Tolerances, BackendChoice, Cache))
    return build_job(Path(model), g[Inputs], g[Tolerances], g[BackendChoice], g[Cache], canary=canary,
                     **(backend_extra or {}))


def golden_digest(golden: Golden) -> str:
    import hashlib

    h = hashlib.sha256()
    import json

    h.update(json.dumps(["golden", len(golden.outputs)]).encode() + b"\n")
    for outs in golden.outputs:  # framed like feeds_digest: name, dtype, shape and byte count before the bytes
        h.update(json.dumps(["set", len(outs)]).encode() + b"\n")
        for name in sorted(outs):
            a = np.ascontiguousarray(outs[name])
            h.update(json.dumps([name, str(a.dtype), list(a.shape), a.nbytes], ensure_ascii=True).encode() + b"\n")
            h.update(a.tobytes())
    return h.hexdigest()


def _all_tensors(catalog: Catalog) -> set[str]:
    return {t for n in catalog.model.graph.node for t in n.output}
