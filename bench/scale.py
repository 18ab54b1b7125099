"""Scale: cost per evaluation and whole commands on generated chain models, and peak memory on a large model.

    python bench/scale.py                       # chains of 1k, 5k, 20k nodes: per evaluation + whole commands
    python bench/scale.py --sizes 1000 --no-cli # per-evaluation figures only
    python bench/scale.py --large               # a 48-layer transformer: 1.36 GB external weights, 2353 nodes

Chains: x[1, W] through N elementwise nodes (Mul by ~1, Add of ~0, alternating) with one planted large-offset
cancellation (Add 60000 then Sub 60000: h is lost in FP16 storage) in the middle: the minimal FP32 set is those
two nodes. Printed per size: setup (catalog, executor, boundary reference), wall per evaluation (cold: sessions
built on first use; warm: the same plans again) over search-like plans, and the wall time and peak RSS of

    bisector precision chain.onnx --atol 1 --rtol 0.9 --val-range x:[1,2] -o OUT --no-cache [--plot]

each in a subprocess under /usr/bin/time -v (the tolerance leaves the accumulated FP16 noise of 20k nodes, about
0.5, under the default 0.9 margin, so the planted pair stays the answer; at --atol 0.5 the 20k chain's error is
diffuse and the search needs thousands of evaluations).

--large: a 48-layer transformer, d=768 (random weights, 1.36 GB, external data in a temp dir, never committed); prints one plain ONNX
Runtime FP32 inference's peak RSS and wall (a subprocess), the search's peak RSS, wall and evaluations
(`precision`, no plot), and the ratio of the peaks. Models are generated into a temp dir at run time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# ---- models ----------------------------------------------------------------------------------------------------
def chain_model(n: int, width: int = 256) -> tuple[onnx.ModelProto, list[str]]:
    rng = np.random.default_rng(n)
    nodes, inits = [], []
    h = "x"
    mid = n // 2
    planted = [f"planted_add{mid}", f"planted_sub{mid}"]
    i = 0
    while len(nodes) < n:
        if i == mid:
            inits.append(numpy_helper.from_array(np.array(60000.0, np.float32), "offset"))
            nodes.append(helper.make_node("Add", [h, "offset"], [f"pa{i}"], name=planted[0]))
            nodes.append(helper.make_node("Sub", [f"pa{i}", "offset"], [f"ps{i}"], name=planted[1]))
            h = f"ps{i}"
        elif i % 2 == 0:
            inits.append(numpy_helper.from_array(rng.uniform(0.999, 1.001, width).astype(np.float32), f"c{i}"))
            nodes.append(helper.make_node("Mul", [h, f"c{i}"], [f"h{i}"], name=f"mul{i}"))
            h = f"h{i}"
        else:
            inits.append(numpy_helper.from_array(rng.uniform(-1e-3, 1e-3, width).astype(np.float32), f"c{i}"))
            nodes.append(helper.make_node("Add", [h, f"c{i}"], [f"h{i}"], name=f"add{i}"))
            h = f"h{i}"
        i += 1
    nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), planted


def matmul_chain_model(n: int = 600, width: int = 16, batch: int = 4, output_every: int = 0) -> onnx.ModelProto:
    """`n` MatMul + Tanh pairs on a [batch, width] tensor (2n nodes, weights near identity): many small nodes whose
    FP16 errors all add up, so a tight tolerance makes a long diffuse search (3399 evaluations at 1e-4) whose
    plans hold ~1100 of the 1200 nodes FP32. Twentieth round: such a search held every plan it asked as
    frozensets (636 MB against 67 MB for one inference). ``output_every``: every such Tanh is a graph output too
    (10: the 60-output chain, many small outputs each judged per evaluation)."""
    rng = np.random.default_rng(0)
    nodes, inits, t = [], [], "x"
    for i in range(n):
        w = (np.eye(width) + rng.standard_normal((width, width)) * 0.05).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [t, f"w{i}"], [f"m{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"tanh{i}"))
        t = f"t{i}"
    outputs = [f"t{i}" for i in range(output_every - 1, n, output_every)] if output_every else [t]
    g = helper.make_graph(nodes, "matmul_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, [batch, width]) for o in outputs],
                          initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def transformer_model(layers: int = 48, d: int = 768, seq: int = 64, heads: int = 16,
                      ) -> tuple[onnx.ModelProto, list[str]]:
    """A pre-norm transformer encoder in basic ONNX ops (LayerNorm and GELU decomposed), random weights."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    dh = d // heads

    def w(name, shape, scale):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def c(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def node(op, ins, name, **kw):
        nodes.append(helper.make_node(op, ins, [name], name=name, **kw))
        return name

    c("eps", 1e-5)
    c("two", 2.0)
    c("half", 0.5)
    c("one", 1.0)
    c("sqrt2", np.sqrt(2.0))
    c("scale", 1.0 / np.sqrt(dh))
    c("axes_last", [-1], np.int64)
    c("shape_heads", [1, seq, heads, dh], np.int64)
    c("shape_model", [1, seq, d], np.int64)

    def layernorm(x, p):
        mu = node("ReduceMean", [x, "axes_last"], f"{p}_mu")
        xc = node("Sub", [x, mu], f"{p}_xc")
        sq = node("Pow", [xc, "two"], f"{p}_sq")
        var = node("ReduceMean", [sq, "axes_last"], f"{p}_var")
        ve = node("Add", [var, "eps"], f"{p}_ve")
        sd = node("Sqrt", [ve], f"{p}_sd")
        xn = node("Div", [xc, sd], f"{p}_xn")
        g = node("Mul", [xn, c(f"{p}_g", np.ones(d))], f"{p}_g_mul")
        return node("Add", [g, c(f"{p}_b", np.zeros(d))], f"{p}_b_add")

    def linear(x, p, din, dout):
        m = node("MatMul", [x, w(f"{p}_w", (din, dout), 1 / np.sqrt(din))], f"{p}_mm")
        return node("Add", [m, c(f"{p}_bias", np.zeros(dout))], f"{p}_bias_add")

    h = "x"
    for layer in range(layers):
        p = f"l{layer}"
        a = layernorm(h, f"{p}_ln1")
        heads_of = {}
        for k in ("q", "k", "v"):
            t = linear(a, f"{p}_{k}", d, d)
            r = node("Reshape", [t, "shape_heads"], f"{p}_{k}_split")
            heads_of[k] = node("Transpose", [r], f"{p}_{k}_t", perm=[0, 2, 3, 1] if k == "k" else [0, 2, 1, 3])
        s = node("MatMul", [heads_of["q"], heads_of["k"]], f"{p}_scores")
        s = node("Mul", [s, "scale"], f"{p}_scaled")
        s = node("Softmax", [s], f"{p}_softmax", axis=-1)
        o = node("MatMul", [s, heads_of["v"]], f"{p}_attn")
        o = node("Transpose", [o], f"{p}_attn_t", perm=[0, 2, 1, 3])
        o = node("Reshape", [o, "shape_model"], f"{p}_attn_merge")
        o = linear(o, f"{p}_o", d, d)
        h = node("Add", [h, o], f"{p}_res1")
        m = layernorm(h, f"{p}_ln2")
        m = linear(m, f"{p}_fc1", d, 4 * d)
        g1 = node("Div", [m, "sqrt2"], f"{p}_gelu_div")  # exact GELU: 0.5 x (1 + erf(x / sqrt 2))
        g2 = node("Erf", [g1], f"{p}_gelu_erf")
        g3 = node("Add", [g2, "one"], f"{p}_gelu_add")
        g4 = node("Mul", [m, g3], f"{p}_gelu_mul")
        m = node("Mul", [g4, "half"], f"{p}_gelu_half")
        m = linear(m, f"{p}_fc2", 4 * d, d)
        h = node("Add", [h, m], f"{p}_res2")
    h = layernorm(h, "final_ln")
    nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "transformer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, d])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), []


def vae_decoder_model(latent: int = 64, channels: tuple[int, ...] = (64, 64, 32, 16), groups: int = 8,
                      blocks: int = 2) -> onnx.ModelProto:
    """A Stable-Diffusion-style VAE decoder (issue 14 names diffusion VAEs), random weights: a 4-channel latent of
    `latent`² to an RGB image 2^(len(channels)-1) times larger. As torch exports it at opset 17: GroupNorm as
    Reshape -> InstanceNormalization -> Reshape -> Mul -> Add, SiLU as x * Sigmoid(x), nearest Resize then a
    3x3 Conv per upsampling, ResNet blocks with 1x1 shortcuts where the width changes, and one self-attention
    over every latent position in the middle (4096 tokens at 64²: a 64 MB score matrix). Its activations grow
    toward the output (16 channels at 512²: 16 MB a tensor), as a real decoder's do."""
    rng = np.random.default_rng(3)
    nodes, inits = [], []
    count = [0]

    def name(p: str) -> str:
        count[0] += 1
        return f"{p}_{count[0]}"

    def const(value, dtype=np.float32) -> str:
        n = name("c")
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), n))
        return n

    def node(op, ins, p, **kw) -> str:
        out = name(p)
        nodes.append(helper.make_node(op, ins, [out], name=out, **kw))
        return out

    def conv(x, cin, cout, k=3) -> str:
        wt = const(rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k))
        b = const(rng.standard_normal(cout) * 0.01)
        return node("Conv", [x, wt, b], "conv", pads=[k // 2] * 4)

    def group_norm(x, c) -> str:
        r = node("Reshape", [x, const([0, groups, -1], np.int64)], "gn_reshape")
        n = node("InstanceNormalization", [r, const(np.ones(groups)), const(np.zeros(groups))], "gn_inorm",
                 epsilon=1e-6)
        s = node("Reshape", [n, node("Shape", [x], "gn_shape")], "gn_back")
        g = node("Mul", [s, const(1 + rng.standard_normal((c, 1, 1)) * 0.1)], "gn_gamma")
        return node("Add", [g, const(rng.standard_normal((c, 1, 1)) * 0.1)], "gn_beta")

    def silu(x) -> str:
        return node("Mul", [x, node("Sigmoid", [x], "silu_sigmoid")], "silu")

    def resnet(x, cin, cout) -> str:
        h = conv(silu(group_norm(x, cin)), cin, cout)
        h = conv(silu(group_norm(h, cout)), cout, cout)
        skip = x if cin == cout else conv(x, cin, cout, k=1)
        return node("Add", [skip, h], "res_add")

    def attention(x, c, hw) -> str:
        h = group_norm(x, c)
        flat = node("Transpose", [node("Reshape", [h, const([1, c, hw * hw], np.int64)], "attn_flat")], "attn_t",
                    perm=[0, 2, 1])
        q, k, v = (node("MatMul", [flat, const(rng.standard_normal((c, c)) / np.sqrt(c))], f"attn_{p}")
                   for p in "qkv")
        kt = node("Transpose", [k], "attn_kt", perm=[0, 2, 1])
        s = node("Mul", [node("MatMul", [q, kt], "attn_scores"), const(1 / np.sqrt(c))], "attn_scale")
        o = node("MatMul", [node("Softmax", [s], "attn_softmax", axis=-1), v], "attn_out")
        o = node("MatMul", [o, const(rng.standard_normal((c, c)) / np.sqrt(c))], "attn_proj")
        o = node("Reshape", [node("Transpose", [o], "attn_back", perm=[0, 2, 1]), const([1, c, hw, hw], np.int64)],
                 "attn_unflat")
        return node("Add", [x, o], "attn_res")

    x = conv("z", 4, channels[0])
    x = resnet(x, channels[0], channels[0])
    x = attention(x, channels[0], latent)
    x = resnet(x, channels[0], channels[0])
    size, cin = latent, channels[0]
    for level, cout in enumerate(channels):
        for _ in range(blocks):
            x = resnet(x, cin, cout)
            cin = cout
        if level < len(channels) - 1:
            x = node("Resize", [x, "", const([1, 1, 2, 2])], "upsample", mode="nearest")
            x = conv(x, cin, cin)
            size *= 2
    x = conv(silu(group_norm(x, cin)), cin, 3)
    nodes[-1].output[0] = "image"
    g = helper.make_graph(nodes, "vae_decoder",
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, latent, latent])],
                          [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
                          initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def save(model: onnx.ModelProto, path: Path, external: bool = False) -> Path:
    if external:
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=path.name + ".data", size_threshold=1024)
    else:
        onnx.save(model, str(path))
    return path


# ---- measurements ----------------------------------------------------------------------------------------------
def timed(cmd: list[str], env: dict | None = None) -> dict:
    """Wall seconds, peak RSS (MB) and exit code of `cmd` under /usr/bin/time -v; stdout tail."""
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True,
                       env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t0
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    return {"wall": wall, "peak_mb": int(m.group(1)) / 1024 if m else float("nan"), "rc": p.returncode,
            "out": p.stdout.strip().splitlines()[-2:], "err": p.stderr.strip().splitlines()[-30:]}


def per_evaluation(path: Path, planted: list[str], plans: int = 20) -> dict:
    """Setup and wall per evaluation (cold and warm) through the emulate backend, on search-like plans: the
    planted nodes plus a few random others FP32, and bisection-like halves."""
    from bisector.backends.emulate.backend import EmulateBackend
    from bisector.fp16.plan import Plan
    from bisector.model.catalog import Catalog

    t0 = time.perf_counter()
    cat = Catalog.load(path)
    be = EmulateBackend()
    be.open(cat)
    feeds = {"x": np.random.default_rng(1).uniform(1, 2, (1, 256)).astype(np.float32)}
    be.run(Plan.all_fp32(cat.candidates), feeds)
    setup = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    cands = list(cat.candidates)
    sets = []
    for i in range(plans):
        if i % 2:
            lo = int(rng.integers(0, len(cands)))
            sets.append(frozenset(cands[lo: lo + len(cands) // (2 + i)]) | set(planted))
        else:
            sets.append(frozenset(rng.choice(cands, size=4, replace=False)) | set(planted))
    out = {"setup": setup, "nodes": len(cat.names)}
    for label in ("cold", "warm"):
        t0 = time.perf_counter()
        for s in sets:
            be.run(Plan(frozenset(s), cat.candidates), feeds)
        out[label] = (time.perf_counter() - t0) / len(sets)
    out["sessions"] = be.executor.sessions_built
    be.close()
    return out


def cli(path: Path, out: Path, extra: list[str], args: list[str]) -> dict:
    return timed([sys.executable, "-m", "bisector.cli.main", "precision", str(path), *args, "-o", str(out),
                  "--no-cache", *extra])


PLAIN_INFERENCE = """
import sys, time, numpy as np, onnxruntime as ort
so = ort.SessionOptions(); so.log_severity_level = 3
t0 = time.perf_counter()
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
i = s.get_inputs()[0]
x = np.random.default_rng(1).uniform(0, 1, [d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
s.run(None, {i.name: x})
print(f"wall {time.perf_counter() - t0:.2f} s")
"""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,5000,20000")
    ap.add_argument("--no-cli", action="store_true", help="per-evaluation figures only (no whole commands)")
    ap.add_argument("--large", action="store_true")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--seq", type=int, default=64)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bisector-scale-") as tmp:
        tmp = Path(tmp)
        if a.large:
            return large(tmp, a.layers, a.d, a.seq)
        args = ["--atol", "1", "--rtol", "0.9", "--val-range", "x:[1,2]"]
        print("| nodes | setup s | wall/eval cold s | wall/eval warm s | sessions | precision (default) s (peak MB) "
              "| precision --plot s (peak MB) |")
        print("|---|---|---|---|---|---|---|")
        for n in [int(s) for s in a.sizes.split(",")]:
            model, planted = chain_model(n)
            path = save(model, tmp / f"chain{n}.onnx")
            pe = per_evaluation(path, planted)
            row = (f"| {n} | {pe['setup']:.2f} | {pe['cold']:.3f} | {pe['warm']:.3f} | {pe['sessions']} |")
            if not a.no_cli:
                for extra in ([], ["--plot"]):
                    r = cli(path, tmp / f"out{n}", extra, args)
                    ok = "" if r["rc"] == 0 else f" rc={r['rc']}"
                    row += f" {r['wall']:.1f} ({r['peak_mb']:.0f}){ok} |"
                    if r["rc"] not in (0,):
                        print("\n".join(r["err"]), file=sys.stderr)
            print(row, flush=True)


def large(tmp: Path, layers: int, d: int, seq: int) -> None:
    t0 = time.perf_counter()
    model, _ = transformer_model(layers, d, seq)
    path = save(model, tmp / "transformer.onnx", external=True)
    del model
    size = sum(f.stat().st_size for f in tmp.iterdir()) / 2**30
    n_nodes = len(onnx.load(str(path), load_external_data=False).graph.node)
    print(f"model: {layers} layers, d={d}, seq={seq}: {n_nodes} nodes, {size:.2f} GiB on disk "
          f"(generated in {time.perf_counter() - t0:.0f} s)")
    plain = timed([sys.executable, "-c", PLAIN_INFERENCE, str(path)])
    if plain["rc"]:
        print("\n".join(plain["err"]), file=sys.stderr)
    print(f"one plain ORT FP32 inference: peak {plain['peak_mb']:.0f} MB, {plain['out'][-1] if plain['out'] else ''}")
    r = cli(path, tmp / "out", [], ["--atol", "1e-1", "--rtol", "1e-1", "--val-range", "x:[-1,1]"])
    evals = next((line for line in r["out"] if "evaluations" in line), "")
    print(f"precision: rc {r['rc']}, peak {r['peak_mb']:.0f} MB, wall {r['wall']:.0f} s; {evals}")
    if r["rc"] not in (0, 1):
        print("\n".join(r["err"]), file=sys.stderr)
    print(f"peak ratio search / one inference: {r['peak_mb'] / plain['peak_mb']:.2f}")
    try:
        n_evals = json.loads((tmp / "out" / "constraints.json").read_text())["evaluations"]["new"]
        cold = float(plain["out"][-1].split()[1])
        print(f"wall ratio (wall - 2 s) / (evaluations x one inference incl. loading the model, {cold:.2f} s): "
              f"{max(0.0, r['wall'] - 2) / (n_evals * cold):.2f}  (bench/default_command.py --large: the same "
              "against a warm inference)")
    except (OSError, KeyError, ValueError, IndexError) as exc:
        print(f"wall ratio not computed: {exc}")


if __name__ == "__main__":
    main()
