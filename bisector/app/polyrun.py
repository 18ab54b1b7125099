"""`run` with Polygraphy's runners (issue 18): `--onnxrt` is the FP32 reference, `--trt` the reduced-precision
runner (evaluated on --backend, emulate by default), compared like `polygraphy run --trt --onnxrt`.

- `--onnxrt` alone runs ONNX Runtime FP32 and (with --save-outputs) saves golden outputs.
- `--trt` alone runs the plan: FP32 unless --fp16/--bf16, as a TensorRT build is; `--layer-precisions` and
  `--trt-npps` keep layers FP32; compared with `--load-outputs` when given.
- both: the trt runner is compared with the onnxrt runner (the reference, so reldiff is relative to FP32).
- `--load-outputs`: the loaded runner is the reference of the run before it (`--onnxrt` if given, else `--trt`),
  as in Polygraphy, which compares each run with the next.
- `--trt-outputs/--onnx-outputs NAMES | mark all`: the runners return exactly those tensors (graph outputs are not
  added), and every tensor both runners return is compared, in topological order.
Commands that need real TensorRT (an engine, a network script) are a UsageError that says so.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from bisector import ort_pool
from bisector.app.options import BackendChoice, Cache, Comparison, Inputs, Runners, Tolerances, TrtBuilder
from bisector.compare import OutputComparison, compare_output, indices_match, non_finite
from bisector.errors import UsageError
from bisector.model.catalog import Catalog, check_comparable_outputs
from bisector.model.polyjson import Feeds
from bisector.model.weights import ort_session
from bisector.text import one_line

log = logging.getLogger("bisector")

NEEDS_TRT = "needs TensorRT"
ENGINE_SUFFIXES = (".engine", ".plan", ".trt")


def needs_tensorrt(what: str, instead: str) -> UsageError:
    """The one message for commands that need real TensorRT (exit 2): what, and what to run instead."""
    return UsageError(f"{what} {NEEDS_TRT}, which bisector does not use for this: it evaluates ONNX models (FP16 "
                      f"emulated on the CPU by default). Instead: {instead}")


def check_model(model: Path, model_type: str | None, command: str = "run") -> None:
    """Refuse, with point 9's message, models bisector cannot evaluate without TensorRT."""
    name = Path(model).name
    if model_type == "engine" or (model_type is None and Path(model).suffix in ENGINE_SUFFIXES):
        raise needs_tensorrt(
            f"{name} is a serialized TensorRT engine; running it",
            f"`bisector {command} MODEL.onnx --trt --fp16 --onnxrt` on the ONNX model the engine was built from "
            f"(with --backend tensorrt to build real engines where TensorRT is installed), or `polygraphy {command} "
            f"{name} ...` on a machine with TensorRT.")
    if model_type == "trt-network-script" or (model_type is None and Path(model).suffix == ".py"):
        raise needs_tensorrt(
            f"{name} is a TensorRT network script (it builds the network with the TensorRT API); running it",
            "give the ONNX model it parses and set the precisions with --layer-precisions NAME:float32 or "
            "--trt-npps SCRIPT (postprocess scripts run on a recorded network, no TensorRT needed).")
    if model_type not in (None, "onnx", "onnx-like"):
        raise UsageError(f"--model-type {model_type}: bisector evaluates ONNX models only; export the model to ONNX")


@dataclass
class RunnerResult:
    name: str
    precision: str  # fp32 | fp16 | bf16 | unknown
    outputs: list[dict[str, np.ndarray]]
    runtimes: list[float]
    provenance: dict[str, Any] = field(default_factory=dict)


@dataclass
class PairResult:
    """One runner compared with the reference, per iteration: every tensor both returned."""

    runner: str
    reference: str
    iterations: list[dict[str, OutputComparison]]
    reasons: list[dict[str, str]]  # --compare-func indices: why an output failed

    @property
    def passed(self) -> bool:
        return all(c.passed for it in self.iterations for c in it.values()) and all(self.iterations)


@dataclass
class PolyRunResult:
    runners: list[RunnerResult]
    pairs: list[PairResult]
    invalid: list[str]  # --validate findings
    no_effect: dict[str, Any]
    report: list[str]
    catalog: Catalog
    fp32_nodes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(p.passed for p in self.pairs) and not self.invalid


def polyrun(model: str | Path, fp32: Iterable[str] = (), *, constraints: str | Path | None = None,
            precision: str | None = None, runners: Runners, comparison: Comparison | None = None,
            trt_builder: TrtBuilder | None = None, save_outputs: str | Path | None = None,
            inputs: Inputs | None = None, tolerances: Tolerances | None = None, backend: BackendChoice | None = None,
            cache: Cache | None = None) -> PolyRunResult:
    """Polygraphy's `run` for the runners in `runners`; `precision` (fp16, bf16 or None = FP32) is the --trt
    runner's. Returns the runners' outputs, the comparisons with the reference and a Polygraphy-style report."""
    from bisector.app.job import feeds_for

    inputs, tolerances = inputs or Inputs(), tolerances or Tolerances()
    backend, comparison, trt_builder = backend or BackendChoice(), comparison or Comparison(), trt_builder or TrtBuilder()
    check_model(Path(model), runners.model_type)
    if not Path(model).is_file():
        raise UsageError(f"model not found: {model}")
    catalog = Catalog.load(Path(model))
    check_comparable_outputs(catalog.model.graph, catalog.tensor_types)
    report: list[str] = []
    no_effect = _no_effect(backend, runners, trt_builder, report)
    # Polygraphy's checks exactly: the search's headroom (--margin) is not part of a Polygraphy comparison.
    tol = dataclasses.replace(tolerances.tolerance(), margin=1.0)

    feeds_list, _info = feeds_for(catalog, inputs)
    all_tensors = [t for n in catalog.model.graph.node if n.op_type != "Constant" for t in n.output if t]
    results: list[RunnerResult] = []

    # The trt runner's plan: FP32 unless a reduced precision is enabled; layers named FP32 stay FP32.
    fp32_nodes = fp32_from_flags(catalog, fp32, constraints, runners, precision)

    reference: RunnerResult | None = None
    if runners.onnxrt:
        names = _excluded(_wanted(catalog, runners.onnx_outputs, all_tensors, "--onnx-outputs"),
                          runners.onnx_exclude_outputs)
        reference = _run_onnxrt(catalog, feeds_list, names)
        results.append(reference)
    loaded: RunnerResult | None = None
    if inputs.load_outputs is not None:
        loaded = _load_outputs(catalog, inputs.load_outputs, runners, len(feeds_list))
    if runners.trt:
        names = _excluded(_wanted(catalog, runners.trt_outputs, all_tensors, "--trt-outputs"),
                          runners.trt_exclude_outputs)
        results.append(_run_trt(catalog, feeds_list, names, runners.trt_outputs == ["*"], precision, fp32_nodes,
                                backend, report))
    for r in results:
        total = sum(r.runtimes) * 1e3
        report.append(f"[I] {r.name} | Completed {len(r.runtimes)} iteration(s) in {total:.4g} ms | "
                      f"Average inference time: {total / max(len(r.runtimes), 1):.4g} ms.")

    invalid = _validate(results, report) if comparison.validate else []

    # Polygraphy compares each run with the next, the later one the reference (reldiff divides by it), loaded
    # outputs last: `--trt --onnxrt --load-outputs F` is trt vs onnxrt, then onnxrt vs F. The trt runner is
    # always compared with the FP32 reference (onnxrt, else the loaded file), whatever order the flags come in.
    pairs: list[PairResult] = []
    order = {t: i for i, t in enumerate([*catalog.input_names, *all_tensors])}
    trt = next((r for r in results if r is not reference), None)
    if trt is not None and (reference or loaded) is not None:
        pairs.append(_compare_runners(trt, reference or loaded, tol, comparison, order, report))
    if reference is not None and loaded is not None:
        pairs.append(_compare_runners(reference, loaded, tol, comparison, order, report))
    if not results and loaded is None:
        log.warning("no runner selected (--onnxrt, --trt) and nothing loaded: nothing to do")

    if save_outputs is not None:
        from bisector.files import write_text_atomic
        from bisector.model.polyjson import run_results_many

        write_text_atomic(Path(save_outputs), run_results_many(
            [(r.name, r.outputs, r.runtimes, r.provenance) for r in results]))
        report.append(f"[I] Saving inference results to {save_outputs}")
    return PolyRunResult(results, pairs, invalid, no_effect, report, catalog, sorted(fp32_nodes))


# ---- pieces -------------------------------------------------------------------------------------------------------
TRT_ONLY_BACKEND_FLAGS = (("tactic_sources", "--tactic-sources"), ("builder_optimization_level",
                          "--builder-optimization-level"), ("load_timing_cache", "--load-timing-cache"),
                          ("save_timing_cache", "--save-timing-cache"), ("save_engines", "--save-engines"))


def _no_effect(backend: BackendChoice, runners: Runners, trt_builder: TrtBuilder, report: list[str]) -> dict[str, Any]:
    """TensorRT-only flags given: recorded, and reported once as having no effect on emulate."""
    given = dict(trt_builder.given())
    for attr, flag in TRT_ONLY_BACKEND_FLAGS:
        v = getattr(backend, attr)
        if v not in (None, [], ()):
            given[flag] = v if not isinstance(v, Path) else str(v)
    if runners.tf32:
        given["--tf32"] = True
    if backend.precision_constraints != "obey":
        given["--precision-constraints"] = backend.precision_constraints
    if not given:
        return {}
    shown = ", ".join(f"{k} {' '.join(map(str, v)) if isinstance(v, list) else v}" if v is not True else k
                      for k, v in given.items())
    if backend.backend == "emulate":
        message = (f"TensorRT-only option(s) recorded, no effect on --backend emulate: {shown} (emulate applies "
                   f"the requested layer precisions exactly, as `obey` would)")
    else:
        wired = {"--tactic-sources", "--builder-optimization-level", "--load-timing-cache", "--save-timing-cache",
                 "--save-engines", "--precision-constraints"}
        rest = {k: v for k, v in given.items() if k not in wired}
        if not rest:
            return given
        message = f"option(s) recorded but not passed to --backend {backend.backend}: {', '.join(rest)}"
    log.warning(message)
    return given


def fp32_from_flags(catalog: Catalog | str | Path, fp32: Iterable[str], constraints, runners: Runners,
                    precision: str | None) -> set[str]:
    """The FP32 node set that --fp32, --constraints, --layer-precisions and --trt-npps ask for (candidates only)."""
    from bisector.artifacts.constraints import Constraints

    if not isinstance(catalog, Catalog):
        catalog = Catalog.load(Path(catalog))
    wanted = set(fp32)
    if constraints is not None:
        wanted |= set(Constraints.read(Path(constraints)).fp32_nodes)
    unknown = catalog.unknown(sorted(wanted))
    if unknown:
        raise UsageError(f"node(s) not in the model: {unknown}")
    if runners.layer_precisions:
        from bisector.backends.trt_layers import layer_precisions_to_plan

        wanted |= set(layer_precisions_to_plan(catalog, runners.layer_precisions))
    for script in runners.trt_npps:
        from bisector.backends.trt_recording import run_postprocess_script

        wanted |= set(run_postprocess_script(script, catalog))
    if precision is None and (runners.layer_precisions or runners.trt_npps) and runners.trt:
        log.warning("--layer-precisions/--trt-npps without --fp16 or --bf16: the --trt runner builds FP32, as "
                    "TensorRT does without a reduced-precision flag")
    return {n for n in wanted if n in catalog.candidates}


def _wanted(catalog: Catalog, marked: list[str] | None, all_tensors: list[str], flag: str) -> list[str]:
    if marked is None:
        return list(catalog.output_names)
    if marked == ["*"]:
        return list(dict.fromkeys([*all_tensors, *catalog.output_names]))
    known = set(all_tensors) | set(catalog.input_names) | set(catalog.output_names)
    unknown = [t for t in marked if t not in known]
    if unknown:
        raise UsageError(f"{flag}: no tensor named {', '.join(repr(t) for t in unknown)} in {catalog.path.name}")
    return list(marked)


def _excluded(names: list[str], exclude: list[str] | None) -> list[str]:
    return [t for t in names if t not in set(exclude or ())]


def _run_onnxrt(catalog: Catalog, feeds_list: Sequence[Feeds], names: list[str]) -> RunnerResult:
    from onnx import helper

    from bisector.model.polyjson import runner_name

    model = catalog.model
    extra = [t for t in names if t not in catalog.output_names and t not in catalog.input_names]
    if extra:
        import copy

        model = copy.deepcopy(model)
        for t in extra:
            model.graph.output.append(helper.make_empty_tensor_value_info(t))
    opts = ort_pool.session_options()
    opts.log_severity_level = 3
    try:
        session = ort_session(model, catalog.weight_arrays, opts, ["CPUExecutionProvider"])
    except Exception as exc:
        raise UsageError(f"ONNX Runtime cannot load {catalog.path}: {exc}") from None
    outs, runtimes = [], []
    fetch = [t for t in names if t not in catalog.input_names]
    for i, feeds in enumerate(feeds_list):
        t0 = time.perf_counter()
        try:
            values = session.run(fetch, dict(feeds))
        except Exception as exc:
            raise UsageError(f"ONNX Runtime failed on input set {i}: {exc}") from None
        runtimes.append(time.perf_counter() - t0)
        got = dict(zip(fetch, values))
        outs.append({t: (feeds[t] if t in catalog.input_names else got[t]) for t in names})
    return RunnerResult(runner_name("onnxrt-runner"), "fp32", outs, runtimes,
                        {"precision": "fp32", "role": "reference", "runner": "onnxruntime CPUExecutionProvider"})


def _run_trt(catalog: Catalog, feeds_list: Sequence[Feeds], names: list[str], mark_all: bool, precision: str | None,
             fp32_nodes: set[str], backend: BackendChoice, report: list[str]) -> RunnerResult:
    from bisector.backends import backend_factory
    from bisector.fp16.plan import Plan
    from bisector.model.polyjson import runner_name

    extra = {"storage": precision} if precision == "bf16" else {}
    if precision == "bf16" and backend.backend != "emulate":
        raise UsageError(f"--bf16 is emulated only (--backend emulate), not on --backend {backend.backend}")
    if set(names) - set(catalog.output_names) and backend.backend != "emulate":
        raise UsageError(f"--trt-outputs with intermediate tensors needs --backend emulate (--backend "
                         f"{backend.backend} exposes only graph outputs)")
    made = backend_factory(backend.backend, **backend.backend_options(backend_input_shapes(feeds_list), **extra))()
    made.open(catalog)
    plan = (Plan(frozenset(fp32_nodes), catalog.candidates) if precision else Plan.all_fp32(catalog.candidates))
    what = (f"{precision.upper()} storage, {len(plan.fp32)} of {len(catalog.candidates)} candidate node(s) FP32"
            + (f" ({', '.join(sorted(plan.fp32))})" if plan.fp32 and len(plan.fp32) <= 8 else "")
            if precision else "FP32 (no --fp16/--bf16)")
    name = runner_name("trt-runner")
    report.append(f"[I] {name} | --backend {made.name}: {what}")
    outs, runtimes = [], []
    try:
        for feeds in feeds_list:
            t0 = time.perf_counter()
            if mark_all:
                got = made.run_all(plan, feeds)  # type: ignore[attr-defined]
                values = {t: np.asarray(got[t]) for t in names if t in got}
            else:
                got = made.run(plan, feeds, [t for t in names if t not in catalog.input_names])
                values = {t: (feeds[t] if t in catalog.input_names else np.asarray(got[t])) for t in names}
            runtimes.append(time.perf_counter() - t0)
            outs.append(values)
    finally:
        made.close()
    return RunnerResult(name, precision or "fp32", outs, runtimes,
                        {"precision": precision or "fp32", "role": "reduced" if precision else "trt-fp32",
                         "backend": made.name, "fp32_nodes": sorted(plan.fp32) if precision else "all"})


def backend_input_shapes(feeds_list: Sequence[Feeds]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(np.shape(v)) for k, v in feeds_list[0].items()} if feeds_list else {}


def _load_outputs(catalog: Catalog, path: Path | list[Path], runners: Runners, n_sets: int) -> RunnerResult:
    from bisector.model.golden import check_declared
    from bisector.model.polyjson import load_golden_runner

    name, outs, precision = load_golden_runner(path, runners.golden_runner, runners.allow_reduced_golden)
    if precision == "unknown":
        log.warning("--load-outputs %s: runner %s does not say in which precision it ran; using it as golden "
                    "because it was named", path, name)
    if len(outs) < n_sets:
        raise UsageError(f"--load-outputs {path}: {len(outs)} iteration(s) for {n_sets} input set(s)")
    for i, o in enumerate(outs[:n_sets]):
        check_declared(catalog, o, f"--load-outputs {path} (runner {name}, iteration {i})")
    log.info("golden outputs: runner %s of %s", name, path)
    shown = ", ".join(map(str, path)) if isinstance(path, list) else str(path)
    return RunnerResult(name, precision, outs[:n_sets], [0.0] * n_sets, {"precision": precision, "file": shown})


def _validate(results: Sequence[RunnerResult], report: list[str]) -> list[str]:
    found = []
    for r in results:
        for i, outs in enumerate(r.outputs):
            for name, a in outs.items():
                n_nan, n_inf = non_finite(a)
                if n_nan or n_inf:
                    found.append(f"{r.name} | iteration {i} | output {name!r}: {n_nan} NaN, {n_inf} Inf")
                    report.append(f"[E] {r.name} | Output: {name!r} | Invalid values: {n_nan} NaN, {n_inf} Inf "
                                  f"(--validate)")
    report.append("[E] FAILED | Validation" if found else "[I] PASSED | Output Validation")
    return found


def _compare_runners(other: RunnerResult, golden: RunnerResult, tol, comparison: Comparison,
                     order: Mapping[str, int], report: list[str]) -> PairResult:
    from bisector.artifacts.polyreport import format_pair_output, format_summary

    report.append(f"[I] Accuracy Comparison | {other.name} vs. {golden.name}")
    iterations: list[dict[str, OutputComparison]] = []
    reasons: list[dict[str, str]] = []
    for i, (outs, gold) in enumerate(zip(other.outputs, golden.outputs)):
        if len(other.outputs) > 1:
            report.append(f"[I]     Iteration: {i}")
        common = sorted((t for t in outs if t in gold), key=lambda t: order.get(t, len(order)))
        cmp: dict[str, OutputComparison] = {}
        why: dict[str, str] = {}
        if not common:
            report.append(f"[E]     No common outputs between {other.name} ({sorted(outs)}) and {golden.name} "
                          f"({sorted(gold)})")
            iterations.append({})
            reasons.append({})
            continue
        for t in common:
            a, g = np.asarray(outs[t]), np.asarray(gold[t])
            if a.shape != g.shape and "file" in golden.provenance:
                raise UsageError(f"--load-outputs {golden.provenance['file']} (runner {golden.name}): output {t!r} has "
                                 f"shape {list(g.shape)}, {other.name} gives {list(a.shape)}; the golden outputs come "
                                 f"from another model or other input shapes")
            if comparison.compare_func == "indices":
                ok, reason = indices_match(a, g, comparison.index_tolerance)
                c = compare_output(t, a, g, tol, keep_diff=False) if a.shape == g.shape else \
                    compare_output(t, a, g, tol)
                c.passed, c.stat = ok, f"indices (index tolerance {comparison.index_tolerance})"
                c.reason = reason
                why[t] = reason
                report.append(f"[I]     Comparing Output: '{one_line(t)}' with index tolerance {comparison.index_tolerance}")
                report.append(f"[{'I' if ok else 'E'}]         {'PASSED' if ok else 'FAILED'} | Output: '{t}'"
                              + (f" | {reason}" if reason else ""))
            else:
                a_cmp, g_cmp = _same_infinities_zeroed(a, g) if comparison.infinities_compare_equal else (a, g)
                c = compare_output(t, a_cmp, g_cmp, tol, keep_diff=True)
                report.extend(format_pair_output(t, a, g, c, other.name, golden.name, tol.quantile))
                c.absdiff = None
            cmp[t] = c
            if not c.passed and comparison.fail_fast:
                report.append("[E]     --fail-fast: stopping at the first mismatched output")
                break
        bad = [t for t, c in cmp.items() if not c.passed]
        if bad:
            report.append(f"[E]     FAILED | Mismatched outputs: {bad}")
        else:
            report.append(f"[I]     PASSED | All outputs matched | Outputs: {list(cmp)}")
        iterations.append(cmp)
        reasons.append(why)
        if bad and comparison.fail_fast:
            break
    pair = PairResult(other.name, golden.name, iterations, reasons)
    report.append(format_summary(pair, len(other.outputs)))
    return pair


def _same_infinities_zeroed(a: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Polygraphy's --infinities-compare-equal: where both hold the same +-inf the absdiff is 0 (and so the
    reldiff, 0 / inf), not NaN; both values are set to 0 there, which gives exactly that."""
    if a.shape != g.shape or not (np.issubdtype(a.dtype, np.floating) and np.issubdtype(g.dtype, np.floating)):
        return a, g
    same = np.isinf(a) & (a == g)
    if not same.any():
        return a, g
    return np.where(same, 0, a).astype(a.dtype), np.where(same, 0, g).astype(g.dtype)


def gen_script(path: str | Path, argv: Sequence[str]) -> Path:
    """Polygraphy's `--gen-script`: a Python script that reruns `bisector ARGV` (without --gen-script) through
    bisector's entry point."""
    from bisector.files import write_text_atomic

    keep, skip = [], False
    for tok in argv:
        if skip:
            skip = False
            continue
        if tok == "--gen-script":
            skip = True
            continue
        if tok.startswith("--gen-script="):
            continue
        keep.append(tok)
    text = ("#!/usr/bin/env python3\n"
            f"# Generated by: bisector {' '.join(argv)}\n"
            "# Reproduces that run (Polygraphy's --gen-script, for bisector).\n"
            "import sys\n\nfrom bisector.cli.main import main\n\n"
            f"if __name__ == '__main__':\n    sys.exit(main({keep!r}))\n")
    write_text_atomic(Path(path), text)
    Path(path).chmod(0o755)
    return Path(path)
