"""`ort-cuda`: real FP16 kernels on an NVIDIA GPU through ONNX Runtime's CUDA execution provider (DESIGN §2, §4a).

By default one *switch model* serves every plan (`fp16.switch`: each candidate's FP16 form — exactly what every
mixed model writes for it — beside its FP32 form, chosen per run by a boolean input), so the session, and cuDNN's
algorithm search, happen once per search instead of once per plan: on an H100, a 303-node detector's search took
6.7 s instead of 56 s (docs/verification.md, "Issue 14: one switch model"). BISECTOR_ORT_CUDA_SWITCH=0 gives each
plan its strongly typed mixed-precision ONNX (`mixed.build_mixed_model`) and its own ORT session (cached per plan,
LRU) — with ORT's fusions across neighbouring FP16 nodes, which the switch model cannot have. The switch session
is replayed as a CUDA graph where ORT can capture one (`ort_cuda_graph`; BISECTOR_ORT_CUDA_GRAPH=0 turns it off):
a switch run was mostly ORT's per-node work on the CPU (2.6–3.7 × one FP32 inference instead of 5–8 × on three
detectors, docs/verification.md, "Fortieth round"). The first two plans of every session run twice, so a model on
which ORT-CUDA's kernels do not repeat themselves is said (`run_to_run`).

What this backend measures that `emulate` does not: the GPU kernels' own arithmetic (some FP16 kernels accumulate
or compute intermediates in FP16) and ORT's fusions. What it cannot promise: a node that ORT places on the CPU
provider runs there in FP32 (ORT wraps FP16 nodes without a CPU kernel in casts and removes the fp32->fp16->fp32
chains, DESIGN §4), so its FP16 verdict is not a GPU one. Every session is first created with
`session.disable_cpu_ep_fallback=1`; when ORT refuses that (some node has no CUDA kernel, or is a shape
computation ORT prefers on the CPU), the session is created again with fallback allowed, its first run is
profiled, and the nodes that ran on the CPU provider are recorded: `cpu_fallback_nodes` in `describe()` (FP16
candidates among them are the verdicts to distrust) and a warning in the log.

Install: `pip uninstall onnxruntime && pip install onnxruntime-gpu` (the two packages share the `onnxruntime`
module and must not be installed together); ORT's CUDA/cuDNN libraries come from the system or from the
`nvidia-*` wheels (`onnxruntime.preload_dlls()` loads those of a PyTorch install). Without the CUDA provider or
without a GPU the backend stops with a UsageError (exit 2).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from bisector import __version__, ort_pool
from bisector.backends.ort_cuda_graph import GRAPH_ENV, GraphRunner, same_bits
from bisector.errors import BackendFailure, BuildFailure, UsageError
from bisector.fp16.casts import FLOAT, cast, fp16_name
from bisector.fp16.mixed import build_mixed_model
from bisector.fp16.switch import build_switch_model
from bisector.fp16.plan import Plan

if TYPE_CHECKING:  # pragma: no cover
    from bisector.model.catalog import Catalog

log = logging.getLogger("bisector")

CUDA_EP = "CUDAExecutionProvider"
CPU_EP = "CPUExecutionProvider"
_INSTALL_HINT = (
    "Install the GPU build of ONNX Runtime on a machine with an NVIDIA GPU and driver: "
    "`pip uninstall onnxruntime && pip install onnxruntime-gpu` (the two packages provide the same module and "
    "must not be installed together; onnxruntime-gpu 1.31 needs CUDA 13 and cuDNN 9, e.g. the nvidia-* wheels "
    "that PyTorch installs). Or choose `--backend emulate`, which needs no GPU."
)


class OrtCudaBackend:
    name = "ort-cuda"

    def __init__(self, device_id: int = 0, strict: bool = True, *, session_cache_size: int = 8,
                 graph_optimization: str = "all", providers: Sequence[Any] | None = None, switch: bool | None = None,
                 graph: bool | None = None):
        """`strict`: first ask ORT for a session with CPU fallback disabled (only then is every node known to run
        on the GPU); `strict=False` skips that attempt and always profiles the first run to find CPU nodes.
        `providers` is a test hook: use exactly these providers and skip the CUDA checks (a CPU stand-in lets
        tests show that the canary catches a backend that silently computes FP32)."""
        self.device_id = int(device_id)
        self.strict = bool(strict)
        self.session_cache_size = max(1, int(session_cache_size))
        self.graph_optimization = graph_optimization
        self._forced_providers = list(providers) if providers is not None else None
        self.ort = import_ort(check_cuda=providers is None)
        # ORT's process-wide logger prints what no session option reaches: cuDNN's frontend logs an error line
        # for each Conv it then runs another way ("No execution plans support the graph", 22 lines in one search
        # of a layout detector on an H100) and a warning per session about plugin EPs. That logger belongs to the
        # process: the command line asks for fatal only (a failure still reaches the user once, as our error with
        # ORT's message in it); a program using the API keeps its own setting unless it sets the variable.
        severity = os.environ.get(PROCESS_LOG_ENV, "").strip()
        if severity:
            if severity not in ("0", "1", "2", "3", "4"):
                raise UsageError(f"{PROCESS_LOG_ENV}={severity!r}: an ONNX Runtime severity, 0 (verbose) to 4 (fatal)")
            if hasattr(self.ort, "set_default_logger_severity"):
                self.ort.set_default_logger_severity(int(severity))
        self.catalog: Catalog | None = None
        self._sessions: OrderedDict[tuple, Any] = OrderedDict()
        self._device: dict[str, str] | None = None
        self.cpu_fallback: dict[str, dict[str, Any]] = {}  # plan key -> {"nodes": [...], "other": [...], ...}
        self.session_times: list[float] = []
        # One switch model for every plan (bisector.fp16.switch): built and loaded once, a plan is a run with one
        # flag per candidate, so cuDNN's algorithm search runs once per search instead of once per plan.
        env = os.environ.get(SWITCH_ENV, "where")
        if env not in ("0", "1", "where", "if"):
            raise UsageError(f"{SWITCH_ENV}={env!r}: where (default) or 1, if, or 0 (a session per plan)")
        self.switch = (env != "0") if switch is None else bool(switch)
        self.switch_kind = "if" if env == "if" else "where"
        self._flags: dict[str, str] = {}
        self._switch_cpu: list[str] | None = None  # nodes the switch session placed on the CPU provider
        # The Where switch model replayed as a CUDA graph (`ort_cuda_graph`): ORT's per-node work, most of a switch
        # run, done once at capture. Off where ORT cannot capture (control flow, CPU nodes) or a replay differs.
        genv = os.environ.get(GRAPH_ENV, "1").strip()
        if genv not in ("0", "1"):
            raise UsageError(f"{GRAPH_ENV}={genv!r}: 1 (default: replay the switch model as a CUDA graph) or 0")
        # a CPU stand-in (`providers`) has no graph to capture: its bound runs only where a test asks (`graph=True`)
        self.graph = (genv == "1" and providers is None) if graph is None else bool(graph)
        self.graph_off: str | None = None  # why the switch session runs without a graph, when it does
        self.run_to_run: float | None = None  # the largest difference seen between two runs of one plan

    # ---- protocol ------------------------------------------------------------------------------------------
    def open(self, catalog: "Catalog") -> None:
        self.close()
        self.catalog = catalog
        if self._forced_providers is None:
            self._device = _device_info(self.device_id)
            self._probe_gpu()

    def canary(self) -> None:
        from bisector.backends.canary import run_canary

        run_canary(lambda: OrtCudaBackend(self.device_id, self.strict, graph_optimization=self.graph_optimization,
                                          providers=self._forced_providers))

    def describe(self) -> dict[str, str]:
        fallback_nodes = sorted({n for v in self.cpu_fallback.values() for n in v["nodes"]})
        d = {
            "backend": self.name,
            "onnxruntime": self.ort.__version__,
            "providers": ",".join(self._provider_names()),
            "device_id": str(self.device_id),
            "graph_optimization": self.graph_optimization,
            "strict": str(self.strict).lower(),
            "bisector": __version__,
        }
        if self.switch:  # other kernels (no fusion across nodes): other verdicts, kept apart in the journal
            d["mode"] = f"switch-{self.switch_kind}"
            runners = [r for r in (getattr(s, "_bisector_graph", None) for s in self._sessions.values()) if r]
            if self._uses_graph():  # not part of the journal key (the same kernels; job.py)
                d["cuda_graph"] = self.graph_off or next((f"off: {r.failed}" for r in runners if r.failed), "on")
                bound, plain = sum(r.bound_runs for r in runners), sum(r.plain_runs for r in runners)
                d["cuda_graph_runs"] = f"{bound} bound, {plain} plain"
        if self._device:
            d.update({f"device_{k}": v for k, v in self._device.items()})
        extra = extra_cuda_options()
        if extra:  # e.g. another cuDNN algorithm choice: other kernels, so other verdicts (part of the journal key)
            d["cuda_options"] = ",".join(f"{k}={v}" for k, v in sorted(extra.items()))
        if self.run_to_run is not None:  # observed, not part of the journal key (job.py)
            d["run_to_run"] = f"{self.run_to_run:.3g}"
        # Which verdicts are real-GPU ones: nodes that ran on the CPU provider in any session so far.
        d["cpu_fallback_nodes"] = ",".join(fallback_nodes)
        d["cpu_fallback_plans"] = str(sum(1 for v in self.cpu_fallback.values() if v["nodes"] or v["other"]))
        return d

    def close(self) -> None:
        self._sessions.clear()

    def run(self, plan: Plan, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        names = tuple(outputs) if outputs is not None else tuple(self._cat.output_names)
        sess = self._session(plan, names)
        runner = getattr(sess, "_bisector_graph", None)
        if runner is not None:
            vector = np.fromiter((node in plan.fp16 for node in self._flags), dtype=bool, count=len(self._flags))
            feed = {name: np.asarray(feeds[name]) for name in sess._bisector_inputs}
            try:
                result = runner.run(feed, vector, names)
            except Exception as e:  # noqa: BLE001 - as below
                raise BackendFailure(f"ort-cuda: running the switch model for a plan ({len(plan.fp32)} FP32 nodes) "
                                     f"failed: {e}") from e
            if getattr(sess, "_bisector_profile", False):  # the runner's first run was a plain one
                self._record_placement(plan, sess)
            else:
                self._note_fallback(plan, self._switch_cpu or [], [], None)
            self._check_repeat(sess, result, lambda: runner.plain(feed, vector, names))
            return _as_float32(names, result)
        flags = self._flags if self.switch else {}
        flag_inputs = set(flags.values())
        feed = {i.name: np.asarray(feeds[i.name]) for i in sess.get_inputs() if i.name not in flag_inputs}
        feed.update({flag: np.array(node in plan.fp16) for node, flag in flags.items()})
        try:
            if getattr(sess, "_bisector_profile", False):
                result = sess.run(list(names), feed)
                self._record_placement(plan, sess)
            else:
                result = sess.run(list(names), feed)
                if self.switch and self._switch_cpu is not None:
                    self._note_fallback(plan, self._switch_cpu, [], None)
        except Exception as e:  # noqa: BLE001 - a CUDA/ORT runtime error is a backend failure, not a verdict
            raise BackendFailure(f"ort-cuda: running the mixed model of a plan ({len(plan.fp32)} FP32 nodes) failed: {e}") from e
        self._check_repeat(sess, result, lambda: sess.run(list(names), feed))
        return _as_float32(names, result)

    def _check_repeat(self, sess, result: Sequence[Any], again: Callable[[], Sequence[Any]]) -> None:
        """The first `REPEAT_CHECKS` plans of each session run twice: where ORT-CUDA's kernels are not deterministic
        on the model (Magika on an H200: eight runs of its all-FP32 plan, eight outputs up to 9.5e-4 apart), a
        verdict near the tolerance can change from run to run, and the user hears it once, with how far apart."""
        done = getattr(sess, "_bisector_repeats", 0)
        if done >= REPEAT_CHECKS:
            return
        sess._bisector_repeats = done + 1
        try:
            other = again()
        except Exception:  # noqa: BLE001 - the plan's own run succeeded; a failing repeat tells nothing new
            return
        apart = max((_apart(a, b) for a, b in zip(result, other)), default=0.0)
        if apart == 0.0:
            return
        first = self.run_to_run is None
        self.run_to_run = max(self.run_to_run or 0.0, apart)
        if first:
            log.warning("ort-cuda: two runs of the same plan in one session gave outputs up to %.3g apart: ONNX "
                        "Runtime's CUDA kernels are not deterministic on this model, so a verdict within that of the "
                        "tolerance can change from run to run (keep headroom: --margin; judge the final set again: "
                        "verify --backend ort-cuda)", apart)

    # ---- sessions ------------------------------------------------------------------------------------------
    @property
    def _cat(self) -> "Catalog":
        if self.catalog is None:
            raise BackendFailure("ort-cuda: run() before open()")
        return self.catalog

    def _provider_names(self) -> list[str]:
        if self._forced_providers is not None:
            return [p if isinstance(p, str) else p[0] for p in self._forced_providers]
        return [CUDA_EP]

    def _providers(self, allow_cpu: bool, graph: bool = False) -> list[Any]:
        if self._forced_providers is not None:
            return list(self._forced_providers)
        # use_tf32=0: ORT's CUDA provider runs FP32 MatMul/Conv in TF32 by default (10-bit mantissa), so a node
        # kept "FP32" would not be FP32 and even the all-FP32 plan fails tight tolerances (seen on the H100).
        options = {"device_id": str(self.device_id), "use_tf32": "0", **extra_cuda_options()}
        if graph:
            options["enable_cuda_graph"] = "1"
        return [(CUDA_EP, options), CPU_EP] if allow_cpu else [(CUDA_EP, options)]

    def _options(self, strict: bool, profile: bool):
        so = ort_pool.session_options()  # the process's choice of pool (bisector.ort_pool), as every session
        level = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
                 "all": "ORT_ENABLE_ALL"}.get(self.graph_optimization)
        if level is None:
            raise UsageError(f"ort-cuda: graph_optimization {self.graph_optimization!r}: use disable, basic, extended or all")
        so.graph_optimization_level = getattr(self.ort.GraphOptimizationLevel, level)
        # Fatal only: a refused strict attempt is expected, and ORT's error lines are noise when it recovers (cuDNN's
        # frontend logs "No execution plans support the graph" for a Conv and falls back, H100, layout detector);
        # where it does not, its message reaches the user once, in our exception.
        so.log_severity_level = 4
        if strict:
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        if profile:
            so.enable_profiling = True
            so.profile_file_prefix = os.path.join(tempfile.gettempdir(), f"bisector_ort_cuda_{os.getpid()}")
        return so

    def _session(self, plan: Plan, outputs: tuple[str, ...]):
        key = ("switch" if self.switch else plan.key(), outputs)
        sess = self._sessions.get(key)
        if sess is not None:
            self._sessions.move_to_end(key)
            return sess
        if self.switch and self._uses_graph() and self.graph_off is None:
            sess = self._graph_session(outputs)
            if sess is not None:
                return self._keep(key, sess)
        if self.switch:
            model, self._flags = build_switch_model(self._cat, self.switch_kind)
            model = _with_outputs(model, outputs)
        else:
            model = self._mixed_model(plan, outputs)
        data = model.SerializeToString()
        t0 = time.perf_counter()
        strict_error = None
        sess = None
        if self.strict and self._forced_providers is None:
            try:
                sess = self.ort.InferenceSession(data, self._options(strict=True, profile=False),
                                                 providers=self._providers(allow_cpu=False))
            except Exception as e:  # noqa: BLE001 - ORT raises Fail/InvalidArgument/... depending on the cause
                strict_error = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if sess is None:
            try:
                sess = self.ort.InferenceSession(data, self._options(strict=False, profile=True),
                                                 providers=self._providers(allow_cpu=True))
            except Exception as e:  # noqa: BLE001
                raise BuildFailure(f"ort-cuda: ONNX Runtime could not create a session for the mixed model of a "
                                   f"plan ({len(plan.fp32)} FP32 nodes): {e}") from e
            sess._bisector_profile = True  # type: ignore[attr-defined]
            sess._bisector_strict_error = strict_error  # type: ignore[attr-defined]
        else:
            self.cpu_fallback.setdefault(plan.key(), {"nodes": [], "other": [], "fp16_nodes": []})
            if self.switch:
                self._switch_cpu = []
        if self._forced_providers is None and CUDA_EP not in sess.get_providers():
            raise UsageError(f"--backend ort-cuda: ONNX Runtime did not enable the CUDA provider on device "
                             f"{self.device_id} (session providers {sess.get_providers()}). {_INSTALL_HINT}")
        self.session_times.append(time.perf_counter() - t0)
        return self._keep(key, sess)

    def _keep(self, key: tuple, sess):
        """`sess` cached under `key`, the least recently used beyond `session_cache_size` let go."""
        self._sessions[key] = sess
        while len(self._sessions) > self.session_cache_size:
            self._sessions.popitem(last=False)
        return sess

    def _uses_graph(self) -> bool:
        return self.switch and self.switch_kind == "where" and self.graph

    def _graph_session(self, outputs: tuple[str, ...]):
        """The switch model's session with ORT's CUDA graph enabled, and its runner; None, with the reason in
        `graph_off`, where ORT cannot have one (a compute node on the CPU, control flow): the caller then builds
        the plain switch session."""
        model, flags = build_switch_model(self._cat, "where")
        model = _with_outputs(model, outputs)
        t0 = time.perf_counter()
        data = model.SerializeToString()
        if self._forced_providers is None:
            # Every node on the GPU; else the shape computations alone on the CPU, which ORT's graph allows where
            # no copy between the two is needed (YOLOv8n: its Shape/Gather/Concat chains), placement profiled
            attempts = [(self._providers(allow_cpu=False, graph=True), self._options(strict=True, profile=False),
                         False),
                        (self._providers(allow_cpu=True, graph=True), self._options(strict=False, profile=True), True)]
            device = "cuda"
        else:  # a CPU stand-in (tests): the same bound runs, without a graph to capture
            attempts = [(list(self._forced_providers), self._options(strict=False, profile=False), False)]
            device = "cpu"
        sess, error = None, ""
        for providers, options, profile in attempts:
            try:
                sess = self.ort.InferenceSession(data, options, providers=providers)
                break
            except Exception as e:  # noqa: BLE001 - control flow in the model, compute nodes ORT keeps on the CPU
                error = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        if sess is None:
            self.graph_off = f"off: {error}"
            log.info("ort-cuda: no CUDA graph for this model (%s)", error)
            return None
        self.session_times.append(time.perf_counter() - t0)
        self._flags = flags
        if profile:
            sess._bisector_profile = True  # type: ignore[attr-defined]  # its first run tells the placement
            self._switch_cpu = None
        else:
            self._switch_cpu = []
        flag_inputs = set(flags.values())
        inputs = [i.name for i in sess.get_inputs() if i.name not in flag_inputs]
        sess._bisector_inputs = inputs  # type: ignore[attr-defined]
        runner = GraphRunner(self.ort, sess, list(flags.values()), device, self.device_id)
        sess._bisector_graph = runner  # type: ignore[attr-defined]
        return sess

    def _mixed_model(self, plan: Plan, outputs: tuple[str, ...]) -> onnx.ModelProto:
        return _with_outputs(build_mixed_model(self._cat, plan), outputs)

    def _note_fallback(self, plan: Plan, in_catalog: list[str], other: list[str], strict_error: str | None) -> None:
        candidates = set(self._cat.candidates)
        fp16_on_cpu = sorted(n for n in in_catalog if n in candidates and n in plan.fp16)
        self.cpu_fallback[plan.key()] = {"nodes": in_catalog, "other": other, "fp16_nodes": fp16_on_cpu,
                                       "strict_error": strict_error}
        if fp16_on_cpu and self._forced_providers is None:
            log.warning("ort-cuda: %d FP16 node(s) of this plan ran on ONNX Runtime's CPU provider, in FP32 (their "
                        "verdicts are not GPU ones): %s", len(fp16_on_cpu), ", ".join(fp16_on_cpu[:20]))


    def _record_placement(self, plan: Plan, sess) -> None:
        """Which nodes ran on the CPU provider (from ORT's profile of the session's first run)."""
        sess._bisector_profile = False
        try:
            path = sess.end_profiling()
        except Exception:  # noqa: BLE001
            return
        on_cpu: list[str] = []
        try:
            with open(path) as f:
                events = json.load(f)
            for e in events:
                if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
                    continue
                if e.get("args", {}).get("provider") == CPU_EP:
                    on_cpu.append(e["name"][: -len("_kernel_time")])
        except (OSError, ValueError):
            return
        finally:
            try:
                os.remove(path)
            except OSError:
                pass
        nodes = self._cat.nodes
        in_catalog = sorted({n for n in on_cpu if n in nodes})
        other = sorted({n for n in on_cpu if n not in nodes})
        if self.switch:  # one session for every plan: its placement holds for every later plan too
            self._switch_cpu = in_catalog
        self._note_fallback(plan, in_catalog, other, getattr(sess, "_bisector_strict_error", None))

    def _probe_gpu(self) -> None:
        """A one-node FP16 session: proves the CUDA provider loads and a GPU is there, before any search."""
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1])
        g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
        so = ort_pool.session_options()
        so.log_severity_level = 4
        try:
            sess = self.ort.InferenceSession(m.SerializeToString(), so, providers=self._providers(allow_cpu=True))
        except Exception as e:  # noqa: BLE001
            raise UsageError(f"--backend ort-cuda: could not start ONNX Runtime's CUDA provider on device "
                             f"{self.device_id}: {str(e).strip()[:400]}. {_INSTALL_HINT}") from e
        if CUDA_EP not in sess.get_providers():
            raise UsageError(f"--backend ort-cuda: ONNX Runtime fell back to {sess.get_providers()} instead of the "
                             f"CUDA provider on device {self.device_id} (no usable GPU or CUDA/cuDNN libraries "
                             f"missing). {_INSTALL_HINT}")



def _apart(a: Any, b: Any) -> float:
    """0 where `a` and `b` are the same bits; else the largest absolute difference (inf where only one is finite,
    or where they differ in anything but float values)."""
    if same_bits(a, b):
        return 0.0
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype.kind != "f" or b.dtype.kind != "f":
        return float("inf")
    x, y = a.astype(np.float64), b.astype(np.float64)
    both = np.isfinite(x) & np.isfinite(y)
    if (not np.array_equal(both, np.isfinite(x)) or not np.array_equal(both, np.isfinite(y))
            or not np.array_equal(x[~both], y[~both], equal_nan=True)):  # +inf against -inf too
        return float("inf")
    d = np.abs(x[both] - y[both])
    return float(d.max()) if d.size else 0.0  # NaNs in the same places with other payloads: no difference


def _as_float32(names: Sequence[str], result: Sequence[Any]) -> dict[str, np.ndarray]:
    out = {}
    for n, v in zip(names, result):
        v = np.asarray(v)
        out[n] = v.astype(np.float32) if v.dtype == np.float16 else v
    return out


def _with_outputs(model: onnx.ModelProto, outputs: tuple[str, ...]) -> onnx.ModelProto:
    """`model` with exactly `outputs` as its graph outputs (an internal FP32 tensor of a mixed model may be asked
    for: its FP16 version is cast back)."""
    graph = model.graph
    have = {o.name for o in graph.output}
    produced = {t for n in graph.node for t in n.output} | {i.name for i in graph.input}
    for t in outputs:
        if t in have:
            continue
        if t not in produced and fp16_name(t) in produced:
            graph.node.append(cast(fp16_name(t), t, FLOAT))
        elif t not in produced:
            raise BackendFailure(f"ort-cuda: tensor {t!r} does not exist in the mixed model")
        vi = onnx.ValueInfoProto()
        vi.name = t
        graph.output.append(vi)
    if set(outputs) != have:
        # Only the requested outputs, so ORT prunes nothing the caller needs and computes nothing it doesn't.
        keep = [o for o in graph.output if o.name in set(outputs)]
        del graph.output[:]
        graph.output.extend(keep)
    return model


REPEAT_CHECKS = 2  # plans per session run twice (`_check_repeat`)
PROCESS_LOG_ENV = "BISECTOR_ORT_PROCESS_LOG_SEVERITY"  # ORT's process-wide logger (the CLI sets 4 unless --verbose)
OPTIONS_ENV = "BISECTOR_ORT_CUDA_OPTIONS"
SWITCH_ENV = "BISECTOR_ORT_CUDA_SWITCH"


def extra_cuda_options() -> dict[str, str]:
    """CUDA provider options from BISECTOR_ORT_CUDA_OPTIONS ("key=value,key=value"), e.g.
    `cudnn_conv_algo_search=HEURISTIC` (ORT's default EXHAUSTIVE benchmarks every Conv's algorithms in each new
    session, i.e. once per plan here). device_id and use_tf32 stay the backend's."""
    raw = os.environ.get(OPTIONS_ENV, "").strip()
    out: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in raw.split(","))):
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise UsageError(f"{OPTIONS_ENV}={raw!r}: give key=value pairs separated by commas")
        if k.strip() in ("device_id", "use_tf32"):
            raise UsageError(f"{OPTIONS_ENV}: {k.strip()} is set by the backend")
        out[k.strip()] = v.strip()
    return out


def import_ort(check_cuda: bool):
    import onnxruntime as ort

    if not check_cuda:
        return ort
    available = ort.get_available_providers()
    if CUDA_EP not in available:
        raise UsageError(
            f"--backend ort-cuda needs ONNX Runtime's CUDA execution provider, but the installed onnxruntime "
            f"{ort.__version__} offers only {', '.join(available)}. {_INSTALL_HINT}"
        )
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:  # CUDA/cuDNN from the nvidia-* wheels (a PyTorch install); harmless where the system provides them
            preload()
        except Exception as e:  # noqa: BLE001
            log.debug("onnxruntime.preload_dlls() failed: %s", e)
    return ort


def _device_info(device_id: int) -> dict[str, str]:
    """GPU name, compute capability and driver through the CUDA driver API (no framework needed)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return {}
    try:
        if cuda.cuInit(0) != 0:
            return {}
        dev = ctypes.c_int()
        if cuda.cuDeviceGet(ctypes.byref(dev), device_id) != 0:
            return {}
        buf = ctypes.create_string_buffer(256)
        cuda.cuDeviceGetName(buf, 256, dev)
        major, minor, drv = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # COMPUTE_CAPABILITY_MAJOR
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # COMPUTE_CAPABILITY_MINOR
        cuda.cuDriverGetVersion(ctypes.byref(drv))
        return {"name": buf.value.decode(errors="replace"), "compute_capability": f"{major.value}.{minor.value}",
                "cuda_driver": f"{drv.value // 1000}.{drv.value % 1000 // 10}"}
    except Exception:  # noqa: BLE001
        return {}
