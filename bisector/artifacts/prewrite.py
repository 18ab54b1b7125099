"""The mixed model's large weights written while the search runs, so that the work after it does not grow with them.

Issue 14: on a model with 1.27 GB of weights and a 3-evaluation search, converting and writing the mixed model's
0.68 GB of FP16 weights after the search was 31-39% of the search's own wall time (disk-bound: 0.4-1.5 GB/s on
the same machine within a minute). Most of the final data file does not depend on the set the search finds: every
weight an FP16 node reads is stored as its FP16 copy, and the final set keeps few nodes FP32. So a thread writes
the weights of the all-FP16 mixed model, in their order and alignment, into the data file's temporary file while
the search runs; at the end the writer reuses each weight found there by its name (the same name always holds
the same bytes: a weight's FP16 copy has its own name, `fp16.mixed.fp16_name`) and appends the rest (the FP32
weights of the FP32 set, small initializers) before the rename.

The thread runs at the process's own priority. It ran at nice 19 until the search's sessions moved onto one
shared ONNX Runtime pool (bisector.ort_pool), whose threads spin between parallel sections: beside them a nice-19
thread got almost no CPU, and the write waited for the search's end (51-63% of a 3-evaluation search after it on
the 1.27 GB model, 5-7% at normal priority, wall time the same or 2-3% lower; docs/benchmarks.md, "Scale,
nineteenth round").

When the bytes the final model does not read (FP16 copies of weights only the FP32 set reads) would pass
`MAX_UNUSED_SHARE` of the file, the prewritten file is dropped and the data file written compactly as before. The
file is all or nothing either way (`files.AtomicFile`); a killed run leaves only a temporary file that the next
run removes.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Mapping

import numpy as np

from bisector.artifacts import data_file
from bisector.files import AtomicFile
from bisector.fp16 import fastcast
from bisector.model import weights as weight_store
from bisector.model.catalog import Catalog

log = logging.getLogger("bisector")

MAX_UNUSED_SHARE = 0.2  # at most this share of a reused data file may be bytes the final model does not read


class WeightPrewrite:
    """Writes the all-FP16 mixed model's stub weights into a temporary data file on a thread (`start`), for
    `artifacts.write` to finish (`take`) or drop (`discard`)."""

    def __init__(self, data_path: Path, values: Mapping[str, object]):
        self.data_path = Path(data_path)
        self._values = dict(values)  # name -> array or FP16Copy, in the mixed model's initializer order
        self._file = AtomicFile(self.data_path)
        self._offsets: dict[tuple, int] = {}
        self._size = 0
        self._written = 0  # values written, in order
        self._stop = threading.Event()  # discarded
        self._handover = threading.Event()  # `take`: the caller's thread writes the rest
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write, name="bisector-prewrite", daemon=True)

    @classmethod
    def start(cls, catalog: Catalog, mixed_path: Path) -> "WeightPrewrite | None":
        """Begin writing the data file of `mixed_path`'s mixed model, or None where that model would be one file
        (its weights below `data_file.EXTERNAL_DATA_FROM_BYTES`: little to gain) or has no candidates."""
        from bisector.fp16.mixed import build_mixed_detached

        if not catalog.candidates or os.environ.get("BISECTOR_PREWRITE", "1") == "0":  # =0: write after the search
            return None
        # Without building the mixed model (0.44 s on a 5000-node chain): its weights are at most the model's with
        # an FP16 copy beside each (an FP32 reader keeps the original), so below this it is one file for sure.
        held = sum(int(np.asarray(v).nbytes) for v in catalog.weight_arrays.values()) + catalog.model.ByteSize()
        if 1.5 * held < data_file.EXTERNAL_DATA_FROM_BYTES:
            return None
        try:
            model, values = build_mixed_detached(catalog, frozenset())  # every candidate FP16
        except Exception as exc:  # noqa: BLE001 - the writer after the search meets it again and reports it
            log.debug("not prewriting the mixed model's weights: %s", exc)
            return None
        if data_file.stays_one_file(model, values):
            return None
        self = cls(Path(mixed_path).with_name(Path(mixed_path).name + ".data"), values)
        self._thread.start()
        return self

    def _write(self) -> None:
        f = self._file.sink
        try:
            with fastcast.on_this_thread():
                for name, value in self._values.items():
                    if self._stop.is_set() or self._handover.is_set():
                        return
                    self._put(f, name, np.ascontiguousarray(np.asarray(value)))
        except BaseException as exc:  # noqa: BLE001 - reported by `take`, which then writes compactly
            self._error = exc

    def _put(self, f, name: str, raw: np.ndarray) -> None:
        pad = (-self._size) % data_file.ALIGN
        if pad:
            f.write(bytes(pad))
        f.write(memoryview(raw.reshape(-1).view(np.uint8)))
        self._offsets[data_file.value_key(name, raw)] = self._size + pad
        self._size += pad + raw.nbytes
        self._written += 1

    def take(self) -> tuple[AtomicFile, dict[tuple, int], int] | None:
        """The finished file: the thread hands over after its current weight, and the caller's thread writes the
        rest at normal priority, converting one ahead (`weights.in_turn`). Returns the open file, its offsets by
        `value_key` and its size; None where writing failed (the caller then writes the data file itself)."""
        self._handover.set()
        self._thread.join()
        if self._error is None and not self._stop.is_set():
            names = list(self._values)[self._written:]
            try:
                for name, raw in zip(names, weight_store.in_turn([self._values[n] for n in names])):
                    self._put(self._file.sink, name, raw)
            except Exception as exc:  # noqa: BLE001 - the writer after the search meets it again and reports it
                self._error = exc
        if self._error is not None or self._stop.is_set():
            if self._error is not None:
                log.debug("prewriting the mixed model's weights failed (%s); writing them now", self._error)
            self.discard()
            return None
        return self._file, self._offsets, self._size

    def discard(self) -> None:
        """Stop the thread and remove the temporary file (idempotent)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._file.discard()
