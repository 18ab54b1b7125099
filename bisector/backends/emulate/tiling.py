"""Row tiles: the part of a model around one huge intermediate tensor, run a slice of rows at a time.

An attention over every position of a 96² latent (a diffusion VAE's decoder) computes a 9216 x 9216 score matrix,
324 MB in FP32. One plain ONNX Runtime inference holds it about once (it computes the scale and the Softmax in
place where it knows the shapes). An emulated block holds it two or three times: a rounding Cast pair after each
op keeps an op's FP32 input, its output and the FP16 copy alive together (docs/benchmarks.md, "Scale,
twenty-seventh round": the search peaked at 2.58 x one inference's memory on that decoder alone).

But every op from the scores' MatMul to the MatMul that applies them (scale, Softmax along the last axis, the Cast
pairs) computes each row of its output from the same row of its input: the part is row-local. Run on a slice of
the query rows at a time it computes the same rows, and holds a slice of the scores instead of the whole. This
module finds such parts (`find_regions`) and says how to cut them (`Region.tiles`); the executor runs them
(`NodeExecutor._run_tiled`).

A region starts at a MatMul of two computed tensors (Q x Kᵀ: a weight MatMul's output grows with its input, not
past it) whose output is at least TILE_FROM_BYTES at the shapes of the first inputs the executor sees, sliced
along its first operand's rows. It grows forward through the ops whose output rows depend only on the same rows of
their sliced input (`_maps_axis`), and ends where an op reads a tensor that is not sliced the same way (a residual
Add of the full input) or mixes rows (a Reshape, a normalisation). It is used only where every tensor of
TILE_FROM_BYTES or more it computes stays inside it, and only where its tensors come to OVER_OTHERS times those of
any other block (the executor's `_tile` compares them: `footprint`). Where another block holds about as much, the
chunks a whole run of the region leaves in ONNX Runtime's arena serve that block later, and tiles only add chunks
of their own: a 64² VAE decoder (64 MB scores; 16-channel blocks at 512²) peaked at 404 MB whole and 435 MB tiled.

Same bits: ONNX Runtime's CPU MatMul computes an output row from the same row of its first operand in the same
order whatever the number of rows, once the rows are many (MLAS splits the inner dimension across threads only
where the output is small: a few thousand elements), and Softmax, the elementwise ops and the Casts work row by
row. Tiles hold TILE_BYTES of the largest tensor and at least MIN_TILE_ROWS rows. And the executor tiles a
region on every run alike (the reference and every plan), so its results never mix tiled and whole runs
(tests/test_tiling.py checks the tiled runs against whole ones on random plans).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import onnx
from onnx import shape_inference

from bisector.model.graph import is_product, weightless_copy

log = logging.getLogger("bisector")

TILE_FROM_BYTES = int(float(os.environ.get("BISECTOR_TILE_FROM_MB", "64")) * 2**20)  # 0: never tile
TILE_BYTES = 16 << 20  # of the region's largest tensor per tile
MIN_TILE_ROWS = 64  # (MLAS splits a MatMul's inner dimension across threads only for small outputs)
MAX_REGION_NODES = 64
OVER_OTHERS = 1.5  # a region is tiled where its block's footprint is this many times any other block's

# Ops that compute each output element from the elements at the same position of their inputs (numpy
# broadcasting): a slice of rows in, the same slice out, where every other input is broadcast along the axis
_ELEMENTWISE = frozenset({
    "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh", "BitShift", "Cast", "CastLike", "Ceil",
    "Celu", "Clip", "Cos", "Cosh", "Div", "Elu", "Equal", "Erf", "Exp", "Floor", "Gelu", "Greater",
    "GreaterOrEqual", "HardSigmoid", "HardSwish", "Identity", "IsInf", "IsNaN", "LeakyRelu", "Less", "LessOrEqual",
    "Log", "Max", "Mean", "Min", "Mish", "Mod", "Mul", "Neg", "Not", "Or", "Pow", "PRelu", "Reciprocal", "Relu",
    "Round", "Selu", "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Sub", "Sum", "Tan", "Tanh",
    "ThresholdedRelu", "Where", "Xor"})
_ROW_NORMALISED = frozenset({"Softmax", "LogSoftmax", "Hardmax"})


@dataclass(frozen=True)
class Region:
    """Nodes (in an order that runs) computing their outputs a slice of `entry`'s `axis` at a time."""
    nodes: tuple[str, ...]
    entry: str
    axis: int
    axes: Mapping[str, int] = field(hash=False)  # every tensor the region computes: its sliced axis
    rows_per_tile: int = MIN_TILE_ROWS
    # The shapes of the tensors it reads (weights aside) that its row-locality was shown for: a broadcast along
    # the rows holds for these. Runs on other shapes (a part of the batch) run whole.
    inputs: Mapping[str, tuple[int, ...]] = field(default_factory=dict, hash=False)
    co: Mapping[str, int] = field(default_factory=dict, hash=False)  # other inputs sliced with the entry: axis

    def tiles(self, shapes: Mapping[str, tuple[int, ...]]) -> int:
        """How many tiles a run on inputs of these `shapes` takes (1: run whole)."""
        if any(shapes.get(t) != s for t, s in self.inputs.items()):
            return 1
        rows = self.inputs[self.entry][self.axis]
        return max(1, -(-rows // self.rows_per_tile)) if rows >= 2 * self.rows_per_tile else 1


def concrete_shapes(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape as ONNX infers it for these inputs (weights without their bytes); only fully known
    shapes. Empty where inference fails."""
    light = weightless_copy(model)
    for vi in light.graph.input:
        v = feeds.get(vi.name)
        if not isinstance(v, np.ndarray) or not vi.type.HasField("tensor_type"):
            continue
        shape = vi.type.tensor_type.shape
        shape.ClearField("dim")
        for d in v.shape:
            shape.dim.add().dim_value = int(d)
    try:
        inferred = shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - no tiling then, as before
        log.debug("tiling: shape inference failed: %s", exc)
        return {}
    out: dict[str, tuple[int, ...]] = {}
    g = inferred.graph
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        t = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if t is None or not t.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
        if all(d >= 0 for d in dims):
            out[vi.name] = tuple(dims)
    for init in g.initializer:
        out[init.name] = tuple(init.dims)
    return out


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _maps_axis(node: onnx.NodeProto, sliced: Mapping[str, int], shapes: Mapping[str, tuple[int, ...]],
               opset: int, co: dict[str, int] | None = None, whole=frozenset()) -> int | None:
    """The axis of `node`'s (first) output along which it is sliced when its inputs in `sliced` are sliced
    along theirs; None where its output rows depend on more than the same rows of those inputs.

    `co` (given: filled in): an elementwise op's other input that is as long as the output along the axis (an
    attention mask, a position bias) is sliced with it, on the axis it lines up with; none read whole (`whole`:
    a MatMul's second operand) or already sliced on another axis."""
    out = node.output[0] if node.output else ""
    if node.domain not in ("", "ai.onnx") or len([o for o in node.output if o]) != 1 or out not in shapes:
        return None
    rank = len(shapes[out])
    op = node.op_type
    if op in _ELEMENTWISE:
        axis = None
        for t in node.input:
            if not t:
                continue
            if t not in shapes:
                return None
            shift = rank - len(shapes[t])
            if t in sliced:
                a = sliced[t] + shift
                if axis is not None and a != axis:
                    return None
                axis = a
        if axis is None:
            return None
        along: dict[str, int] = {}
        for t in node.input:  # every input not sliced is broadcast along the axis, or sliced with it
            if t and t not in sliced:
                a = axis - (rank - len(shapes[t]))
                if a < 0 or shapes[t][a] == 1:
                    continue
                if co is None or t in whole or shapes[t][a] != shapes[out][axis] or co.get(t, a) != a:
                    return None
                along[t] = a
        if co is not None:
            co.update(along)
        return axis
    if op in _ROW_NORMALISED:
        (t,) = [i for i in node.input if i]
        if t not in sliced:
            return None
        a, n = sliced[t], len(shapes[t])
        along = _attr(node, "axis", -1 if opset >= 13 else 1)
        along = along + n if along < 0 else along
        if opset >= 13:
            return a if a != along else None
        return a if a < along else None  # before opset 13 the op normalises over every axis from `axis` on
    if op == "MatMul":
        a_name, b_name = node.input[0], node.input[1]
        if a_name not in sliced or b_name in sliced or a_name not in shapes or b_name not in shapes \
                or (co is not None and b_name in co):
            return None
        ra, rb = len(shapes[a_name]), len(shapes[b_name])
        a = sliced[a_name]
        if ra < 2:
            return None
        if a == ra - 2:  # the rows of A: the rows of the product
            return rank - 2
        if a < ra - 2:  # a batch axis of A: B must be broadcast along it
            b_axis = a - (ra - rb)
            if rb >= 3 and b_axis >= 0 and shapes[b_name][b_axis] != 1:
                return None
            return a + (rank - ra)
        return None
    if op == "Transpose":
        t = node.input[0]
        if t not in sliced:
            return None
        perm = list(_attr(node, "perm", list(range(len(shapes.get(t, ())) - 1, -1, -1))))
        return perm.index(sliced[t]) if sliced[t] in perm else None
    return None


def _nbytes(shape: tuple[int, ...], elem: int) -> int:
    size = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).itemsize if elem else 4
    return math.prod(shape) * size


class _Either:
    """`in` either set (`own`, which grows, or `other`)."""

    def __init__(self, own: set[str], other) -> None:
        self.own, self.other = own, other

    def __contains__(self, t: object) -> bool:
        return t in self.own or t in self.other


def find_regions(nodes: list[onnx.NodeProto], weights: frozenset[str] | set[str],
                 shapes: Mapping[str, tuple[int, ...]], types: Mapping[str, int], graph_outputs: set[str],
                 opset: int, unfusable=lambda n: False, tile_from: int | None = None) -> list[Region]:
    """The row-tiled regions of `nodes` (in topological order); see the module's note."""
    tile_from = TILE_FROM_BYTES if tile_from is None else tile_from
    if tile_from <= 0:
        return []

    def size(t: str) -> int:
        return _nbytes(shapes[t], types.get(t, onnx.TensorProto.FLOAT)) if t in shapes else 0

    regions: list[Region] = []
    taken: set[str] = set()
    for i, seed in enumerate(nodes):
        if (not is_product(seed, weights) or seed.name in taken or size(seed.output[0]) < tile_from
                or unfusable(seed)):
            continue
        a = seed.input[0]
        if a not in shapes or len(shapes[a]) < 2:
            continue
        sliced: dict[str, int] = {a: len(shapes[a]) - 2}
        co: dict[str, int] = {}  # inputs from outside sliced with the rows (`_maps_axis`)
        whole = _Either(set(), weights)  # read whole by a member (weights: the executor feeds them itself)
        members: list[onnx.NodeProto] = []
        tainted: set[str] = set()  # tensors computed from the region's outputs outside it
        for node in nodes[i:]:
            ins = [t for t in node.input if t]
            if not any(t in sliced and t != a or (t == a and node is seed) for t in ins) \
                    and not any(t in tainted for t in ins):
                continue
            axis, trial = None, dict(co)
            if (len(members) < MAX_REGION_NODES and node.name not in taken and not unfusable(node)
                    and not any(t in tainted for t in ins) and not (a in ins and node is not seed)):
                axis = _maps_axis(node, sliced, shapes, opset, trial, whole)
            if node is seed and axis is None:
                break
            if axis is None:
                tainted.update(o for o in node.output if o)
                continue
            members.append(node)
            co = trial
            if node.op_type == "MatMul":
                whole.own.add(node.input[1])
            for o in node.output:
                if o:
                    sliced[o] = axis
        if not members:
            continue
        names = {n.name for n in members}
        computed = {o for n in members for o in n.output if o}
        read_outside = {t for n in nodes if n.name not in names for t in n.input if t in computed} | (
            computed & graph_outputs)
        # a region whose huge tensor is read outside it (or whose outputs are about as large) saves nothing
        largest = max(size(t) for t in computed)
        if any(size(t) >= tile_from for t in read_outside) or sum(size(t) for t in read_outside) * 4 > largest:
            continue
        rows = shapes[a][sliced[a]]
        per_row = max(1, largest // max(rows, 1))
        reads = {t for n in members for t in n.input if t and t not in computed and t not in weights}
        if not all(t in shapes for t in reads):
            continue
        region = Region(tuple(n.name for n in members), a, sliced[a],
                        {t: sliced[t] for t in computed}, max(MIN_TILE_ROWS, TILE_BYTES // per_row),
                        {t: shapes[t] for t in sorted(reads)}, co)
        regions.append(region)
        taken |= names
    return regions


def footprint(nodes: list[onnx.NodeProto], weights: frozenset[str] | set[str], shapes: Mapping[str, tuple[int, ...]],
              types: Mapping[str, int]) -> int:
    """Bytes of every tensor (weights aside) `nodes` read or compute: what a block of them may hold at once."""
    tensors = {t for n in nodes for t in list(n.input) + list(n.output) if t and t not in weights and t in shapes}
    return sum(_nbytes(shapes[t], types.get(t, onnx.TensorProto.FLOAT)) for t in tensors)


def arrange(nodes: list[onnx.NodeProto], regions: list[Region]) -> list[onnx.NodeProto]:
    """`nodes` with each region's members together, where its last member stood: the nodes between them that do
    not read what the region computes (directly or not) go before it, those that do after it."""
    for region in regions:
        members = set(region.nodes)
        idx = [i for i, n in enumerate(nodes) if n.name in members]
        first, last = idx[0], idx[-1]
        computed = {o for n in nodes[first:last + 1] if n.name in members for o in n.output if o}
        before, inside, after = [], [], []
        for n in nodes[first:last + 1]:
            if n.name in members:
                inside.append(n)
            elif any(t in computed for t in n.input):
                computed.update(o for o in n.output if o)
                after.append(n)
            else:
                before.append(n)
        nodes = nodes[:first] + before + inside + after + nodes[last + 1:]
    return nodes
