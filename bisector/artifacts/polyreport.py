"""Polygraphy's comparison text (comparator/compare.py, util.py), line for line, for `run --trt --onnxrt`."""

from __future__ import annotations

from typing import Any

import numpy as np

from bisector.compare import EPSILON, OutputComparison
from bisector.text import one_line


def _f(x: float) -> str:
    return f"{x:.5g}"


def str_stats(a: np.ndarray) -> str:
    """`mean=…, std-dev=…, var=…, median=…, min=… at (…), max=… at (…), avg-magnitude=…` as Polygraphy prints."""
    a = np.asarray(a)
    if a.size == 0:
        return "<empty>"
    f = a.astype(np.float32) if a.dtype == np.bool_ or a.dtype == np.float16 or np.issubdtype(a.dtype, np.integer) else a
    with np.errstate(all="ignore"):
        idx_min = tuple(int(i) for i in np.unravel_index(int(np.argmin(f)), f.shape)) if f.ndim else ()
        idx_max = tuple(int(i) for i in np.unravel_index(int(np.argmax(f)), f.shape)) if f.ndim else ()
        return (f"mean={_f(np.mean(f, dtype=np.float32))}, std-dev={_f(np.std(f))}, var={_f(np.var(f))}, "
                f"median={_f(np.median(f))}, min={_f(np.min(f))} at {idx_min}, max={_f(np.max(f))} at {idx_max}, "
                f"avg-magnitude={_f(np.mean(np.abs(f), dtype=np.float32))}")


def str_histogram(a: np.ndarray, hist_range: Any = None, indent: str = "") -> list[str]:
    a = np.asarray(a)
    if a.dtype == np.bool_ or a.size == 0:
        return []
    finite = a[np.isfinite(a)] if np.issubdtype(a.dtype, np.floating) else a
    if finite.size == 0:
        return []
    try:
        hist, edges = np.histogram(finite, range=hist_range)
    except (ValueError, RuntimeError):
        return []
    peak = int(hist.max())
    if not peak:
        return []
    labels = [f"{b:.3g}" for b in edges]
    w0, w1 = max(len(b) for b in labels), max(len(b) for b in labels[1:])
    lines = [f"{indent}---- Histogram ----", f"{indent}{'Bin Range':{w0 + w1 + 5}}|  Num Elems | Visualization"]
    for num, lo, hi in zip(hist, labels, labels[1:]):
        lines.append(f"{indent}({lo:<{w0}}, {hi:<{w1}}) | {int(num):10} | {'#' * int(40 * float(num) / float(peak))}")
    return lines


def _desc(a: np.ndarray) -> str:
    return f"(dtype={np.asarray(a).dtype}, shape={tuple(np.shape(a))})"


def format_pair_output(name: str, actual: np.ndarray, golden: np.ndarray, c: OutputComparison, runner: str,
                       reference: str, quantile: float | None = None) -> list[str]:
    """One output of `A vs. B`, as Polygraphy's simple comparison prints it (histograms when it fails)."""
    name = one_line(name)  # a model's output name may hold a newline: each line of the report stays one line
    lines = [f"[I]     Comparing Output: '{name}' {_desc(actual)} with '{name}' {_desc(golden)}",
             f"[I]         Tolerance: [abs={c.atol:.5g}, rel={c.rtol:.5g}] | Checking {c.stat} error"]
    if c.reason:
        lines.append(f"[E]         Will not compare outputs of different shapes: {c.reason}")
        lines.append(f"[E]         FAILED | Output: '{name}' | {c.reason}")
        return lines
    show_hist = not c.passed
    a32, g32 = _up(actual), _up(golden)
    both = np.concatenate([a32[np.isfinite(a32)].ravel(), g32[np.isfinite(g32)].ravel()]) \
        if np.issubdtype(a32.dtype, np.floating) else None
    hist_range = (float(both.min()), float(both.max())) if both is not None and both.size else None
    for who, arr in ((runner, actual), (reference, golden)):
        lines.append(f"[I]         {who}: {name} | Stats: {str_stats(arr)}")
        if show_hist:
            lines += [f"                {x}" if i else f"[I]             {x}"
                      for i, x in enumerate(str_histogram(_up(arr), hist_range))]
    absdiff = c.absdiff if c.absdiff is not None else np.abs(a32 - g32)
    if np.issubdtype(np.asarray(golden).dtype, np.integer):  # no epsilon on integer zeros (compare.py)
        g32 = np.asarray(golden)
    g_eps = np.where(g32 == 0, g32 + EPSILON, g32) if np.issubdtype(g32.dtype, np.floating) else g32
    with np.errstate(all="ignore"):
        reldiff = absdiff / np.abs(g_eps)
    lines.append(f"[I]         Error Metrics: {name}")
    note = " (requirements may be lower if both abs/rel tolerances are set)" if c.stat == "elemwise" else ""
    if c.stat == "quantile" and quantile is not None:
        note = f" (quantile={quantile:.4g})"
    lines.append(f"[I]             Minimum Required Tolerance: {c.stat} error | [abs={c.required_abs:.5g}] OR "
                 f"[rel={c.required_rel:.5g}]{note}")
    for label, diff in (("Absolute Difference", absdiff), ("Relative Difference", reldiff)):
        lines.append(f"[I]             {label} | Stats: {str_stats(diff)}")
        if show_hist:
            lines += [f"                    {x}" if i else f"[I]                 {x}"
                      for i, x in enumerate(str_histogram(diff))]
    if c.passed:
        lines.append(f"[I]         PASSED | Output: '{name}' | Difference is within tolerance "
                     f"(rel={c.rtol:.5g}, abs={c.atol:.5g})")
    else:
        lines.append(f"[E]         FAILED | Output: '{name}' | Difference exceeds tolerance "
                     f"(rel={c.rtol:.5g}, abs={c.atol:.5g})")
    return lines


def format_summary(pair: Any, n_iterations: int) -> str:
    passed = sum(1 for it in pair.iterations if it and all(c.passed for c in it.values()))
    rate = 100.0 * passed / max(n_iterations, 1)
    tag = "I" if passed == n_iterations else "E"
    return (f"[{tag}] Accuracy Summary | {pair.runner} vs. {pair.reference} | Passed: {passed}/{n_iterations} "
            f"iterations | Pass Rate: {rate:.1f}%")


def _up(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.astype(np.float32) if a.dtype in (np.float16, np.bool_) or np.issubdtype(a.dtype, np.integer) else a
