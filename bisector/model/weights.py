"""One copy of a model's weights per process: numpy arrays beside a protobuf that keeps only stubs.

A loaded model used to hold its weights three times over a search: in the catalog's protobuf, in the emulate
executor's numpy copy, and again in whatever serialised the protobuf (the golden session). Here the catalog's
protobuf keeps, for each large top-level initializer, a stub (name, type, dims; data_location EXTERNAL,
location `IN_MEMORY`), and the values live once, as arrays:

- weights in external data files are memory-mapped read-only (no copy at all: the pages are the file's), and
- weights stored inside the model file are converted once into a page file (`page_inline`,
  `bisector.model.pages`), after which the parsed protobuf is dropped.

Either way the values are a file's pages, which the emulator gives back after each session build and run that
read them (`pages.release`): a search holds the weights of the block it is running, not the model's.

Every reader of weight values goes through `Catalog.value`, `Catalog.weight_arrays` or `materialize` (a full
protobuf, built only where a writer or a foreign parser needs one); ORT sessions run on the arrays themselves
(`share_into`: `add_initializer`, no copy).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bisector.errors import UsageError
from bisector.model import pages, wire
from bisector.model.graph import constant_tensor, copy_without, copy_without_initializers, outer_scope_inputs

# Ops whose fast ONNX Runtime CPU kernels need their weights as constants (Conv's NCHWc layout: several times
# faster) and copy them into their own layout while the session is built: the executor gives them such weights
# as initializers (`executor._session`); others' weights are fed on every run.
BUILD_ONLY_OPS = frozenset({"Conv", "ConvTranspose"})

IN_MEMORY = "bisector-in-memory"  # the external-data location of a stub whose values are in the catalog's arrays
DETACH_MIN_BYTES = 4096  # smaller initializers stay inline: shape constants and scalars, cheap to keep twice

# ONNX element types numpy holds natively (bfloat16, float8 and int4 are not: those stay inline in the protobuf).
NUMPY_TYPES = frozenset({
    TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT8, TensorProto.INT16,
    TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32,
    TensorProto.UINT64, TensorProto.BOOL,
})


def stub(name: str, data_type: int, dims: Iterable[int]) -> TensorProto:
    t = TensorProto(name=name, data_type=data_type, dims=list(dims), data_location=TensorProto.EXTERNAL)
    t.external_data.add(key="location", value=IN_MEMORY)
    return t


def is_stub(t: TensorProto) -> bool:
    return t.data_location == TensorProto.EXTERNAL and any(
        e.key == "location" and e.value == IN_MEMORY for e in t.external_data)


def _external(t: TensorProto) -> dict[str, str] | None:
    if t.data_location != TensorProto.EXTERNAL:
        return None
    return {e.key: e.value for e in t.external_data}


def _mapped(t: TensorProto, info: dict[str, str], base: Path, model_path: Path) -> np.ndarray:
    """An external initializer as a read-only memory map of its file (validated as onnx's loader would)."""
    location = info.get("location", "")
    path = (base / location).resolve()
    if not location or Path(location).is_absolute() or ".." in Path(location).parts:
        raise UsageError(f"{model_path}: initializer {t.name!r} names external data {location!r} outside the "
                         "model's directory")
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
    shape = tuple(int(d) for d in t.dims)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    try:
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else nbytes
        size = path.stat().st_size
    except (ValueError, OSError) as exc:
        raise UsageError(f"{model_path}: cannot load its external data files ({location}: {exc})") from None
    if length != nbytes or offset < 0 or offset + nbytes > size:
        raise UsageError(f"{model_path}: cannot load its external data files (initializer {t.name!r}: "
                         f"{nbytes} bytes at offset {offset} of {location}, which has {size} bytes; length "
                         f"field {length})")
    if nbytes == 0:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype.newbyteorder("<"), mode="r", offset=offset, shape=shape)


def detach(model: onnx.ModelProto, model_path: Path, raw: Mapping[int, wire.RawData] | None = None,
           ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model with its large top-level initializers replaced by stubs, and their values.

    `model` was loaded without its external data: external initializers are mapped from their files, inline ones
    converted. `raw`: the initializers (by index) whose raw_data the reader left in the file (`wire`), copied
    from there one at a time. Initializers numpy cannot hold, and external ones of such types, are loaded into
    the protobuf as onnx would (they are rare and small in practice)."""
    light = copy_without(model, ("initializer", "node"))
    values: dict[str, np.ndarray] = {}
    base = model_path.parent
    _nodes_with_constants_as_stubs(model, light, values)
    with _InFile(model_path, raw) as in_file:
        for index, init in enumerate(model.graph.initializer):
            if index in in_file.raw:
                values[init.name] = in_file.value(init, index)
                light.graph.initializer.append(stub(init.name, init.data_type, init.dims))
                continue
            info = _external(init)
            if init.data_type in NUMPY_TYPES and (info is not None or _value_bytes(init) >= DETACH_MIN_BYTES):
                values[init.name] = (_mapped(init, info, base, model_path) if info is not None
                                     else _inline_array(init, model_path))
                light.graph.initializer.append(stub(init.name, init.data_type, init.dims))
                continue
            _keep_inline(light, init, info, base, model_path)
    return light, values


def _inline_array(init: TensorProto, model_path: Path) -> np.ndarray:
    try:
        return numpy_helper.to_array(init)
    except ValueError as exc:  # its data does not fit its dims (numpy: "cannot reshape array of size ...")
        raise UsageError(f"{model_path} is not a readable ONNX model (initializer {init.name!r}: {exc})") from None


def _keep_inline(light: onnx.ModelProto, init: TensorProto, info, base: Path, model_path: Path) -> None:
    kept = light.graph.initializer.add()
    kept.CopyFrom(init)
    if info is not None:
        try:
            from onnx.external_data_helper import load_external_data_for_tensor

            load_external_data_for_tensor(kept, str(base))
        except Exception as exc:  # noqa: BLE001 - onnx raises several kinds
            raise UsageError(f"{model_path}: cannot load its external data files ({exc})") from None


class _InFile:
    """The initializers whose raw_data `wire.read_without_weights` left in the model file, copied from there one
    at a time (pread, a few MB at a time) into a page file, or into an array where there is none: the process
    never holds more than one tensor of the file at once, nor the file's pages (no memory map of it)."""

    CHUNK = 4 << 20

    def __init__(self, model_path: Path, raw: Mapping[int, wire.RawData] | None):
        self.path, self.raw = model_path, dict(raw or {})
        self._file = None
        self._pages = pages.PageFile()

    def __enter__(self) -> "_InFile":
        if self.raw:
            self._file = open(self.path, "rb")
        return self

    def value(self, init: TensorProto, index: int) -> np.ndarray:
        where = self.raw[index]
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).newbyteorder("<")
        shape = tuple(int(d) for d in init.dims)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes != where.length:
            raise UsageError(f"{self.path} is not a readable ONNX model (initializer {init.name!r} holds "
                             f"{where.length} bytes of data; its type and dims need {nbytes})")
        copy = self._pages.put_pieces(where.length, _pieces(self._file.fileno(), where, self.CHUNK))
        if copy is None:
            copy = np.empty(where.length, np.uint8)
            _read_into(self._file.fileno(), where.offset, memoryview(copy))
        return copy.view(dtype).reshape(shape)

    def __exit__(self, *exc) -> None:
        self._pages.close()
        if self._file is not None:
            self._file.close()


def _pieces(fd: int, where: wire.RawData, chunk: int) -> Iterator[bytes]:
    """A file's bytes at `where`, a chunk at a time (pread: the process holds one chunk, not the file's pages)."""
    pos, end = where.offset, where.offset + where.length
    while pos < end:
        data = os.pread(fd, min(chunk, end - pos), pos)
        if not data:
            raise UsageError(f"the model file ended while reading a weight at byte {pos}")
        yield data
        pos += len(data)


def _read_into(fd: int, offset: int, view: memoryview) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise UsageError(f"the model file ended while reading a weight at byte {offset + done}")
        done += n


def page_inline(values: dict[str, np.ndarray]) -> int:
    """Move the in-memory arrays of `values` into a page file, in place (external-data maps are file-backed
    already); returns the bytes moved. Where the file cannot be written the rest stay in memory."""
    file, moved = pages.PageFile(), 0
    for name, v in values.items():
        if pages.file_backed(v) or v.dtype.hasobject or v.nbytes < DETACH_MIN_BYTES:
            continue
        paged = file.put(v)
        if paged is None:
            break
        values[name] = paged
        moved += int(v.nbytes)
    file.close()  # the arrays keep their maps
    return moved


def _nodes_with_constants_as_stubs(model: onnx.ModelProto, light: onnx.ModelProto, values: dict[str, np.ndarray]) -> None:
    """`model`'s nodes into `light`, but large top-level Constant nodes become initializer stubs, their values
    arrays, as large initializers do. Some exporters (paddle2onnx) put every weight in a Constant node; kept as
    nodes, their bytes stayed in the protobuf beside the arrays every reader made of them (an 11 MB text
    recogniser: its weights held twice for the whole search). An initializer and a Constant node are the same
    value to ONNX, ONNX Runtime and TensorRT; a Constant that is also a graph output stays a node (not every
    consumer takes an initializer as a graph output)."""
    outputs = {o.name for o in model.graph.output}
    for node in model.graph.node:
        t = _large_constant_value(node)
        if t is None or node.output[0] in outputs:
            light.graph.node.add().CopyFrom(node)
            continue
        values[node.output[0]] = numpy_helper.to_array(t)
        light.graph.initializer.append(stub(node.output[0], t.data_type, t.dims))


def _large_constant_value(node: onnx.NodeProto) -> TensorProto | None:
    t = constant_tensor(node)
    if t is None or t.data_type not in NUMPY_TYPES or t.data_location == TensorProto.EXTERNAL or t.segment.ListFields():
        return None
    return t if _value_bytes(t) >= DETACH_MIN_BYTES else None


def _value_bytes(init: TensorProto) -> int:
    """The size of an initializer's value from its dims (`ByteSize()` serialises the tensor to count it: 0.2 s
    for a 226 MB model's weights)."""
    return math.prod(init.dims) * onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize


def materialize_tensor(t: TensorProto, values: Mapping[str, np.ndarray]) -> TensorProto:
    """`t`, or for a stub a full TensorProto of its value."""
    if not is_stub(t):
        return t
    return numpy_helper.from_array(np.ascontiguousarray(values[t.name]), t.name)


def materialize(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A full copy of `model` with every stub's bytes filled in (for writers and foreign parsers: TensorRT)."""
    full = copy_without_initializers(model)
    full.graph.initializer.extend(materialize_tensor(t, values) for t in model.graph.initializer)
    return full


class Serialized:
    """`materialize(model, values).SerializeToString()`, written piece by piece: the bytes are the same a parser
    reads (protobuf concatenates a message's fields in any order, and repeated fields keep their order), but no
    full protobuf and no serialised copy of the weights exist at once — each stub's value goes from its array
    to the file (a 42 MB model: its artifacts' peak held the weights three times, in the materialised protobuf,
    its bytes and the arrays). `len(self)` is the file's size."""

    def __init__(self, model: onnx.ModelProto, values: Mapping[str, np.ndarray]):
        light = copy_without_initializers(model)
        graph_bytes = light.graph.SerializeToString()
        light.ClearField("graph")
        self._head = light.SerializeToString()
        self._pieces: list = [graph_bytes]
        for t in model.graph.initializer:
            self._pieces.extend(_initializer_pieces(t, values))
        size = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in self._pieces)
        self._graph_header = _key(onnx.ModelProto, "graph") + _varint(size)
        self.size = len(self._head) + len(self._graph_header) + size

    def __len__(self) -> int:
        return self.size

    def write(self, f) -> None:
        f.write(self._head)
        f.write(self._graph_header)
        arrays = in_turn([p for p in self._pieces if not isinstance(p, bytes)])
        for piece in self._pieces:
            f.write(piece if isinstance(piece, bytes) else memoryview(next(arrays).reshape(-1).view(np.uint8)))


def in_turn(values: list) -> Iterator[np.ndarray]:
    """Each of `values` (arrays, or array-likes converted when read: `fp16.mixed.FP16Copy`) as a contiguous array,
    in order, the next one converted on a thread while the caller writes this one (ORT's Cast, numpy and file
    writes release the GIL): at most two converted values exist at once. Once the caller is done with one, the
    pages of the file-backed arrays it came from go back (`pages.release`): writing a 604 MB model's mixed copy
    held every FP32 weight's pages by its end (684 MB peak)."""
    def contiguous(v) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(v))

    if not values:
        return
    with ThreadPoolExecutor(1) as pool:
        ahead = pool.submit(contiguous, values[0])
        for k in range(len(values)):
            out = ahead.result()
            if k + 1 < len(values):
                ahead = pool.submit(contiguous, values[k + 1])
            yield out
            del out
            _release_sources(values[k])


def _release_sources(value) -> None:
    """The pages of what `value` was read from: the array itself, or an FP16 copy's source and rounded form."""
    for v in (value, getattr(value, "value", None), getattr(value, "rounded", None)):
        if isinstance(v, np.ndarray):
            pages.release(v)


def _initializer_pieces(t: TensorProto, values: Mapping[str, np.ndarray]) -> list:
    """One `GraphProto.initializer` entry: bytes, and for a stub its array (or array-like, converted when
    written) as the `raw_data` bytes themselves."""
    if not is_stub(t):
        body = t.SerializeToString()
        return [_key(onnx.GraphProto, "initializer") + _varint(len(body)) + body]
    value = values[t.name]
    if not isinstance(value, np.ndarray):  # converted when written: its type and shape are known now
        sample = np.zeros(1, value.dtype)
    else:
        value = np.ascontiguousarray(value)
        sample = value.reshape(-1)[:1]
    header = numpy_helper.from_array(sample, t.name)  # name, element type, raw bytes of one value
    size = int(np.prod(value.shape, dtype=np.int64))
    if not header.HasField("raw_data") or value.dtype.byteorder == ">" or (size and
                                                                        len(header.raw_data) != sample.itemsize):
        full = materialize_tensor(t, values).SerializeToString()  # a type from_array does not store raw
        return [_key(onnx.GraphProto, "initializer") + _varint(len(full)) + full]
    header.ClearField("raw_data")
    del header.dims[:]
    header.dims.extend(value.shape)
    head = header.SerializeToString() + _key(TensorProto, "raw_data") + _varint(value.nbytes)
    return [_key(onnx.GraphProto, "initializer") + _varint(len(head) + value.nbytes) + head, value]


def _key(message, field: str) -> bytes:
    """The tag of a length-delimited field (wire type 2)."""
    return _varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | 2)


_varint = wire.varint


# Weights of this size and up reach a session as the caller's arrays; below, serialising them costs nothing.
SHARE_MIN_BYTES = 4096


def share_into(opts, graph: onnx.GraphProto, values: Mapping[str, np.ndarray]) -> list:
    """Make `opts` give a session built from `graph` the stubbed initializers' values without copying them.

    ORT reads a stub's name from `add_external_initializers` and, with `add_initializer` on the same OrtValue,
    runs on the caller's buffer (with prepacking off; measured 1.8 MB per session for a 64 MB weight against
    66 MB with `add_external_initializers` alone). Returns what must outlive the session."""
    import onnxruntime as ort

    names, held = [], []
    for t in graph.initializer:
        if is_stub(t):
            v = np.asarray(values[t.name])
            if not v.flags.c_contiguous:
                v = np.ascontiguousarray(v)
            names.append(t.name)
            held.append(ort.OrtValue.ortvalue_from_numpy(v))
    if names:
        opts.add_external_initializers(names, held)
        in_place = _read_in_place(graph)
        for name, value in zip(names, held):
            if name in in_place:
                opts.add_initializer(name, value)
    return held


# Operators whose weight inputs ONNX Runtime's graph optimizers never rewrite under the weight's own name. An
# `add_initializer` value replaces, by name, whatever initializer the optimized graph holds: where an optimizer
# rewrote a weight in place (the transpose optimizer transposes an elementwise operand when it pushes a Transpose
# through an Add, Mul, Sub, ...; it keeps the name), the session ran on the weight as it was, in the old layout.
# A Transpose pair around an Add of a [1, 1, 1, C] constant failed to broadcast (Yahoo's open_nsfw: the golden run
# stopped at its first NHWC block) or, where the shapes allowed it, broadcast along the wrong axis: a golden
# output 1.45 away from what ONNX Runtime gives for the model file. Other weights are handed over with
# `add_external_initializers` alone, which ONNX Runtime copies: the optimizers then work on its copy.
_READ_IN_PLACE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Gather", "LSTM", "GRU", "RNN",
                                "MatMulInteger", "ConvInteger"})


def _read_in_place(graph: onnx.GraphProto) -> set[str]:
    """The graph's stubs that only operators of _READ_IN_PLACE_OPS read (a subgraph's read disqualifies one)."""
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for t in node.input:
            readers.setdefault(t, set()).add(node.op_type)
        for t in outer_scope_inputs(node):
            readers.setdefault(t, set()).add("")  # read inside a subgraph
    return {t.name for t in graph.initializer
            if is_stub(t) and readers.get(t.name) and readers[t.name] <= _READ_IN_PLACE_OPS}


def ort_session(model: onnx.ModelProto, values: Mapping[str, np.ndarray], opts, providers: list[str]):
    """An ONNX Runtime session of `model` (stubs and all) running on `values` without copying them.

    Prepacking stays on, as in a plain session: the golden and `run` outputs are then bit for bit what ORT gives
    for the model file (off, MLAS accumulates in another order: last-bit differences, which move verdicts of an
    oracle that is chaotic near a tight tolerance). Its packed copies live only as long as this one session."""
    import onnxruntime as ort

    held = []
    if any(is_stub(t) for t in model.graph.initializer):
        held = share_into(opts, model.graph, values)
    # ORT packs or copies most weights while it builds the session (prepacking is on here) and reads each once:
    # their pages go back as it goes, so the process does not hold all of them beside all the packed copies;
    # what a kernel reads at run time (a Gather's table, an Add's operand) comes back from the file as it is read
    with pages.releasing([values[t.name] for t in model.graph.initializer if is_stub(t)]):
        session = ort.InferenceSession(model.SerializeToString(), opts, providers=providers)
    session._bisector_shared = held  # type: ignore[attr-defined]  # the arrays must outlive the session
    return session


def external_files(model: onnx.ModelProto, base: Path) -> list[Path]:
    """The external data files a (not yet detached) model's initializers name."""
    names = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    return sorted(base / n for n in names if n and n != IN_MEMORY)
