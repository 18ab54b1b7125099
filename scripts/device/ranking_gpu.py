"""Issue 15 on a GPU: does the emulator's predicted ranking save *device* evaluations?

For each case (a model from bench/registry_models.py carried with the code, and its flags), searches with `auto`
on `--backend ort-cuda` (every verdict the GPU's) once per `--variants` option set — by default
`use_prediction=False` (the probes, as before issue 15's seventh round) and `use_prediction=True` (the ranking
computed on the CPU emulator, calibrated by the GPU's own all-FP16 excess) — and the same on `emulate` for
reference. Records per search: FP32 set size, evaluations
(device plans judged), the ranking's emulator runs, whether the set passes and is 1-minimal on that backend, and
seconds. Writes one JSON file.

    python3 scripts/device/ranking_gpu.py --out $OUT/ranking_gpu.json --model DIR/320n.onnx
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

CASES = {  # model file name -> (label, flags), as bench/strategies.py's registry cases
    "320n.onnx": [("yolov8n 3e-3", ["--input-shapes", "images:[1,3,320,320]", "--atol", "3e-3", "--rtol", "3e-3"]),
                  ("yolov8n 1e-3", ["--input-shapes", "images:[1,3,320,320]", "--atol", "1e-3", "--rtol", "1e-3"])],
    "ch_PP-OCRv4_rec_infer.onnx": [
        ("ppocr-rec 3e-3", ["--input-shapes", "x:[1,3,48,320]", "--atol", "3e-3", "--rtol", "3e-3"]),
        ("ppocr-rec 2e-3", ["--input-shapes", "x:[1,3,48,320]", "--atol", "2e-3", "--rtol", "2e-3"])],
}


def search(model: Path, flags: list[str], backend: str, options: dict) -> dict:
    from bisector.app.job import open_job
    from bisector.app.options import options_from_flags
    from bisector.search.driver import removable, run_search

    t0 = time.perf_counter()
    job = open_job(model, no_cache=True, **options_from_flags(flags + ["--backend", backend]))
    try:
        oracle = job.oracle()
        result = run_search(oracle, "auto", dict(options))
        out = {"backend": backend, "options": options, "fp32": len(result.fp32),
               "evaluations": result.evaluations, "passed": result.passed, "minimal": result.minimal,
               "not_removable_checked": not removable(oracle, result.fp32, judge_missing=True),
               "seconds": round(time.perf_counter() - t0, 1), "search_seconds": round(result.seconds, 1)}
    finally:
        job.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--backends", default="ort-cuda,emulate")
    ap.add_argument("--deadline", type=float, default=540.0)
    ap.add_argument("--variants", default='[{"use_prediction": false}, {"use_prediction": true}]',
                    help="JSON list of auto option sets, each searched per case and backend (issue 15, ninth "
                         "round: '[{\"diffuse_after_ranked\": 8}, {}]', the switch before and now)")
    a = ap.parse_args()
    variants = json.loads(a.variants)
    start = time.monotonic()
    rows = []
    for label, flags in CASES[Path(a.model).name]:
        for backend in a.backends.split(","):
            for options in variants:
                if time.monotonic() - start > a.deadline:
                    rows.append({"case": label, "backend": backend, "options": options, "skipped": "deadline"})
                    continue
                try:
                    row = search(Path(a.model), flags, backend, options)
                except Exception as exc:  # noqa: BLE001 - recorded, the next search runs
                    row = {"backend": backend, "options": options, "error": f"{type(exc).__name__}: {exc}"}
                row["case"] = label
                rows.append(row)
                print(json.dumps(row), flush=True)
                Path(a.out).write_text(json.dumps(rows, indent=1))
    Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
