"""What `bisector profile` costs, against one FP32 inference (no test; run by hand).

    .venv/bin/python bench/profile_cost.py [MODEL [bisector flags...]]

Default: fixtures/planted.onnx with the flags in fixtures/planted.json. `--size N` regenerates the planted model
with N x N images instead of 16 x 16 (fixtures/generate.py, same graph and planted nodes) to see how the cost
scales once node compute, not per-node Python overhead, dominates. Every figure is the best of --repeat runs,
both as wall time and as CPU time of this process (the CPU figure is the honest one on a shared machine: other
jobs inflate wall time). ORT runs single-threaded in every case so the figures compare like with like.

Printed: one whole-model ORT FP32 inference; one node-by-node FP32 reference pass (the emulate backend's unit of
work); one emulated all-FP16 evaluation (what a search pays per plan); the profile's scoring passes with warm
sessions; the cold profile (session builds, reference, scores: what `bisector profile` pays after loading);
and the ratios to one whole-model FP32 inference and to one node-by-node pass.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bisector.backends.emulate.backend import EmulateBackend  # noqa: E402
from bisector.model.catalog import Catalog  # noqa: E402
from bisector.model.inputs import generate_inputs  # noqa: E402
from bisector.fp16.plan import Plan  # noqa: E402
from bisector.sensitivity import compute_scores  # noqa: E402
from bisector.app.options import Inputs, Tolerances  # noqa: E402


def _flags(args: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    key = None
    for a in args:
        if a.startswith("--"):
            key = a
            out.setdefault(key, [])
        elif key:
            out[key].append(a)
    return out


def best(fn, repeat: int) -> tuple[float, float]:
    wall = cpu = float("inf")
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return wall, cpu


def main(argv: list[str]) -> None:
    if argv and not argv[0].startswith("--"):
        model, args = Path(argv[0]), argv[1:]
    else:
        model = ROOT / "fixtures" / "planted.onnx"
        args = json.loads((ROOT / "fixtures" / "planted.json").read_text())["args"] + argv
    f = _flags(args)
    repeat = int((f.pop("--repeat", None) or ["5"])[0])
    size = f.pop("--size", None)
    if size:
        import tempfile

        import onnx

        sys.path.insert(0, str(ROOT / "fixtures"))
        import generate  # type: ignore[import-not-found]

        generate.H = generate.W = int(size[0])
        model = Path(tempfile.mkdtemp()) / f"planted_{size[0]}.onnx"
        onnx.save(generate.planted_model()[0], model)
    inputs = Inputs(val_range=f.get("--val-range", []), input_shapes=f.get("--input-shapes", []))
    tol = Tolerances(atol=f.get("--atol", []), rtol=f.get("--rtol", []),
                     check_error_stat=f.get("--check-error-stat", [])).tolerance()
    catalog = Catalog.load(model)
    feeds_list = generate_inputs(catalog, inputs.val_range, inputs.input_shapes)
    feeds = feeds_list[0]

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    whole = ort.InferenceSession(catalog.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    whole.run(None, feeds)
    t_inf = best(lambda: whole.run(None, feeds), repeat * 4)

    def cold() -> None:
        b = EmulateBackend(threads=1)
        b.open(catalog)
        compute_scores(catalog, b, feeds_list, tol)

    t_cold = best(cold, max(1, repeat // 2))

    backend = EmulateBackend(threads=1)
    backend.open(catalog)
    backend.reference(feeds)
    t_ref = best(lambda: backend.executor.run_reference(feeds), repeat)
    fp16 = Plan.all_fp16(catalog.candidates)
    t_eval = best(lambda: backend.run(fp16, feeds), repeat)
    t_prof = best(lambda: compute_scores(catalog, backend, feeds_list, tol), repeat)

    n = len(catalog.candidates)
    print(f"model {model.name}: {len(catalog.names)} nodes, {n} candidates; best of {repeat}; seconds wall / CPU")
    rows = [("one FP32 inference (whole model, ORT)", t_inf),
            ("one FP32 reference pass (node by node)", t_ref),
            ("one emulated all-FP16 evaluation", t_eval),
            ("profile scores (warm sessions)", t_prof),
            ("profile cold (sessions + reference + scores)", t_cold)]
    for label, (w, c) in rows:
        print(f"  {label:<46} {w:9.4f} / {c:9.4f}   = {w / t_inf[0]:7.1f} / {c / max(t_inf[1], 1e-9):7.1f} inferences"
              f"   = {w / t_ref[0]:5.2f} / {c / max(t_ref[1], 1e-9):5.2f} node-by-node passes")
    print(f"ratio profile(warm)/inference: wall {t_prof[0] / t_inf[0]:.1f}x, CPU {t_prof[1] / max(t_inf[1], 1e-9):.1f}x; "
          f"profile(warm)/node-by-node pass: wall {t_prof[0] / t_ref[0]:.2f}x, CPU {t_prof[1] / max(t_ref[1], 1e-9):.2f}x; "
          f"profile(warm)/one emulated evaluation: wall {t_prof[0] / t_eval[0]:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
