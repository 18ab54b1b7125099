"""Models with chains of element-moving nodes (twins: bisector.fp16.points.single_node_twins; idle
FP32 members: IdleFP32), built at test time."""

from __future__ import annotations

import numpy as np


def movement_chain_model(path):
    """x -> MatMul a -> Reshape r -> Transpose t -> Unsqueeze u -> Squeeze s -> Reshape s_flat -> MatMul m -> y;
    beside it a Reshape read twice (r2 -> Transpose t2 and Sigmoid; t2 -> Reshape t2b), an Identity whose output
    is a graph output (q -> Reshape q2), a Gather of a weight (g) and a Concat: the twins are t, u, s, s_flat (of
    r) and t2b (of t2); r2's readers, q2 and the Gather are not."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = lambda name, *shape: numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)  # noqa: E731
    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [
        helper.make_node("MatMul", ["x", "wa"], ["a"], name="a"),
        helper.make_node("Reshape", ["a", "s_r"], ["r"], name="r"),
        helper.make_node("Transpose", ["r"], ["t"], name="t", perm=[1, 0, 2]),
        helper.make_node("Unsqueeze", ["t", "ax0"], ["u"], name="u"),
        helper.make_node("Squeeze", ["u", "ax0"], ["s"], name="s"),
        helper.make_node("Reshape", ["s", "s_back"], ["s2"], name="s_flat"),
        helper.make_node("MatMul", ["s2", "wm"], ["y"], name="m"),
        helper.make_node("Reshape", ["a", "s_back"], ["r2"], name="r2"),
        helper.make_node("Transpose", ["r2"], ["t2"], name="t2", perm=[1, 0]),
        helper.make_node("Reshape", ["t2", "s_back"], ["t2b"], name="t2b"),
        helper.make_node("Sigmoid", ["r2"], ["h2"], name="h2"),
        helper.make_node("Add", ["t2b", "h2"], ["z"], name="z"),
        helper.make_node("Identity", ["a"], ["qo"], name="q"),
        helper.make_node("Reshape", ["qo", "s_back"], ["q2"], name="q2"),
        helper.make_node("Gather", ["emb", "idx"], ["g"], name="g"),
        helper.make_node("Concat", ["z", "q2", "g"], ["c"], name="c", axis=0),
    ]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 24]),
         helper.make_tensor_value_info("qo", TensorProto.FLOAT, [32, 16]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, [68, 16])],
        initializer=[w("wa", 16, 16), w("wm", 16, 24), w("emb", 10, 16), ints("s_r", [4, 8, 16]),
                     ints("s_back", [32, 16]), ints("ax0", [0]), ints("idx", [1, 3, 5, 7])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def exact_readers_model(path):
    """Nodes whose FP16 outputs are exact on FP16 inputs, and near misses: x -> MatMul a, MatMul b; Relu r (of a);
    Max mx (of r, b); Floor fl (of mx) -> MatMul y; Concat cw (of mx and a weight); Neg ng (of the graph input x);
    Identity q (of a) whose reader is the Relu-free Add z (of q, ng). Idle where their producers are FP16: r, mx, fl,
    q; never: cw (a weight is converted), ng (a graph input is rounded)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w = lambda name, *shape: numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)  # noqa: E731
    nodes = [
        helper.make_node("MatMul", ["x", "wa"], ["a"], name="a"),
        helper.make_node("MatMul", ["x", "wb"], ["b"], name="b"),
        helper.make_node("Relu", ["a"], ["r"], name="r"),
        helper.make_node("Max", ["r", "b"], ["mx"], name="mx"),
        helper.make_node("Floor", ["mx"], ["fl"], name="fl"),
        helper.make_node("MatMul", ["fl", "wy"], ["y"], name="y"),
        helper.make_node("Concat", ["mx", "wc"], ["cw"], name="cw", axis=0),
        helper.make_node("Neg", ["x"], ["ng"], name="ng"),
        helper.make_node("Identity", ["a"], ["q"], name="q"),
        helper.make_node("Add", ["q", "ng"], ["z"], name="z"),
    ]
    graph = helper.make_graph(
        nodes, "readers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 8]),
         helper.make_tensor_value_info("cw", TensorProto.FLOAT, [36, 16]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [32, 16])],
        initializer=[w("wa", 16, 16), w("wb", 16, 16), w("wy", 16, 8),
                     numpy_helper.from_array((rng.standard_normal((4, 16)) * 8).astype(np.float32), "wc")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def copies_model(path):
    """Nodes that copy elements with attributes or several inputs/outputs, after a Conv a of x: a nearest Resize
    rn and a linear one rl (interpolates: not a copy), a reflect Pad pr and a constant Pad pc whose value 0.3 is a
    weight (FP16 converts it), a Split sp and a Concat cc of its two halves swapped; each read by a Conv."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(13)
    w = lambda name, *shape: numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)  # noqa: E731
    f32 = lambda name, v: numpy_helper.from_array(np.array(v, np.float32), name)  # noqa: E731
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    conv = lambda src, name: helper.make_node("Conv", [src, f"w{name}"], [f"y{name}"], name=name)  # noqa: E731
    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a"], name="a", pads=[1, 1, 1, 1]),
        helper.make_node("Resize", ["a", "", "scales"], ["rn_o"], name="rn"),  # mode: nearest by default
        helper.make_node("Resize", ["a", "", "scales"], ["rl_o"], name="rl", mode="linear"),
        helper.make_node("Pad", ["a", "pads"], ["pr_o"], name="pr", mode="reflect"),
        helper.make_node("Pad", ["a", "pads", "pval"], ["pc_o"], name="pc"),
        helper.make_node("Split", ["a"], ["s1", "s2"], name="sp", axis=1, num_outputs=2),
        helper.make_node("Concat", ["s2", "s1"], ["cc_o"], name="cc", axis=1),
        conv("rn_o", "b"), conv("rl_o", "c"), conv("pr_o", "d"), conv("pc_o", "e"), conv("cc_o", "f"),
    ]
    outs = [helper.make_tensor_value_info(f"y{n}", TensorProto.FLOAT, None) for n in "bcdef"]
    graph = helper.make_graph(
        nodes, "copies", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])], outs,
        initializer=[w("wa", 4, 4, 3, 3), *(w(f"w{n}", 2, 4, 3, 3) for n in "bcdef"),
                     f32("scales", [1, 1, 2, 2]), i64("pads", [0, 0, 1, 1, 0, 0, 1, 1]), f32("pval", 0.3)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path
