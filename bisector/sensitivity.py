"""Per-node FP16 sensitivity scores, cheap: no search, a fixed number of passes over the model.

For every candidate node `X` (the emulate backend's rules, DESIGN §4):

- **local**: `X` alone runs FP16, fed with the golden FP32 tensors. It reads its float data inputs rounded
  (activations round to nearest, inf beyond ±65504; weights clamp), runs once, and stores its outputs rounded.
  Its outputs are compared with the FP32 reference outputs. The input rounding is part of this score, so a
  consumer that only fails because it reads an overflowing or cancelling input (`planted_attenuate` reading
  `planted_gain`'s ±3e4·h, `planted_offset_sub` reading h+20000) scores high by itself.
- **downstream** (one step of propagation): every consumer `Y` of `X`'s outputs runs *FP32* on `X`'s FP16
  outputs (everything else golden), and `Y`'s outputs are compared with the reference. This is what blames the
  *producer* of a tensor whose rounding a consumer amplifies: `planted_offset_add`'s own output is only 4e-4
  off relatively (h+20000 stored in FP16), but `planted_offset_sub` turns that into an error of up to 8 on
  values in [0, 1]. A longer propagation (the whole forward cone of `X`) would be one emulated evaluation per
  node, which is exactly the cost this module avoids.

score = max(local, downstream), each in units of the tolerance: for `elemwise` the largest per-element
min(absdiff/atol, reldiff/rtol) over the node's float outputs (> 1 means that tensor alone would fail the check
the user asked for, applied to an intermediate tensor); for mean/median/max/quantile the smaller of
statistic(absdiff)/atol and statistic(reldiff)/rtol. An element that became inf or NaN where the reference is
finite saturates the score at ``SATURATED`` × (1 + affected fraction); finite scores are capped below it. Over
several input sets the largest score wins and counts add up. Overflow (finite → inf), underflow (nonzero → 0)
and NaN counts are reported per tensor, for the rounded inputs and the outputs of the local run.

Cost: the local runs of all candidates are one ORT session run (copies of the nodes reading Cast-pair-rounded
inputs), the downstream consumers another; then one comparison per tensor. Measured in docs/benchmarks.md
("Profile cost"): 9-13 emulated evaluations warm — more than the ~5 FP32 inferences once aimed for, because the
comparisons of large tensors are several passes over memory each.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import onnx

from bisector.backends.emulate.executor import Overlay
from bisector.compare import EPSILON, Tolerance, compare_output
from bisector.errors import UsageError
from bisector.fp16.points import Read, RoundingPoints, rounding_points
from bisector.model.catalog import Catalog
from bisector.model.graph import has_subgraph, nonempty

SCHEMA_VERSION = 1
SATURATED = 1e9  # scores at or above this: an inf/NaN appeared where FP32 is finite
_VALUE_BLIND = frozenset({"Shape", "Size"})  # consumers that read only a tensor's shape


# ---- one tensor ------------------------------------------------------------------------------------------------
def tensor_score(actual: np.ndarray, golden: np.ndarray, tolerance: Tolerance, name: str = "") -> float:
    """How far `actual` is from `golden`, in units of the tolerance that would apply to a tensor called `name`."""
    return judge(actual, golden, tolerance, name)[0]


def judge(actual: np.ndarray, golden: np.ndarray, tolerance: Tolerance, name: str = "",
          counts: bool = True) -> tuple[float, dict[str, int] | None]:
    """(score, counts) of one tensor against its reference, in few passes over memory (see the module note).

    counts: overflow (finite -> inf), underflow (nonzero -> 0), NaN (not NaN -> NaN) and size; None when not
    asked for. A score of exactly 0 means the tensors are equal.
    """
    if actual.shape != golden.shape:
        return SATURATED * 2, ({**_NO_COUNTS, "size": int(actual.size)} if counts else None)
    if not (golden.dtype.kind == "f" and actual.dtype.kind == "f"):
        r = compare_output(name, actual, golden, tolerance)
        return _finite_score(r.excess, 1.0 if r.mismatches else 0.0), ({**_NO_COUNTS, "size": int(actual.size)} if counts else None)
    if actual.size == 0:
        return 0.0, ({**_NO_COUNTS, "size": 0} if counts else None)
    # at least 1-d: numpy turns 0-d results into scalars, which the in-place ops below cannot write into
    a = np.atleast_1d(actual.astype(np.float32, copy=False))
    g = np.atleast_1d(golden.astype(np.float32, copy=False))
    with np.errstate(all="ignore"):
        d = np.empty(a.shape, np.float32)  # an array even for 0-d tensors, so the in-place ops below work
        np.subtract(a, g, out=d)
        np.abs(d, out=d)
        top = float(d.max())
        finite = math.isfinite(top)
        c = None
        if counts:
            c = tensor_counts(a, g, assume_finite=finite)
        if top == 0:
            return 0.0, c
        if not finite:  # an inf or NaN somewhere: count those FP32 does not have
            same = (a == g) | (np.isnan(a) & np.isnan(g))
            n_bad = int(np.count_nonzero(~same & ~(np.isfinite(a) & np.isfinite(g))))
            if n_bad:
                return SATURATED * (1.0 + n_bad / a.size), c
            d[same] = 0.0
        stat, atol, rtol = tolerance.stat.get(name), tolerance.atol.get(name), tolerance.rtol.get(name)
        if stat == "elemwise":
            # per element min(absdiff/atol, reldiff/rtol) == absdiff / max(atol, rtol*|golden|)
            if atol <= 0 and rtol <= 0:
                return SATURATED * 0.999, c
            den = np.abs(g)
            np.maximum(den, np.float32(EPSILON), out=den)
            den *= np.float32(rtol)
            np.maximum(den, np.float32(atol), out=den)
            np.divide(d, den, out=d)
            return _finite_score(float(d.max())), c
    r = compare_output(name, a, g, tolerance)
    return _finite_score(r.excess), c


def _finite_score(value: float, nonfinite_fraction: float = 0.0) -> float:
    if math.isnan(value) or math.isinf(value):
        return SATURATED * (1.0 + nonfinite_fraction)
    return min(float(value), SATURATED * 0.999)


_NO_COUNTS = {"overflow": 0, "underflow": 0, "nan": 0}


def rounding_counts(value: np.ndarray, is_weight: bool = False) -> dict[str, int]:
    """What storing `value` in FP16 does to it, counted without converting it: overflow (finite values from
    65520 up become inf; a weight is clamped instead, counted all the same), underflow (nonzero values below
    2^-25 become 0; a weight is lifted to 2^-24 instead, not counted)."""
    with np.errstate(all="ignore"):
        mag = np.abs(value)
        finite = np.isfinite(mag)
        if is_weight:  # clamped beyond ±65504 (65504 itself is exact)
            overflow = int(np.count_nonzero(finite & (mag > np.float32(65504.0))))
        else:  # round-to-nearest reaches inf from 65520 up
            overflow = int(np.count_nonzero(finite & (mag >= np.float32(65520.0))))
        underflow = 0 if is_weight else int(np.count_nonzero((mag > 0) & (mag <= np.float32(2.0**-25))))
    return {"overflow": overflow, "underflow": underflow, "nan": 0, "size": int(value.size)}


def tensor_counts(actual: np.ndarray, golden: np.ndarray, assume_finite: bool = False) -> dict[str, int]:
    """overflow (finite -> inf), underflow (nonzero -> 0) and NaN (not NaN -> NaN) element counts, and size.

    `assume_finite`: the caller knows `actual` has no inf/NaN (saves a pass)."""
    if actual.dtype.kind != "f" or actual.shape != golden.shape:
        return {**_NO_COUNTS, "size": int(actual.size)}
    with np.errstate(all="ignore"):
        zero = actual == 0
        underflow = int(np.count_nonzero(zero & (golden != 0) & np.isfinite(golden))) if zero.any() else 0
        if assume_finite or np.isfinite(actual).all():
            return {"overflow": 0, "underflow": underflow, "nan": 0, "size": int(actual.size)}
        finite_g = np.isfinite(golden)
        return {
            "overflow": int(np.count_nonzero(finite_g & np.isinf(actual))),
            "underflow": underflow,
            "nan": int(np.count_nonzero(np.isnan(actual) & ~np.isnan(golden))),
            "size": int(actual.size),
        }


# ---- the profile -----------------------------------------------------------------------------------------------
def compute_scores(
    catalog: Catalog,
    backend: Any,
    feeds_list: Sequence[Mapping[str, np.ndarray]],
    tolerance: Tolerance,
    downstream: bool = True,
) -> list[dict]:
    """One record per candidate, sorted by score (highest first, ties in topological order).

    `backend` must offer the emulate backend's `reference(feeds)` and `run_node(fp16, node, tensors)`
    (`EmulateBackend`, opened on `catalog`). Each record: name, op, index (topological position among the
    candidates), score, local, downstream, via (the consumer that gave the downstream score), overflow,
    underflow, nan (totals over the tensors), tensors {name: {role, overflow, underflow, nan, size}}.
    """
    if not (hasattr(backend, "reference") and hasattr(backend, "run_node")):
        raise UsageError(f"profile needs the emulate backend (got {getattr(backend, 'name', backend)!r})")
    if not feeds_list:
        raise UsageError("profile needs at least one input set")
    consumers = _consumers(catalog)
    alone = {name: rounding_points(catalog, (name,)) for name in catalog.candidates}  # each candidate alone FP16
    records: dict[str, dict] = {}
    for index, name in enumerate(catalog.candidates):
        node = catalog.nodes[name]
        records[name] = {"name": name, "op": node.op_type, "index": index, "score": 0.0, "local": 0.0,
                         "downstream": 0.0, "via": None, "overflow": 0, "underflow": 0, "nan": 0, "tensors": {}}
    for feeds in feeds_list:
        ref = backend.reference(feeds)
        read_counts: dict[str, dict[str, int]] = {}
        for name in catalog.candidates:
            for t, idx in catalog.reads(name):
                read = alone[name].read(name, idx, t, is_float=ref[t].dtype == np.float32)
                if read is Read.EXACT:
                    continue  # not data: never rounded
                counts = read_counts.get(t)  # the same rounding for every reader (weights: the same clamp)
                if counts is None:
                    counts = read_counts[t] = rounding_counts(ref[t], is_weight=read is Read.WEIGHT)
                _add_counts(records[name], t, "input", counts)
        local = _local_outputs(catalog, backend, ref, alone)
        changed_by: dict[str, dict[str, np.ndarray]] = {}
        for name, outs in local.items():
            rec = records[name]
            for o, v in outs.items():
                score, counts = judge(v, ref[o], tolerance, o)
                _add_counts(rec, o, "output", counts)
                rec["local"] = max(rec["local"], score)
                if score != 0:
                    changed_by.setdefault(name, {})[o] = v
        if not downstream or not changed_by:
            continue
        for (name, consumer), theirs in _downstream_outputs(catalog, backend, ref, changed_by, consumers).items():
            rec = records[name]
            # a consumer's sequence output (SplitToSequence, pinned) is no tensor to judge: its tensors are judged
            # where a reader takes them out, one consumer further than this score looks
            s = max((judge(v, ref[o], tolerance, o, counts=False)[0] for o, v in theirs.items()
                     if not isinstance(v, (list, tuple))), default=0.0)
            if s > rec["downstream"]:
                rec["downstream"], rec["via"] = s, consumer
    out = []
    for rec in records.values():
        rec["score"] = max(rec["local"], rec["downstream"])
        for t in rec["tensors"].values():
            for k in ("overflow", "underflow", "nan"):
                rec[k] += t[k]
        out.append(rec)
    out.sort(key=lambda r: (-r["score"], r["index"]))
    for rank, rec in enumerate(out, 1):
        rec["rank"] = rank
    return out


def _local_outputs(catalog: Catalog, backend: Any, ref: Mapping[str, np.ndarray],
                   alone: Mapping[str, RoundingPoints]) -> dict[str, dict[str, np.ndarray]]:
    """Every candidate alone in FP16 on golden inputs, all in ONE session run: a copy of each candidate reading
    and storing as its one-node plan's rounding points say (the executor's Cast pairs and converted weights).
    One session build and one run instead of one per node (per-node session builds dominated the profile's cost)."""
    single = [n for n in catalog.candidates if has_subgraph(catalog.nodes[n])]
    batched = [catalog.nodes[n] for n in catalog.candidates if n not in single]
    result = {n: backend.run_node(frozenset((n,)), n, ref) for n in single}
    if not batched:
        return result
    executor = backend.executor
    specs = [executor.spec(node, alone[node.name], ref) for node in batched]
    nodes, weights = executor.compose(batched, specs, out_name=_local_name)
    inputs = {t: ref[t] for node in batched for t in catalog.node_inputs(node.name) if t not in weights
              and t not in catalog.weights}
    outputs = [(node.name, o, _local_name(node, o)) for node in batched for o in nonempty(node.output)]
    values = executor.run_graph(("profile-local",), nodes, inputs, weights, [f for _, _, f in outputs])
    for (name, o, _), v in zip(outputs, values):
        result.setdefault(name, {})[o] = v
    return result


def _local_name(node: onnx.NodeProto, output: str) -> str:
    return f"{output}@{node.name}"


def _downstream_outputs(catalog: Catalog, backend: Any, ref: Mapping[str, np.ndarray],
                        changed_by: Mapping[str, Mapping[str, np.ndarray]],
                        consumers: Mapping[str, list[str]]) -> dict[tuple[str, str], dict[str, np.ndarray]]:
    """For each candidate X whose FP16 outputs differ, each consumer running FP32 on them — one session run."""
    nodes, weights, inputs, outputs = [], {}, {}, []
    result: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    for name, outs in changed_by.items():
        for consumer in dict.fromkeys(c for o in outs for c in consumers.get(o, ())):
            node = catalog.nodes[consumer]
            if has_subgraph(node):  # outer-scope reads: run it on its own
                view = Overlay(dict(outs), ref)
                result[(name, consumer)] = backend.run_node(frozenset(), consumer, view)
                continue
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            for i, t in enumerate(node.input):
                if not t:
                    continue
                if t in outs:
                    copy.input[i] = f"{t}@{name}"
                    inputs[copy.input[i]] = outs[t]
                elif t in catalog.weights:
                    weights[t] = ref[t]
                else:
                    inputs[t] = ref[t]
            for j, o in enumerate(node.output):
                if o:
                    copy.output[j] = f"{o}@{name}>{consumer}"
                    outputs.append((name, consumer, o, copy.output[j]))
            copy.name = f"{consumer}@{name}"
            nodes.append(copy)
    if nodes:
        key = ("profile-downstream", tuple(sorted(changed_by)))
        values = backend.executor.run_graph(key, nodes, inputs, weights, [f for *_, f in outputs])
        for (name, consumer, o, _), v in zip(outputs, values):
            result.setdefault((name, consumer), {})[o] = v
    return result


def _add_counts(rec: dict, tensor: str, role: str, counts: dict[str, int]) -> None:
    prev = rec["tensors"].get(tensor)
    if prev is None:
        rec["tensors"][tensor] = {"role": role, **counts}
    else:
        for k in ("overflow", "underflow", "nan"):
            prev[k] += counts[k]


def _consumers(catalog: Catalog) -> dict[str, list[str]]:
    """tensor -> nodes that read its values (explicit data inputs or outer-scope reads), in topological order."""
    out: dict[str, list[str]] = {}
    for t, uses in catalog.consumers.items():
        names = [r.name for r, i in uses
                 if r.op_type not in _VALUE_BLIND and not (i is not None and catalog.is_parameter(r.name, i))]
        if names:
            out[t] = list(dict.fromkeys(names))
    return out


# ---- files -----------------------------------------------------------------------------------------------------
def profile_document(nodes: Iterable[dict], meta: Mapping[str, Any] | None = None) -> dict:
    """The profile.json content; non-finite numbers (a NaN required tolerance, say) become null (strict JSON)."""
    return _jsonable({"schema_version": SCHEMA_VERSION, **(dict(meta) if meta else {}), "nodes": list(nodes)})


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_profile(path: Path, nodes: Sequence[dict], meta: Mapping[str, Any] | None = None) -> Path:
    from bisector.files import write_text_atomic

    path = Path(path)
    write_text_atomic(path, json.dumps(profile_document(nodes, meta), indent=2, allow_nan=False) + "\n")
    return path


def load_scores(path: str | Path) -> dict[str, float]:
    """{node name: score} from a profile.json (for `precision --scores`). Raises UsageError on a bad file."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"scores file not found: {path}") from None
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: [[[[… nested too deep
        raise UsageError(f"{path}: not a readable profile JSON ({exc})") from None
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, list):
        raise UsageError(f"{path}: not a profile (expected {{\"nodes\": [...]}}, as `bisector profile` writes)")
    scores: dict[str, float] = {}
    for i, n in enumerate(nodes):
        try:
            scores[str(n["name"])] = float(n["score"])
        except (TypeError, KeyError, ValueError):
            raise UsageError(f"{path}: nodes[{i}] lacks a name or a numeric score") from None
    return scores
