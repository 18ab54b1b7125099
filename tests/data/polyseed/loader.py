"""A Polygraphy network loader script: it builds the network with the TensorRT API itself."""
import tensorrt as trt
from polygraphy.backend.trt import NetworkFromOnnxPath

load_network = NetworkFromOnnxPath("needs_constraints.onnx")
