"""Shared sessions for twin parts (bisector.backends.emulate.shared_parts) against a session per part, in one
process per model: the same random plans (fused, and every fifth node by node as the second opinion runs them)
with sharing off and on. Prints whether every output is the same bit for bit, the sessions each built, the wall
time of the plans and its ratio (on / off).

    python bench/shared_parts.py [--plans 20] [--arithmetic storage|gpu] [--only TEXT]

Models: the generated 1200-node MatMul/Tanh chain (bench/scale.py) and every model of bench/registry_models.py
(fetched and cached as there), fed at their benchmark shapes. Results: docs/benchmarks.md, "Scale, thirty-first
round".
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bisector.backends.emulate import EmulateBackend  # noqa: E402
from bisector.fp16.plan import Plan  # noqa: E402
from bisector.model.catalog import Catalog  # noqa: E402
from bisector.model.inputs import generate_inputs  # noqa: E402


def compare(path: Path, shapes: dict, ranges: dict, plans: int, arithmetic: str) -> str:
    cat = Catalog.load(path)
    feeds = generate_inputs(cat, {k: tuple(v) for k, v in ranges.items()}, shapes)[0]
    cands = tuple(cat.candidates)
    runs = {}
    for share in (False, True):
        be = EmulateBackend(arithmetic=arithmetic)
        be.open(cat)
        be.executor.share_parts = share
        rng = random.Random(1)
        outs, t = [], time.perf_counter()
        for i in range(plans):
            frac = rng.choice([0.0, 0.02, 0.3, 0.7, 0.98, rng.random()])
            plan = Plan(frozenset(c for c in cands if rng.random() < frac), cands)
            outs.append(be.run(plan, feeds))
            if i % 5 == 0:
                outs.append(be.run_node_by_node(plan, feeds))
        runs[share] = (outs, time.perf_counter() - t, be.executor.sessions_built, len(be.executor._unshared))
        be.close()
    same = all(np.array_equal(a[k], b[k], equal_nan=True) for a, b in zip(runs[False][0], runs[True][0]) for k in a)
    off, on = runs[False], runs[True]
    return (f"| {path.stem} | {len(cands)} | {'yes' if same else '**no**'} | {off[2]} → {on[2]} | "
            f"{off[1]:.2f} → {on[1]:.2f} s ({on[1] / off[1]:.2f}) | {on[3]} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=20)
    ap.add_argument("--arithmetic", default="storage", choices=["storage", "gpu"])
    ap.add_argument("--only", default=None)
    a = ap.parse_args()
    import scale
    from registry_models import MODELS, fetch

    print(f"--fp16-arithmetic {a.arithmetic}, {a.plans} random plans (+ every fifth node by node)\n")
    print("| model | candidates | same bits | sessions built (off → on) | wall of the plans (on / off) | parts "
          "that do not share |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as td:
        chain = Path(td) / "matmul_tanh_chain_1200.onnx"
        onnx.save(scale.matmul_chain_model(600), chain)
        cases = [(chain, {}, {})] + [(fetch(n), dict(m.shapes), dict(m.ranges)) for n, m in MODELS.items()
                                     if not a.only or a.only in n]
        for path, shapes, ranges in cases:
            if path is None or (a.only and a.only not in path.stem and path == chain):
                continue
            print(compare(path, shapes, ranges, a.plans, a.arithmetic), flush=True)


if __name__ == "__main__":
    main()
