"""Every strategy on the real fixture models through the real driver (emulate backend), side by side.

    python bench/fixture_searches.py

Prints, per model and strategy: evaluations (distinct plans judged), FP32 set size, exact (= the planted set),
1-minimal, wall seconds; and `auto` with the `profile` scores hint (profile time + search time).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STRATEGIES = ["auto", "greedy", "ddmin", "bisect", "linear"]


def search(model: Path, args: list[str], strategy: str, scores: dict | None = None) -> dict:
    from bisector.search.driver import run_search
    from bisector.app.job import open_job
    from bisector.app.options import options_from_flags

    job = open_job(model, no_cache=True, **options_from_flags(args))
    oracle = job.oracle()
    t0 = time.perf_counter()
    result = run_search(oracle, strategy, hints={"scores": scores} if scores else None)
    seconds = time.perf_counter() - t0
    job.close()
    return {"fp32": result.fp32, "evaluations": oracle.total, "minimal": result.minimal, "seconds": seconds,
            "passed": result.passed}


def profile_scores(model: Path, args: list[str]) -> tuple[dict, float]:
    from bisector.sensitivity import compute_scores
    from bisector.app.job import open_job
    from bisector.app.options import options_from_flags

    job = open_job(model, no_cache=True, **options_from_flags(args))
    t0 = time.perf_counter()
    nodes = compute_scores(job.catalog, job.backend, job.feeds_list, job.tolerance)
    seconds = time.perf_counter() - t0
    job.close()
    return {n["name"]: n["score"] for n in nodes}, seconds


def main() -> None:
    planted = json.loads((ROOT / "fixtures" / "planted.json").read_text())
    models = [
        ("needs_constraints.onnx", ["--atol", "1e-1", "--val-range", "x:[1,2]"], {"Add", "Sub"}),
        ("planted.onnx", planted["args"], set(planted["fp32_nodes"])),
        # PyTorch exports (fixtures/exported): no planted answer, "exact" compares with auto's set
        ("exported/cnn.onnx", ["--atol", "1e-6", "--rtol", "1e-4"], None),
        ("exported/encoder.onnx", ["--val-range", "ids:[0,999]", "--val-range", "mask:[1,1]", "--input-shapes",
                                   "ids:[1,32]", "--input-shapes", "mask:[1,32]", "--atol", "5e-5", "--rtol", "1e-4"],
         None),
    ]
    print("| model | strategy | evaluations | FP32 size | exact | 1-minimal | seconds |")
    print("|---|---|---|---|---|---|---|")
    for name, args, expected in models:
        path = ROOT / "fixtures" / name
        for strategy in STRATEGIES:
            r = search(path, args, strategy)
            if expected is None and strategy == "auto":
                expected = r["fp32"]
            print(f"| {name} | {strategy} | {r['evaluations']} | {len(r['fp32'])} | {r['fp32'] == expected} | "
                  f"{r['minimal']} | {r['seconds']:.2f} |")
        try:
            scores, prof_s = profile_scores(path, args)
        except ImportError:
            continue
        r = search(path, args, "auto", scores)
        print(f"| {name} | auto + profile scores | {r['evaluations']} | {len(r['fp32'])} | {r['fp32'] == expected} | "
              f"{r['minimal']} | {r['seconds']:.2f} search + {prof_s:.2f} profile = {r['seconds'] + prof_s:.2f} |")


if __name__ == "__main__":
    main()
