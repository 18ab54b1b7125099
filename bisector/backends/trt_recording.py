"""A recording TensorRT-10-like network of a model, and Polygraphy network-postprocess scripts run on it.

Users already have precision scripts for `polygraphy run --trt-npps FILE[:FUNC]` (ours, `add_constraints.py`,
is one). `run_postprocess_script` loads such a script the way Polygraphy does, runs it on a `RecordingNetwork`
of the model (one layer per node, named and tagged with `[ONNX Layer: <node>]` metadata as TensorRT's ONNX
parser does; see `trt_layers.predict_layers`), with a small stand-in `tensorrt` module (`recording_tensorrt`)
providing what such scripts use, and reads back which layers it set to FP32 (precision and/or an output type)
-> nodes, by the one matching rule (`trt_layers.match_layers`). No TensorRT is imported or needed.

What the stand-in offers: `__version__` (a 10.x), `DataType` and its aliases (`trt.float32`, `trt.float16`, ...),
`BuilderFlag` (with FP16 / OBEY_PRECISION_CONSTRAINTS), `LayerType`, `NetworkDefinitionCreationFlag`,
`TensorIOMode`, `Logger`/`ILogger`, and the classes `INetworkDefinition`, `ILayer`, `ITensor` (so isinstance
checks work). The network offers `num_layers`, `get_layer(i)`, `len()`, indexing and iteration, `num_inputs`,
`get_input(i)`, `num_outputs`, `get_output(i)`, `name`; a layer `name`, `metadata`, `type`, `num_inputs`,
`get_input(i)`, `num_outputs`, `get_output(i)`, `precision`, `precision_is_set`, `reset_precision()`,
`set_output_type(i, t)`, `get_output_type(i)`, `output_type_is_set(i)`, `reset_output_type(i)`; a tensor
`name`, `dtype`, `shape`, `is_network_input`, `is_network_output`. Layer types are the usual TensorRT layer of
the op (an op TensorRT has no layer for shows as PLUGIN_V3, as a plugin would). Anything else a script touches
raises AttributeError naming it, which comes back as a UsageError.
"""

from __future__ import annotations

import contextlib
import enum
import importlib.util
import itertools
import logging
import os
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from onnx import TensorProto

from bisector.backends.trt_layers import PredictedLayer, match_layers, predict_layers, subgraph_aliases
from bisector.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from bisector.model.catalog import Catalog

log = logging.getLogger("bisector")
RECORDING_VERSION = "10.13.0.35"
DEFAULT_FUNCTION = "postprocess"  # Polygraphy's default callable name for --trt-npps

DataType = enum.IntEnum("DataType", ["FLOAT", "HALF", "INT8", "INT32", "BOOL", "UINT8", "FP8", "BF16", "INT64",
                                     "INT4", "FP4", "E8M0"], start=0)
LayerType = enum.IntEnum("LayerType", [
    "CONVOLUTION", "GRID_SAMPLE", "NMS", "ACTIVATION", "POOLING", "LRN", "SCALE", "SOFTMAX", "DECONVOLUTION",
    "CONCATENATION", "ELEMENTWISE", "PLUGIN", "UNARY", "PADDING", "SHUFFLE", "REDUCE", "TOPK", "GATHER",
    "MATRIX_MULTIPLY", "RAGGED_SOFTMAX", "CONSTANT", "IDENTITY", "CAST", "PLUGIN_V2", "SLICE", "SHAPE",
    "PARAMETRIC_RELU", "RESIZE", "TRIP_LIMIT", "RECURRENCE", "ITERATOR", "LOOP_OUTPUT", "SELECT", "ASSERTION",
    "FILL", "QUANTIZE", "DEQUANTIZE", "CONDITION", "CONDITIONAL_INPUT", "CONDITIONAL_OUTPUT", "SCATTER", "EINSUM",
    "ONE_HOT", "NON_ZERO", "REVERSE_SEQUENCE", "NORMALIZATION", "PLUGIN_V3", "SQUEEZE", "UNSQUEEZE", "CUMULATIVE",
    "DYNAMIC_QUANTIZE"], start=0)
BuilderFlag = enum.IntEnum("BuilderFlag", [
    "FP16", "BF16", "INT8", "DEBUG", "GPU_FALLBACK", "REFIT", "DISABLE_TIMING_CACHE", "EDITABLE_TIMING_CACHE",
    "TF32", "SPARSE_WEIGHTS", "SAFETY_SCOPE", "OBEY_PRECISION_CONSTRAINTS", "PREFER_PRECISION_CONSTRAINTS",
    "DIRECT_IO", "REJECT_EMPTY_ALGORITHMS", "VERSION_COMPATIBLE", "EXCLUDE_LEAN_RUNTIME", "FP8",
    "ERROR_ON_TIMING_CACHE_MISS", "DISABLE_COMPILATION_CACHE", "WEIGHTLESS", "STRIP_PLAN", "REFIT_IDENTICAL",
    "WEIGHT_STREAMING", "INT4", "REFIT_INDIVIDUAL", "STRICT_NANS", "MONITOR_MEMORY", "FP4"], start=0)
NetworkDefinitionCreationFlag = enum.IntEnum("NetworkDefinitionCreationFlag", ["EXPLICIT_BATCH", "STRONGLY_TYPED"],
                                             start=0)
TensorIOMode = enum.IntEnum("TensorIOMode", ["NONE", "INPUT", "OUTPUT"], start=0)

_FROM_ONNX: dict[int, Any] = {TensorProto.FLOAT: DataType.FLOAT, TensorProto.FLOAT16: DataType.HALF,
              TensorProto.BFLOAT16: DataType.BF16, TensorProto.INT8: DataType.INT8, TensorProto.INT32: DataType.INT32,
              TensorProto.INT64: DataType.INT64, TensorProto.BOOL: DataType.BOOL, TensorProto.UINT8: DataType.UINT8}
_FLOATS = (DataType.FLOAT, DataType.HALF, DataType.BF16)
_LAYER_TYPES = {
    "Conv": "CONVOLUTION", "ConvTranspose": "DECONVOLUTION", "MatMul": "MATRIX_MULTIPLY", "Gemm": "MATRIX_MULTIPLY",
    "Relu": "ACTIVATION", "Sigmoid": "ACTIVATION", "Tanh": "ACTIVATION", "LeakyRelu": "ACTIVATION",
    "Elu": "ACTIVATION", "Selu": "ACTIVATION", "Softplus": "ACTIVATION", "HardSigmoid": "ACTIVATION",
    "Clip": "ACTIVATION", "ThresholdedRelu": "ACTIVATION", "PRelu": "PARAMETRIC_RELU",
    "Add": "ELEMENTWISE", "Sub": "ELEMENTWISE", "Mul": "ELEMENTWISE", "Div": "ELEMENTWISE", "Pow": "ELEMENTWISE",
    "Max": "ELEMENTWISE", "Min": "ELEMENTWISE", "Sum": "ELEMENTWISE", "Equal": "ELEMENTWISE",
    "Greater": "ELEMENTWISE", "Less": "ELEMENTWISE", "And": "ELEMENTWISE", "Or": "ELEMENTWISE",
    "Exp": "UNARY", "Log": "UNARY", "Sqrt": "UNARY", "Abs": "UNARY", "Neg": "UNARY", "Reciprocal": "UNARY",
    "Sin": "UNARY", "Cos": "UNARY", "Erf": "UNARY", "Floor": "UNARY", "Ceil": "UNARY", "Not": "UNARY",
    "Softmax": "SOFTMAX", "LogSoftmax": "SOFTMAX", "MaxPool": "POOLING", "AveragePool": "POOLING",
    "GlobalAveragePool": "POOLING", "GlobalMaxPool": "POOLING", "LRN": "LRN",
    "Concat": "CONCATENATION", "Reshape": "SHUFFLE", "Transpose": "SHUFFLE", "Flatten": "SHUFFLE",
    "Squeeze": "SQUEEZE", "Unsqueeze": "UNSQUEEZE", "Identity": "IDENTITY", "Cast": "CAST",
    "ReduceMean": "REDUCE", "ReduceSum": "REDUCE", "ReduceMax": "REDUCE", "ReduceMin": "REDUCE",
    "ReduceProd": "REDUCE", "TopK": "TOPK", "Gather": "GATHER", "GatherElements": "GATHER", "GatherND": "GATHER",
    "Slice": "SLICE", "Split": "SLICE", "Shape": "SHAPE", "Resize": "RESIZE", "Upsample": "RESIZE",
    "Pad": "PADDING", "Where": "SELECT", "Range": "FILL", "ConstantOfShape": "FILL", "Expand": "SLICE",
    "QuantizeLinear": "QUANTIZE", "DequantizeLinear": "DEQUANTIZE", "If": "CONDITION", "Loop": "TRIP_LIMIT",
    "Scan": "TRIP_LIMIT", "ScatterND": "SCATTER", "ScatterElements": "SCATTER", "Einsum": "EINSUM",
    "OneHot": "ONE_HOT", "NonZero": "NON_ZERO", "ReverseSequence": "REVERSE_SEQUENCE", "CumSum": "CUMULATIVE",
    "LayerNormalization": "NORMALIZATION", "InstanceNormalization": "NORMALIZATION",
    "GroupNormalization": "NORMALIZATION", "BatchNormalization": "SCALE", "GridSample": "GRID_SAMPLE",
    "NonMaxSuppression": "NMS",
}


class ITensor:
    """A network tensor: name, TensorRT dtype, shape (-1 where unknown)."""

    def __init__(self, name: str, dtype: Any, shape: tuple[int, ...] = (),
                 is_network_input: bool = False, is_network_output: bool = False) -> None:
        self.name, self.dtype, self.shape = name, dtype, shape
        self.is_network_input, self.is_network_output = is_network_input, is_network_output

    def __repr__(self) -> str:
        return f"ITensor({self.name!r}, {self.dtype.name})"


class _TensorIO:
    """Inputs and outputs, as TensorRT's layers and networks both expose them."""

    _inputs: list[ITensor]
    _outputs: list[ITensor]

    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    def get_input(self, index: int) -> ITensor:
        return self._inputs[index]

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def get_output(self, index: int) -> ITensor:
        return self._outputs[index]


class ILayer(_TensorIO):
    """One predicted layer; records the precision and output types a script sets."""

    def __init__(self, predicted: PredictedLayer, inputs: list[ITensor], outputs: list[ITensor]) -> None:
        self.name = predicted.name
        self.metadata = predicted.metadata
        self.type = LayerType[_LAYER_TYPES.get(predicted.op_type, "PLUGIN_V3")]
        self._inputs, self._outputs = inputs, outputs
        self._precision: Any = None
        self._output_types: dict[int, Any] = {}

    def __repr__(self) -> str:
        return f"ILayer({self.name!r}, {self.type.name})"


    @property
    def precision(self) -> Any:
        return DataType.FLOAT if self._precision is None else self._precision

    @precision.setter
    def precision(self, dtype: Any) -> None:
        self._precision = DataType(dtype)

    @property
    def precision_is_set(self) -> bool:
        return self._precision is not None

    def reset_precision(self) -> None:
        self._precision = None

    def set_output_type(self, index: int, dtype: Any) -> None:
        self._outputs[index]  # IndexError for an output the layer does not have, as TensorRT refuses it
        self._output_types[index] = DataType(dtype)

    def get_output_type(self, index: int) -> Any:
        return self._output_types.get(index, DataType.FLOAT)

    def output_type_is_set(self, index: int) -> bool:
        return index in self._output_types

    def reset_output_type(self, index: int) -> None:
        self._output_types.pop(index, None)

    def kept_fp32(self) -> bool:
        """Whether the script asked for FP32 here: precision float32 and/or a float32 output type."""
        return self._precision == DataType.FLOAT or DataType.FLOAT in self._output_types.values()


class INetworkDefinition(_TensorIO):
    """The predicted layers of one model, in parser order."""

    def __init__(self, name: str, layers: list[ILayer], inputs: list[ITensor], outputs: list[ITensor]) -> None:
        self.name = name
        self._layers, self._inputs, self._outputs = layers, inputs, outputs

    @property
    def num_layers(self) -> int:
        return len(self._layers)

    def get_layer(self, index: int) -> ILayer:
        return self._layers[index]

    def __len__(self) -> int:
        return len(self._layers)

    def __getitem__(self, index: int) -> ILayer:
        return self._layers[index]

    def __iter__(self) -> Iterator[ILayer]:
        return iter(self._layers)



RecordingNetwork = INetworkDefinition


def recording_network(catalog: "Catalog") -> INetworkDefinition:
    """A fresh recording network of the model's predicted layers (tensor dtypes from the catalog)."""
    inputs = {n: ITensor(n, _dtype(catalog, n), _shape(catalog, n), is_network_input=True) for n in catalog.input_names}
    outputs = set(catalog.output_names)
    tensors: dict[str, ITensor] = dict(inputs)

    def tensor(name: str) -> ITensor:
        if name not in tensors:
            tensors[name] = ITensor(name, _dtype(catalog, name), _shape(catalog, name),
                                    is_network_output=name in outputs)
        return tensors[name]

    layers = [ILayer(p, [tensor(t) for t in p.inputs], [tensor(t) for t in p.outputs]) for p in predict_layers(catalog)]
    return INetworkDefinition(catalog.path.name, layers, list(inputs.values()), [tensor(n) for n in catalog.output_names])


def _dtype(catalog: "Catalog", tensor: str) -> Any:
    return _FROM_ONNX.get(catalog.tensor_types.get(tensor, TensorProto.FLOAT), DataType.FLOAT)


def _shape(catalog: "Catalog", tensor: str) -> tuple[int, ...]:
    infos = list(catalog.model.graph.input) + list(catalog.model.graph.output) + list(catalog.model.graph.value_info)
    for vi in infos:
        if vi.name == tensor and vi.type.HasField("tensor_type"):
            return tuple(d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim)
    return ()


class ILogger:
    Severity = enum.IntEnum("Severity", ["INTERNAL_ERROR", "ERROR", "WARNING", "INFO", "VERBOSE"], start=0)
    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = Severity  # `trt.Logger(trt.Logger.WARNING)`

    def __init__(self, min_severity: Any = None) -> None:
        self.min_severity = min_severity

    def log(self, severity: Any, msg: str) -> None:
        log.debug("postprocess script (TensorRT log %s): %s", severity, msg)


class _RecordingModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"bisector's recording TensorRT has no `tensorrt.{name}` (it offers "
                             f"{', '.join(sorted(k for k in vars(self) if not k.startswith('_')))})")


def recording_tensorrt() -> types.ModuleType:
    """The stand-in `tensorrt` module scripts see while they run on a recording network (TensorRT 10, weak typing)."""
    mod = _RecordingModule("tensorrt", "bisector's recording stand-in for TensorRT (no engines, no GPU)")
    setattr(mod, "__version__", RECORDING_VERSION)
    setattr(mod, "DataType", DataType)
    for alias, member in (("float32", "FLOAT"), ("float16", "HALF"), ("bfloat16", "BF16"), ("int8", "INT8"),
                          ("int32", "INT32"), ("int64", "INT64"), ("bool", "BOOL"), ("uint8", "UINT8"),
                          ("fp8", "FP8"), ("int4", "INT4"), ("fp4", "FP4")):
        setattr(mod, alias, DataType[member])
    for cls in (LayerType, BuilderFlag, NetworkDefinitionCreationFlag, TensorIOMode, INetworkDefinition, ILayer,
                ITensor, ILogger):
        setattr(mod, cls.__name__, cls)
    setattr(mod, "Logger", ILogger)
    return mod


# ---- Polygraphy --trt-npps FILE[:FUNC] ----------------------------------------------------------------------
def split_script_arg(arg: str) -> tuple[Path, str]:
    """`FILE[:FUNC]` -> (file, function); the function defaults to `postprocess`, as in Polygraphy.

    Polygraphy splits on the last ':' (`parse_arglist_to_tuple_list`, a missing separator meaning "no
    function"). We do the same, except that an argument naming an existing file is taken whole, so a path with
    a ':' in it still works.
    """
    text = os.fspath(arg)
    if Path(text).is_file():
        return Path(text), DEFAULT_FUNCTION
    path, sep, func = text.rpartition(":")
    if not sep:
        return Path(text), DEFAULT_FUNCTION
    return Path(path), func or DEFAULT_FUNCTION


_counter = itertools.count()


@contextlib.contextmanager
def _tensorrt_replaced(module: types.ModuleType, folder: Path) -> Iterator[None]:
    """`import tensorrt` yields `module`, and the script's folder is importable (as with Polygraphy), meanwhile."""
    saved = {k: sys.modules[k] for k in list(sys.modules) if k == "tensorrt" or k.startswith("tensorrt.")}
    for k in saved:
        del sys.modules[k]
    sys.modules["tensorrt"] = module
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(folder))
        sys.modules.pop("tensorrt", None)
        sys.modules.update(saved)


def _load_callable(path: Path, func: str) -> Any:
    if not path.is_file():
        raise UsageError(f"network postprocess script not found: {path}")
    if path.suffix != ".py":
        raise UsageError(f"network postprocess script {path} must be a .py file (Polygraphy imports it)")
    name = f"_bisector_npps_{next(_counter)}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import the network postprocess script {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # sys.exit() in a script is its failure, not bisector's exit
        raise UsageError(f"importing {path} failed: {type(exc).__name__}: {exc}") from None
    obj = getattr(module, func, None)
    if obj is None:
        known = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise UsageError(f"{path} has no `{func}` (callables there: {', '.join(known) or 'none'}); "
                         f"name one as {path}:FUNCTION")
    if isinstance(obj, type):  # Polygraphy's InvokeFromScript instantiates a class with no arguments
        obj = obj()
    if not callable(obj):
        raise UsageError(f"`{func}` in {path} is not callable")
    return obj


def run_postprocess_script(script: str | os.PathLike[str], catalog: "Catalog") -> frozenset[str]:
    """The FP32 node set a Polygraphy network-postprocess script asks for.

    `script` is `FILE[:FUNC]` (FUNC defaults to `postprocess`). The callable is invoked as Polygraphy does,
    `func(network=network)`, on a fresh recording network of the model, with `import tensorrt` yielding the
    recording stand-in. A node is FP32 when the script set float32 as the precision or an output type of any of
    its layers. The result holds candidates only: pinned nodes are FP32 in every plan (a script that leaves a
    pinned node out is logged, since its build would run that node in FP16), and Constant/Shape/Cast nodes
    never round. A missing file or function, or a script that raises, is a UsageError.
    """
    path, func = split_script_arg(os.fspath(script))
    network = recording_network(catalog)
    with _tensorrt_replaced(recording_tensorrt(), path.resolve().parent):
        fn = _load_callable(path, func)
        try:
            fn(network=network)
        except (Exception, SystemExit) as exc:
            raise UsageError(f"{path}:{func} failed on the model's layers: {type(exc).__name__}: {exc}") from None
    layers = match_layers(network, catalog.names, subgraph_aliases(catalog.model))
    fp32 = {node for node, idx in layers.items() if any(network.get_layer(i).kept_fp32() for i in idx)}
    left_out = sorted(n for n in catalog.pinned if n in layers and n not in fp32)
    if left_out:
        log.warning("%s:%s leaves pinned node(s) %s in FP16; bisector keeps them FP32 in every plan",
                    path, func, ", ".join(left_out))
    return frozenset(fp32.intersection(catalog.candidates))
