"""bisector: find the minimal set of ONNX nodes that must stay FP32 in an FP16 build."""

__version__ = "0.1.0"
