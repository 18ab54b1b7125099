"""Verify `emulate` against real GPU FP16 (`ort-cuda`) and build the resulting mixed models with TensorRT-RTX.

Runs on the device machine (see scripts/device/README.md), in one go:

1. environment: GPU, driver, onnxruntime(-gpu), tensorrt_rtx versions;
2. the canary through `ort-cuda` on the GPU (must pass: 65505.5 reads back 65504, all-FP16 seed fails) and through
   a CPU stand-in of the same backend (must fail: ORT's CPU provider computes FP16 graphs in FP32);
3. for every case (fixtures, test-vector models, generated models): `bisector precision` with `--backend emulate`
   and with `--backend ort-cuda` (the CLI, as a user runs it), both FP32 sets, evaluations, per-candidate times;
4. cross-judging: all-FP16, each backend's set and all-FP32 judged by both backends (verdict agreement), the
   nodes ORT placed on the CPU, and, where the verdicts differ, the first tensors where GPU and emulation part;
5. TensorRT-RTX: parse + build (strongly typed) of the mixed ONNX of all-FP16 and of each final set, each in a
   subprocess (running engines is refused on compute capability 9.0; that is recorded, not hidden).

Writes OUT/validate.json (everything) and OUT/validate.log (what it printed). Usage:

    PYTHONPATH=/tmp/site python3 scripts/device/validate.py --out "$OUT" [--cases a,b] [--skip-trt]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
SECOND = os.environ.get("VALIDATE_SECOND", "ort-cuda")  # "emulate" for a CPU smoke test of this script
LOG: list[str] = []
T0 = time.monotonic()


def say(*a) -> None:
    line = " ".join(str(x) for x in a)
    LOG.append(line)
    print(line, flush=True)


# ---- cases ------------------------------------------------------------------------------------------------------
def generated_models(work: Path) -> dict[str, Path]:
    """Two small models that stress what emulation does not model: arithmetic inside layers (long GEMM
    accumulations, LayerNorm/Softmax/Erf internals) and a cancellation after a long reduction."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    work.mkdir(parents=True, exist_ok=True)
    out = {}

    def init(name, arr):
        return numpy_helper.from_array(np.asarray(arr, dtype=np.float32), name)

    # mlp_ln: MatMul(512) + bias -> LayerNorm -> erf-GELU -> MatMul(256) -> Softmax, plus a ReduceSumSquare head
    inits = [init("W1", rng.standard_normal((512, 512)) * 0.08), init("b1", rng.standard_normal(512) * 0.1),
             init("g", 1 + 0.1 * rng.standard_normal(512)), init("beta", 0.1 * rng.standard_normal(512)),
             init("W2", rng.standard_normal((512, 256)) * 0.3), init("c_sqrt", [0.70710678]),
             init("c_one", [1.0]), init("c_half", [0.5])]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"], name="fc1"),
        helper.make_node("Add", ["h1", "b1"], ["h1b"], name="fc1_bias"),
        helper.make_node("LayerNormalization", ["h1b", "g", "beta"], ["ln"], name="ln", axis=-1, epsilon=1e-5),
        helper.make_node("Mul", ["ln", "c_sqrt"], ["gs"], name="gelu_scale"),
        helper.make_node("Erf", ["gs"], ["ge"], name="gelu_erf"),
        helper.make_node("Add", ["ge", "c_one"], ["ge1"], name="gelu_add1"),
        helper.make_node("Mul", ["ln", "ge1"], ["gm"], name="gelu_mul"),
        helper.make_node("Mul", ["gm", "c_half"], ["gelu"], name="gelu_half"),
        helper.make_node("MatMul", ["gelu", "W2"], ["logits"], name="fc2"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
        helper.make_node("ReduceSumSquare", ["gelu"], ["energy"], name="energy", keepdims=1, axes=[1]),
    ]
    g = helper.make_graph(nodes, "mlp_ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 512])],
                          [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [8, 256]),
                           helper.make_tensor_value_info("energy", TensorProto.FLOAT, [8, 1])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m)
    out["mlp_ln"] = work / "mlp_ln.onnx"
    onnx.save(m, out["mlp_ln"])

    # accum: a K=4096 GEMM of positive values (sums ~1000, FP16 ulp 0.5-1) then a mean-centering cancellation
    inits = [init("W", rng.uniform(0, 1, (4096, 32))), init("scale", [0.01])]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["y"], name="gemm_k4096"),
        helper.make_node("ReduceMean", ["y"], ["mu"], name="mean", axes=[1], keepdims=1),
        helper.make_node("Sub", ["y", "mu"], ["z"], name="center"),
        helper.make_node("Mul", ["z", "scale"], ["out"], name="scale_out"),
    ]
    g = helper.make_graph(nodes, "accum", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4096])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 32])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(m)
    out["accum"] = work / "accum.onnx"
    onnx.save(m, out["accum"])

    # fallback: nodes ORT keeps on the CPU provider: Det (no CUDA kernel) and a Shape->Gather->Concat->Reshape
    # shape computation (ORT prefers such nodes on the CPU); exercises the cpu_fallback_nodes report on a GPU
    i64 = lambda name, vals: numpy_helper.from_array(np.asarray(vals, dtype=np.int64), name)  # noqa: E731
    inits = [init("W", rng.standard_normal((9, 4))), i64("idx0", [0]), i64("minus1", [-1]), i64("ax1", [1])]
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "idx0"], ["b"], name="batch", axis=0),
        helper.make_node("Concat", ["b", "minus1"], ["newshape"], name="newshape", axis=0),
        helper.make_node("Reshape", ["x", "newshape"], ["r"], name="flatten"),
        helper.make_node("MatMul", ["r", "W"], ["m"], name="proj"),
        helper.make_node("Det", ["x"], ["d"], name="det"),
        helper.make_node("Unsqueeze", ["d", "ax1"], ["du"], name="det_unsq"),
        helper.make_node("Mul", ["m", "du"], ["out"], name="scale_by_det"),
    ]
    g = helper.make_graph(nodes, "fallback", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 4])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(m)
    out["fallback"] = work / "fallback.onnx"
    onnx.save(m, out["fallback"])
    return out


def cases(work: Path) -> list[dict]:
    planted = json.loads((ROOT / "fixtures" / "planted.json").read_text())
    result = [
        {"name": "needs_constraints", "model": ROOT / "fixtures" / "needs_constraints.onnx",
         "args": ["--atol", "1e-1", "--val-range", "x:[1,2]"]},
        {"name": "planted", "model": ROOT / "fixtures" / "planted.onnx", "args": planted["args"]},
    ]
    tv = ROOT / "tests" / "data" / "testvectors"
    for d in sorted(p for p in tv.iterdir() if (p / "model.onnx").exists()):
        result.append({"name": f"tv_{d.name}", "model": d / "model.onnx",
                       "args": ["--load-inputs", str(d / "inputs.npz"), "--atol", "1e-2", "--rtol", "1e-2"]})
    gen = generated_models(work / "models")
    result.append({"name": "gen_mlp_ln", "model": gen["mlp_ln"],
                   "args": ["--val-range", "x:[-1,1]", "--atol", "3e-4", "--rtol", "3e-4"]})
    result.append({"name": "gen_fallback", "model": gen["fallback"],
                   "args": ["--val-range", "x:[0,1]", "--atol", "1e-2", "--rtol", "1e-2"]})
    result.append({"name": "gen_accum", "model": gen["accum"],
                   "args": ["--val-range", "x:[0,1]", "--atol", "1e-3", "--rtol", "1e-3"]})
    return result


# ---- pieces ---------------------------------------------------------------------------------------------------
def environment() -> dict:
    env = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        env["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                                            "--format=csv,noheader"], capture_output=True, text=True,
                                           timeout=30).stdout.strip()
    except Exception as e:  # noqa: BLE001
        env["nvidia_smi"] = f"unavailable: {e}"
    import onnx
    import onnxruntime as ort

    env.update(onnx=onnx.__version__, onnxruntime=ort.__version__, onnxruntime_path=os.path.dirname(ort.__file__),
               providers=ort.get_available_providers(), numpy=np.__version__)
    try:
        from bisector.backends.trt_import import import_tensorrt_rtx

        trt = import_tensorrt_rtx()
        env["tensorrt_rtx"] = getattr(trt, "__version__", "?")
        env["tensorrt_rtx_module"] = trt.__name__
    except Exception as e:  # noqa: BLE001
        env["tensorrt_rtx"] = f"unavailable: {e}"
    return env


def canary_checks() -> dict:
    from bisector.backends.ort_cuda import CPU_EP, OrtCudaBackend
    from bisector.backends.canary import canary_model, run_canary
    from bisector.model.catalog import Catalog
    from bisector.fp16.mixed import build_mixed_model
    from bisector.fp16.plan import Plan

    res: dict = {}
    cat = Catalog.from_model(canary_model())
    m = build_mixed_model(cat, Plan.all_fp16(cat.candidates))
    import onnx

    inferred = onnx.shape_inference.infer_shapes(m)
    types = {v.name: onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type) for v in inferred.graph.value_info}
    res["mixed_canary_tensor_types"] = types
    b = OrtCudaBackend()
    b.open(cat)
    x = np.array([65505.5, 1.25, 1.5, 1.75], dtype=np.float32)
    o16 = b.run(Plan.all_fp16(cat.candidates), {"x": x})
    o32 = b.run(Plan.all_fp32(cat.candidates), {"x": x})
    res["gpu_all_fp16"] = {k: v.tolist() for k, v in o16.items()}
    res["gpu_all_fp32"] = {k: v.tolist() for k, v in o32.items()}
    res["describe"] = b.describe()
    res["cpu_fallback"] = b.cpu_fallback
    b.close()
    try:
        run_canary(lambda: OrtCudaBackend())
        res["gpu_canary"] = "passed"
    except Exception as e:  # noqa: BLE001
        res["gpu_canary"] = f"FAILED: {type(e).__name__}: {e}"
    try:
        run_canary(lambda: OrtCudaBackend(providers=[CPU_EP]))
        res["cpu_stand_in_canary"] = "passed (WRONG: should have failed)"
    except Exception as e:  # noqa: BLE001
        res["cpu_stand_in_canary"] = f"failed as it must: {type(e).__name__}: {str(e)[:160]}"
    return res


def search(case: dict, backend: str, work: Path) -> dict:
    d = work / case["name"] / backend
    d.mkdir(parents=True, exist_ok=True)
    jfile = d / "result.json"
    cmd = [PY, "-m", "bisector.cli.main", "precision", str(case["model"]), "--fp16", *case["args"], "--backend", backend,
           "-o", str(d / "out"), "--json", str(jfile), "--cache-dir", str(work / "cache")]
    t0 = time.perf_counter()
    # cwd outside the source tree: `python -m` would import ./bisector (without bisector.strategies) first
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=400, cwd=work)
    wall = time.perf_counter() - t0
    res = {"cmd": " ".join(shlex.quote(c) for c in cmd[1:]).replace(str(ROOT) + "/", ""), "rc": r.returncode,
           "wall_s": round(wall, 3), "stdout": r.stdout.strip()[-600:], "stderr": r.stderr.strip()[-1500:]}
    if jfile.exists():
        j = json.loads(jfile.read_text())
        ev = j.get("evaluations", {})
        t = j.get("timings", {})
        new = max(1, ev.get("new", 0))
        res.update(fp32_nodes=j["fp32_nodes"], passed=j["passed"], minimal=j["minimal"], evaluations=ev,
                   candidates=j.get("candidates"), timings=t, backend=j.get("backend"),
                   per_candidate_s=round(t.get("search", 0.0) / new, 5),
                   per_candidate_run_s=round(t.get("backend_run", 0.0) / new, 5))
    return res


def open_case_job(case: dict, backend: str, work: Path, **backend_options):
    from bisector.app.job import open_job
    from bisector.app.options import options_from_flags

    return open_job(Path(case["model"]), backend=backend, cache_dir=work / "cache", canary=False,
                    backend_extra=backend_options, **options_from_flags(case["args"]))


def verdict_json(v) -> dict:
    keep = ("passed", "required_tolerance", "abs", "rel", "mismatches", "size", "reason")
    return {"passed": v.passed, "outputs": {k: {kk: vv for kk, vv in r.to_json().items() if kk in keep}
                                            for k, r in v.outputs.items()}}


def cross_judge(case: dict, sets: dict[str, list[str]], work: Path) -> dict:
    """Judge each named FP32 set with both backends (same inputs, golden and tolerance as the CLI)."""
    res: dict = {"plans": {}}
    jobs = {}
    try:
        for backend in ("emulate", "ort-cuda"):
            jobs[backend] = open_case_job(case, SECOND if backend == "ort-cuda" else backend, work)
        jobs["ort-cuda-noopt"] = open_case_job(case, SECOND, work)
        jobs["ort-cuda-noopt"].backend.graph_optimization = "disable"
        cands = jobs["emulate"].catalog.candidates
        res["candidates"] = len(cands)
        for label, s in sets.items():
            fs = frozenset(cands) if s == "ALL" else frozenset(s)
            row: dict = {"size": len(fs)}
            for backend, job in jobs.items():
                v = job.oracle().evaluate(fs)
                row[backend] = verdict_json(v)
            ob = jobs["ort-cuda"].backend
            from bisector.fp16.plan import Plan

            info = getattr(ob, "cpu_fallback", {}).get(Plan(fs, cands).key(), {})
            row["ort_cpu_nodes"] = info.get("nodes", [])
            row["ort_cpu_fp16_nodes"] = info.get("fp16_nodes", [])
            row["ort_cpu_other"] = info.get("other", [])[:20]
            row["agree"] = row["emulate"]["passed"] == row["ort-cuda"]["passed"]
            if not row["agree"] or label == "all_fp16":
                row["divergence"] = divergence(jobs["emulate"], jobs["ort-cuda"], fs)
            res["plans"][label] = row
        res["describe_ort"] = jobs["ort-cuda"].backend.describe()
    finally:
        for j in jobs.values():
            j.close()
    return res


def divergence(ej, oj, fp32: frozenset) -> list[dict]:
    """Per node output (topological order): how far the GPU's tensor is from the emulation's, first input set."""
    from bisector.fp16.plan import Plan

    cat = ej.catalog
    plan = Plan(fp32, cat.candidates)
    feeds = ej.feeds_list[0]
    emu = ej.backend.run_all(plan, feeds)
    names = [t for n in cat.model.graph.node for t in n.output if t and cat.is_float(t)
             and n.op_type not in ("Constant",)]
    try:
        gpu = oj.backend.run(plan, feeds, outputs=names)
    except Exception as e:  # noqa: BLE001
        return [{"error": str(e)[:300]}]
    rows = []
    for n in cat.model.graph.node:
        for t in n.output:
            if t not in gpu:
                continue
            a, b = np.asarray(emu[t], np.float64), np.asarray(gpu[t], np.float64)
            if a.shape != b.shape:
                rows.append({"node": n.name, "op": n.op_type, "tensor": t, "error": f"shape {a.shape} vs {b.shape}"})
                continue
            both_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
            d = np.where(both_inf, 0.0, np.abs(a - b))
            d = np.nan_to_num(d, nan=np.inf)
            i = int(np.argmax(d)) if d.size else 0
            rows.append({"node": n.name, "op": n.op_type, "fp16": n.name in plan.fp16, "tensor": t,
                         "max_abs_diff": float(d.max()) if d.size else 0.0,
                         "n_diff": int((d > 0).sum()), "size": int(d.size),
                         "emulate_at_max": float(a.flat[i]) if d.size else None,
                         "gpu_at_max": float(b.flat[i]) if d.size else None})
    return rows


TRT_CHILD = r"""
import json, sys, time
from bisector.backends.trt_import import import_tensorrt_rtx
trt = import_tensorrt_rtx()
data = open(sys.argv[1], 'rb').read()
res = {}
logger = trt.Logger(trt.Logger.WARNING)
builder = trt.Builder(logger)
flags = 0
st = getattr(trt.NetworkDefinitionCreationFlag, 'STRONGLY_TYPED', None)
if st is not None:
    flags |= 1 << int(st)
res['strongly_typed_flag'] = st is not None
net = builder.create_network(flags)
parser = trt.OnnxParser(net, logger)
t0 = time.perf_counter()
ok = parser.parse(data)
res['parse'] = bool(ok)
res['parse_s'] = round(time.perf_counter() - t0, 3)
res['parse_errors'] = [str(parser.get_error(i)) for i in range(parser.num_errors)]
res['layers'] = net.num_layers
if ok:
    cfg = builder.create_builder_config()
    t0 = time.perf_counter()
    eng = builder.build_serialized_network(net, cfg)
    res['build'] = eng is not None
    res['build_s'] = round(time.perf_counter() - t0, 3)
    res['engine_bytes'] = int(eng.nbytes) if eng is not None else 0
    if eng is not None and len(sys.argv) > 2:
        open(sys.argv[2], 'wb').write(eng)
print('TRTJSON' + json.dumps(res))
"""

TRT_RUN_CHILD = r"""
import sys
from bisector.backends.trt_import import import_tensorrt_rtx
trt = import_tensorrt_rtx()
logger = trt.Logger(trt.Logger.WARNING)
rt = trt.Runtime(logger)
eng = rt.deserialize_cuda_engine(open(sys.argv[1], 'rb').read())
print('DESERIALIZED' if eng is not None else 'DESERIALIZE_RETURNED_NONE')
ctx = eng.create_execution_context() if eng is not None else None
print('CONTEXT' if ctx is not None else 'NO_CONTEXT')
"""


def trt_rtx(case: dict, sets: dict[str, list[str]], work: Path) -> dict:
    import onnx

    from bisector.model.catalog import Catalog
    from bisector.fp16.mixed import build_mixed_model

    cat = Catalog.load(case["model"])
    res = {}
    seen: dict[frozenset, str] = {}
    for label, s in sets.items():
        if s == "ALL":
            continue
        fs = frozenset(s)
        if fs in seen:
            res[label] = {"same_as": seen[fs]}
            continue
        seen[fs] = label
        path = work / case["name"] / f"mixed_{label}.onnx"
        m = build_mixed_model(cat, fs)
        onnx.checker.check_model(m)
        onnx.save(m, path)
        eng = path.with_suffix(".engine")
        r = subprocess.run([PY, "-c", TRT_CHILD, str(path), str(eng)], check=False, capture_output=True, text=True, timeout=300)
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith("TRTJSON")), None)
        if line:
            res[label] = json.loads(line[len("TRTJSON"):])
        else:
            res[label] = {"error": f"rc={r.returncode}: {(r.stderr or r.stdout).strip()[-500:]}"}
        res[label]["rc"] = r.returncode
        if r.stderr.strip():
            res[label]["log_tail"] = r.stderr.strip()[-300:]
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "validate_out"))
    ap.add_argument("--work", default="/tmp/bisector-validate")
    ap.add_argument("--cases", default="")
    ap.add_argument("--skip-trt", action="store_true")
    ap.add_argument("--deadline", type=float, default=480.0, help="seconds; start no new case after this")
    a = ap.parse_args()
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    report: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S")}

    def save():
        (out / "validate.json").write_text(json.dumps(report, indent=1, default=str))
        (out / "validate.log").write_text("\n".join(LOG) + "\n")

    report["environment"] = environment()
    say("environment:", json.dumps(report["environment"]))
    try:
        report["canary"] = canary_checks()
        say("canary:", report["canary"]["gpu_canary"], "| CPU stand-in:", report["canary"]["cpu_stand_in_canary"])
        say("  GPU all-FP16 canary outputs:", report["canary"]["gpu_all_fp16"])
    except Exception:  # noqa: BLE001
        report["canary"] = {"error": traceback.format_exc()[-2000:]}
        say("canary ERROR", report["canary"]["error"])
    save()

    wanted = set(filter(None, a.cases.split(",")))
    report["cases"] = {}
    engine_for_run = None
    for case in cases(work):
        if wanted and case["name"] not in wanted:
            continue
        name = case["name"]
        if time.monotonic() - T0 > a.deadline:
            say(f"== {name}: skipped (deadline {a.deadline:g}s reached)")
            report["cases"][name] = {"skipped": "deadline"}
            continue
        say(f"== {name}: {case['model'].relative_to(ROOT) if str(case['model']).startswith(str(ROOT)) else case['model']} {' '.join(case['args'])}")
        c: dict = {"model": str(case["model"]).replace(str(ROOT) + "/", ""), "args": case["args"]}
        report["cases"][name] = c
        try:
            for backend in ("emulate", "ort-cuda"):
                r = c[backend] = search(case, SECOND if backend == "ort-cuda" else backend, work)
                say(f"  {backend:8s} rc={r['rc']} fp32={r.get('fp32_nodes')} evals={r.get('evaluations')} "
                    f"per-candidate={r.get('per_candidate_s')}s wall={r['wall_s']}s")
                if r["rc"] not in (0, 1):
                    say("   stderr:", r["stderr"][-400:])
            sets: dict = {"all_fp16": []}
            for backend in ("emulate", "ort-cuda"):
                if "fp32_nodes" in c[backend]:
                    sets[f"{backend}_set"] = c[backend]["fp32_nodes"]
            sets["all_fp32"] = "ALL"
            e_set, o_set = sets.get("emulate_set"), sets.get("ort-cuda_set")
            c["sets_agree"] = e_set is not None and o_set is not None and sorted(e_set) == sorted(o_set)
            c["cross"] = cross_judge(case, sets, work)
            for label, row in c["cross"]["plans"].items():
                say(f"  judge {label:13s} size={row['size']:3d} emulate={row['emulate']['passed']!s:5s} "
                    f"ort-cuda={row['ort-cuda']['passed']!s:5s} ort-cuda(noopt)={row['ort-cuda-noopt']['passed']!s:5s} "
                    f"agree={row['agree']} cpu_nodes={row['ort_cpu_nodes']} cpu_fp16_nodes={row['ort_cpu_fp16_nodes']}")
            if not a.skip_trt:
                c["trt_rtx"] = trt_rtx(case, sets, work)
                for label, t in c["trt_rtx"].items():
                    say(f"  trt-rtx {label:13s} " + json.dumps({k: v for k, v in t.items() if k != 'log_tail'})[:300])
                    if engine_for_run is None and t.get("build"):
                        engine_for_run = work / name / f"mixed_{label}.engine"
        except Exception:  # noqa: BLE001
            c["error"] = traceback.format_exc()[-3000:]
            say("  ERROR", c["error"])
        save()

    if engine_for_run is not None:
        r = subprocess.run([PY, "-c", TRT_RUN_CHILD, str(engine_for_run)], check=False, capture_output=True, text=True, timeout=120)
        report["trt_rtx_run_attempt"] = {"engine": str(engine_for_run), "rc": r.returncode,
                                         "stdout": r.stdout.strip()[-500:], "stderr": r.stderr.strip()[-800:]}
        say("trt-rtx run attempt:", json.dumps(report["trt_rtx_run_attempt"])[:900])
    # summary
    n = agree = 0
    sets_agree = 0
    for c in report["cases"].values():
        sets_agree += bool(c.get("sets_agree"))
        for row in c.get("cross", {}).get("plans", {}).values():
            if row.get("size") is not None and row is c["cross"]["plans"].get("all_fp32"):
                continue  # all-FP32 agrees trivially; not counted
            n += 1
            agree += bool(row.get("agree"))
    report["summary"] = {"cases": len(report["cases"]), "sets_agree": sets_agree, "verdicts": n,
                         "verdicts_agree": agree}
    say("summary:", json.dumps(report["summary"]))
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
