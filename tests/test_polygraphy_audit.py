"""Polygraphy-compatibility audit: verdicts, files and flags that differed from the real polygraphy package."""

from __future__ import annotations

import numpy as np
import pytest

from bisector.compare import Tolerance, compare_output
from bisector.values import PerOutput


def polygraphy_passes(actual: np.ndarray, golden: np.ndarray, **kw) -> bool:
    """Polygraphy's own verdict (SimpleCompareFunc, golden second as `--load-outputs` puts it)."""
    from polygraphy.comparator import CompareFunc, IterationResult

    func = CompareFunc.simple(**kw)
    out = func(IterationResult({"y": actual}, runner_name="a"), IterationResult({"y": golden}, runner_name="b"))
    return bool(out["y"])


def bisector_passes(actual: np.ndarray, golden: np.ndarray, atol=1e-5, rtol=1e-5, check_error_stat="elemwise"):
    tol = Tolerance(atol=PerOutput(atol), rtol=PerOutput(rtol), stat=PerOutput(check_error_stat))
    return compare_output("y", actual, golden, tol)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("stat", ["elemwise", "max", "mean", "median"])
def test_integer_outputs_compare_exactly_as_polygraphy(dtype, stat):
    """Integers were cast to float32: above 2**24 different values compared equal, so an exact check
    (--atol 0 --rtol 0) passed where Polygraphy fails; and a zero integer golden got the float epsilon."""
    golden = np.array([1, 2**25 + 1, 7, 2**30], dtype)
    actual = np.array([1, 2**25, 7, 2**30], dtype)
    for a, g, kw in ((actual, golden, {"atol": 0.0, "rtol": 0.0}), (golden, golden, {"atol": 0.0, "rtol": 0.0}),
                     (np.array([0, 2], dtype), np.array([0, 0], dtype), {"atol": 0.0, "rtol": 1e30}),
                     (np.array([0, 0], dtype), np.array([0, 0], dtype), {"atol": 0.0, "rtol": 0.0})):
        want = polygraphy_passes(a, g, check_error_stat=stat, **kw)
        got = bisector_passes(a, g, check_error_stat=stat, **kw)
        assert got.passed == want, (a, g, kw, stat)
    c = bisector_passes(actual, golden, atol=0.0, rtol=0.0)
    assert c.required_abs == 1.0 and c.mismatches == 1
