"""`--trt-npps my_script.py:custom_func`: a postprocess function under another name."""
import tensorrt as trt


def custom_func(network):
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        if layer.name == "Add":
            layer.precision = trt.float32
