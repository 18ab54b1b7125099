"""Search wall time on the emulate backend against one FP32 inference, side by side in one run.

    python bench/emulate_speed.py [--blocks 16] [--size 144] [--channels 64] [--strategy auto]

Builds a conv network whose FP32 ONNX Runtime inference takes >= 50 ms here, plants FP16-intolerant nodes,
runs a whole search, and prints:
- one FP32 inference (full-model ORT session, all graph optimisations), median of 5;
- the search: evaluations, wall time, per-evaluation breakdown (node sessions built, backend run, compare);
- the ratio  search wall / (evaluations x one FP32 inference)  — the target is <= 2;
- the baseline design (a cast-pair rewrite + a new ORT session per candidate), timed on a few plans.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_model(blocks: int, size: int, channels: int = 32) -> tuple[onnx.ModelProto, list[str]]:
    rng = np.random.default_rng(3)
    nodes, inits, planted = [], [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    x = "x"
    w = const("stem_w", rng.standard_normal((channels, 3, 3, 3)) / np.sqrt(27))
    nodes.append(helper.make_node("Conv", [x, w], ["h0"], name="stem", pads=[1, 1, 1, 1]))
    h = "h0"
    for i in range(blocks):
        w = const(f"w{i}", rng.standard_normal((channels, channels, 3, 3)) * (0.5 / np.sqrt(channels * 9)))
        nodes.append(helper.make_node("Conv", [h, w], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        nodes.append(helper.make_node("Add", [f"r{i}", h], [f"a{i}"], name=f"residual{i}"))
        out = f"a{i}"
        if i in (blocks // 3, 2 * blocks // 3):  # planted: large-offset cancellation
            off = const(f"off{i}", np.array(30000.0))
            nodes.append(helper.make_node("Add", [out, off], [f"po{i}"], name=f"planted_add{i}"))
            nodes.append(helper.make_node("Sub", [f"po{i}", off], [f"ps{i}"], name=f"planted_sub{i}"))
            planted += [f"planted_add{i}", f"planted_sub{i}"]
            out = f"ps{i}"
        h = out
    nodes.append(helper.make_node("ReduceMean", [h], ["y"], name="pool", axes=[2, 3], keepdims=0))
    graph = helper.make_graph(nodes, "speed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), planted


def fp32_inference_seconds(model: onnx.ModelProto, feeds, repeats: int = 5) -> float:
    from bisector.cores import usable_cores

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = usable_cores()  # as the emulate backend: ORT's default ignores taskset
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    sess.run(None, feeds)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cast_pair_baseline_seconds(catalog, plan, feeds) -> dict[str, float]:
    """The design we avoid: rewrite the graph with Cast pairs for this plan, build a new session, run once."""
    t0 = time.perf_counter()
    model = onnx.ModelProto()
    model.CopyFrom(catalog.model)
    graph = model.graph
    new_nodes = []
    for node in graph.node:
        new_nodes.append(node)
        if node.name in plan.fp16:
            for o in list(node.output):
                a, b = f"{o}__h", f"{o}__r"
                node.output[list(node.output).index(o)] = a
                new_nodes.append(helper.make_node("Cast", [a], [b], to=TensorProto.FLOAT16))
                new_nodes.append(helper.make_node("Cast", [b], [o], to=TensorProto.FLOAT))
    del graph.node[:]
    graph.node.extend(new_nodes)
    t1 = time.perf_counter()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    t2 = time.perf_counter()
    sess.run(None, feeds)
    t3 = time.perf_counter()
    return {"rewrite": t1 - t0, "session": t2 - t1, "inference": t3 - t2, "total": t3 - t0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--size", type=int, default=144)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--strategy", default="auto")
    ap.add_argument("--block-size", type=int, default=None, help="executor block size (default: the backend's)")
    args = ap.parse_args()

    from bisector.backends.emulate.backend import EmulateBackend
    from bisector.model.catalog import Catalog
    from bisector.compare import Tolerance
    from bisector.model.golden import run_reference_model
    from bisector.search.oracle import Oracle
    from bisector.fp16.plan import Plan
    from bisector.search.driver import run_search
    from bisector.values import PerOutput

    model, planted = build_model(args.blocks, args.size, args.channels)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speed.onnx"
        onnx.save(model, path)
        catalog = Catalog.load(path)
    feeds = {"x": np.random.default_rng(1).uniform(0, 1, (1, 3, args.size, args.size)).astype(np.float32)}
    golden = run_reference_model(catalog, [feeds])
    # Thread-pool spinning off, as in the emulate backend's sessions: a spinning pool left behind by one inference
    # steals the cores from whatever runs next on this 2-core machine (measured: +25 % on the next evaluation).
    fp32_opts = ort.SessionOptions()
    fp32_opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    fp32_session = ort.InferenceSession(model.SerializeToString(), fp32_opts, providers=["CPUExecutionProvider"])
    fp32_session.run(None, feeds)
    fp32_times: list[float] = []

    def interleaved_fp32(_verdict) -> None:
        # One FP32 inference after every evaluation: both sides see the same machine load (this box is shared).
        t = time.perf_counter()
        fp32_session.run(None, feeds)
        fp32_times.append(time.perf_counter() - t)

    backend = EmulateBackend(**({"block_size": args.block_size} if args.block_size else {}))
    t0 = time.perf_counter()
    backend.open(catalog)
    oracle = Oracle(backend, catalog.candidates, [feeds], golden, Tolerance(PerOutput(1e-2), PerOutput(1e-2)),
                    on_verdict=interleaved_fp32)
    result = run_search(oracle, args.strategy)
    wall = time.perf_counter() - t0 - sum(fp32_times)
    t_fp32 = statistics.median(fp32_times)
    evals = oracle.total
    run_s = sum(v.seconds["run"] for v in oracle.history)
    cmp_s = sum(v.seconds["compare"] for v in oracle.history)

    plans = [Plan(frozenset(), catalog.candidates), Plan(frozenset(planted), catalog.candidates),
             Plan(frozenset(catalog.candidates[: len(catalog.candidates) // 2]), catalog.candidates)]
    base = [cast_pair_baseline_seconds(catalog, p, feeds) for p in plans]
    base_mean = {k: statistics.mean(b[k] for b in base) for k in base[0]}

    exact = sorted(result.fp32) == sorted(planted)
    print(f"model: {args.blocks} conv blocks of {args.channels} channels, input 1x3x{args.size}x{args.size}, "
          f"{len(catalog.candidates)} candidates, "
          f"{len(planted)} planted")
    print(f"one FP32 inference (ORT, full model; median of {len(fp32_times)}, interleaved with the search): {t_fp32 * 1e3:.1f} ms")
    print(f"search ({args.strategy}): {evals} evaluations, exact={exact}, wall {wall:.2f} s")
    print(f"  per evaluation: backend run {run_s / evals * 1e3:.1f} ms, compare {cmp_s / evals * 1e3:.2f} ms, "
          f"sessions built once: {backend.executor.sessions_built} "
          f"({backend.executor.build_seconds:.2f} s in all)")
    print(f"  ratio  wall / (evaluations x FP32 inference) = {wall / (evals * t_fp32):.2f}   (target <= 2)")
    print(f"baseline: cast-pair rewrite + new session per candidate: rewrite {base_mean['rewrite'] * 1e3:.1f} ms, "
          f"session {base_mean['session'] * 1e3:.1f} ms, inference {base_mean['inference'] * 1e3:.1f} ms "
          f"= {base_mean['total'] / t_fp32:.2f} x FP32 inference per candidate")


if __name__ == "__main__":
    main()
