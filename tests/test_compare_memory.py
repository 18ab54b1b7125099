"""The comparator on large outputs: the same numbers as whole-array NumPy, in bounded temporaries (issue 14)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import bisector.compare as compare
from bisector.compare import Tolerance, compare_output
from bisector.values import PerOutput


def _tol(stat: str, atol: float = 1e-3, rtol: float = 1e-3, margin: float = 1.0) -> Tolerance:
    return Tolerance(atol=PerOutput(atol), rtol=PerOutput(rtol), stat=PerOutput(stat), margin=margin)


@pytest.mark.parametrize("stat", ["elemwise", "max", "mean", "median"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int64, np.bool_])
def test_chunked_comparison_equals_one_chunk(monkeypatch, stat, dtype):
    """Chunk boundaries change nothing: the verdict JSON (mismatches, excess, summaries) is identical with chunks
    of 7 elements and with one chunk, also with NaN, inf and zero goldens in odd places."""
    rng = np.random.default_rng(3)
    if dtype is np.bool_:
        g, a = rng.random((5, 37)) > 0.5, rng.random((5, 37)) > 0.5
    else:
        g = (rng.standard_normal((5, 37)) * 3).astype(dtype)
        a = (g + rng.standard_normal((5, 37)) * 1e-3).astype(dtype)
        if np.issubdtype(dtype, np.floating):
            a[1, 3], a[4, 36], g[0, 0], g[2, 8] = np.nan, np.inf, 0, 0
    results = []
    for chunk in (7, 1 << 30):
        monkeypatch.setattr(compare, "_CHUNK", chunk)
        for tol in (_tol(stat), _tol(stat, 0.0, 1e-2, 0.9), _tol(stat, 1e-2, 0.0)):
            r = compare_output("y", a, g, tol, keep_diff=True)
            results.append((repr(r.to_json()), r.absdiff.tobytes()))
    assert results[:3] == results[3:]


@pytest.mark.parametrize("stat", ["elemwise", "max", "mean", "median"])
def test_comparing_a_large_output_keeps_temporaries_bounded(stat):
    """A 4M-element float32 output (16 MB): the comparison's own allocations stay under 1.5x the output — one
    array its size (absdiff, then reldiff written over it) and chunk-sized temporaries (the whole-array version
    peaked at about 10x: float64 ratios, masks and |golden| at once; absdiff and reldiff side by side, 2.3x)."""
    rng = np.random.default_rng(0)
    g = rng.standard_normal(4 << 20).astype(np.float32)
    a = g + rng.standard_normal(g.size).astype(np.float32) * 1e-4
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        r = compare_output("y", a, g, _tol(stat))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.size == g.size and 0 < r.excess < 1
    assert peak < 1.5 * g.nbytes, f"{peak / g.nbytes:.1f}x the output"
    kept = compare_output("y", a, g, _tol(stat), keep_diff=True)  # the caller keeps absdiff: reldiff apart
    assert kept.to_json() == r.to_json() and np.array_equal(kept.absdiff, np.abs(a - g))


@pytest.mark.parametrize("stat", ["elemwise", "max", "mean", "median"])
def test_scalar_and_empty_outputs(stat):
    """A 0-d output (a loss, a score) and an empty one compare like any other (NumPy subtracts 0-d arrays to a
    scalar, which the in-place steps must not trip on)."""
    r = compare_output("loss", np.float32(1.5).reshape(()), np.float32(1.0).reshape(()), _tol(stat))
    assert not r.passed and r.size == 1 and r.required_abs == pytest.approx(0.5) and r.excess > 1
    assert r.abs["median"] == pytest.approx(0.5) and r.rel["max"] == pytest.approx(0.5)
    same = compare_output("loss", np.float32(1.0).reshape(()), np.float32(1.0).reshape(()), _tol(stat))
    assert same.passed and same.excess == 0.0
    empty = compare_output("none", np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32), _tol(stat))
    assert empty.passed and empty.size == 0


def test_fortran_ordered_and_strided_outputs_compare_correctly(monkeypatch):
    """Layouts other than C order (a Fortran-ordered or sliced output) are compared element for element: the
    relative error is written where it is read (a flat view of a non-C array would be a copy)."""
    monkeypatch.setattr(compare, "_CHUNK", 7)
    rng = np.random.default_rng(9)
    g = rng.standard_normal((9, 13, 5)).astype(np.float32)
    a = g + np.float32(2e-3) * (rng.random(g.shape) > 0.5)
    want = compare_output("y", np.ascontiguousarray(a), np.ascontiguousarray(g), _tol("elemwise"))
    for a2, g2 in ((np.asfortranarray(a), np.asfortranarray(g)), (np.asfortranarray(a), g),
                   (a.transpose(2, 0, 1), g.transpose(2, 0, 1))):
        got = compare_output("y", a2, g2, _tol("elemwise"))
        assert got.mismatches == want.mismatches and got.excess == want.excess
        assert got.rel["max"] == want.rel["max"] and got.rel["median"] == want.rel["median"]
        assert got.rel["mean"] == pytest.approx(want.rel["mean"], rel=1e-6)


def _hostile_arrays(rng, n):
    """Arrays a bracketing median or a float32 pre-selection could get wrong: orders, ties, NaN, ±inf, tiny and
    huge values, periodic patterns a strided sample misreads."""
    x = rng.standard_normal(n)
    yield "normal", x
    yield "sorted", np.sort(x)
    yield "reversed", np.sort(x)[::-1].copy()
    yield "constant", np.full(n, 3.0)
    yield "three values", rng.integers(0, 3, n).astype(float)
    y = x.copy()
    y[n // 3] = np.nan
    yield "one NaN", y
    y = x.copy()
    y[: n // 3] = np.inf
    yield "a third +inf", y
    y = x.copy()
    y[: n // 2 + 1] = -np.inf
    yield "half -inf", y
    yield "periodic", np.tile([0, 0, 0, 1, 2, 2, 2, 9], n // 8 + 1)[:n].astype(float)
    yield "subnormal", np.abs(x) * 1e-42
    yield "huge", np.abs(x) * 1e37


@pytest.mark.parametrize("n", [999, 1000, 4096, 70001])
def test_median_is_numpys_bit_for_bit(monkeypatch, n):
    """`compare.median` (a bracketed partition) returns np.median's number bit for bit on every dtype and on
    arrays built to defeat the bracket (the fast path runs here from 64 elements, with a 256-value sample)."""
    monkeypatch.setattr(compare, "_MEDIAN_FROM", 64)
    monkeypatch.setattr(compare, "_SAMPLE", 256)
    rng = np.random.default_rng(n)
    for kind, x in _hostile_arrays(rng, n):
        for dtype in (np.float16, np.float32, np.float64):
            with np.errstate(all="ignore"):
                a = x.astype(dtype)
            got, want = compare.median(a.copy()), np.median(a.copy())
            assert np.asarray(got, dtype).tobytes() == np.asarray(want, dtype).tobytes(), (kind, dtype, got, want)


def test_median_of_a_large_output_brackets_the_middle():
    """On a 4.2 M-element output the bracket holds the middle (no fallback) and the value is np.median's."""
    rng = np.random.default_rng(0)
    a = np.abs(rng.standard_normal(4_200_001).astype(np.float32)) * np.float32(1e-3)
    calls = []
    real = np.median
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compare.np, "median", lambda *args, **kw: calls.append(1) or real(*args, **kw))
        got = compare.median(a)
    assert not calls, "fell back to np.median"
    assert np.float32(got).tobytes() == np.float32(real(a)).tobytes()


def test_excess_is_the_float64_formula_bit_for_bit():
    """`compare._excess` (float32 pre-selection, float64 at the few elements near the top) is the old float64
    formula max(min(ad/atol, rd/rtol)), NaN as inf, bit for bit: values over float32's whole range, NaN, ±inf,
    zeros, ties one ulp apart, and tolerances from 1e-300 to 1e300 and zero."""
    def old(ad, rd, atol, rtol):
        per_element = np.minimum(compare._ratio(ad, atol), compare._ratio(rd, rtol))
        return float(np.max(np.where(np.isnan(per_element), np.inf, per_element)))

    rng = np.random.default_rng(1)
    with np.errstate(all="ignore"):
        for trial in range(1500):
            size = int(rng.integers(1, 3000))
            ad = np.abs(rng.standard_normal(size) * 10.0 ** rng.integers(-45, 39)).astype(np.float32)
            rd = np.abs(rng.standard_normal(size) * 10.0 ** rng.integers(-45, 39)).astype(np.float32)
            kind = trial % 6
            if kind == 1:
                ad[rng.integers(0, size)] = np.nan
            elif kind == 2:
                ad[rng.integers(0, size)], rd[rng.integers(0, size)] = np.inf, np.inf
            elif kind == 3:
                ad[:] = 0
            elif kind == 4:  # ties and neighbours one ulp apart
                ad = np.full(size, np.float32(1e-3))
                ad[::3] = np.nextafter(np.float32(1e-3), np.float32(1))
                rd = ad * np.float32(7)
            atol = 0.0 if trial % 11 == 0 else float(10.0 ** rng.uniform(-300, 300) if trial % 5 == 0
                                                     else 10.0 ** rng.uniform(-9, 2))
            rtol = 0.0 if trial % 13 == 0 else float(10.0 ** rng.uniform(-9, 2))
            assert compare._excess(ad, rd, atol, rtol) == old(ad, rd, atol, rtol), (trial, atol, rtol)


def test_elementwise_check_on_float32_is_whole_array_numpy(monkeypatch):
    """The float32 path (one pass per chunk into reused scratch arrays: |golden| with zeros as EPSILON, the
    relative error, the mismatch count as "not within either tolerance", the excess) gives what plain whole-array
    NumPy gives for Polygraphy's formulas, with zeros, -0, NaN, ±inf and subnormals across chunk boundaries."""
    monkeypatch.setattr(compare, "_CHUNK", 1000)
    rng = np.random.default_rng(11)
    g = (rng.standard_normal(4321) * 2).astype(np.float32)
    a = (g + rng.standard_normal(g.size).astype(np.float32) * np.float32(3e-3)).astype(np.float32)
    g[[0, 999, 1000, 2500]] = 0
    g[17] = -0.0
    a[[5, 1999]] = np.nan
    a[3001], g[3002], g[3003] = np.inf, -np.inf, np.float32(1e-42)
    a[1000] = 0  # an exact zero where the golden is zero: no error (0 / EPSILON), not 0 / 0
    g_fin = np.where(np.isfinite(g), g, np.float32(1))  # the same without NaN and inf: summaries to compare
    a_fin = np.where(np.isfinite(a) & np.isfinite(g), a, g_fin)
    for a, g, atol, rtol, m in ((a, g, 1e-3, 1e-3, 1.0), (a, g, 0.0, 5e-3, 0.8), (a, g, 2e-3, 0.0, 1.0),
                                (a_fin, g_fin, 1e-3, 1e-3, 1.0), (a_fin, g_fin, 0.0, 5e-3, 1.0)):
        r = compare_output("y", a, g, _tol("elemwise", atol, rtol, m))
        with np.errstate(all="ignore"):
            ad = np.abs(a - g)
            rd = ad / np.abs(np.where(g == 0, g + compare.EPSILON, g))
            bad = ((ad > atol * m) | np.isnan(ad)) & ((rd > rtol * m) | np.isnan(rd))
            per = np.minimum(ad.astype(np.float64) / atol if atol else np.where(ad > 0, np.inf, 0.0),
                             rd.astype(np.float64) / rtol if rtol else np.where(rd > 0, np.inf, 0.0))
        assert r.mismatches == int(bad.sum()) > 0 and not r.passed
        assert r.excess == float(np.max(np.where(np.isnan(per), np.inf, per)))
        want = {"min": float(np.min(rd)), "max": float(np.max(rd)), "mean": float(np.mean(rd)),
                "median": float(np.median(rd))}
        assert repr(r.rel) == repr(want)  # (NaN here: repr compares it)
    clean = compare_output("y", g_fin + np.float32(1e-4), g_fin, _tol("elemwise", 1e-3, 1e-3))
    assert clean.passed and clean.mismatches == 0 and 0 < clean.excess < 1


@pytest.mark.parametrize("shape", [(7600, 10), (128, 1, 8210), (475, 32)])
def test_median_of_a_structured_output_brackets_the_middle(shape):
    """Outputs whose columns differ (a detector's box values, a recogniser's logits per class): the sample is
    taken at random places, so its bracket holds the middle where a stride sampling some columns only missed it
    (fell back to np.median in a third of a search's medians)."""
    rng = np.random.default_rng(3)
    cols = shape[-1]
    a = (rng.standard_normal(shape) + np.arange(cols) % 2 * 0.5).astype(np.float32)  # odd columns sit higher
    calls = []
    real = np.median
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compare, "_MEDIAN_FROM", 1 << 12)
        mp.setattr(compare.np, "median", lambda *args, **kw: calls.append(1) or real(*args, **kw))
        got = compare.median(a)
    assert not calls, "fell back to np.median"
    assert np.float32(got).tobytes() == np.float32(real(a)).tobytes()


@pytest.mark.parametrize("stat", ["elemwise", "max", "mean", "median", "quantile"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.bool_])
def test_a_lean_comparison_decides_exactly_what_a_full_one_decides(stat, dtype):
    """`lean=True` (a search's verdicts) leaves out the summaries only a report shows; everything a search reads —
    pass, excess, mismatches, required tolerances, the worst element, the differences' max — is the same number,
    also with NaN, inf and zero goldens, at margins below 1 and with a zero tolerance."""
    rng = np.random.default_rng(11)
    for trial in range(6):
        if dtype is np.bool_:
            g, a = rng.random((7, 41)) > 0.5, rng.random((7, 41)) > 0.5
        else:
            g = (rng.standard_normal((7, 41)) * 3).astype(dtype)
            a = (g + rng.standard_normal((7, 41)) * 10.0 ** -rng.integers(1, 5)).astype(dtype)
            if trial % 2:
                a[1, 3], g[0, 0], g[2, 8] = np.nan, 0, 0
            if trial == 3:
                a[4, 40] = np.inf
        for tol in (_tol(stat), _tol(stat, 0.0, 1e-2, 0.9), _tol(stat, 1e-2, 0.0), _tol(stat, 1e-4, 1e-4, 0.9)):
            full, lean = compare_output("y", a, g, tol), compare_output("y", a, g, tol, lean=True)
            assert lean.lean and not full.lean
            for field in ("passed", "mismatches", "size", "worst_index"):
                assert getattr(lean, field) == getattr(full, field), (field, stat, trial)
            for field in ("excess", "required_abs", "required_rel"):
                np.testing.assert_equal(getattr(lean, field), getattr(full, field), err_msg=f"{field} {stat} {trial}")
            np.testing.assert_equal(lean.abs["max"], full.abs["max"])
            np.testing.assert_equal(lean.rel["max"], full.rel["max"])
            assert "median" not in lean.abs and not lean.actual and lean.golden == full.golden
            assert compare.OutputComparison.from_json("y", lean.to_json()).lean  # the journal keeps the mark


def test_a_search_judges_lean_and_reports_its_final_set_judged_in_full(tmp_path):
    """Every verdict of the search is lean; the set it reports is judged again in full (`Oracle.confirm`), so the
    report's comparison has its summaries; a second run replays lean verdicts from the journal and again reports
    its final set judged in full."""
    import json

    import bisector
    from bisector.app.job import open_job
    from bisector.search.driver import run_search

    from .conftest import FIXTURES

    model = FIXTURES / "planted.onnx"
    with open_job(model, no_cache=True) as job:
        oracle = job.oracle()
        result = run_search(oracle, "auto")
        assert len(oracle.history) > 3 and all(v.lean for v in oracle.history)
        assert not result.verdict.lean and all("median" in o.abs and o.actual for o in result.verdict.outputs.values())
    for d in ("o", "o2"):  # the second run: every verdict from the journal
        r = bisector.precision(model, output_dir=tmp_path / d, cache=bisector.Cache(cache_dir=tmp_path / "c"))
        assert not r.verdict.lean
        final = json.loads((tmp_path / d / "constraints.json").read_text())["outputs"]
        assert all("median" in o["abs"] and o["actual"] and "lean" not in o for o in final.values()), final


@pytest.mark.parametrize("lean", [False, True])
def test_comparisons_after_the_first_reuse_this_threads_work_arrays(lean):
    """The command fixes glibc's mmap threshold, so every temporary from 128 KiB up was a fresh map faulted in
    page by page on every comparison (a 276 k-element output: 2.5 ms instead of 0.4). The absdiff array and the
    chunk scratch arrays are this thread's, reused: a second comparison of the same output allocates no array
    of its size, and gives the same verdict as the first; a kept absdiff is the caller's own array."""
    rng = np.random.default_rng(1)
    g = rng.standard_normal(1 << 20).astype(np.float32)
    a1 = g + rng.standard_normal(g.size).astype(np.float32) * 1e-4
    a2 = a1.copy()
    first = compare_output("y", a1, g, _tol("elemwise"), lean=lean)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        second = compare_output("y", a2, g, _tol("elemwise"), lean=lean)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert second.to_json() == first.to_json()
    assert peak < 0.25 * g.nbytes, f"{peak / g.nbytes:.2f}x the output"
    kept = compare_output("y", a1, g, _tol("elemwise"), keep_diff=True)
    again = compare_output("y", a2 * 2, g, _tol("elemwise"))  # reuses the work arrays; the kept one is apart
    assert np.array_equal(kept.absdiff, np.abs(a1 - g)) and not again.passed


def test_an_exact_integer_output_whose_golden_is_zero_has_no_excess():
    """Polygraphy's integer comparison divides by |golden| without an epsilon: an exact element whose golden is 0
    has reldiff 0 / 0 = NaN and passes on its absolute error. Its excess (the smallest tolerance scale that
    passes) is 0; it was inf (min(0, NaN)), so an int64 ArgMax output of zeros (a diacritizer's gated classes,
    PyPI text2tashkeel) made `verify` print 'pass ... inf x the tolerance' and the search leave out its headroom."""
    g = np.array([0, 0, 3, 0, 7], dtype=np.int64)
    r = compare_output("idx", g.copy(), g, _tol("elemwise", 1e-2, 1e-2, 0.9))
    assert r.passed and r.mismatches == 0 and r.excess == 0.0
    a = g.copy()
    a[1] = 2  # a real mismatch where the golden is 0: absolute error 2, relative inf
    r = compare_output("idx", a, g, _tol("elemwise", 1e-2, 1e-2, 0.9))
    assert not r.passed and r.mismatches == 1 and r.excess == pytest.approx(200.0)
    f = np.array([0.5, np.nan], dtype=np.float32)  # NaN against a finite golden still never passes
    assert compare_output("y", f, np.array([0.5, 1.0], np.float32), _tol("elemwise", 1e-2, 0.0)).excess == float("inf")


def test_the_headroom_of_a_model_with_an_exact_integer_output_is_its_float_outputs(tmp_path):
    import json

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from .conftest import main_cli

    nodes = [helper.make_node("Add", ["x", "b"], ["s"], name="add"), helper.make_node("Mul", ["s", "k"], ["y"], name="mul"),
             helper.make_node("ArgMax", ["s"], ["idx"], name="argmax", axis=1, keepdims=0)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 4]),
                           helper.make_tensor_value_info("idx", TensorProto.INT64, [8])],
                          [numpy_helper.from_array(np.array([100, 0, 0, 0], np.float32), "b"),
                           numpy_helper.from_array(np.full(4, 1.001, np.float32), "k")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert main_cli("precision", path, "--fp16", "--atol", "1e-2", "--rtol", "1e-2", "-o", tmp_path / "o", "--no-cache") == 0
    c = json.loads((tmp_path / "o" / "constraints.json").read_text())
    assert c["outputs"]["idx"]["passed"] and c["outputs"]["idx"]["excess"] == 0.0  # argmax is always 0 here
    assert c["headroom"] == pytest.approx(1 - c["outputs"]["y"]["excess"])  # was None: the int output's inf


def _fields(c: compare.OutputComparison) -> str:
    """Everything a comparison holds, NaN-safe (json spells NaN), plus the worst element's index."""
    import json

    return json.dumps([c.to_json(), c.worst_index, c.passed, c.excess], sort_keys=True, default=float)


@pytest.mark.parametrize("margin", [1.0, 0.9])
def test_many_small_outputs_judged_together_are_each_judged_as_alone(margin):
    """A search's lean comparisons of many small outputs run together (`_lean_together`): every output's
    comparison is the one `compare_output` gives it alone, field for field and bit for bit, with NaN, inf, -0.0
    and zero goldens, outputs that pass and fail, per-output tolerances (two groups and a lone one), and outputs
    the together path must leave alone (float16, int64, a mean check, a shape mismatch, one over the size limit,
    an empty one) in between."""
    rng = np.random.default_rng(7)
    for trial in range(8):
        gold, act, atol, rtol, stat = {}, {}, {}, {}, {}
        for i in range(23):
            shape = tuple(int(s) for s in rng.integers(1, 9, size=int(rng.integers(0, 4))))
            g = (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 3)).astype(np.float32)
            a = (g + rng.standard_normal(shape) * 10.0 ** -rng.integers(1, 6)).astype(np.float32)
            if g.size > 2 and i % 3 == 0:
                g.reshape(-1)[0], g.reshape(-1)[1] = 0.0, -0.0
            if g.size > 1 and i % 5 == trial % 5:
                a.reshape(-1)[-1] = [np.nan, np.inf, -np.inf, 0.0, g.reshape(-1)[-1]][trial % 5]
            if i % 7 == 6:
                a = a.astype(np.float16) if trial % 2 else a.astype(np.int64)
            name = f"out {i}"
            gold[name], act[name] = g, a
            atol[name], rtol[name] = (1e-3, 1e-3) if i % 4 else (1e-2, 0.0)
            stat[name] = "mean" if i == 9 else "elemwise"
        act["out 11"] = act["out 11"].reshape(-1)[:1] if act["out 11"].size > 1 else np.zeros(3, np.float32)
        gold["big"] = rng.standard_normal(compare._TOGETHER_MAX + 1).astype(np.float32)
        act["big"] = gold["big"] + np.float32(1e-4)
        gold["empty"], act["empty"] = np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32)
        gold["same"] = rng.standard_normal((3, 5)).astype(np.float32)
        act["same"] = gold["same"].copy()  # excess 0: `_excess_at`'s own path
        # several elements within 1e-5 of the largest float32 ratio, the largest in float64 not the first of them
        gold["ties"] = np.ones(6, np.float32)
        act["ties"] = np.array([1, 1.05, np.nextafter(np.float32(1.05), np.float32(2)), 1.05, 1, 1], np.float32)
        atol["lone"], rtol["lone"] = 5e-2, 5e-2
        gold["lone"] = rng.standard_normal(6).astype(np.float32)
        act["lone"] = gold["lone"] * np.float32(1.01)
        tol = Tolerance(atol=PerOutput(1e-3, atol), rtol=PerOutput(1e-3, rtol),
                        stat=PerOutput("elemwise", stat), margin=margin)
        together = compare.compare_outputs(act, gold, tol, lean=True)
        assert list(together) == list(gold)
        for name in gold:
            alone = compare_output(name, act[name], gold[name], tol, lean=True)
            assert _fields(together[name]) == _fields(alone), (trial, name)
        assert any(not c.passed for c in together.values()) and any(c.passed for c in together.values())


def test_outputs_judged_together_take_a_few_numpy_calls_not_a_comparison_each(monkeypatch):
    """The reason the together path exists: 60 small outputs are judged without 60 calls of `compare_output`."""
    calls = []
    real = compare.compare_output
    monkeypatch.setattr(compare, "compare_output", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    rng = np.random.default_rng(3)
    gold = {f"t{i}": rng.standard_normal((4, 16)).astype(np.float32) for i in range(60)}
    act = {k: v + np.float32(1e-4) for k, v in gold.items()}
    out = compare.compare_outputs(act, gold, _tol("elemwise"), lean=True)
    assert len(out) == 60 and all(c.passed and c.lean for c in out.values()) and not calls
    compare.compare_outputs(act, gold, _tol("elemwise"))  # a full comparison (a report's) goes one by one
    assert len(calls) == 60
