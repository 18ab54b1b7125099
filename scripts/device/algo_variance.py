"""Device: how much of the GPU's verdict depends on which cuDNN algorithms ORT-CUDA picks. For a few registry
cases: the default emulate search's set, then that set and all-FP16 judged on ort-cuda (margin 1) under several
CUDA provider options (BISECTOR_ORT_CUDA_OPTIONS). One JSON line per case.

    python3 algo_variance.py --models DIR [--case LABEL MODEL SHAPE TOL ...] [--fp16-arithmetic storage|gpu]

`--case` (repeatable) replaces the default cases; `--fp16-arithmetic` chooses the emulate search's mode.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from bisector.app.job import open_job

CASES = [("yolov8n 3e-3", "320n.onnx", "images:[1,3,320,320]", "3e-3"),
         ("ppocr-rec 2.5e-3", "ch_PP-OCRv4_rec_infer.onnx", "x:[1,3,48,320]", "2.5e-3")]
VARIANTS = ["", "cudnn_conv_algo_search=HEURISTIC", "cudnn_conv_algo_search=DEFAULT",
            "cudnn_conv_algo_search=DEFAULT,cudnn_conv_use_max_workspace=0", "prefer_nhwc=1"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True)
    ap.add_argument("--case", nargs=4, action="append", metavar=("LABEL", "MODEL", "SHAPE", "TOL"))
    ap.add_argument("--fp16-arithmetic", default="storage")
    a = ap.parse_args()
    for label, model, shape, tol in a.case or CASES:
        path = Path(a.models) / model
        out = Path("/tmp/algo") / label.replace(" ", "_")
        subprocess.run([sys.executable, "-m", "bisector.cli", "precision", str(path), "--fp16", "--input-shapes", shape,
                        "--atol", tol, "--rtol", tol, "-o", str(out), "--no-cache", "--fp16-arithmetic", a.fp16_arithmetic],
                       capture_output=True, check=True)
        fp32 = json.loads((out / "constraints.json").read_text())["fp32_nodes"]
        row = {"case": label, "mode": a.fp16_arithmetic, "set": len(fp32)}
        for v in VARIANTS:
            os.environ["BISECTOR_ORT_CUDA_OPTIONS"] = v
            try:
                job = open_job(path, backend="ort-cuda", atol=[tol], rtol=[tol], margin=1.0, no_cache=True,
                               input_shapes=[shape])
                row[v or "default (EXHAUSTIVE)"] = {"set": round(job.judge(job.plan(fp32)).excess, 3),
                                                    "all FP16": round(job.judge(job.plan([])).excess, 3)}
                job.close()
            except Exception as exc:  # noqa: BLE001 - a variant ORT refuses is a result too
                row[v] = repr(exc)[:200]
        os.environ.pop("BISECTOR_ORT_CUDA_OPTIONS", None)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
