"""A recording fake of the TensorRT Python API surface bisector uses, and of cuda-python's runtime.

Version-parameterised:
- 10.x: weak typing present (BuilderFlag.FP16, OBEY/PREFER_PRECISION_CONSTRAINTS, layer.precision,
  set_output_type);
- 11.x and RTX: those are absent (accessing them raises AttributeError, as on the real module).

The parser names layers like onnx-tensorrt: a node's first layer gets the node name, further layers go through
the parser's unique-name generator (`<base>_<k>`, one global counter), every layer registered for a node gets
metadata `[ONNX Layer: <node>]`; helper layers registered without a node get `ONNXTRT_*` names and no metadata.
Constant nodes make no layer. The engine computes outputs with onnxruntime on the ONNX the parser received.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
import pickle
import types
from typing import Any, Callable

import numpy as np
import onnx
import onnxruntime as ort


class DataType(enum.IntEnum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    FP8 = 6
    BF16 = 7
    INT64 = 8


_ONNX_TO_TRT = {1: DataType.FLOAT, 10: DataType.HALF, 3: DataType.INT8, 6: DataType.INT32, 9: DataType.BOOL,
                2: DataType.UINT8, 7: DataType.INT64, 16: DataType.BF16}
_NP = {DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT32: np.int32, DataType.INT64: np.int64,
       DataType.BOOL: np.bool_, DataType.INT8: np.int8, DataType.UINT8: np.uint8}


class Dims(tuple):
    def __new__(cls, shape=()):
        return super().__new__(cls, tuple(int(d) for d in shape))


def make_fake_tensorrt(version: str = "10.13.0.35", *, rtx: bool = False, with_metadata: bool = True,
                       layers_per_node: dict[str, int] | None = None, helper_layers: dict[str, int] | None = None,
                       no_layer: set[str] | None = None, fail_build: Callable[[Any, Any], bool] | None = None,
                       fail_parse: bool = False, half_outputs: bool = False) -> types.ModuleType:
    """A fresh fake module; `mod.calls` records every call that matters, in order.

    layers_per_node: node -> number of layers the parser makes (default 1); helper_layers: node -> number of
    helper layers (no metadata, `ONNXTRT_*` names) added *between* the node's layers; no_layer: nodes folded
    away (no layer); fail_build(network, config) -> True makes the build return None with an error logged.
    """
    major = int(version.split(".")[0])
    weak = major < 11 and not rtx
    calls: list[tuple] = []
    mod = types.ModuleType("tensorrt_rtx" if rtx else "tensorrt")
    mod.__version__ = version
    mod.calls = calls
    mod.DataType = DataType
    mod.Dims = Dims
    for alias, dt in (("float32", "FLOAT"), ("float16", "HALF"), ("int32", "INT32"), ("int64", "INT64"),
                      ("bool", "BOOL"), ("int8", "INT8"), ("uint8", "UINT8"), ("bfloat16", "BF16")):
        setattr(mod, alias, DataType[dt])
    flags = ["TF32", "DEBUG", "DIRECT_IO"] + (["FP16", "BF16", "OBEY_PRECISION_CONSTRAINTS",
                                                  "PREFER_PRECISION_CONSTRAINTS"] if weak else [])
    mod.BuilderFlag = enum.IntEnum("BuilderFlag", flags, start=0)
    mod.NetworkDefinitionCreationFlag = enum.IntEnum(
        "NetworkDefinitionCreationFlag", ["EXPLICIT_BATCH", "STRONGLY_TYPED"], start=0)
    mod.TacticSource = enum.IntEnum("TacticSource", ["CUBLAS", "CUBLAS_LT", "CUDNN", "EDGE_MASK_CONVOLUTIONS",
                                                     "JIT_CONVOLUTIONS"], start=0)
    mod.TensorIOMode = enum.IntEnum("TensorIOMode", ["NONE", "INPUT", "OUTPUT"], start=0)

    class ILogger:
        Severity = enum.IntEnum("Severity", ["INTERNAL_ERROR", "ERROR", "WARNING", "INFO", "VERBOSE"], start=0)

        def __init__(self) -> None:
            pass

        def log(self, severity, msg):  # pragma: no cover - overridden
            pass

    mod.ILogger = ILogger
    engines: dict[int, dict] = {}

    class Tensor:
        def __init__(self, name, dtype, shape=()):
            self.name, self.dtype, self.shape = name, dtype, Dims(shape)

    class Layer:
        def __setattr__(self, key, value):  # TensorRT 11 / RTX layers have no precision to set
            if key == "precision" and not weak:
                raise AttributeError("'ILayer' object has no attribute 'precision' (strongly typed TensorRT)")
            object.__setattr__(self, key, value)

        def __init__(self, name, metadata, outputs):
            self.name, self.metadata, self._outputs = name, metadata, outputs
            self._precision = None
            self._output_types: dict[int, Any] = {}

        @property
        def num_outputs(self):
            return len(self._outputs)

        def get_output(self, i):
            return self._outputs[i]

    class WeakLayer(Layer):
        @property
        def precision(self):
            return self._precision or DataType.FLOAT

        @precision.setter
        def precision(self, dt):
            calls.append(("layer.precision", self.name, dt))
            self._precision = dt

        def set_output_type(self, i, dt):
            calls.append(("layer.set_output_type", self.name, i, dt))
            self._output_types[i] = dt

        def reset_precision(self):
            calls.append(("layer.reset_precision", self.name))
            self._precision = None

        def reset_output_type(self, i):
            self._output_types.pop(i, None)

    LayerClass = WeakLayer if weak else Layer

    class Network:
        def __init__(self, flags):
            self.flags = flags
            self.layers: list[Layer] = []
            self.inputs: list[Tensor] = []
            self.model_bytes = b""

        @property
        def num_layers(self):
            return len(self.layers)

        def get_layer(self, i):
            return self.layers[i]

        @property
        def num_inputs(self):
            return len(self.inputs)

        def get_input(self, i):
            return self.inputs[i]

    class ParserError:
        def __init__(self, msg):
            self._msg = msg

        def desc(self):
            return self._msg

    class OnnxParser:
        def __init__(self, network, logger):
            self.network, self.logger, self.errors = network, logger, []
            calls.append(("OnnxParser",))

        @property
        def num_errors(self):
            return len(self.errors)

        def get_error(self, i):
            return self.errors[i]

        def parse(self, model_bytes):
            calls.append(("parser.parse", len(model_bytes)))
            if fail_parse:
                self.errors.append(ParserError("In node 0: unsupported operator (fake)"))
                return False
            model = onnx.load_from_string(model_bytes)
            self.network.model_bytes = model_bytes
            inferred = onnx.shape_inference.infer_shapes(model)
            types_ = {vi.name: vi.type.tensor_type.elem_type for vi in
                      list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
            inits = {i.name for i in model.graph.initializer}
            for vi in model.graph.input:
                if vi.name in inits:
                    continue
                dims = [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]
                self.network.inputs.append(Tensor(vi.name, _ONNX_TO_TRT[vi.type.tensor_type.elem_type], dims))
            taken: set[str] = set()
            counter = itertools.count(0)

            def unique(base):  # onnx-tensorrt's generateUniqueName: one counter for all names
                cand = base
                while cand in taken:
                    cand = f"{base}_{next(counter)}"
                taken.add(cand)
                return cand

            for node in model.graph.node:
                name = node.name or f"node_of_{node.output[0]}"
                if node.op_type == "Constant" or name in (no_layer or ()):
                    continue
                outs = [Tensor(o, _ONNX_TO_TRT.get(types_.get(o, 1), DataType.FLOAT)) for o in node.output]
                n = (layers_per_node or {}).get(name, 1)
                helpers = (helper_layers or {}).get(name, 0)
                for k in range(n):
                    last = k == n - 1
                    meta = f"[ONNX Layer: {name}]" if with_metadata else ""
                    layer_outs = outs if last else [Tensor(f"{name}_tmp{k}", DataType.FLOAT)]
                    self.network.layers.append(LayerClass(unique(name), meta, layer_outs))
                    if not last:
                        for _ in range(helpers):
                            self.network.layers.append(LayerClass(unique("ONNXTRT_Helper"), "",
                                                                  [Tensor("h", DataType.FLOAT)]))
            return True

    class TimingCache:
        def __init__(self, data):
            self.data = data

        def serialize(self):
            return b"fake-timing-cache:" + self.data

    class Profile:
        def set_shape(self, name, mn, opt, mx):
            calls.append(("profile.set_shape", name, tuple(mn), tuple(opt), tuple(mx)))

    class Config:
        def __init__(self):
            self.flag_set: set = set()
            self.timing_cache = None
            self.profiles: list = []
            if major >= 10:
                self._level = 3

        @property
        def builder_optimization_level(self):
            return self._level

        @builder_optimization_level.setter
        def builder_optimization_level(self, level):
            calls.append(("config.builder_optimization_level", level))
            self._level = level

        def set_flag(self, flag):
            calls.append(("config.set_flag", flag.name))
            self.flag_set.add(flag.name)

        def set_tactic_sources(self, mask):
            calls.append(("config.set_tactic_sources", mask))
            return True

        def create_timing_cache(self, data):
            cache = TimingCache(bytes(data))
            calls.append(("config.create_timing_cache", bytes(data), id(cache)))
            return cache

        def set_timing_cache(self, cache, ignore_mismatch):
            calls.append(("config.set_timing_cache", id(cache), ignore_mismatch))
            self.timing_cache = cache
            return True

        def add_optimization_profile(self, profile):
            calls.append(("config.add_optimization_profile",))
            self.profiles.append(profile)
            return len(self.profiles) - 1

    class Builder:
        def __init__(self, logger):
            self.logger = logger
            calls.append(("Builder",))

        def create_network(self, flags=0):
            calls.append(("builder.create_network", flags))
            return Network(flags)

        def create_builder_config(self):
            calls.append(("builder.create_builder_config",))
            return Config()

        def create_optimization_profile(self):
            return Profile()

        def build_serialized_network(self, network, config):
            marked = {l.name: (l._precision, dict(l._output_types)) for l in network.layers if l._precision is not None}
            calls.append(("builder.build_serialized_network", sorted(config.flag_set), sorted(marked)))
            if fail_build is not None and fail_build(network, config):
                self.logger.log(ILogger.Severity.ERROR, "fake: could not find any implementation for a node")
                return None
            key = len(engines) + 1
            engines[key] = {"model": network.model_bytes, "marked": marked}
            return memoryview(pickle.dumps(key))

    class Engine:
        def __init__(self, info):
            self.info = info
            self.session = ort.InferenceSession(info["model"], providers=["CPUExecutionProvider"])
            self.ins = [(i.name, i.type) for i in self.session.get_inputs()]
            self.outs = [(o.name, o.type) for o in self.session.get_outputs()]

        @property
        def num_io_tensors(self):
            return len(self.ins) + len(self.outs)

        def get_tensor_name(self, i):
            return (self.ins + self.outs)[i][0]

        def get_tensor_mode(self, name):
            return mod.TensorIOMode.INPUT if name in dict(self.ins) else mod.TensorIOMode.OUTPUT

        def get_tensor_dtype(self, name):
            t = dict(self.ins + self.outs)[name]
            dt = {"tensor(float)": DataType.FLOAT, "tensor(float16)": DataType.HALF,
                  "tensor(int64)": DataType.INT64, "tensor(int32)": DataType.INT32, "tensor(bool)": DataType.BOOL}[t]
            if half_outputs and dt == DataType.FLOAT and name not in dict(self.ins):
                return DataType.HALF
            return dt

        def create_execution_context(self):
            calls.append(("engine.create_execution_context",))
            return Context(self)

    class Context:
        def __init__(self, engine):
            self.engine, self.shapes, self.addresses = engine, {}, {}
            self._results = None

        def set_input_shape(self, name, shape):
            calls.append(("context.set_input_shape", name, tuple(shape)))
            self.shapes[name] = tuple(shape)
            return True

        def set_tensor_address(self, name, ptr):
            calls.append(("context.set_tensor_address", name))
            self.addresses[name] = ptr
            return True

        def _run(self, feeds):
            return dict(zip([o for o, _ in self.engine.outs], self.engine.session.run(None, feeds)))

        def get_tensor_shape(self, name):
            if name in self.shapes:
                return Dims(self.shapes[name])
            feeds = {n: np.zeros(self.shapes[n], dtype=np.float32 if t == "tensor(float)" else np.int64)
                     for n, t in self.engine.ins}
            return Dims(self._run(feeds)[name].shape)

        def execute_async_v3(self, stream):
            calls.append(("context.execute_async_v3", stream))
            feeds = {}
            for n, t in self.engine.ins:
                dtype = np.dtype(_NP[self.engine.get_tensor_dtype(n)])
                count = int(np.prod(self.shapes[n], dtype=np.int64))
                buf = ctypes.string_at(self.addresses[n], count * dtype.itemsize)
                feeds[n] = np.frombuffer(buf, dtype=dtype).reshape(self.shapes[n]).copy()
            for n, value in self._run(feeds).items():
                value = value.astype(_NP[self.engine.get_tensor_dtype(n)])
                data = np.ascontiguousarray(value).tobytes()
                ctypes.memmove(self.addresses[n], data, len(data))
            return True

    class Runtime:
        def __init__(self, logger):
            calls.append(("Runtime",))

        def deserialize_cuda_engine(self, data):
            calls.append(("runtime.deserialize_cuda_engine",))
            return Engine(engines[pickle.loads(bytes(data))])

    mod.Builder, mod.Runtime, mod.OnnxParser = Builder, Runtime, OnnxParser
    mod.engines = engines
    return mod


def make_fake_cudart() -> types.SimpleNamespace:
    """cuda-python's runtime with host memory standing in for device memory (pointers are real addresses)."""
    buffers: dict[int, Any] = {}
    log: list[tuple] = []

    class cudaError_t(enum.IntEnum):
        cudaSuccess = 0
        cudaErrorMemoryAllocation = 2

    class cudaMemcpyKind(enum.IntEnum):
        cudaMemcpyHostToDevice = 1
        cudaMemcpyDeviceToHost = 2

    def cudaMalloc(size):
        buf = ctypes.create_string_buffer(int(size))
        ptr = ctypes.addressof(buf)
        buffers[ptr] = buf
        log.append(("cudaMalloc", size))
        return cudaError_t.cudaSuccess, ptr

    def cudaFree(ptr):
        buffers.pop(int(ptr))
        log.append(("cudaFree",))
        return (cudaError_t.cudaSuccess,)

    def cudaMemcpyAsync(dst, src, count, kind, stream):
        ctypes.memmove(int(dst), int(src), int(count))
        log.append(("cudaMemcpyAsync", kind.name, count))
        return (cudaError_t.cudaSuccess,)

    return types.SimpleNamespace(
        cudaError_t=cudaError_t, cudaMemcpyKind=cudaMemcpyKind, cudaMalloc=cudaMalloc, cudaFree=cudaFree,
        cudaMemcpyAsync=cudaMemcpyAsync, buffers=buffers, log=log,
        cudaStreamCreate=lambda: (cudaError_t.cudaSuccess, 7),
        cudaStreamSynchronize=lambda s: (cudaError_t.cudaSuccess,),
        cudaStreamDestroy=lambda s: (cudaError_t.cudaSuccess,),
    )
