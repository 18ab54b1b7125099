"""Issues 17 and 14 on one GPU: `--workers 1` vs `--workers 2` with `--backend ort-cuda`, and ort-cuda's cost.

    PYTHONPATH=/tmp/site python3 scripts/device/parallel_gpu.py all --out $OUT/parallel_gpu.json --smi-dir $OUT
    python scripts/device/parallel_gpu.py report docs/verification/gpu17/parallel_gpu.json

Models: fixtures/planted.onnx (args of fixtures/planted.json) and a detector-sized conv net built here
(`detector`: YOLO-style backbone, SiLU = Conv·Sigmoid(Conv), residual Adds, 5 stride-2 stages at 1×3×320×640,
~300 nodes, two planted large-offset Add/Sub pairs). Each search is one `bisector.app.precision.precision()` call
in a fresh process (`one`), as the CLI runs it (journal and cache off), with nvidia-smi sampling utilisation and
memory every 200 ms in the background. Both workers of `--workers 2` get CUDA_VISIBLE_DEVICES=0 on one GPU
(worker_envs() assigns GPUs round-robin: gpus[i % len(gpus)]).

Issue 14: one plain FP32 GPU inference of the detector (an onnxruntime-gpu session, TF32 off like the backend):
session creation and warm run; the same for the all-FP16 mixed model; then the ort-cuda search against the
emulate search on the same machine, with ORT's default cudnn_conv_algo_search (EXHAUSTIVE) and with HEURISTIC
(BISECTOR_ORT_CUDA_OPTIONS).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def build_detector(h: int = 320, w: int = 640, blocks: int = 14, widths=(16, 32, 64, 96, 128), head: int = 255):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    nodes, inits, planted = [], [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    def conv_silu(x, cin, cout, k, stride, name):
        gain = 1.0 if stride == 2 or name == "stem" else 0.25
        wt = const(f"{name}_w", rng.standard_normal((cout, cin, k, k)) * (gain / np.sqrt(cin * k * k)))
        b = const(f"{name}_b", rng.uniform(-0.1, 0.1, cout))
        nodes.append(helper.make_node("Conv", [x, wt, b], [f"{name}_c"], name=name, pads=[k // 2] * 4,
                                      strides=[stride, stride]))
        nodes.append(helper.make_node("Sigmoid", [f"{name}_c"], [f"{name}_s"], name=f"{name}_sig"))
        nodes.append(helper.make_node("Mul", [f"{name}_c", f"{name}_s"], [f"{name}_y"], name=f"{name}_silu"))
        return f"{name}_y"

    x = conv_silu("x", 3, widths[0], 3, 1, "stem")
    cin = widths[0]
    for si, c in enumerate(widths):
        x = conv_silu(x, cin, c, 3, 2, f"s{si}_down")
        cin = c
        for bi in range(blocks):
            name = f"s{si}_b{bi}"
            y = conv_silu(x, c, c, 3, 1, name)
            nodes.append(helper.make_node("Add", [x, y], [f"{name}_res"], name=f"{name}_add"))
            x = f"{name}_res"
            if (si, bi) in ((1, blocks // 2), (3, blocks // 2)):  # planted: large-offset cancellation
                off = const(f"{name}_off", np.array(30000.0))
                nodes.append(helper.make_node("Add", [x, off], [f"{name}_po"], name=f"planted_add_s{si}"))
                nodes.append(helper.make_node("Sub", [f"{name}_po", off], [f"{name}_ps"], name=f"planted_sub_s{si}"))
                planted += [f"planted_add_s{si}", f"planted_sub_s{si}"]
                x = f"{name}_ps"
    wt = const("head_w", rng.standard_normal((head, cin, 1, 1)) / np.sqrt(cin))
    nodes.append(helper.make_node("Conv", [x, wt], ["y"], name="head"))
    oh, ow = h >> len(widths), w >> len(widths)
    graph = helper.make_graph(nodes, "detector", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, head, oh, ow])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), planted


DETECTOR_ARGS = ["--val-range", "x:[0,1]", "--atol", "2e-2", "--rtol", "2e-2"]


def planted_args() -> list[str]:
    return json.loads((ROOT / "fixtures" / "planted.json").read_text())["args"]


# ---- one search in this process ------------------------------------------------------------------------------
def one_search(model: str, args: list[str], backend: str, workers: int, fp16_arith: str | None = None,
               ray: str | None = None) -> dict:
    """precision() as the CLI runs it, with the driver's result (rounds) captured."""
    import bisector.app.precision as P

    captured: dict = {}
    real = P.run_search

    def spy(oracle, *a, **kw):
        r = real(oracle, *a, **kw)
        captured.update(rounds=r.rounds, workers=r.workers, new=r.evaluations.get("new"))
        b = getattr(oracle, "backend", None)
        st = getattr(b, "session_times", None)
        if st:
            captured["session_seconds"] = {"n": len(st), "median": statistics.median(st), "sum": sum(st),
                                           "max": max(st)}
        return r

    P.run_search = spy
    from bisector.app.options import BackendChoice

    opts: dict = {"no_cache": True, "resume": False}
    it = iter(args)
    for flag in it:
        val = next(it)
        if flag == "--val-range":
            opts.setdefault("val_range", []).append(val)
        elif flag == "--atol":
            opts["atol"] = [val]
        elif flag == "--rtol":
            opts["rtol"] = [val]
        else:
            raise SystemExit(f"unknown flag {flag}")
    if ray:  # --ray ADDRESS --workers N: N actors (num_gpus=1 each for ort-cuda)
        opts["ray"] = ray
        opts["workers"] = workers
    elif workers > 1:
        opts["workers"] = workers
    choice = BackendChoice(backend=backend, **({"fp16_arithmetic": fp16_arith} if fp16_arith else {}))
    t0 = time.perf_counter()
    r = P.precision(model, backend=choice, **opts)
    wall = time.perf_counter() - t0
    c = r.constraints
    return {"wall": round(wall, 2), "fp32": sorted(r.fp32_nodes), "passed": r.passed, "minimal": r.minimal,
            "evaluations": c.evaluations.new, "candidates": c.candidates,
            "timings": {k: round(v, 3) for k, v in c.timings.items()}, **captured,
            "per_eval_s": round(c.timings.get("search", wall) / max(1, c.evaluations.new), 4)}


def cmd_search(a) -> int:
    res = one_search(a.model, json.loads(a.args), a.backend, a.workers, a.arith, a.ray or None)
    if a.ray:
        try:  # where the actors ran (Ray sets CUDA_VISIBLE_DEVICES per actor)
            import ray as _ray

            res["ray_version"] = _ray.__version__
        except ImportError:
            pass
    Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


# ---- orchestration -------------------------------------------------------------------------------------------
class Smi:
    def __init__(self, path: Path):
        self.path = path
        self.p = None

    def __enter__(self):
        try:
            self.f = open(self.path, "w")
            self.p = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,index,utilization.gpu,memory.used",
                                       "--format=csv,noheader,nounits", "-lms", "200"], stdout=self.f,
                                      stderr=subprocess.DEVNULL)
        except OSError:
            self.p = None
        return self

    def __exit__(self, *exc):
        if self.p is not None:
            self.p.terminate()
            self.p.wait(5)
            self.f.close()

    def summary(self) -> dict:
        per: dict[str, tuple[list, list]] = {}
        try:
            for ln in self.path.read_text().splitlines():
                parts = [x.strip() for x in ln.split(",")]
                if len(parts) >= 4:
                    u, m = per.setdefault(parts[1], ([], []))
                    u.append(float(parts[2]))
                    m.append(float(parts[3]))
        except (OSError, ValueError):
            pass

        def one(util, mem):
            return {"samples": len(util), "util_mean": round(statistics.mean(util), 1),
                    "util_median": statistics.median(util), "util_max": max(util),
                    "util_busy_share": round(sum(u > 0 for u in util) / len(util), 2), "mem_max_MiB": max(mem)}

        if len(per) == 1:
            return one(*next(iter(per.values())))
        return {f"gpu{k}": one(*v) for k, v in per.items() if v[0]}


def run_one(label: str, model: str, args: list[str], backend: str, workers: int, smi_dir: Path, env_extra=None,
            arith: str | None = None, timeout: int = 400, ray: str | None = None) -> dict:
    jf = Path(tempfile.mkstemp(suffix=".json")[1])
    env = {**os.environ, **(env_extra or {})}
    cmd = [PY, __file__, "search", "--model", model, "--args", json.dumps(args), "--backend", backend,
           "--workers", str(workers), "--json", str(jf), *(["--arith", arith] if arith else []),
           *(["--ray", ray] if ray else [])]
    smi = Smi(smi_dir / f"smi_{label}.csv")
    t0 = time.perf_counter()
    with smi:
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
            rc, err = r.returncode, r.stderr
        except subprocess.TimeoutExpired as e:
            rc, err = "timeout", str(e.stderr)[-500:] if e.stderr else ""
    res: dict = {"label": label, "backend": backend, "workers": workers, "ray": ray, "env": env_extra or {}, "rc": rc,
                 "process_wall": round(time.perf_counter() - t0, 2)}
    try:
        res.update(json.loads(jf.read_text()))
    except (OSError, ValueError):
        res["stderr"] = err[-1500:]
    res["warnings"] = [ln[:300] for ln in err.splitlines() if "WARNING" in ln or "warning" in ln][:8]
    res["gpu"] = smi.summary()
    print(f"{label:34s} rc={rc} wall={res.get('wall')} evals={res.get('evaluations')} rounds={res.get('rounds')} "
          f"size={len(res.get('fp32', []))} per_eval={res.get('per_eval_s')} gpu={res['gpu']} "
          f"{res.get('stderr', '')[-300:]}", flush=True)
    return res


def inference_costs(model_path: str, planted: list[str], out: dict) -> None:
    """Plain onnxruntime-gpu sessions of the detector: FP32 (as the user deploys the reference) and all-FP16."""
    import onnx
    import onnxruntime as ort

    from bisector.app.job import open_job
    from bisector.backends.ort_cuda import OrtCudaBackend
    from bisector.fp16.plan import Plan

    feeds = {"x": np.random.default_rng(0).uniform(0, 1, (1, 3, 320, 640)).astype(np.float32)}
    res = {}
    for algo in ("EXHAUSTIVE", "HEURISTIC", "DEFAULT"):
        prov = [("CUDAExecutionProvider", {"device_id": "0", "use_tf32": "0", "cudnn_conv_algo_search": algo})]
        t0 = time.perf_counter()
        s = ort.InferenceSession(model_path, providers=prov)
        t_sess = time.perf_counter() - t0
        t0 = time.perf_counter()
        s.run(None, feeds)
        t_first = time.perf_counter() - t0
        runs = []
        for _ in range(20):
            t0 = time.perf_counter()
            s.run(None, feeds)
            runs.append(time.perf_counter() - t0)
        res[f"fp32_{algo}"] = {"session_s": round(t_sess, 4), "first_run_s": round(t_first, 4),
                               "warm_run_median_s": round(statistics.median(runs), 5)}
        print(f"FP32 {algo}: {res[f'fp32_{algo}']}", flush=True)
    # all-FP16 and planted-FP32 mixed models through the backend (session + first run = one evaluation's GPU cost)
    job = open_job(Path(model_path), backend="emulate", no_cache=True, canary=False, val_range=["x:[0,1]"],
                   atol=["2e-2"], rtol=["2e-2"])
    cat = job.catalog
    for algo in ("", "cudnn_conv_algo_search=HEURISTIC"):
        os.environ["BISECTOR_ORT_CUDA_OPTIONS"] = algo
        b = OrtCudaBackend()
        b.open(cat)
        for label, fp32 in (("all_fp16", frozenset()), ("planted_fp32", frozenset(planted))):
            plan = Plan(fp32, cat.candidates)
            t0 = time.perf_counter()
            b.run(plan, feeds)
            t_eval = time.perf_counter() - t0
            runs = []
            for _ in range(10):
                t0 = time.perf_counter()
                b.run(plan, feeds)
                runs.append(time.perf_counter() - t0)
            key = f"backend_{label}_{algo.split('=')[-1] if algo else 'EXHAUSTIVE(default)'}"
            res[key] = {"first_eval_s": round(t_eval, 4), "session_s": round(b.session_times[-1], 4),
                        "warm_run_median_s": round(statistics.median(runs), 5)}
            print(f"{key}: {res[key]}", flush=True)
        b.close()
    os.environ.pop("BISECTOR_ORT_CUDA_OPTIONS", None)
    job.close()
    out["inference"] = res


def switch_agreement(model_path: str, out: dict, plans: int = 16) -> None:
    """Issue 14: the switch model against per-plan mixed-model sessions on the GPU, plan by plan: the largest
    output difference between the two and each one's error against the FP32 golden, verdicts at DETECTOR_ARGS."""
    import random

    import numpy as np

    from bisector.app.job import open_job
    from bisector.app.options import options_from_flags
    from bisector.backends.ort_cuda import OrtCudaBackend
    from bisector.fp16.plan import Plan

    job = open_job(model_path, no_cache=True, **options_from_flags(DETECTOR_ARGS))
    cat, feeds, golden = job.catalog, job.feeds_list[0], job.golden.outputs[0]
    rows = []
    t0 = time.perf_counter()
    per, sw = OrtCudaBackend(switch=False), OrtCudaBackend(switch=True)
    for b in (per, sw):
        b.open(cat)
    rng = random.Random(0)
    cands = list(cat.candidates)
    sets = [frozenset(), frozenset(cands)] + [frozenset(rng.sample(cands, rng.randrange(len(cands)))) for _ in range(plans)]
    for fp32 in sets:
        plan = Plan(fp32, cat.candidates)
        a, b = per.run(plan, feeds), sw.run(plan, feeds)
        row = {"fp32": len(fp32), "max_diff": 0.0, "err_per_plan": 0.0, "err_switch": 0.0}
        for k in a:
            g = np.asarray(golden[k], np.float64)
            row["max_diff"] = max(row["max_diff"], float(np.max(np.abs(a[k] - b[k]))))
            row["err_per_plan"] = max(row["err_per_plan"], float(np.max(np.abs(a[k] - g))))
            row["err_switch"] = max(row["err_switch"], float(np.max(np.abs(b[k] - g))))
        rows.append(row)
        print(f"agree: {row}", flush=True)
    out["switch_agreement"] = {"rows": rows, "seconds": round(time.perf_counter() - t0, 1),
                               "sessions_per_plan": len(per.session_times), "sessions_switch": len(sw.session_times),
                               "switch_session_s": sw.session_times}
    job.close()


def cmd_all(a) -> int:
    import onnx

    out: dict = {"started": time.strftime("%H:%M:%S")}
    smi_dir = Path(tempfile.mkdtemp(prefix="smi-"))
    keep = Path(a.smi_dir) if a.smi_dir else None
    try:
        import ray  # noqa: F401
        out["ray"] = getattr(ray, "__version__", "?")
    except ImportError:
        out["ray"] = None
    print(f"ray: {out['ray']}", flush=True)
    try:
        from bisector.search.executors import visible_gpus, worker_envs

        out["visible_gpus"] = visible_gpus()
        out["worker_envs_2"] = worker_envs("ort-cuda", 2)[0]
        print(f"visible GPUs {out['visible_gpus']}; worker envs for 2: {out['worker_envs_2']}", flush=True)
    except Exception as e:  # noqa: BLE001
        out["visible_gpus"] = repr(e)
    det = Path(tempfile.mkdtemp(prefix="det-")) / "detector.onnx"
    model, planted = build_detector()
    onnx.save(model, det)
    out["detector"] = {"nodes": len(model.graph.node), "planted": planted, "args": DETECTOR_ARGS,
                       "convs": sum(n.op_type == "Conv" for n in model.graph.node)}
    print(f"detector: {out['detector']}", flush=True)
    planted_onnx = str(ROOT / "fixtures" / "planted.onnx")
    save = lambda: Path(a.out).write_text(json.dumps(out, indent=1))  # noqa: E731
    steps = a.steps.split(",")
    if "inference" in steps:
        inference_costs(str(det), planted, out)
        save()
    runs = out.setdefault("runs", [])
    plan = []
    if "planted" in steps:
        plan += [("planted_ort-cuda_w1", planted_onnx, planted_args(), "ort-cuda", 1, None),
                 ("planted_ort-cuda_w2", planted_onnx, planted_args(), "ort-cuda", 2, None)]
    if "detector" in steps:
        plan += [("detector_ort-cuda_w1", str(det), DETECTOR_ARGS, "ort-cuda", 1, None),
                 ("detector_ort-cuda_w2", str(det), DETECTOR_ARGS, "ort-cuda", 2, None)]
    h = {"BISECTOR_ORT_CUDA_OPTIONS": "cudnn_conv_algo_search=HEURISTIC"}
    if "heuristic" in steps:
        plan += [("detector_ort-cuda_w1_heuristic", str(det), DETECTOR_ARGS, "ort-cuda", 1, h),
                 ("detector_ort-cuda_w2_heuristic", str(det), DETECTOR_ARGS, "ort-cuda", 2, h)]
    sw = {"BISECTOR_ORT_CUDA_SWITCH": "1"}
    if "switch" in steps:  # issue 14: one switch model for the whole search (bisector/fp16/switch.py)
        plan += [("detector_ort-cuda_w1_switch", str(det), DETECTOR_ARGS, "ort-cuda", 1, sw),
                 ("detector_ort-cuda_w1_switch_heuristic", str(det), DETECTOR_ARGS, "ort-cuda", 1, {**sw, **h}),
                 ("planted_ort-cuda_w1_switch", planted_onnx, planted_args(), "ort-cuda", 1, sw)]
    if "agree" in steps:
        switch_agreement(str(det), out)
        save()
    if "emulate" in steps:
        plan += [("detector_emulate_w1", str(det), DETECTOR_ARGS, "emulate", 1, None),
                 ("planted_emulate_w1", planted_onnx, planted_args(), "emulate", 1, None)]
    h = {"BISECTOR_ORT_CUDA_OPTIONS": "cudnn_conv_algo_search=HEURISTIC"}
    ray_runs = {  # --ray auto (a Ray head started beforehand: `ray start --head`), N = 1 and 2 actors
        "ray-planted": [("planted_ort-cuda_ray1", planted_onnx, planted_args(), "ort-cuda", 1, None),
                        ("planted_ort-cuda_ray2", planted_onnx, planted_args(), "ort-cuda", 2, None)],
        "ray-heuristic": [("detector_ort-cuda_ray1_heuristic", str(det), DETECTOR_ARGS, "ort-cuda", 1, h),
                          ("detector_ort-cuda_ray2_heuristic", str(det), DETECTOR_ARGS, "ort-cuda", 2, h)],
        "ray-detector": [("detector_ort-cuda_ray1", str(det), DETECTOR_ARGS, "ort-cuda", 1, None),
                         ("detector_ort-cuda_ray2", str(det), DETECTOR_ARGS, "ort-cuda", 2, None)],
        "base-planted": [("planted_ort-cuda_w1", planted_onnx, planted_args(), "ort-cuda", 1, None)],
        "base-heuristic": [("detector_ort-cuda_w1_heuristic", str(det), DETECTOR_ARGS, "ort-cuda", 1, h)],
        "base-detector": [("detector_ort-cuda_w1", str(det), DETECTOR_ARGS, "ort-cuda", 1, None)],
    }
    plan = [(*p, False) for p in plan]
    for st in steps:
        plan += [(*p, st.startswith("ray-")) for p in ray_runs.get(st, [])]
    deadline = time.time() + a.deadline
    for label, m, args, backend, w, env, use_ray in plan:
        if time.time() > deadline:
            runs.append({"label": label, "skipped": "deadline"})
            print(f"{label}: skipped (deadline)", flush=True)
            continue
        runs.append(run_one(label, m, args, backend, w, smi_dir, env, timeout=max(20, int(deadline - time.time() + 50)),
                            ray=a.ray if use_ray else None))
        save()
    if keep is not None:  # all samples in one file (the device returns at most 8 files)
        with open(keep / "smi_samples.csv", "w") as f:
            for p in sorted(smi_dir.glob("smi_*.csv")):
                for ln in p.read_text().splitlines():
                    f.write(f"{p.stem[4:]},{ln}\n")
    out["finished"] = time.strftime("%H:%M:%S")
    save()
    return 0


def cmd_report(a) -> int:
    d = json.loads(Path(a.path).read_text())
    print(f"detector: {d.get('detector')}; ray: {d.get('ray')}; worker envs (2 workers): {d.get('worker_envs_2')}\n")
    print("| run | wall s | search s | evaluations | rounds | per eval s | FP32 set | GPU util mean / median / max % | busy share | mem max MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in d.get("runs", []):
        if "skipped" in r:
            print(f"| {r['label']} | skipped ({r['skipped']}) |||||||||")
            continue
        g = r.get("gpu", {})
        gs = [g] if "util_mean" in g else [g[k] for k in sorted(g)]
        cell = lambda k: " ; ".join(str(x.get(k)) for x in gs)  # noqa: E731
        util = " ; ".join(f"{x.get('util_mean')} / {x.get('util_median')} / {x.get('util_max')}" for x in gs)
        print(f"| {r['label']} | {r.get('wall')} | {r.get('timings', {}).get('search', '–')} | {r.get('evaluations')} | "
              f"{r.get('rounds')} | {r.get('per_eval_s')} | {len(r.get('fp32', []))}: {', '.join(r.get('fp32', []))[:120]} | "
              f"{util} | {cell('util_busy_share')} | {cell('mem_max_MiB')} |")
    print()
    for k, v in d.get("inference", {}).items():
        print(f"- {k}: {v}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("search")
    s.add_argument("--model", required=True)
    s.add_argument("--args", required=True)
    s.add_argument("--backend", default="ort-cuda")
    s.add_argument("--workers", type=int, default=1)
    s.add_argument("--arith", default=None)
    s.add_argument("--json", required=True)
    s.add_argument("--ray", default="")
    al = sub.add_parser("all")
    al.add_argument("--out", required=True)
    al.add_argument("--smi-dir", default="")
    al.add_argument("--steps", default="inference,planted,detector,heuristic,emulate",
                    help="also: switch (BISECTOR_ORT_CUDA_SWITCH=1 searches), agree (switch vs per-plan outputs)")
    al.add_argument("--deadline", type=float, default=500)
    al.add_argument("--ray", default="auto", help="address for the ray-* steps (ray-planted, ray-heuristic, "
                    "ray-detector; base-planted, base-heuristic: --workers 1 baselines)")
    r = sub.add_parser("report")
    r.add_argument("path")
    a = ap.parse_args()
    return {"search": cmd_search, "all": cmd_all, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
