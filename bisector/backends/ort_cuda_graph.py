"""ort-cuda's switch model replayed as a captured CUDA graph (issue 14, item 5).

The switch model (`fp16.switch`) holds both forms of every candidate, so one run launches five to six kernels
per candidate: on an H100 a 303-node detector's switch run took 23.5 ms against 3.2 ms for its FP32 model, nearly
all of it ONNX Runtime's per-node work on the CPU, not the GPU's (the kernels are small). ORT's CUDA provider can
capture a session's kernels once as a CUDA graph and replay them with one launch (`enable_cuda_graph`). What a
replay needs, and this module provides:

- inputs and outputs at fixed GPU addresses (`IOBinding` to `OrtValue`s allocated once per input signature,
  i.e. input names, shapes and dtypes); a run copies its feed into them (`update_inplace`) and its outputs out;
- the plan's flags: each candidate's scalar flag input is bound to one element of a single bool vector on the
  GPU, so a plan is one copy of that vector (when it changed), and no kernel reads flags out of a vector;
- a graph per input signature (ORT's `gpu_graph_id` run option; at most `MAX_GRAPHS`, further signatures run
  without one), captured on the thread that runs the search (ORT keeps graphs per thread: runs from another
  thread go the plain way).

Nothing here changes which kernels run: the same session's kernels, launched by a replay instead of one by one.
That is checked, not assumed: the first `CHECK_RUNS` bound runs of each signature (ORT's warm-up runs, the
capture and the first replay) are also run the plain way and must give the same bits; if any differs, or ORT
fails to capture (a node that synchronises with the host, e.g. NonZero), the runner stops using graphs for the
rest of the search and says why (`failed`), and every later run is a plain one of the same session.

On a CPU provider (tests) the same bound runs happen without a graph: everything but the capture is exercised.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

log = logging.getLogger("bisector")

GRAPH_ENV = "BISECTOR_ORT_CUDA_GRAPH"
MAX_GRAPHS = 4  # input signatures with a graph each (a search uses one; held-out draws of other shapes are rare)
CHECK_RUNS = 3  # bound runs per signature also run plainly and compared (ORT captures after two warm-up runs)
_ANNOTATION = "gpu_graph_id"  # ORT's run option: which graph a run captures or replays; -1: none


class GraphRunner:
    """Runs one session (the switch model) through bound inputs and outputs, replaying a CUDA graph per
    input signature where the provider captures one."""

    def __init__(self, ort: Any, sess: Any, flags: Sequence[str], device: str = "cuda", device_id: int = 0):
        self.ort = ort
        self.sess = sess
        self.flags = list(flags)  # the switch model's flag inputs, in the order of a plan's vector
        self.device = device
        self.device_id = int(device_id)
        self.failed: str | None = None  # why graphs were given up, if they were
        self.bound_runs = 0  # runs served by bound buffers (replays on a GPU)
        self.plain_runs = 0
        self._owner = threading.get_ident()
        self._lock = threading.Lock()
        self._signatures: dict[tuple, _Bound] = {}
        self._plain_options = ort.RunOptions()
        self._plain_options.add_run_config_entry(_ANNOTATION, "-1")

    def run(self, feed: Mapping[str, np.ndarray], flags: np.ndarray, outputs: Sequence[str]) -> list[np.ndarray]:
        """The session's `outputs` for `feed` (the model's own inputs) and the plan's `flags` (a bool per flag
        input, in `self.flags`' order)."""
        with self._lock:
            if self.failed is not None or threading.get_ident() != self._owner:
                return self._plain(feed, flags, outputs)
            signature = tuple(sorted((k, np.shape(v), np.asarray(v).dtype.str) for k, v in feed.items()))
            bound = self._signatures.get(signature)
            if bound is None:
                result = self._plain(feed, flags, outputs)
                if len(self._signatures) < MAX_GRAPHS:  # the plain run tells the outputs' shapes
                    try:
                        self._signatures[signature] = _Bound(self, len(self._signatures) + 1, feed, flags,
                                                             outputs, result)
                    except Exception as e:  # noqa: BLE001 - no room for the buffers, a binding ORT refuses
                        return self._give_up(f"could not bind the buffers: {str(e).strip()[:300]}", feed, flags,
                                             outputs, result)
                return result
            try:
                result = bound.run(feed, flags)
            except Exception as e:  # noqa: BLE001 - a capture ORT cannot make is a reason to stop, not a verdict
                return self._give_up(f"ONNX Runtime could not run the captured graph: {str(e).strip()[:300]}",
                                     feed, flags, outputs)
            if bound.checks_left:
                bound.checks_left -= 1
                plain = self._plain(feed, flags, outputs)
                if not all(same_bits(a, b) for a, b in zip(result, plain)):
                    again = self._plain(feed, flags, outputs)
                    why = ("a replayed run differed from the same session's plain run" if
                           all(same_bits(a, b) for a, b in zip(plain, again)) else
                           "the session's own plain runs differ from each other, so no replay can be checked")
                    return self._give_up(why, feed, flags, outputs, plain)
            self.bound_runs += 1
            return result

    def plain(self, feed: Mapping[str, np.ndarray], flags: np.ndarray, outputs: Sequence[str]) -> list[np.ndarray]:
        """A run of the same session without the graph (the backend's repeat check)."""
        with self._lock:
            return self._plain(feed, flags, outputs)

    def _plain(self, feed, flags, outputs) -> list[np.ndarray]:
        self.plain_runs += 1
        named = {name: np.array(bool(v)) for name, v in zip(self.flags, flags)}
        return self.sess.run(list(outputs), {**feed, **named}, self._plain_options)

    def _give_up(self, why: str, feed, flags, outputs, plain: list[np.ndarray] | None = None) -> list[np.ndarray]:
        self.failed = why
        self._signatures.clear()  # lets go of the bound GPU buffers
        log.warning("ort-cuda: CUDA graphs off for the rest of this search (%s); runs go the plain way, slower, "
                    "with the same kernels", why)
        return plain if plain is not None else self._plain(feed, flags, outputs)


class _Bound:
    """One input signature's buffers, binding and graph id."""

    def __init__(self, runner: GraphRunner, graph_id: int, feed: Mapping[str, np.ndarray], flags: np.ndarray,
                 outputs: Sequence[str], result: Sequence[np.ndarray]):
        ort, sess = runner.ort, runner.sess
        place = (runner.device, runner.device_id)
        self.sess = sess
        self.binding = sess.io_binding()
        self.inputs: dict[str, Any] = {}
        self.fed: dict[str, np.ndarray] = {}  # the arrays last copied in (held, so `is` can tell them again)
        for name, value in feed.items():
            value = np.ascontiguousarray(value)
            # On the GPU the OrtValue is a copy; on the CPU (the stand-in) it would wrap the caller's array itself
            # (ORT's wrapper keeps that array alive), so it wraps a copy, and the stand-in copies in as the GPU does
            buffer = value if runner.device != "cpu" else np.array(value, copy=True)
            self.inputs[name] = ort.OrtValue.ortvalue_from_numpy(buffer, *place)
            self.binding.bind_ortvalue_input(name, self.inputs[name])
            self.fed[name] = value
        self.flags = np.array(flags, dtype=bool, copy=True)
        self.flag_value = ort.OrtValue.ortvalue_from_numpy(np.array(self.flags, copy=True), *place)
        base = self.flag_value.data_ptr()
        for k, name in enumerate(runner.flags):  # a scalar input at element k of the vector (bools: no alignment)
            self.binding.bind_input(name, runner.device, runner.device_id, np.bool_, [], base + k)
        self.outputs = []
        for name, value in zip(outputs, result):
            value = np.asarray(value)
            out = ort.OrtValue.ortvalue_from_shape_and_type(list(value.shape), value.dtype, *place)
            self.binding.bind_ortvalue_output(name, out)
            self.outputs.append(out)
        self.options = ort.RunOptions()
        self.options.add_run_config_entry(_ANNOTATION, str(graph_id))
        self.checks_left = CHECK_RUNS

    def run(self, feed: Mapping[str, np.ndarray], flags: np.ndarray) -> list[np.ndarray]:
        for name, value in feed.items():
            # The same read-only array as last time cannot hold other values; any other (another input set of the
            # same shapes, or a writeable array its owner may have changed in place) is copied in again
            if value is not self.fed[name] or value.flags.writeable:
                value = np.ascontiguousarray(value)
                self.inputs[name].update_inplace(value)
                self.fed[name] = value
        if not np.array_equal(flags, self.flags):
            self.flags = np.array(flags, dtype=bool, copy=True)
            self.flag_value.update_inplace(self.flags)
        self.binding.synchronize_inputs()
        self.sess.run_with_iobinding(self.binding, self.options)
        self.binding.synchronize_outputs()
        if self.outputs and self.outputs[0].device_name() == "cpu":  # a CPU buffer's array is the buffer itself
            return [np.array(out.numpy(), copy=True) for out in self.outputs]
        return [out.numpy() for out in self.outputs]


def same_bits(a: Any, b: Any) -> bool:
    """The same shape, dtype and bytes (NaN payloads included): what a replay must give (and `ort_cuda._apart`'s 0)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
