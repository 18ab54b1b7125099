"""Device: does the set an emulate search finds hold on the GPU, per arithmetic mode, on the registry models at
the tight tolerances of bench/strategies.py (the diffuse cases of issue 15)? For each case and each
`--fp16-arithmetic` mode (storage: the default; gpu): the default command on this host's CPUs (margin 0.9), then
its set judged on ort-cuda at the case's own tolerance with margin 1 (GPU excess <= 1 holds). One JSON line per
case to stdout.

    python3 registry_holds.py --models DIR [--only TEXT]    DIR: the models of bench/registry_models.py by file
                                                            name, and text.npz (bench/strategies.py's text image)
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bisector.app.job import open_job

SHAPES = {"magika": ["--input-shapes", "bytes:[1,2048]", "--val-range", "bytes:[0,256]"],
          "ppocr-cls": ["--input-shapes", "x:[1,3,48,192]"], "yolov8n": ["--input-shapes", "images:[1,3,320,320]"],
          "ppocr-rec": ["--input-shapes", "x:[1,3,48,320]"], "ppocr-det": ["--load-inputs", "{models}/text.npz"],
          "dddd-rec": ["--input-shapes", "input1:[1,1,64,256]"], "dddd-det": ["--input-shapes", "images:[1,3,416,416]"]}
FILES = {"magika": "model.onnx", "ppocr-cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx", "yolov8n": "320n.onnx",
         "ppocr-rec": "ch_PP-OCRv4_rec_infer.onnx", "ppocr-det": "ch_PP-OCRv4_det_infer.onnx",
         "dddd-rec": "common.onnx", "dddd-det": "common_det.onnx"}
CASES = [("magika", "2e-5"), ("magika", "5e-6"), ("ppocr-cls", "1e-4"), ("yolov8n", "3e-3"), ("yolov8n", "1e-3"),
         ("yolov8n", "2e-3"), ("ppocr-rec", "3e-3"), ("ppocr-rec", "2e-3"), ("ppocr-rec", "2.5e-3"),
         ("ppocr-rec", "4e-3"), ("ppocr-det", "mean 3e-5"),
         # sixteenth round: ddddocr's models, held out (bench/strategies.py's cases)
         ("dddd-rec", "6e-3"), ("dddd-rec", "3e-3"), ("dddd-det", "3e-3"), ("dddd-det", "1e-3")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--work", default="/tmp/holds")
    ap.add_argument("--judge", default="ort-cuda", help="the backend that judges the sets (emulate: a dry run here)")
    a = ap.parse_args()
    for name, tol in CASES:
        label = f"{name} {tol}"
        if a.only and a.only not in label:
            continue
        path = Path(a.models) / FILES[name]
        inputs = [x.replace("{models}", a.models) for x in SHAPES[name]]
        if tol.startswith("mean"):
            t = tol.split()[1]
            tols = ["--atol", t, "--rtol", "0", "--check-error-stat", "mean"]
        else:
            tols = ["--atol", tol, "--rtol", tol]
        row = {"case": label}
        sets = {}
        for mode in ("storage", "gpu"):
            out = Path(a.work) / f"{name}_{tol.replace(' ', '_')}_{mode}"
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "bisector.cli", "precision", str(path), "--fp16", *inputs, *tols,
                                "--fp16-arithmetic", mode, "-o", str(out), "--no-cache"], capture_output=True, text=True)
            row[mode] = {"exit": r.returncode, "wall": round(time.perf_counter() - t0, 1)}
            if r.returncode == 0:
                c = json.loads((out / "constraints.json").read_text())
                sets[mode] = c["fp32_nodes"]
                row[mode].update(size=len(c["fp32_nodes"]), evaluations=c["evaluations"]["total"],
                                 emulate_excess=round(1 - c["headroom"], 3))
            else:
                row[mode]["error"] = r.stderr.strip().splitlines()[-1:] if r.stderr.strip() else []
        opts = dict(atol=[tols[1]], rtol=[tols[3]], margin=1.0, backend=a.judge, no_cache=True)
        if "--check-error-stat" in tols:
            opts["check_error_stat"] = ["mean"]
        if inputs[0] == "--load-inputs":
            opts["load_inputs"] = [inputs[1]]
        else:
            opts["input_shapes"] = [inputs[1]]
            if "--val-range" in inputs:
                opts["val_range"] = [inputs[inputs.index("--val-range") + 1]]
        job = open_job(path, **opts)
        for mode, fp32 in sets.items():
            row[mode]["gpu_excess"] = round(job.judge(job.plan(fp32)).excess, 3)
        row["gpu all-FP16"] = round(job.judge(job.plan([])).excess, 3)
        job.close()
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
