"""A model file read without its large weights' bytes (the protobuf wire format, just enough of it).

`onnx.load` reads a whole model file into one bytes object and parses it into a protobuf that holds every
initializer's raw_data again: for a moment the process holds the weights twice, and then once more while
`weights.detach` converts them to arrays (a 604 MB transformer: 1.23 GB at load against 0.67 GB for one plain
ONNX Runtime inference; docs/benchmarks.md, "Scale, seventeenth round"). Here the file is scanned through a memory
map instead: the top-level initializers' raw_data fields (numeric types numpy holds, 4 KiB and up) are left out of
the bytes handed to the parser, and where each one lies in the file is returned, for `weights.detach` to copy from
there tensor by tensor. Every other byte reaches the parser as written.

Anything unexpected (a malformed or truncated file, a repeated field, raw_data beside a segment or external data,
a field of wire type 3 or 4) returns None, and the caller parses the whole file as before: this is an economy,
never a second parser with opinions of its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from onnx import TensorProto

from bisector.model import pages

# Field numbers (onnx.proto3): ModelProto.graph, GraphProto.initializer, and TensorProto's fields read here.
MODEL_GRAPH, GRAPH_INITIALIZER = 7, 5
T_DIMS, T_DATA_TYPE, T_SEGMENT, T_RAW_DATA, T_DATA_LOCATION = 1, 2, 3, 9, 14
_LEN = 2


@dataclass(frozen=True)
class RawData:
    """Where one initializer's raw_data lies in the file."""

    offset: int
    length: int


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


class _Malformed(Exception):
    pass


def _read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Malformed
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf, start: int, end: int):
    """(field number, wire type, start of the field's tag, end of its tag, start of its value, end of its value)
    in order (a length-delimited field's length lies between the end of its tag and its value)."""
    pos = start
    while pos < end:
        tag_at = pos
        key, pos = _read_varint(buf, pos, end)
        tag_end = pos
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _Malformed
        if wire == 0:
            _, after = _read_varint(buf, pos, end)
        elif wire == 1:
            after = pos + 8
        elif wire == 5:
            after = pos + 4
        elif wire == _LEN:
            length, pos = _read_varint(buf, pos, end)
            after = pos + length
        else:  # groups (3, 4) and reserved types: not in ONNX files
            raise _Malformed
        if after > end:
            raise _Malformed
        yield number, wire, tag_at, tag_end, pos, after
        pos = after


class _File:
    """Random reads of a file through a small window (os.pread): no memory map, whose faults can bring whole
    large folios of the page cache into this process (a 96 MB model: 48 MB mapped to read 2 KB of headers)."""

    WINDOW = 1 << 16

    def __init__(self, fd: int, size: int):
        self.fd, self.size = fd, size
        self._at, self._data = 0, b""

    def __getitem__(self, key):
        if isinstance(key, slice):
            return self.read(key.start, key.stop)
        if not self._at <= key < self._at + len(self._data):
            self._at, self._data = key, os.pread(self.fd, self.WINDOW, key)
            if not self._data:
                raise _Malformed
        return self._data[key - self._at]

    def read(self, start: int, stop: int) -> bytes:
        if self._at <= start and stop <= self._at + len(self._data):
            return self._data[start - self._at : stop - self._at]
        parts, pos = [], start
        while pos < stop:
            chunk = os.pread(self.fd, min(stop - pos, 1 << 30), pos)
            if not chunk:
                raise _Malformed
            parts.append(chunk)
            pos += len(chunk)
        return b"".join(parts)


def read_without_weights(path: Path, numpy_types: frozenset[int], min_bytes: int
                         ) -> tuple[bytes, dict[int, RawData]] | None:
    """The file's bytes with the raw_data of each top-level initializer of a type in `numpy_types` and at least
    `min_bytes` long left out, and {index among the graph's initializers: where its raw_data is}; None where the
    file is not what this reader expects (the caller then parses it whole)."""
    if os.environ.get(pages.ENV, "").strip() == "0" or not hasattr(os, "pread"):
        return None  # the switch restores the previous load too
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return None
            return _scan(_File(f.fileno(), size), size, numpy_types, min_bytes)
    except (OSError, ValueError, _Malformed):
        return None


def _scan(mm, size: int, numpy_types, min_bytes: int):
    out = bytearray()
    raw: dict[int, RawData] = {}
    graphs = 0
    for number, wire, tag_at, tag_end, start, end in _fields(mm, 0, size):
        if number == MODEL_GRAPH and wire == _LEN:
            graphs += 1
            if graphs > 1:  # a repeated message field merges: leave that to the parser
                return None
            body = _graph(mm, start, end, numpy_types, min_bytes, raw)
            out += mm[tag_at:tag_end]
            out += varint(len(body))
            out += body
        else:
            out += mm[tag_at:end]
    if not raw:
        return None  # nothing to leave out: the plain parse is as good
    return bytes(out), raw


def _graph(mm, start: int, end: int, numpy_types, min_bytes: int, raw: dict[int, RawData]) -> bytearray:
    out = bytearray()
    index = 0
    for number, wire, tag_at, tag_end, value_at, after in _fields(mm, start, end):
        if number == GRAPH_INITIALIZER and wire == _LEN:
            body, where = _tensor(mm, value_at, after, numpy_types, min_bytes)
            if where is not None:
                raw[index] = where
                out += mm[tag_at:tag_end]
                out += varint(len(body))
                out += body
            else:
                out += mm[tag_at:after]
            index += 1
        else:
            out += mm[tag_at:after]
    return out


def _tensor(mm, start: int, end: int, numpy_types, min_bytes: int) -> tuple[bytes, RawData | None]:
    """A TensorProto's bytes without its raw_data, and where that was; (b"", None) where it stays whole."""
    data_type = location = None
    raw_at: tuple[int, int, int] | None = None
    seen: set[int] = set()
    for number, wire, tag_at, _, value_at, after in _fields(mm, start, end):
        if number in (T_DATA_TYPE, T_RAW_DATA, T_DATA_LOCATION, T_SEGMENT):
            if number in seen:
                return b"", None  # repeated scalars: the last wins in protobuf; the parser knows that
            seen.add(number)
        if number == T_DATA_TYPE and wire == 0:
            data_type, _ = _read_varint(mm, value_at, after)
        elif number == T_DATA_LOCATION and wire == 0:
            location, _ = _read_varint(mm, value_at, after)
        elif number == T_RAW_DATA and wire == _LEN:
            raw_at = (tag_at, value_at, after)
    if (raw_at is None or T_SEGMENT in seen or data_type not in numpy_types
            or location not in (None, TensorProto.DEFAULT) or raw_at[2] - raw_at[1] < min_bytes):
        return b"", None
    tag_at, value_at, after = raw_at
    return mm[start:tag_at] + mm[after:end], RawData(value_at, after - value_at)
