"""Twenty-sixth round (device): do a plan and the same plan without its idle FP32 members (bisector.fp16.points.
IdleFP32) give the same outputs on ORT-CUDA, as they do on the emulator?

For each model, random plans (each candidate FP32 with probability 0.5 or 0.9) that hold idle members; each plan
and its `without` run on emulate and on ort-cuda: bit-equal outputs or not, the largest difference in units of
the tolerance, and both verdicts (pass/fail, excess at margin 1). The plan run twice on ort-cuda gives the
backend's own run-to-run difference for scale.

    python3 scripts/device/idle_gpu.py --models DIR [--plans 8] [--only NAME] > $OUT/idle_gpu.log
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from bisector.app.job import open_job
from bisector.app.options import options_from_flags
from bisector.fp16.plan import Plan
from bisector.fp16.points import IdleFP32

# name, file under --models, flags (tolerance, shapes)
CASES = [
    ("basic-pitch", "audio/nmp.onnx", ["--atol", "1e-2", "--rtol", "1e-2",
                                       "--input-shapes", "serving_default_input_2:0:[1,43844,1]"]),
    ("ocr-tiny-rec", "idle/rec.onnx", ["--atol", "3e-3", "--rtol", "3e-3", "--input-shapes", "x:[1,3,48,320]"]),
    ("ppocr-det", "idle/ch_PP-OCRv4_det_infer.onnx", ["--atol", "1e-2", "--rtol", "1e-2",
                                                      "--input-shapes", "x:[1,3,320,640]"]),
    ("yolov8n", "idle/320n.onnx", ["--atol", "3e-3", "--rtol", "3e-3", "--input-shapes", "images:[1,3,320,320]"]),
    ("magika", "idle/model.onnx", ["--atol", "2e-5", "--rtol", "2e-5", "--input-shapes", "bytes:[1,2048]",
                                   "--val-range", "bytes:[0,256]"]),
    ("ppocr-cls", "idle/ch_ppocr_mobile_v2.0_cls_infer.onnx", ["--atol", "1e-4", "--rtol", "1e-4",
                                                               "--input-shapes", "x:[1,3,48,192]"]),
]


def plans_with_idle(cands, idle, count, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for p in (0.5, 0.9):
        tries = 0
        while sum(1 for q, _, _ in out if q == p) < count // 2 and tries < 200:
            tries += 1
            fp32 = frozenset(n for n in cands if rng.random() < p)
            canon = idle.without(fp32)
            if canon != fp32:
                out.append((p, fp32, canon))
    return out


def compare(a, b, names, tol):
    """Bit-equal on every output, and the largest |a - b| / (atol + rtol |b|) (Polygraphy's elementwise check)."""
    equal = all(np.array_equal(a[o], b[o], equal_nan=True) for o in names)
    worst = 0.0
    for o in names:
        x, y = np.asarray(a[o], np.float64), np.asarray(b[o], np.float64)
        if x.size and x.shape == y.shape:
            with np.errstate(invalid="ignore"):
                d = np.abs(x - y) / (tol.atol.get(o) + tol.rtol.get(o) * np.abs(y))
            worst = max(worst, float(np.nanmax(d)) if np.isfinite(d).any() else 0.0)
    return equal, worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True)
    ap.add_argument("--plans", type=int, default=8)
    ap.add_argument("--only", default=None)
    a = ap.parse_args()
    for name, rel, flags in CASES:
        if a.only and a.only != name:
            continue
        path = Path(a.models) / rel
        if not path.is_file():
            print(f"== {name}: {path} missing, skipped", flush=True)
            continue
        plans = None
        for backend in ("emulate", "ort-cuda"):
            t0 = time.perf_counter()
            job = open_job(path, no_cache=True, **options_from_flags([*flags, "--backend", backend]))
            try:
                cat, cands = job.catalog, tuple(job.catalog.candidates)
                idle = IdleFP32(cat, cands)
                if plans is None:
                    plans = plans_with_idle(cands, idle, a.plans)
                    print(f"== {name}: {len(cands)} candidates, {len(idle.readers)} exact readers, "
                          f"{len(idle.movers)} movers; {len(plans)} plans with idle members "
                          f"(dropped {sorted(len(f) - len(c) for _, f, c in plans)})", flush=True)
                feeds = job.feeds_list[0]
                names = list(cat.output_names)
                same = 0
                for p, fp32, canon in plans:
                    r1 = job.backend.run(Plan(fp32, cands), feeds)
                    r2 = job.backend.run(Plan(canon, cands), feeds)
                    again = job.backend.run(Plan(fp32, cands), feeds)
                    equal, worst = compare(r1, r2, names, job.tolerance)
                    noise_equal, noise = compare(r1, again, names, job.tolerance)
                    v1, v2 = job.judge(Plan(fp32, cands)), job.judge(Plan(canon, cands))
                    same += equal
                    print(f"{backend:8s} p={p} |S|={len(fp32)} dropped={len(fp32) - len(canon)} bit-equal={equal} "
                          f"max diff/tol={worst:.3g} (run again: equal={noise_equal}, {noise:.3g}) verdicts "
                          f"{'pass' if v1.passed else 'fail'}/{'pass' if v2.passed else 'fail'} excess "
                          f"{v1.excess:.4g}/{v2.excess:.4g}", flush=True)
                print(f"{backend}: {same} of {len(plans)} bit-equal; {time.perf_counter() - t0:.1f} s", flush=True)
            finally:
                job.close()


if __name__ == "__main__":
    main()
