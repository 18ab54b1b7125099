"""Stand-ins for the models the Polygraphy seed walkthroughs use and we do not ship (tests only).

Same input/output and tensor names as the seeds' models, far fewer channels: ResNet-18 (x[-1,3,224,224] -> y[.,1000]
with /layer4/layer4.1/conv2/Conv_output_0 and /avgpool/GlobalAveragePool_output_0), ResNet_div_zero (a Div by
zero after the classifier), net_bs8 (a PyTorch export with numbered tensors 151, 153, 197).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _init(name: str, a: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(a, dtype=np.float32), name)


def resnet18(div_zero: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(18)
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["/conv1/Conv_output_0"], name="/conv1/Conv", pads=[1, 1, 1, 1],
                         strides=[4, 4]),
        helper.make_node("Relu", ["/conv1/Conv_output_0"], ["/relu/Relu_output_0"], name="/relu/Relu"),
        helper.make_node("Conv", ["/relu/Relu_output_0", "w1", "b1"], ["/layer4/layer4.1/conv2/Conv_output_0"],
                         name="/layer4/layer4.1/conv2/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["/layer4/layer4.1/conv2/Conv_output_0"],
                         ["/avgpool/GlobalAveragePool_output_0"], name="/avgpool/GlobalAveragePool"),
        helper.make_node("Flatten", ["/avgpool/GlobalAveragePool_output_0"], ["/Flatten_output_0"], name="/Flatten"),
        helper.make_node("Gemm", ["/Flatten_output_0", "fc_w", "fc_b"], ["y" if not div_zero else "fc_out"],
                         name="/fc/Gemm", transB=1),
    ]
    inits = [_init("w0", rng.normal(0, 0.3, (8, 3, 3, 3))), _init("b0", rng.normal(0, 0.1, 8)),
             _init("w1", rng.normal(0, 0.3, (8, 8, 3, 3))), _init("b1", rng.normal(0, 0.1, 8)),
             _init("fc_w", rng.normal(0, 0.5, (1000, 8))), _init("fc_b", rng.normal(0, 0.1, 1000))]
    if div_zero:
        inits.append(_init("zero", np.zeros(1)))
        nodes.append(helper.make_node("Div", ["fc_out", "zero"], ["y"], name="/Div"))
    graph = helper.make_graph(nodes, "resnet18_standin",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 224, 224])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1000])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")


def net_bs8() -> onnx.ModelProto:
    rng = np.random.default_rng(8)
    nodes = [
        helper.make_node("Conv", ["input", "w0"], ["151"], name="Conv_0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["151"], ["153"], name="Relu_1"),
        helper.make_node("Mul", ["153", "scale"], ["197"], name="Mul_2"),
        helper.make_node("Add", ["197", "input"], ["output"], name="Add_3"),
    ]
    inits = [_init("w0", rng.normal(0, 0.2, (3, 3, 3, 3))), _init("scale", np.full((1, 3, 1, 1), 1.7))]
    graph = helper.make_graph(nodes, "net_bs8",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [8, 3, 32, 32])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [8, 3, 32, 32])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")


def write_all(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, model in (("ResNet-18.onnx", resnet18()), ("ResNet_div_zero.onnx", resnet18(div_zero=True)),
                        ("net_bs8.onnx", net_bs8())):
        onnx.save(model, folder / name)
        out[name] = folder / name
    return out
