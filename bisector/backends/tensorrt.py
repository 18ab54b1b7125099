"""`tensorrt` and `tensorrt-rtx`: real FP16 engines for each plan (DESIGN §7).

Two paths, chosen by the installed module:

- **weak** (TensorRT 10.x): parse the model once, set `BuilderFlag.FP16` and the precision-constraint flag
  (`obey` by default, or `prefer`), and for every layer that came from an FP32 node set `layer.precision =
  float32` *and* `layer.set_output_type(i, float32)` on its float outputs (precision alone lets TensorRT store the
  outputs in FP16). The parsed network is reused for every plan: the marks of the previous plan are reset.
- **strong** (TensorRT 11.x, TensorRT-RTX, or `strongly_typed=True` on TensorRT >= 10.12): parse the
  mixed-precision ONNX of the plan (`mixed.build_mixed_model`) into a `STRONGLY_TYPED` network; precision lives in
  the graph.

Nodes are mapped to layers by `trt_layers.match_layers`, the one rule the generated add_constraints.py also
carries. An FP32 node that maps to no layer is a BackendFailure (exit 3), listing the nodes: the plan cannot be
expressed in this build, and silently running such a node in FP16 would make the oracle lie. Pinned nodes (not
candidates: Loop/Scan, float shape arithmetic, ops without FP16) are FP32 in every plan, as in the emulation;
a pinned node without a layer is fine (the parser computed it while parsing).

Every candidate build of a search shares one timing cache (optionally loaded from and saved to a file, the
spellings of Polygraphy's `--load-timing-cache` / `--save-timing-cache`). A build that fails raises BuildFailure,
a verdict distinct from an accuracy failure. Inference uses cuda-python buffers and one stream (no PyTorch) with
the TensorRT 10 tensor-address API; floating outputs come back as float32.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from bisector import __version__
from bisector.errors import BackendFailure, BuildFailure, UsageError
from bisector.fp16.plan import Plan
from bisector.backends.trt_layers import match_layers, subgraph_aliases
from bisector.backends.trt_import import (
    import_cudart,
    import_tensorrt,
    import_tensorrt_rtx,
    parse_version,
)

if TYPE_CHECKING:  # pragma: no cover - the real module is only imported lazily
    import tensorrt as trt

    from bisector.model.catalog import Catalog

PRECISION_CONSTRAINTS = ("obey", "prefer")
MIN_STRONGLY_TYPED_10 = (10, 12)


# ---- options ----------------------------------------------------------------------------------------------
@dataclass
class EngineOptions:
    """Build options shared by both paths (validated once, at construction)."""

    load_timing_cache: Path | None = None
    save_timing_cache: Path | None = None
    builder_optimization_level: int | None = None
    tactic_sources: tuple[str, ...] | None = None
    save_engines: Path | None = None
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def describe(self) -> dict[str, str]:
        return {
            "builder_optimization_level": "default" if self.builder_optimization_level is None
            else str(self.builder_optimization_level),
            "tactic_sources": "default" if self.tactic_sources is None else ",".join(self.tactic_sources) or "none",
            "input_shapes": ",".join(f"{k}:{list(v)}" for k, v in sorted(self.input_shapes.items())) or "from inputs",
        }


def plan_hash(plan: Plan) -> str:
    return hashlib.sha256(plan.key().encode()).hexdigest()[:16]


# ---- the backend ------------------------------------------------------------------------------------------
class TensorRTBackend:
    """`--backend tensorrt`: the path follows the installed TensorRT (10.x weak typing, 11.x strong typing)."""

    name = "tensorrt"

    def __init__(
        self,
        *,
        precision_constraints: str = "obey",
        strongly_typed: bool = False,
        load_timing_cache: str | os.PathLike[str] | None = None,
        save_timing_cache: str | os.PathLike[str] | None = None,
        builder_optimization_level: int | None = None,
        tactic_sources: Sequence[str] | None = None,
        save_engines: str | os.PathLike[str] | None = None,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        module: Any = None,
        cudart: Any = None,
    ) -> None:
        if precision_constraints not in PRECISION_CONSTRAINTS:
            raise UsageError(f"--precision-constraints must be one of {', '.join(PRECISION_CONSTRAINTS)}, "
                             f"not {precision_constraints!r}")
        if builder_optimization_level is not None and not 0 <= int(builder_optimization_level) <= 5:
            raise UsageError(f"--builder-optimization-level must be 0..5, not {builder_optimization_level}")
        load = Path(load_timing_cache) if load_timing_cache is not None else None
        if load is not None and load.exists() and not load.is_file():
            raise UsageError(f"--load-timing-cache {load} is not a file")
        self.precision_constraints = precision_constraints
        self.strongly_typed = bool(strongly_typed)
        self.options = EngineOptions(
            load_timing_cache=load,
            save_timing_cache=Path(save_timing_cache) if save_timing_cache is not None else None,
            builder_optimization_level=None if builder_optimization_level is None else int(builder_optimization_level),
            tactic_sources=None if tactic_sources is None else tuple(str(s) for s in tactic_sources),
            save_engines=Path(save_engines) if save_engines is not None else None,
            input_shapes={k: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()},
        )
        self._module = module
        self._cudart_module = cudart
        self.trt: Any = None
        self.path: str | None = None
        self.catalog: Catalog | None = None
        self._engines: _EngineBuilder | None = None
        self._weak: _WeakNetwork | None = None
        self._runner_cache: tuple[tuple, _Runner] | None = None

    # ---- module and path ---------------------------------------------------------------------------------
    def _import(self) -> Any:
        return import_tensorrt(self._module)

    def _choose_path(self, trt_mod: Any) -> str:
        version = parse_version(trt_mod.__version__)
        if version[0] < 10:
            raise UsageError(f"TensorRT {trt_mod.__version__} is too old: bisector needs TensorRT 10 or newer")
        weak_api = hasattr(trt_mod.BuilderFlag, "FP16") and hasattr(trt_mod.BuilderFlag, "OBEY_PRECISION_CONSTRAINTS")
        if version[0] >= 11 or not weak_api:
            return "strong"
        if self.strongly_typed:
            if version[:2] < MIN_STRONGLY_TYPED_10:
                raise UsageError(f"--strongly-typed needs TensorRT >= {'.'.join(map(str, MIN_STRONGLY_TYPED_10))} "
                                 f"(found {trt_mod.__version__}); leave it off to use weak typing")
            return "strong"
        return "weak"

    def _ensure_module(self) -> Any:
        if self.trt is None:
            trt_mod = self._import()
            self.path = self._choose_path(trt_mod)
            self.trt = trt_mod
        return self.trt

    @property
    def judges_branches(self) -> bool:
        """Does a plan's FP16 If run its branches' layers in FP16? On the weak path TensorRT builds them from the
        model's own nodes (constrained only when the If is FP32); the strong path builds the mixed model, whose
        branches compute FP32 as in the emulation."""
        return self.path == "weak"

    # ---- protocol ----------------------------------------------------------------------------------------
    def open(self, catalog: "Catalog") -> None:
        trt_mod = self._ensure_module()
        cudart = import_cudart(self._cudart_module)
        self.close()
        self.catalog = catalog
        self._engines = _EngineBuilder(trt_mod, cudart, self.options, strongly_typed=self.path == "strong")
        if self.path == "weak":
            self._weak = _WeakNetwork(self._engines, catalog, self.precision_constraints)

    def describe(self) -> dict[str, str]:
        trt_mod = self._ensure_module()
        info = {"backend": self.name, self._module_key(): str(trt_mod.__version__), "path": str(self.path)}
        if self.path == "weak":
            info["precision_constraints"] = self.precision_constraints
        info.update(self.options.describe())
        info["bisector"] = __version__
        return info

    def _module_key(self) -> str:
        return "tensorrt"

    def close(self) -> None:
        self._runner_cache = None
        if self._engines is not None:
            self._engines.save_timing_cache()
        self._weak = None
        self._engines = None

    def run(self, plan: Plan, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        if self._engines is None or self.catalog is None:
            raise BackendFailure(f"{self.name} backend used before open()")
        names = list(outputs) if outputs is not None else list(self.catalog.output_names)
        extra = [n for n in names if n not in self.catalog.output_names]
        if extra:
            raise UsageError(f"the {self.name} backend returns graph outputs only; not graph outputs: {extra}")
        shapes = self._build_shapes(feeds)
        key = (plan.key(), tuple(sorted(shapes.items())))
        if self._runner_cache is None or self._runner_cache[0] != key:
            self._runner_cache = None  # free the previous engine before building the next
            self._runner_cache = (key, self._build_runner(plan, shapes))
        result = self._runner_cache[1].infer(feeds)
        return {n: result[n] for n in names}

    # ---- engines -----------------------------------------------------------------------------------------
    def _build_shapes(self, feeds: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
        assert self.catalog is not None
        shapes = {n: tuple(int(d) for d in np.shape(feeds[n])) for n in self.catalog.input_names if n in feeds}
        shapes.update(self.options.input_shapes)
        return shapes

    def _build_runner(self, plan: Plan, shapes: Mapping[str, tuple[int, ...]]) -> "_Runner":
        assert self._engines is not None and self.catalog is not None
        if self.path == "weak":
            assert self._weak is not None
            network = self._weak.apply(plan)
            config = self._engines.make_config(network, shapes)
            self._weak.set_flags(config)
            serialized = self._engines.build(network, config, plan)
        else:
            from bisector.fp16.mixed import build_mixed_model

            model = build_mixed_model(self.catalog, plan)
            network, _parser = self._engines.parse(model.SerializeToString(), plan=plan)
            config = self._engines.make_config(network, shapes)
            serialized = self._engines.build(network, config, plan)
        return self._engines.runner(serialized, plan)

    # ---- for the CLI / report ----------------------------------------------------------------------------
    def unmapped_candidates(self) -> list[str]:
        """Candidates of the opened model that map to no layer (weak path; [] on the strong path)."""
        return [] if self._weak is None else sorted(self._weak.unmapped_candidates)


class TensorRTRTXBackend(TensorRTBackend):
    """`--backend tensorrt-rtx`: TensorRT for RTX (module `tensorrt_rtx`), always strongly typed."""

    name = "tensorrt-rtx"

    def _import(self) -> Any:
        return import_tensorrt_rtx(self._module)

    def _choose_path(self, trt_mod: Any) -> str:
        return "strong"

    def _module_key(self) -> str:
        return "tensorrt_rtx"


# ---- shared machinery -------------------------------------------------------------------------------------
def _make_logger(trt_mod: Any) -> Any:
    """A TensorRT logger that keeps errors and warnings, so a BuildFailure can say what went wrong."""

    class _Logger(trt_mod.ILogger):
        def __init__(self) -> None:
            trt_mod.ILogger.__init__(self)
            self.messages: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity in (trt_mod.ILogger.Severity.INTERNAL_ERROR, trt_mod.ILogger.Severity.ERROR,
                            trt_mod.ILogger.Severity.WARNING):
                self.messages.append(f"[{getattr(severity, 'name', severity)}] {msg}")
                del self.messages[:-50]

        def take(self) -> list[str]:
            out, self.messages = self.messages, []
            return out

    return _Logger()


class _EngineBuilder:
    """Builder, runtime, the one timing cache of a search, and the build options."""

    def __init__(self, trt_mod: Any, cudart: Any, options: EngineOptions, strongly_typed: bool) -> None:
        self.trt = trt_mod
        self.cudart = cudart
        self.options = options
        self.strongly_typed = strongly_typed
        self.logger = _make_logger(trt_mod)
        self.builder: trt.Builder = trt_mod.Builder(self.logger)
        self.runtime: trt.Runtime = trt_mod.Runtime(self.logger)
        self.timing_cache: trt.ITimingCache | None = None
        self.builds = 0
        self._tactic_mask: int | None = None
        if options.tactic_sources is not None:
            self._tactic_mask = self._tactic_sources_mask(options.tactic_sources)

    # parsing ---------------------------------------------------------------------------------------------
    def network_flags(self) -> int:
        flags = 0
        if self.strongly_typed:
            flag = getattr(self.trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
            if flag is not None:  # TensorRT 11 / RTX may have dropped it: every network is strongly typed there
                flags |= 1 << int(flag)
        return flags

    def parse(self, model_bytes: bytes, plan: Plan | None = None) -> tuple["trt.INetworkDefinition", "trt.OnnxParser"]:
        network = self.builder.create_network(self.network_flags())
        parser = self.trt.OnnxParser(network, self.logger)
        try:
            ok = parser.parse(model_bytes)
        except Exception as exc:  # the bindings raise on some malformed models
            ok, errors = False, [f"{type(exc).__name__}: {exc}"]
        else:
            errors = [str(parser.get_error(i).desc()) for i in range(parser.num_errors)] if not ok else []
        if not ok:
            what = "the mixed-precision model of this plan" if plan is not None else "the model"
            msg = f"TensorRT's ONNX parser rejected {what}: " + "; ".join(errors or self.logger.take() or ["no detail"])
            raise (BuildFailure if plan is not None else BackendFailure)(msg)
        return network, parser

    # config ----------------------------------------------------------------------------------------------
    def _tactic_sources_mask(self, names: Sequence[str]) -> int:
        members = {k.upper(): v for k, v in getattr(self.trt.TacticSource, "__members__", {}).items()}
        mask = 0
        for name in names:
            src = members.get(name.upper())
            if src is None:
                raise UsageError(f"unknown tactic source {name!r}; known: {', '.join(sorted(members)) or 'none'}")
            mask |= 1 << int(src)
        return mask

    def make_config(self, network: "trt.INetworkDefinition", shapes: Mapping[str, tuple[int, ...]]) -> "trt.IBuilderConfig":
        config = self.builder.create_builder_config()
        opts = self.options
        if opts.builder_optimization_level is not None:
            if not hasattr(config, "builder_optimization_level"):
                raise UsageError("this TensorRT has no builder optimization level; leave the option off")
            config.builder_optimization_level = opts.builder_optimization_level
        if self._tactic_mask is not None:
            if not config.set_tactic_sources(self._tactic_mask):
                raise UsageError(f"TensorRT refused tactic sources {list(opts.tactic_sources or ())}")
        self._attach_timing_cache(config)
        profile = self._profile(network, shapes)
        if profile is not None:
            config.add_optimization_profile(profile)
        return config

    def _attach_timing_cache(self, config: "trt.IBuilderConfig") -> None:
        if not hasattr(config, "create_timing_cache"):
            if self.options.load_timing_cache or self.options.save_timing_cache:
                raise UsageError("this TensorRT module has no timing cache; leave the timing-cache options off")
            return
        if self.timing_cache is None:
            data = b""
            path = self.options.load_timing_cache
            if path is not None and path.is_file():
                data = path.read_bytes()
            self.timing_cache = config.create_timing_cache(data)
        config.set_timing_cache(self.timing_cache, False)

    def _profile(self, network: "trt.INetworkDefinition", shapes: Mapping[str, tuple[int, ...]]) -> Any:
        """min = opt = max = the given shape, for each input with a dynamic dimension."""
        names = [network.get_input(i).name for i in range(network.num_inputs)]
        unknown = sorted(set(self.options.input_shapes).difference(names))
        if unknown:
            raise UsageError(f"--input-shapes names no input of the model: {unknown} (inputs: {names})")
        profile = None
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            dims = _dims(tensor.shape)
            if all(d >= 0 for d in dims):
                given = shapes.get(tensor.name)
                if given is not None and tuple(given) != dims and tensor.name in self.options.input_shapes:
                    raise UsageError(f"--input-shapes {tensor.name}:{list(given)} contradicts the model's static shape {list(dims)}")
                continue
            shape = shapes.get(tensor.name)
            if shape is None:
                raise UsageError(f"input {tensor.name} has dynamic shape {list(dims)}: give --input-shapes {tensor.name}:[...]")
            if profile is None:
                profile = self.builder.create_optimization_profile()
            dims_t = self.trt.Dims(list(shape))
            profile.set_shape(tensor.name, dims_t, dims_t, dims_t)
        return profile

    # building --------------------------------------------------------------------------------------------
    def build(self, network: "trt.INetworkDefinition", config: "trt.IBuilderConfig", plan: Plan) -> bytes:
        self.logger.take()
        try:
            serialized = self.builder.build_serialized_network(network, config)
        except Exception as exc:
            raise BuildFailure(f"TensorRT engine build failed for a plan with {len(plan.fp32)} FP32 nodes: "
                               f"{type(exc).__name__}: {exc}") from None
        if serialized is None:
            detail = "; ".join(self.logger.take()[-5:]) or "no error message from TensorRT"
            raise BuildFailure(f"TensorRT engine build failed for a plan with {len(plan.fp32)} FP32 nodes: {detail}")
        self.builds += 1
        data = bytes(memoryview(serialized))
        if self.options.save_engines is not None:
            try:
                self.options.save_engines.mkdir(parents=True, exist_ok=True)
                (self.options.save_engines / f"{plan_hash(plan)}.engine").write_bytes(data)
            except OSError as exc:
                raise UsageError(f"cannot save the engine to {self.options.save_engines}: {exc}") from None
        self.save_timing_cache()
        return data

    def save_timing_cache(self) -> None:
        path = self.options.save_timing_cache
        if path is None or self.timing_cache is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(bytes(memoryview(self.timing_cache.serialize())))
            os.replace(tmp, path)
        except OSError as exc:
            raise UsageError(f"cannot save the timing cache to {path}: {exc}") from None

    def runner(self, serialized: bytes, plan: Plan) -> "_Runner":
        engine = self.runtime.deserialize_cuda_engine(serialized)
        if engine is None:
            detail = "; ".join(self.logger.take()[-5:]) or "no detail"
            raise BuildFailure(f"TensorRT could not deserialize the engine it built: {detail}")
        return _Runner(self.trt, self.cudart, engine)


class _WeakNetwork:
    """TensorRT 10 weak typing: one parsed network, precision marks moved from plan to plan."""

    def __init__(self, engines: _EngineBuilder, catalog: "Catalog", precision_constraints: str) -> None:
        self.trt = engines.trt
        self.precision_constraints = precision_constraints
        self.network, self.parser = engines.parse(catalog.full_model().SerializeToString())
        self.layers: dict[str, list[int]] = match_layers(self.network, catalog.names, subgraph_aliases(catalog.model))
        self.unmapped_candidates = frozenset(catalog.candidates).difference(self.layers)
        self.pinned = sorted(n for n in catalog.pinned if n in self.layers)
        self._marked: list[int] = []

    def apply(self, plan: Plan) -> "trt.INetworkDefinition":
        missing = sorted(plan.fp32.intersection(self.unmapped_candidates))
        if missing:
            raise BackendFailure(
                "these FP32 nodes map to no TensorRT layer (by layer metadata, layer name or `<node>_<k>` suffix), "
                f"so their precision cannot be set: {missing}. TensorRT may have folded them into weights or "
                "fused them away; try --strongly-typed (TensorRT >= 10.12) or the emulate backend")
        trt_mod = self.trt
        for i in self._marked:
            layer = self.network.get_layer(i)
            layer.reset_precision()
            for k in range(layer.num_outputs):
                layer.reset_output_type(k)
        self._marked = []
        for node in sorted(plan.fp32) + self.pinned:
            for i in self.layers[node]:
                layer = self.network.get_layer(i)
                layer.precision = trt_mod.float32
                for k in range(layer.num_outputs):
                    if _is_float(trt_mod, layer.get_output(k).dtype):
                        layer.set_output_type(k, trt_mod.float32)
                self._marked.append(i)
        return self.network

    def set_flags(self, config: "trt.IBuilderConfig") -> None:
        trt_mod = self.trt
        config.set_flag(trt_mod.BuilderFlag.FP16)
        if self.precision_constraints == "obey":
            config.set_flag(trt_mod.BuilderFlag.OBEY_PRECISION_CONSTRAINTS)
        else:
            config.set_flag(trt_mod.BuilderFlag.PREFER_PRECISION_CONSTRAINTS)


def _dims(dims: "trt.Dims") -> tuple[int, ...]:
    """A Dims as a tuple (Dims has __len__ and __getitem__)."""
    return tuple(int(dims[j]) for j in range(len(dims)))


def _is_float(trt_mod: Any, dtype: Any) -> bool:
    return dtype in (trt_mod.float32, trt_mod.float16, getattr(trt_mod, "bfloat16", trt_mod.float32))


_NP_BY_NAME = {
    "FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8, "INT32": np.int32, "INT64": np.int64,
    "BOOL": np.bool_, "UINT8": np.uint8,
}


def _np_dtype(dtype: Any) -> np.dtype:
    name = getattr(dtype, "name", str(dtype)).split(".")[-1]
    if name not in _NP_BY_NAME:
        raise BackendFailure(f"engine tensor type {name} has no NumPy equivalent here (BF16/FP8/INT4 I/O unsupported)")
    return np.dtype(_NP_BY_NAME[name])


class _Runner:
    """One engine, one execution context, one CUDA stream; device buffers per call."""

    def __init__(self, trt_mod: Any, cudart: Any, engine: "trt.ICudaEngine") -> None:
        self.trt = trt_mod
        self.cudart = cudart
        self.engine = engine
        context = engine.create_execution_context()
        if context is None:
            raise BackendFailure("TensorRT could not create an execution context (out of device memory?)")
        self.context: trt.IExecutionContext = context
        self.stream = self._cuda(cudart.cudaStreamCreate(), "cudaStreamCreate")
        self.inputs: list[tuple[str, np.dtype]] = []
        self.outputs: list[tuple[str, np.dtype]] = []
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            entry = (name, _np_dtype(engine.get_tensor_dtype(name)))
            if engine.get_tensor_mode(name) == trt_mod.TensorIOMode.INPUT:
                self.inputs.append(entry)
            else:
                self.outputs.append(entry)

    def _cuda(self, result: Any, what: str) -> Any:
        err = result[0] if isinstance(result, tuple) else result
        if err != self.cudart.cudaError_t.cudaSuccess:
            raise BackendFailure(f"CUDA call {what} failed: {err}")
        return result[1] if isinstance(result, tuple) and len(result) > 1 else None

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        cu, ctx = self.cudart, self.context
        missing = [n for n, _ in self.inputs if n not in feeds]
        if missing:
            raise UsageError(f"no values given for engine inputs {missing}")
        allocations: list[Any] = []
        hosts: list[np.ndarray] = []
        try:
            for name, dtype in self.inputs:
                host = np.ascontiguousarray(np.asarray(feeds[name]), dtype=dtype)
                hosts.append(host)
                if not ctx.set_input_shape(name, tuple(host.shape)):
                    raise BackendFailure(f"TensorRT rejected shape {list(host.shape)} for input {name}")
                dev = self._cuda(cu.cudaMalloc(max(host.nbytes, 1)), "cudaMalloc")
                allocations.append(dev)
                self._cuda(cu.cudaMemcpyAsync(dev, host.ctypes.data, host.nbytes,
                                              cu.cudaMemcpyKind.cudaMemcpyHostToDevice, self.stream), "cudaMemcpyAsync")
                ctx.set_tensor_address(name, int(dev))
            results: dict[str, np.ndarray] = {}
            for name, dtype in self.outputs:
                shape = _dims(ctx.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise BackendFailure(f"output {name} has a data-dependent shape {list(shape)}: not supported")
                out = np.empty(shape, dtype=dtype)
                dev = self._cuda(cu.cudaMalloc(max(out.nbytes, 1)), "cudaMalloc")
                allocations.append(dev)
                ctx.set_tensor_address(name, int(dev))
                results[name] = out
                hosts.append(out)
            if not ctx.execute_async_v3(int(self.stream)):
                raise BackendFailure("TensorRT execute_async_v3 failed")
            for (name, _), dev in zip(self.outputs, allocations[len(self.inputs):]):
                out = results[name]
                self._cuda(cu.cudaMemcpyAsync(out.ctypes.data, dev, out.nbytes,
                                              cu.cudaMemcpyKind.cudaMemcpyDeviceToHost, self.stream), "cudaMemcpyAsync")
            self._cuda(cu.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        finally:
            for dev in allocations:
                cu.cudaFree(dev)
        return {n: (a.astype(np.float32) if a.dtype.kind == "f" and a.dtype != np.float32 else a)
                for n, a in results.items()}

    def __del__(self) -> None:
        try:
            self.cudart.cudaStreamDestroy(self.stream)
        except Exception:
            pass
