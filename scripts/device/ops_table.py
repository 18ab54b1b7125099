"""Per op family: how far from the FP32 reference is real GPU FP16, and how far is each emulation of it?

For every op family (Conv, MatMul/Gemm, Add/Mul, Sigmoid/Tanh/Exp, Softmax, LayerNormalization/ReduceMean, Resize)
one single-op ONNX model is built in code with realistic sizes and input distributions. Each is evaluated:

- `ref`      the FP32 model on ONNX Runtime's CPU provider (the reference every error is measured against);
- `castpair` today's emulation (DESIGN §4): inputs and weights rounded to FP16, the op in FP32 on ORT CPU, the
             output rounded to FP16 (reproduced here with numpy + ORT directly; no bisector import);
- candidates FP16-arithmetic emulations in numpy (per family: FP16 step-by-step elementwise math, FP16 or split-K
             FP16 accumulation for GEMM/conv/reductions, FP16 exp for softmax, FP16 statistics for normalisation …);
- `ort-cuda` the op as a real FP16 ONNX (FP16 inputs, weights, output) on ORT's CUDA provider, TF32 off
             (use_tf32=0), CPU fallback forbidden; skipped where onnxruntime has no CUDA provider;
- `torch`    the same op in torch FP16 on CUDA, a second opinion; skipped without torch+CUDA.

Per variant: max and mean |out − ref|, the ratio of each to the GPU's (emulation error / ort-cuda error; within
[1/1.5, 1.5] = "within 1.5×"), and the fraction of output elements whose FP16 value equals the GPU's bit for bit.

    PYTHONPATH=/tmp/site python3 scripts/device/ops_table.py --out $OUT      # on the device (GPU columns)
    python scripts/device/ops_table.py --out /tmp/ops --quick               # here: emulations only

Writes OUT/ops_table.md and OUT/ops_table.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F16 = np.float16
F32 = np.float32


def r16(a) -> np.ndarray:
    """IEEE round-to-nearest to FP16, back as FP32 (what a Cast pair does)."""
    with np.errstate(over="ignore"):
        return np.asarray(a, F32).astype(F16).astype(F32)


def w16(a) -> np.ndarray:
    """Weight conversion of DESIGN §4: clamp finite values to ±65504, tiny nonzeros to ±2^-24, else round."""
    a = np.asarray(a, F32)
    out = np.clip(a, -65504, 65504)
    tiny = (a != 0) & (np.abs(a) < 2.0 ** -24)
    out = np.where(tiny, np.sign(a) * 2.0 ** -24, out)
    return out.astype(F16).astype(F32)


# ---- FP16 arithmetic building blocks (numpy) -----------------------------------------------------------------
def acc16_seq(parts: np.ndarray, axis: int) -> np.ndarray:
    """Sequential FP16 accumulation of `parts` (already FP16 values) along axis: s = fp16(s + p)."""
    parts = np.moveaxis(np.asarray(parts, F32), axis, 0)
    s = np.zeros(parts.shape[1:], F16)
    for p in parts:
        s = (s.astype(F32) + p).astype(F16)
    return s.astype(F32)


def blocked_dot16(a: np.ndarray, b: np.ndarray, block: int) -> np.ndarray:
    """a[M,K] @ b[K,N]: FP32 products summed in FP32 within K-blocks of `block`, each block's partial rounded to FP16
    and the partials accumulated in FP16 (a kernel with FP16 accumulators between K tiles / a split-K with FP16
    partial results). block >= K is plain FP32 accumulation."""
    m, k = a.shape
    n = b.shape[1]
    nb = math.ceil(k / block)
    parts = np.empty((nb, m, n), F32)
    for i in range(nb):
        parts[i] = r16(a[:, i * block:(i + 1) * block].astype(np.float64) @ b[i * block:(i + 1) * block].astype(np.float64))
    return acc16_seq(parts, 0)


def im2col(x: np.ndarray, kh: int, kw: int, pad: int) -> np.ndarray:
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    v = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))  # n c oh ow kh kw
    return v.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * w, c * kh * kw)


def sum16_pairwise(x: np.ndarray, axis: int) -> np.ndarray:
    """Tree (pairwise) summation in FP16: the shape of a GPU block reduction with FP16 accumulators."""
    x = np.moveaxis(r16(x), axis, -1)
    while x.shape[-1] > 1:
        if x.shape[-1] % 2:
            x = np.concatenate([x, np.zeros(x.shape[:-1] + (1,), F32)], -1)
        x = r16(x[..., 0::2] + x[..., 1::2])
    return x[..., 0]


# ---- cases -----------------------------------------------------------------------------------------------------
class Case:
    def __init__(self, family: str, name: str, op: str, inputs: dict, weights: dict, attrs: dict, out_shape,
                 candidates: dict[str, Callable[[dict], np.ndarray]], torch_fn=None, opset: int = 17,
                 param_inits: dict | None = None, note: str = ""):
        self.family, self.name, self.op, self.inputs, self.weights = family, name, op, inputs, weights
        self.attrs, self.out_shape, self.candidates, self.torch_fn = attrs, out_shape, candidates, torch_fn
        self.opset, self.param_inits, self.note = opset, param_inits or {}, note

    def model(self, fp16: bool) -> onnx.ModelProto:
        et = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
        dt = F16 if fp16 else F32
        inits = [numpy_helper.from_array((w16(v).astype(F16) if fp16 else np.asarray(v, F32)), k)
                 for k, v in self.weights.items()]
        inits += [numpy_helper.from_array(v, k) for k, v in self.param_inits.items()]
        ins = [helper.make_tensor_value_info(k, et, list(v.shape)) for k, v in self.inputs.items()]
        names = list(self.inputs) + list(self.weights)
        if self.op == "Resize":
            names = [names[0], "", "scales"]
        node = helper.make_node(self.op, names, ["y"], name=self.name, **self.attrs)
        g = helper.make_graph([node], self.name, ins, [helper.make_tensor_value_info("y", et, list(self.out_shape))],
                              initializer=inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=9)
        del dt
        return m


def build_cases(quick: bool) -> list[Case]:
    rng = np.random.default_rng(1234)
    s = 0.5 if quick else 1.0
    cases: list[Case] = []

    def nrm(*shape, mu=0.0, sd=1.0):
        return (mu + sd * rng.standard_normal(shape)).astype(F32)

    # Conv: a 3x3 conv of a mid-network feature map (post-ReLU-ish activations, He-initialised weights)
    n, c, h = (2, 32, 16) if quick else (4, 64, 32)
    x = np.maximum(nrm(n, c, h, h), 0) + 0.1 * nrm(n, c, h, h)
    W = nrm(c, c, 3, 3, sd=math.sqrt(2 / (c * 9)))
    bias = nrm(c, sd=0.1)

    def conv_acc(block):
        def f(d):
            cols = im2col(r16(d["x"]), 3, 3, 1)
            wm = w16(W).reshape(c, -1).T
            y = blocked_dot16(cols, wm, block) if block else r16(cols.astype(np.float64) @ wm)
            y = r16(y + w16(bias))
            return y.reshape(n, h, h, c).transpose(0, 3, 1, 2)
        return f

    k = c * 9
    cases.append(Case("Conv", "conv3x3", "Conv", {"x": x}, {"W": W, "B": bias}, {"pads": [1, 1, 1, 1]}, (n, c, h, h),
                      {"acc32_bias16": conv_acc(0), "acc16_k32": conv_acc(32), "splitk4_fp16": conv_acc(k // 4)},
                      torch_fn=lambda t, d: t.nn.functional.conv2d(d["x"], d["W"], d["B"], padding=1)))

    # MatMul: activations x projection (K=1024), and Gemm with bias (K=768, transB)
    m_, kk, nn_ = (32, 512, 256) if quick else (64, 1024, 1024)
    a = nrm(m_, kk)
    Wm = nrm(kk, nn_, sd=1 / math.sqrt(kk))

    def mm_acc(block, A, B):
        def f(d):
            return blocked_dot16(r16(d["a"]), w16(B), block) if block else r16(r16(d["a"]).astype(np.float64) @ w16(B))
        return f

    cases.append(Case("MatMul/Gemm", "matmul_k%d" % kk, "MatMul", {"a": a}, {"W": Wm}, {}, (m_, nn_),
                      {"acc16_k32": mm_acc(32, a, Wm), "splitk4_fp16": mm_acc(kk // 4, a, Wm)},
                      torch_fn=lambda t, d: d["a"] @ d["W"]))
    kg = 384 if quick else 768
    ag = nrm(m_, kg, mu=0.2)
    Wg = nrm(256, kg, sd=1 / math.sqrt(kg))
    bg = nrm(256, sd=0.5)

    def gemm_acc(block):
        def f(d):
            y = blocked_dot16(r16(d["a"]), w16(Wg).T, block) if block else r16(r16(d["a"]).astype(np.float64) @ w16(Wg).T)
            return r16(y + w16(bg))
        return f

    cases.append(Case("MatMul/Gemm", "gemm_k%d_bias" % kg, "Gemm", {"a": ag}, {"W": Wg, "C": bg}, {"transB": 1},
                      (m_, 256), {"acc32_bias16": gemm_acc(0), "acc16_k32": gemm_acc(32), "splitk4_fp16": gemm_acc(kg // 4)},
                      torch_fn=lambda t, d: t.nn.functional.linear(d["a"], d["W"], d["C"])))

    # Add / Mul of two activations of different magnitude (a residual add; a gating multiply)
    shp = (128, 512) if quick else (256, 1024)
    xa, xb = nrm(*shp, sd=4.0), nrm(*shp, sd=0.3)
    cases.append(Case("Add/Mul", "add", "Add", {"a": xa, "b": xb}, {}, {}, shp,
                      {"fp16_op": lambda d: r16(r16(d["a"]) + r16(d["b"]))}, torch_fn=lambda t, d: d["a"] + d["b"]))
    ma, mb = nrm(*shp, sd=3.0), nrm(*shp, mu=1.0, sd=0.5)
    cases.append(Case("Add/Mul", "mul", "Mul", {"a": ma, "b": mb}, {}, {}, shp,
                      {"fp16_op": lambda d: r16(r16(d["a"]) * r16(d["b"]))}, torch_fn=lambda t, d: d["a"] * d["b"]))

    # Sigmoid / Tanh / Exp of pre-activations
    xs = nrm(*shp, sd=3.0)

    def sig_steps(d):
        x16 = r16(d["x"])
        e = r16(np.exp(-x16.astype(np.float64)))
        return r16(1.0 / r16(1.0 + e))

    def sig_steps_stable(d):
        x16 = r16(d["x"])
        e = r16(np.exp(-np.abs(x16).astype(np.float64)))
        p = r16(1.0 / r16(1.0 + e))
        return np.where(x16 >= 0, p, r16(e * p))

    cases.append(Case("Sigmoid/Tanh/Exp", "sigmoid", "Sigmoid", {"x": xs}, {}, {}, shp,
                      {"steps16": sig_steps, "steps16_stable": sig_steps_stable},
                      torch_fn=lambda t, d: t.sigmoid(d["x"])))
    xt = nrm(*shp, sd=1.5)

    def tanh_steps(d):
        x16 = r16(d["x"])
        e = r16(np.exp(r16(2 * x16).astype(np.float64)))
        return r16(1 - r16(2 / r16(e + 1)))

    cases.append(Case("Sigmoid/Tanh/Exp", "tanh", "Tanh", {"x": xt}, {}, {}, shp,
                      {"steps16": tanh_steps}, torch_fn=lambda t, d: t.tanh(d["x"])))
    xe = rng.uniform(-8, 10, shp).astype(F32)

    def exp2_16(d):
        x16 = r16(d["x"])
        return r16(np.exp2(r16(x16 * F32(1.4426950408889634)).astype(np.float64)))

    cases.append(Case("Sigmoid/Tanh/Exp", "exp", "Exp", {"x": xe}, {}, {}, shp,
                      {"exp2_of_fp16_arg": exp2_16}, torch_fn=lambda t, d: t.exp(d["x"])))

    # Softmax over classes/keys
    sm_shape = (32, 500) if quick else (64, 1000)
    xl = nrm(*sm_shape, sd=3.0)

    def sm_exp16(sum16: bool):
        def f(d):
            x16 = r16(d["x"])
            z = r16(x16 - x16.max(-1, keepdims=True))
            e = r16(np.exp(z.astype(np.float64)))
            ssum = sum16_pairwise(e, -1)[..., None] if sum16 else e.sum(-1, keepdims=True, dtype=np.float64)
            return r16(e / ssum)
        return f

    cases.append(Case("Softmax", "softmax", "Softmax", {"x": xl}, {}, {"axis": -1}, sm_shape,
                      {"exp16_sum32": sm_exp16(False), "exp16_sum16": sm_exp16(True)},
                      torch_fn=lambda t, d: t.softmax(d["x"], -1)))

    # LayerNormalization of a residual stream; ReduceMean of a long row
    ln_shape = (64, 384) if quick else (128, 768)
    xn = nrm(*ln_shape, mu=0.5, sd=2.0)
    gam, bet = nrm(ln_shape[1], mu=1.0, sd=0.1), nrm(ln_shape[1], sd=0.1)

    def ln_var(stats16: bool, steps16: bool):
        def f(d):
            x16 = r16(d["x"]).astype(np.float64)
            if stats16:
                mu = sum16_pairwise(x16 / ln_shape[1], -1)[..., None]
                dev = r16(x16 - mu)
                var = sum16_pairwise(r16(dev * dev) / ln_shape[1], -1)[..., None]
            else:
                mu = x16.mean(-1, keepdims=True)
                var = ((x16 - mu) ** 2).mean(-1, keepdims=True)
                dev = x16 - mu
            rstd = 1 / np.sqrt(var + 1e-5)
            if steps16:
                return r16(r16(r16(r16(dev) * r16(rstd)) * w16(gam)) + w16(bet))
            return r16(dev * rstd * w16(gam) + w16(bet))
        return f

    cases.append(Case("LayerNormalization/ReduceMean", "layernorm", "LayerNormalization", {"x": xn},
                      {"g": gam, "b": bet}, {"axis": -1, "epsilon": 1e-5}, ln_shape,
                      {"stats16": ln_var(True, False), "steps16": ln_var(False, True), "stats16_steps16": ln_var(True, True)},
                      torch_fn=lambda t, d: t.nn.functional.layer_norm(d["x"], (ln_shape[1],), d["g"], d["b"], 1e-5)))
    rm_shape = (32, 2048) if quick else (64, 4096)
    xr = nrm(*rm_shape, mu=1.0, sd=1.0)

    def rm_seq(d):
        return r16(acc16_seq(r16(d["x"]).T, 0) / rm_shape[1])

    def rm_pair(d):
        return r16(sum16_pairwise(d["x"], -1) / rm_shape[1])

    def rm_prescale(d):
        return sum16_pairwise(r16(r16(d["x"]) / rm_shape[1]), -1)

    cases.append(Case("LayerNormalization/ReduceMean", "reducemean", "ReduceMean", {"x": xr}, {},
                      {"axes": [-1], "keepdims": 0}, rm_shape[:1],
                      {"acc16_sequential": rm_seq, "acc16_pairwise": rm_pair, "prescale_acc16_pairwise": rm_prescale},
                      torch_fn=lambda t, d: d["x"].mean(-1)))

    # Resize: 2x bilinear upsampling of a feature map (half_pixel), as in FPN/UNet decoders
    rs = (2, 16, 16, 16) if quick else (4, 32, 32, 32)
    xz = nrm(*rs, sd=2.0)
    scales = np.array([1, 1, 2, 2], F32)

    def resize_lin(steps16: bool):
        def f(d):
            x16 = r16(d["x"]).astype(np.float64)
            H = rs[2]
            src = (np.arange(2 * H) + 0.5) / 2 - 0.5
            src = np.clip(src, 0, H - 1)
            i0 = np.floor(src).astype(int)
            i1 = np.minimum(i0 + 1, H - 1)
            wgt = src - i0
            if steps16:
                # lerp in FP16: a + w*(b-a) with each step rounded
                rows = r16(x16[:, :, i0, :] + r16(wgt[None, None, :, None] * r16(x16[:, :, i1, :] - x16[:, :, i0, :])))
                return r16(rows[:, :, :, i0] + r16(wgt * r16(rows[:, :, :, i1] - rows[:, :, :, i0])))
            rows = x16[:, :, i0, :] * (1 - wgt)[None, None, :, None] + x16[:, :, i1, :] * wgt[None, None, :, None]
            return r16(rows[:, :, :, i0] * (1 - wgt) + rows[:, :, :, i1] * wgt)
        return f

    def resize_4tap(fma: bool):
        """ORT-CUDA-style bilinear: 4 taps x00*w00 + x01*w01 + x10*w10 + x11*w11 in FP16 arithmetic (weights
        computed in FP32, cast to FP16; with fma each step rounds once, else each product and sum round)."""
        def f(d):
            x16 = r16(d["x"]).astype(np.float64)
            H = rs[2]
            src = np.clip((np.arange(2 * H) + 0.5) / 2 - 0.5, 0, H - 1)
            i0 = np.floor(src).astype(int)
            i1 = np.minimum(i0 + 1, H - 1)
            w1 = src - i0
            w0 = 1 - w1
            Y = lambda i, j: x16[:, :, i, :][:, :, :, j]  # noqa: E731
            wy0, wy1 = w0[None, None, :, None], w1[None, None, :, None]
            taps = [(Y(i0, i0), r16(wy0 * w0)), (Y(i0, i1), r16(wy0 * w1)), (Y(i1, i0), r16(wy1 * w0)),
                    (Y(i1, i1), r16(wy1 * w1))]
            acc = r16(taps[0][0] * taps[0][1])
            for v, w in taps[1:]:
                acc = r16(acc + v * w) if fma else r16(acc + r16(v * w))
            return acc
        return f

    cases.append(Case("Resize", "resize_linear2x", "Resize", {"x": xz}, {}, {"mode": "linear",
                      "coordinate_transformation_mode": "half_pixel"}, (rs[0], rs[1], 2 * rs[2], 2 * rs[3]),
                      {"lerp64_round16": resize_lin(False), "lerp16": resize_lin(True),
                       "taps4_fp16": resize_4tap(False), "taps4_fma16": resize_4tap(True)},
                      param_inits={"scales": scales},
                      torch_fn=lambda t, d: t.nn.functional.interpolate(d["x"], scale_factor=2, mode="bilinear",
                                                                         align_corners=False)))
    del s
    return cases


# ---- runners ---------------------------------------------------------------------------------------------------
def ort_run(model: onnx.ModelProto, feeds: dict, providers, threads: int = 0) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    if any((p[0] if isinstance(p, tuple) else p) == "CUDAExecutionProvider" for p in providers):
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=providers)
    return np.asarray(sess.run(["y"], feeds)[0])


def cast_pair(case: Case) -> np.ndarray:
    """Today's emulation: FP32 model, inputs/weights rounded to FP16, output rounded to FP16 (ORT CPU)."""
    m = case.model(False)
    for init in m.graph.initializer:
        if init.name in case.weights:
            init.CopyFrom(numpy_helper.from_array(w16(numpy_helper.to_array(init)), init.name))
    return r16(ort_run(m, {k: r16(v) for k, v in case.inputs.items()}, ["CPUExecutionProvider"]))


def gpu_ort(case: Case):
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return None, "no CUDA provider"
    try:
        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()
        prov = [("CUDAExecutionProvider", {"use_tf32": "0"})]
        y = ort_run(case.model(True), {k: v.astype(F16) for k, v in case.inputs.items()}, prov)
        return y.astype(F32), ""
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {str(e)[:200]}"


def gpu_torch(case: Case):
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return None, f"no torch: {e}"
    if not torch.cuda.is_available() or case.torch_fn is None:
        return None, "no CUDA"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    d = {k: torch.from_numpy(v.astype(F16)).cuda() for k, v in case.inputs.items()}
    d.update({k: torch.from_numpy(w16(v).astype(F16)).cuda() for k, v in case.weights.items()})
    with torch.no_grad():
        y = case.torch_fn(torch, d)
    torch.cuda.synchronize()
    return y.float().cpu().numpy(), f"torch {torch.__version__}, fp16 reduced-precision reduction " \
                                    f"{torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction}"


def errs(y: np.ndarray, ref: np.ndarray) -> dict:
    d = np.abs(y.astype(np.float64) - ref.astype(np.float64))
    d = np.nan_to_num(d, nan=np.inf)
    rel = d / np.maximum(np.abs(ref.astype(np.float64)), 1e-3)
    return {"max": float(d.max()), "mean": float(d.mean()), "max_rel": float(rel.max())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "ops_out"))
    ap.add_argument("--quick", action="store_true", help="smaller tensors (tests)")
    ap.add_argument("--only", default="", help="comma-separated case names")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import onnxruntime as ort

    env = {"onnxruntime": ort.__version__, "providers": ort.get_available_providers(), "numpy": np.__version__}
    try:
        import platform
        env["cpu"] = platform.processor() or platform.machine()
    except Exception:  # noqa: BLE001
        pass
    rows = []
    wanted = set(filter(None, a.only.split(",")))
    for case in build_cases(a.quick):
        if wanted and case.name not in wanted:
            continue
        t0 = time.perf_counter()
        ref = ort_run(case.model(False), case.inputs, ["CPUExecutionProvider"]).astype(F32)
        variants: dict[str, np.ndarray] = {"castpair": cast_pair(case)}
        for name, fn in case.candidates.items():
            variants[name] = np.asarray(fn({**case.inputs, **case.weights}), F32).reshape(ref.shape)
        notes = {}
        g, notes["ort-cuda"] = gpu_ort(case)
        tg, notes["torch"] = gpu_torch(case)
        row = {"family": case.family, "case": case.name, "op": case.op, "shape": list(ref.shape),
               "ref_absmax": float(np.abs(ref).max()), "variants": {}, "notes": notes}
        gpu_e = errs(g, ref) if g is not None else None
        for vname, y in {**variants, **({"ort-cuda": g} if g is not None else {}),
                         **({"torch": tg} if tg is not None else {})}.items():
            e = errs(y, ref)
            if gpu_e is not None and vname != "ort-cuda":
                e["ratio_max"] = e["max"] / gpu_e["max"] if gpu_e["max"] > 0 else float("nan")
                e["ratio_mean"] = e["mean"] / gpu_e["mean"] if gpu_e["mean"] > 0 else float("nan")
                e["equal_to_gpu"] = float(np.mean(r16(y) == r16(g)))
            row["variants"][vname] = e
        row["seconds"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
        print(f"{case.name:18s} " + " ".join(f"{k}={v['max']:.3g}/{v['mean']:.3g}" for k, v in row["variants"].items()),
              flush=True)
    (out / "ops_table.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    (out / "ops_table.md").write_text(markdown(rows, env))
    return 0


def markdown(rows: list[dict], env: dict) -> str:
    lines = [f"environment: {json.dumps(env)}", ""]
    for r in rows:
        lines.append(f"### {r['family']}: `{r['case']}` ({r['op']}, output {r['shape']}, max |ref| {r['ref_absmax']:.3g})")
        lines.append("")
        lines.append("| variant | max abs err | mean abs err | max rel err | max ratio vs ort-cuda | mean ratio vs ort-cuda | = GPU (fp16 bits) |")
        lines.append("|---|---|---|---|---|---|---|")
        for v, e in r["variants"].items():
            f = lambda k: f"{e[k]:.3g}" if k in e else "–"  # noqa: E731
            eq = f"{100 * e['equal_to_gpu']:.1f} %" if "equal_to_gpu" in e else "–"
            lines.append(f"| {v} | {e['max']:.3g} | {e['mean']:.3g} | {e['max_rel']:.3g} | {f('ratio_max')} | {f('ratio_mean')} | {eq} |")
        extra = "; ".join(f"{k}: {v}" for k, v in r["notes"].items() if v)
        if extra:
            lines.append("")
            lines.append(f"notes: {extra}")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
