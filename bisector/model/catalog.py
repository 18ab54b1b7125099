"""The catalog: loads a model once, names every node uniquely, and lists candidates and pinned nodes.

Everything downstream speaks node names. Unnamed nodes are named the way TensorRT's ONNX parser names their
layers (`node_of_<first output>`), so names in our artifacts match layer names in the user's build.
"""

from __future__ import annotations

import hashlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from bisector.errors import UsageError
from bisector.model.graph import (
    attribute_tensors,
    constant_fills,
    constant_value,
    fill_spec,
    consumers,
    weightless_copy,
    has_subgraph,
    is_product,
    inner_nodes,
    node_reads,
    outer_scope_inputs,
    sort_topologically,
    stored_tensors,
    unique_node_names,
    weight_values,
)
from bisector.model import pages
from bisector.model import weights as weight_store
from bisector.model import wire
from bisector.model.optable import (
    NEVER_CANDIDATES,
    is_parameter_input,
    is_runtime_domain,
    model_opset,
    op_schema,
    supports_fp16,
)

FLOAT = TensorProto.FLOAT
# `tensor_types` entry of a value that is not a tensor (a sequence, an optional, a map): never float, never
# rounded. Without it such a value read as FLOAT (the default for a value of unknown type) and the emulation
# put a rounding Cast on a sequence (ONNX's backend test `test_sequence_model1`: exit 3 from ORT's type check)
NOT_A_TENSOR = TensorProto.UNDEFINED
log = logging.getLogger("bisector")

# Protobuf cannot serialise a message of 2 GiB or more: larger models are loaded by path and written with external
# data. A module constant so that tests can lower it instead of generating a 2 GB file.
PROTOBUF_LIMIT = (1 << 31) - 1
# constant fills from this size live in a page file (`Catalog._fill`), as inline initializers do (`weights.page_inline`)
FILL_PAGES_FROM = weight_store.DETACH_MIN_BYTES


@dataclass
class Catalog:
    path: Path
    model: onnx.ModelProto
    sha256: str
    names: list[str]
    candidates: tuple[str, ...]
    pinned: dict[str, str]
    tensor_types: dict[str, int]
    weights: frozenset[str]
    outer_inputs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    external_data: bool = False  # the file keeps its weights in external data files (mapped, not loaded)
    # Values of the initializers `model` keeps only as stubs (bisector.model.weights): the one copy of them
    weight_arrays: dict[str, np.ndarray] = field(default_factory=dict)
    external_files: tuple[Path, ...] = ()  # the external data files the model file names
    # MatMuls of two computed tensors (an attention's Q x Kᵀ): their outputs' dims as inference gave them at the
    # model's declared input shapes, None where one is unknown (the executor's row tiles: `emulate.tiling`)
    products: dict[str, tuple[int, ...] | None] = field(default_factory=dict)

    # ---- loading -------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike) -> "Catalog":
        path = Path(path)
        _check_model_file(path)
        # The digest reads the files on a second thread while this one parses, detaches and infers types
        # (hashlib and file reads release the GIL): an 8 x 768 transformer's set-up lost 0.16 s to it in sequence.
        with ThreadPoolExecutor(1) as pool:
            head = pool.submit(_hash_files, hashlib.sha256(), [path])
            try:
                model, external, raw = _load_model(path)
                _check_reserved_names(model.graph, path)  # a user's model (mixed models built in memory are exempt)
                from bisector.files import protect

                protect(path, "the input model")  # no output of this process may overwrite it (-o, --json, ...)
                # The locations are read here, from the model as parsed: `model` is rebound to its detached copy
                # below (stubs without external_data), and a lambda reading it on the pool's thread saw one or the
                # other as the threads happened to run (the same file hashed two ways: `verify` said the model had
                # changed since the search)
                locations = _external_locations(path, model)
                digest = pool.submit(lambda: _hash_files(head.result(), locations))
                _load_attribute_data(model, path)
                files = tuple(weight_store.external_files(model, path.parent))
                model, arrays = weight_store.detach(model, path, raw)  # the parsed weights go with the old protobuf
                weight_store.page_inline(arrays)
                catalog = cls.from_model(model, path=path, sha256="pending")
            except BaseException:
                head.cancel()
                raise
            catalog.sha256 = digest.result().hexdigest()
        catalog.external_data, catalog.weight_arrays, catalog.external_files = external, arrays, files
        return catalog

    @classmethod
    def from_model(cls, model: onnx.ModelProto, path: Path | None = None, sha256: str | None = None) -> "Catalog":
        graph = model.graph
        if not graph.node:
            raise UsageError(f"{path or 'model'}: the graph has no nodes")
        try:
            reordered = sort_topologically(graph)
        except ValueError as exc:
            raise UsageError(f"{path or 'model'}: {exc}; not a model ONNX Runtime can run") from None
        if reordered:
            # Everything downstream (blocks, cones, the mixed model) walks nodes in order, so the catalog holds
            # the sorted graph; the file itself is never changed, and the mixed model comes out in valid order
            log.warning("%s: the nodes are not in topological order as ONNX requires (ONNX Runtime sorts them "
                        "itself); bisector sorted them (%d graph%s)", path or "model", reordered,
                        "" if reordered == 1 else "s")
        names = _assign_unique_names(graph)
        inferred = _infer_types(model)
        _drop_stale_value_info(model, inferred)
        tensor_types = _tensor_types(model, inferred)
        constants = [i.name for i in graph.initializer] + [o for n in graph.node if n.op_type == "Constant"
                                                            for o in n.output]
        fills = constant_fills(graph, constants)  # ConstantOfShape of a constant shape: a weight too
        weights = frozenset(constants + list(fills))
        opset = model_opset(model)
        outer = {n.name: outer_scope_inputs(n) for n in graph.node if has_subgraph(n)}
        shape_nodes = _shape_computation_nodes(graph, opset)
        candidates, pinned = [], {}
        for node in graph.node:
            if node.op_type in NEVER_CANDIDATES or (node.output and node.output[0] in fills):
                continue
            tensors = [t for t in list(node.input) + list(node.output) + list(outer.get(node.name, ())) if t]
            if not any(tensor_types.get(t, FLOAT) == FLOAT for t in tensors):
                continue  # no floating-point tensor: nothing to keep in FP32
            if any(tensor_types.get(t) == NOT_A_TENSOR for t in tensors):
                # An FP16 node would store FP16 tensors into (or read them from) a sequence typed FP32: the mixed
                # model would need the sequence retyped end to end. These nodes only move tensors: kept FP32
                pinned[node.name] = f"{node.op_type} reads or writes a sequence/optional value: kept FP32"
            elif node.name in shape_nodes:
                pinned[node.name] = "shape computation: its outputs only feed shape/index parameters"
            elif node.domain == "ai.onnx.ml":
                # Tree ensembles, SVMs, linear models: TensorRT has no layer for them, and the schemas that do allow
                # FP16 type their tensor attributes (split thresholds, leaf weights) like the input, so an FP16 one
                # is a different model from the FP32 one with rounded inputs that an emulation would compute
                pinned[node.name] = f"ONNX-ML operator ({node.op_type}): kept FP32"
            elif node.op_type in ("Loop", "Scan"):
                pinned[node.name] = f"control flow ({node.op_type}): its body is not split; kept FP32 as one unit"
            elif not supports_fp16(node.op_type, node.domain, _default_domain_opset(node, opset)):
                where = (f"ONNX Runtime's {node.domain} schema" if is_runtime_domain(node.domain)
                         else "the ONNX schema")
                pinned[node.name] = f"{node.op_type} has no FP16 type in {where}"
            else:
                candidates.append(node.name)
        return cls(
            path=path or Path("<memory>"),
            model=model,
            sha256=sha256 or hashlib.sha256(model.SerializeToString()).hexdigest(),
            names=names,
            candidates=tuple(candidates),
            pinned=pinned,
            tensor_types=tensor_types,
            weights=weights,
            outer_inputs=outer,
            products=_products(graph, weights, inferred),
        )

    # ---- weight values (the protobuf holds stubs for the large ones: bisector.model.weights) ----------------
    def value(self, name: str) -> np.ndarray:
        """An initializer's or Constant's value (a read-only map or array: never change it in place)."""
        v = self.weight_arrays.get(name)
        if v is not None:
            return v
        init = self._inline_initializers.get(name)
        if init is not None:
            return onnx.numpy_helper.to_array(init)
        node = self.nodes[self.producers[name]]
        if node.op_type == "ConstantOfShape":
            return self._fill(name)
        return constant_value(node)

    def computes_weight(self, node: onnx.NodeProto) -> bool:
        """Whether `node` only computes weights (a Constant, or a constant fill): its outputs are values the
        catalog holds, not work an executor runs."""
        outs = [o for o in node.output if o]
        return bool(outs) and all(o in self.weights for o in outs)

    @cached_property
    def fills(self) -> frozenset[str]:
        """Weights that ConstantOfShape nodes compute from a constant shape (`graph.constant_fills`)."""
        return frozenset(t for t in self.weights if t in self.producers
                         and self.nodes[self.producers[t]].op_type == "ConstantOfShape")

    def _fill(self, name: str) -> np.ndarray:
        """A fill's value, computed once and kept (read-only): the executor, the writers and ORT read this one.
        A large one is written to a page file a slice at a time (`model.pages`) and read through a map, like an
        external-data weight: the process holds its pages only while something reads them (held as an ordinary
        array, the fills of the light DenseNet-121 added 30 MB to its search's peak)."""
        got = self._fill_values.get(name)
        if got is None:
            node = self.nodes[self.producers[name]]
            dims, value = fill_spec(node, np.asarray(self.value(node.input[0])))
            total = int(np.prod(dims, dtype=np.int64))
            if total * value.itemsize >= FILL_PAGES_FROM:
                step = max(1, pages.CONVERT_SLICE_BYTES // value.itemsize)
                piece = np.full(min(step, total), value[0], value.dtype)
                view = self._fill_pages.put_pieces(total * value.itemsize, (
                    piece[: min(step, total - at)] for at in range(0, total, step)))
                if view is not None:
                    got = view.view(value.dtype).reshape(dims)
            if got is None:
                got = np.full(dims, value[0], value.dtype)
                got.setflags(write=False)
            self._fill_values[name] = got
        return got

    @cached_property
    def _fill_pages(self) -> pages.PageFile:
        return pages.PageFile()

    @cached_property
    def _fill_values(self) -> dict[str, np.ndarray]:
        return {}

    @cached_property
    def _inline_initializers(self) -> dict[str, TensorProto]:
        return {i.name: i for i in self.model.graph.initializer if i.name not in self.weight_arrays}

    def weight_values(self) -> dict[str, np.ndarray]:
        """Every top-level initializer and Constant output by name (DESIGN §4: a Constant is a weight); the
        large ones are the catalog's own arrays, not copies."""
        values = weight_values(self.model.graph, skip=self.weight_arrays)
        values.update(self.weight_arrays)
        values.update({t: self.value(t) for t in self.fills})
        return values

    def full_model(self) -> onnx.ModelProto:
        """`model` with every stub's bytes filled in: a second copy of the weights, for writers and parsers
        that need a complete protobuf (TensorRT's). Prefer `value`/`share_into` where they serve."""
        if not self.weight_arrays:
            return self.model
        return weight_store.materialize(self.model, self.weight_arrays)

    def materialized(self, t: TensorProto) -> TensorProto:
        return weight_store.materialize_tensor(t, self.weight_arrays)

    # ---- views ---------------------------------------------------------------------------------------------
    @cached_property
    def unsplit_branches(self) -> dict[str, int]:
        """Candidate nodes with subgraphs (If) -> how many computing nodes their branches hold. A plan lowers
        such a node as one unit: its boundary is stored in FP16 while its branches compute FP32 (the emulation,
        the mixed model and ort-cuda alike), so FP16 arithmetic inside them is judged only by backends that
        build the branches themselves (TensorRT)."""
        out: dict[str, int] = {}
        for name in self.candidates:
            node = self.nodes[name]
            if has_subgraph(node):
                work = sum(1 for n in inner_nodes(node) if n.op_type not in NEVER_CANDIDATES and n.op_type != "Identity")
                if work:
                    out[name] = work
        return out

    @cached_property
    def nodes(self) -> dict[str, onnx.NodeProto]:
        return {n.name: n for n in self.model.graph.node}

    @cached_property
    def producers(self) -> dict[str, str]:
        return {o: n.name for n in self.model.graph.node for o in n.output if o}

    @cached_property
    def input_names(self) -> list[str]:
        inits = {i.name for i in self.model.graph.initializer}
        return [i.name for i in self.model.graph.input if i.name not in inits]

    @cached_property
    def output_names(self) -> list[str]:
        return [o.name for o in self.model.graph.output]

    @cached_property
    def opset(self) -> int | None:
        return model_opset(self.model)

    def is_float(self, tensor: str) -> bool:
        return self.tensor_types.get(tensor, FLOAT) == FLOAT

    def is_sequence(self, tensor: str) -> bool:
        """A value that is not a tensor (a sequence, an optional, a map): never rounded, compared or cut at."""
        return self.tensor_types.get(tensor) == NOT_A_TENSOR

    def node_inputs(self, name: str) -> list[str]:
        """Explicit inputs followed by outer-scope values its subgraphs read (If/Loop/Scan)."""
        return [t for t, _ in self.reads(name)]

    def reads(self, name: str) -> list[tuple[str, int | None]]:
        """(tensor, explicit input index, None for an outer-scope value) for everything the node reads."""
        return self._reads[name]

    @cached_property
    def _reads(self) -> dict[str, list[tuple[str, int | None]]]:
        return {n.name: node_reads(n, self.outer_inputs.get(n.name, ())) for n in self.model.graph.node}

    @cached_property
    def _parameter_slots(self) -> dict[str, frozenset[int]]:
        return {n.name: frozenset(i for i in range(len(n.input)) if is_parameter_input(
            n.op_type, i, n.domain, _default_domain_opset(n, self.opset))) for n in self.model.graph.node}

    @cached_property
    def consumers(self) -> dict[str, list[tuple[onnx.NodeProto, int | None]]]:
        """tensor -> (reader, input index or None for an outer-scope read), readers in topological order."""
        return consumers(self.model.graph.node, self.outer_inputs)

    def is_parameter(self, node_name: str, index: int) -> bool:
        """Is explicit input `index` a shape, index, bound or scale (never data)? Outer-scope values are data."""
        return index in self._parameter_slots[node_name]

    def schema(self, node_name: str):
        """The ONNX schema the node follows at the model's opset (None for unknown or custom operators)."""
        node = self.nodes[node_name]
        return op_schema(node.op_type, node.domain, _default_domain_opset(node, self.opset))

    def unknown(self, names) -> list[str]:
        known = set(self.names)
        return sorted(n for n in names if n not in known)


# ---- helpers -----------------------------------------------------------------------------------------------
# Names the FP16 writers derive from a tensor `t` (the mixed model, the emulation, ort-cuda): `t__fp16`,
# `t__fp16_param`, `t__rounded`, `t__raw`, `t__fp32_compute`, `t__cast_to_fp32`, ... A model that already has such
# a tensor beside `t` would get two producers of one name in the mixed model.
RESERVED_SUFFIXES = ("__fp16", "__fp32", "__rounded", "__raw", "__cast", "__store")


def _check_reserved_names(graph: onnx.GraphProto, path: Path | None) -> None:
    """UsageError naming the tensor when a model tensor collides with a name the FP16 writers derive."""
    tensors = {t for n in graph.node for t in list(n.input) + list(n.output) if t}
    tensors |= {i.name for i in graph.input} | {i.name for i in graph.initializer}
    for derived in sorted(t for t in tensors if "__" in t):
        i = derived.find("__")
        while i > 0:
            base, suffix = derived[:i], derived[i:]
            if base in tensors and suffix.startswith(RESERVED_SUFFIXES):
                raise UsageError(
                    f"{path or 'model'}: tensor {derived!r} collides with the names bisector derives from tensor "
                    f"{base!r} (suffixes {', '.join(RESERVED_SUFFIXES)} are reserved); rename it in the model (is "
                    "this a model.mixed.onnx? search the original model instead)")
            i = derived.find("__", i + 1)




def _default_domain_opset(node: onnx.NodeProto, opset: int | None) -> int | None:
    """The model's default-domain opset for a node of the default domain; None (latest schema) for others."""
    return opset if node.domain in ("", "ai.onnx") else None


def _check_model_file(path: Path) -> None:
    if not path.exists():
        raise UsageError(f"model file not found: {path}")
    if path.is_dir():
        raise UsageError(f"{path} is a directory, not an ONNX model file")
    if path.stat().st_size == 0:
        raise UsageError(f"{path} is empty, not an ONNX model")


def read_graph(path: Path) -> onnx.ModelProto:
    """The model file's protobuf as written, for its structure (nodes, names): the large initializers' raw_data
    may be left in the file (`_load_model`), so never read weight values from it."""
    return _load_model(path)[0]


def _load_model(path: Path) -> tuple[onnx.ModelProto, bool, dict[int, wire.RawData]]:
    """The parsed model (without external data), whether it has external data, and the initializers whose
    raw_data was left in the file (`bisector.model.wire`: parsing it would hold the weights twice)."""
    _check_model_file(path)
    model, raw = None, {}
    light = wire.read_without_weights(path, weight_store.NUMPY_TYPES, weight_store.DETACH_MIN_BYTES)
    if light is not None:
        try:
            model, raw = onnx.ModelProto.FromString(light[0]), light[1]
        except Exception:  # noqa: BLE001 - the plain parse below says what is wrong with the file
            model, raw = None, {}
    if model is None:
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # protobuf raises DecodeError and friends
            raise UsageError(f"{path} is not a readable ONNX model ({type(exc).__name__}: {exc})") from None
    if not model.graph.node and not model.graph.output:
        raise UsageError(f"{path} is not a readable ONNX model (no graph)")
    # External data is not loaded here: `weights.detach` maps it from its files (one copy, the file's pages).
    return model, any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer), raw


def _load_attribute_data(model: onnx.ModelProto, path: Path) -> None:
    """Read into the protobuf the external data of tensors outside the main graph's initializers: a Constant's
    value (onnx.save(..., convert_attribute=True) writes those to the data file too; ONNX Runtime reads them) and
    a subgraph's initializers. `weights.detach` maps only the main graph's initializers; a Constant's value left
    external was read later relative to the working directory ("internal error: ... should be stored in
    jarvis.data, but it is not regular file")."""
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    for t in attribute_tensors(model.graph):
        if uses_external_data(t):
            try:
                load_external_data_for_tensor(t, str(path.parent))
            except Exception as exc:  # a missing or unreadable data file, a location outside the model's folder
                raise UsageError(f"{path}: the external data of tensor {t.name or '(unnamed)'!r} cannot be read "
                                 f"({type(exc).__name__}: {exc})") from None


def _external_locations(path: Path, model: onnx.ModelProto) -> list[Path]:
    """The external data files the model names: its initializers' and its tensor attributes' (a Constant node's
    value can live in external data too), subgraphs included."""
    locations = sorted({e.value for t in stored_tensors(model.graph) for e in t.external_data if e.key == "location"})
    return [path.parent / loc for loc in locations]


def _hash_files(h, paths: list[Path]):
    """`h` updated with each existing file's bytes, in order. The catalog's sha256 is that of the model file and
    the external data files it names, in sorted order (content, not names, decides)."""
    # One reused buffer: no new bytes object per chunk (1.36 GB: 1.65 -> 1.1 s). 1 MB hashes as fast as 16 MB
    # (0.86 s for that 1.36 GB from the page cache) and does not leave 16 MB in this thread's malloc arena, which
    # glibc kept for the rest of the search (a 11 MB model's catalog: +35 -> +19 MB).
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    for p in paths:
        if p.exists():
            with open(p, "rb") as f:
                while n := f.readinto(buf):
                    h.update(view[:n])
    return h


def _assign_unique_names(graph: onnx.GraphProto) -> list[str]:
    names = unique_node_names(graph.node)
    for node, name in zip(graph.node, names):
        node.name = name
    return names


def _infer_types(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Types and shapes as ONNX infers them from the nodes alone (value_info ignored: it may be stale)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(weightless_copy(model), strict_mode=False)
    except Exception as exc:
        log.warning("ONNX shape inference failed (%s); tensor types come from the model's value_info", exc)
        return {}
    return {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}


def _products(graph: onnx.GraphProto, weights: frozenset[str],
              inferred: dict[str, onnx.ValueInfoProto]) -> dict[str, tuple[int, ...] | None]:
    """`Catalog.products`."""
    out: dict[str, tuple[int, ...] | None] = {}
    for n in graph.node:
        if is_product(n, weights):
            vi = inferred.get(n.output[0])
            t = vi.type.tensor_type if vi is not None and vi.type.HasField("tensor_type") else None
            dims = [d.dim_value if d.HasField("dim_value") else 0 for d in t.shape.dim] \
                if t is not None and t.HasField("shape") else [0]
            out[n.output[0]] = tuple(dims) if all(d > 0 for d in dims) else None
    return out


def _drop_stale_value_info(model: onnx.ModelProto, inferred: dict[str, onnx.ValueInfoProto]) -> None:
    """value_info that contradicts inference (wrong type or fixed dims) is removed, with a warning: ONNX Runtime
    would refuse the model, and our rounding decisions must not rest on it."""
    stale = [vi.name for vi in model.graph.value_info if vi.name in inferred and _conflicts(vi, inferred[vi.name])]
    if stale:
        log.warning("ignoring stale value_info for %d tensor(s) (wrong type or shape): %s", len(stale),
                    ", ".join(stale[:10]) + (" ..." if len(stale) > 10 else ""))
        keep = [vi for vi in model.graph.value_info if vi.name not in set(stale)]
        del model.graph.value_info[:]
        model.graph.value_info.extend(keep)


def _conflicts(declared: onnx.ValueInfoProto, inferred: onnx.ValueInfoProto) -> bool:
    a, b = declared.type.tensor_type, inferred.type.tensor_type
    if a.elem_type and b.elem_type and a.elem_type != b.elem_type:
        return True
    if a.HasField("shape") and b.HasField("shape"):
        if len(a.shape.dim) != len(b.shape.dim):
            return True
        for da, db in zip(a.shape.dim, b.shape.dim):
            if da.HasField("dim_value") and db.HasField("dim_value") and da.dim_value != db.dim_value:
                return True
    return False


# Element types ONNX Runtime's Python binding returns no numpy array for (its run fails with "No corresponding
# Numpy type for Tensor Type"): a graph output of one of these cannot be golden
_NO_NUMPY_TYPE = frozenset(getattr(TensorProto, t) for t in (
    "BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0", "FLOAT4E2M1", "UINT4",
    "INT4", "UINT2", "INT2") if hasattr(TensorProto, t))


def check_comparable_outputs(graph: onnx.GraphProto, tensor_types: dict[str, int]) -> None:
    """Outputs are compared as tensors (Polygraphy's comparator does the same): a sequence, optional or map
    output, or one of a type ONNX Runtime cannot hand back, cannot be judged, so say so (before the golden run)
    instead of failing somewhere in the comparison. `inspect` does not ask: it reads any model."""
    for o in graph.output:
        if tensor_types.get(o.name) in _NO_NUMPY_TYPE:
            raise UsageError(f"graph output {o.name!r} is {TensorProto.DataType.Name(tensor_types[o.name])}: ONNX "
                             "Runtime's Python binding cannot return it, so no golden output can be computed or "
                             "compared. Cast it to FLOAT (or FLOAT16) before the output")
        if tensor_types.get(o.name) == NOT_A_TENSOR:
            kind = o.type.WhichOneof("value") or "non-tensor"
            raise UsageError(f"graph output {o.name!r} is a {kind.replace('_type', '')}, not a tensor: bisector compares "
                             "tensor outputs only. Give the model tensor outputs (e.g. a ConcatFromSequence or "
                             "SequenceAt before the output)")


def _tensor_types(model: onnx.ModelProto, inferred: dict[str, onnx.ValueInfoProto]) -> dict[str, int]:
    types: dict[str, int] = {}
    infos = list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)
    for vi in infos + list(inferred.values()):  # inference wins over what the file declares
        kind = vi.type.WhichOneof("value")
        if kind == "tensor_type" and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
        elif kind in ("sequence_type", "optional_type", "map_type"):
            types[vi.name] = NOT_A_TENSOR
    for init in model.graph.initializer:
        types[init.name] = init.data_type
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    types[node.output[0]] = attr.t.data_type
                elif attr.name in ("value_float", "value_floats"):
                    types[node.output[0]] = FLOAT
                elif attr.name in ("value_int", "value_ints"):
                    types[node.output[0]] = TensorProto.INT64
        elif node.op_type in ("Shape", "Size"):
            types[node.output[0]] = TensorProto.INT64
        elif node.op_type == "Cast":
            for attr in node.attribute:
                if attr.name == "to":
                    types[node.output[0]] = attr.i
    return types


def _shape_computation_nodes(graph: onnx.GraphProto, opset: int | None) -> set[str]:
    """Nodes whose every output only feeds shape/index parameters (directly or through other such nodes)."""
    readers = consumers(graph.node)
    graph_outputs = {o.name for o in graph.output}
    shape_nodes: set[str] = set()
    for node in reversed(graph.node):
        if not node.output or has_subgraph(node):
            continue
        ok = True
        for out in node.output:
            if not out:
                continue
            uses = readers.get(out, [])
            if out in graph_outputs or not uses:
                ok = False
                break
            for consumer, idx in uses:
                if consumer.name in shape_nodes:
                    continue
                if not is_parameter_input(consumer.op_type, idx, consumer.domain, _default_domain_opset(consumer, opset)):
                    ok = False
                    break
            if not ok:
                break
        if ok:
            shape_nodes.add(node.name)
    return shape_nodes
