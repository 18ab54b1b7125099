"""Polygraphy's example network postprocess script (examples/cli/run/08_adding_precision_constraints)."""
import tensorrt as trt


def postprocess(network):
    for layer in network:
        if layer.name in ("Add", "Sub"):
            layer.precision = trt.float32
            for index in range(layer.num_outputs):
                layer.set_output_type(index, trt.float32)
