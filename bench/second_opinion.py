"""The second opinion (bisector.app.second_opinion): how often the emulator's fused-block verdict and the
node-by-node verdict of the same plan disagree, and what searching on from such a set gives.

    python bench/second_opinion.py --plans [--only TEXT]     # random plans: fused vs node-by-node bits, and the
                                                             # shortcut (blocks without an FP32 pair run fused)
                                                             # against every touched block node by node
    python bench/second_opinion.py --scan [--only TEXT]      # bench/strategies.py's real-model cases: `auto`'s set
                                                             # judged through the blocks and node by node
    python bench/second_opinion.py --registry --modes check  # the same on every registry case (--only filters)
    python bench/second_opinion.py --all-fp16 [--only TEXT]  # the all-FP16 plan's excess per registry case
    python bench/second_opinion.py --command CASE TOL ...    # the `bisector precision` command per
                                                             # --second-opinion mode (off, search): set, evaluations,
                                                             # wall; -o folders under --out for the device's check
                                                             # (scripts/device/second_opinion_gpu.sh)

Models come from bench/registry_models.py (fetched and cached as there). Results: docs/benchmarks.md, "Trust,
thirtieth round".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import strategies.auto  # noqa: E402,F401  (the plugin package first: bench/strategies.py shares its name)

sys.path.insert(0, str(ROOT / "bench"))
import importlib.util  # noqa: E402

from bisector.app.job import open_job  # noqa: E402
from bisector.app.options import options_from_flags  # noqa: E402
from bisector.backends.emulate import executor as executor_mod  # noqa: E402
from bisector.fp16.plan import Plan  # noqa: E402
from bisector.search.driver import run_search  # noqa: E402


def _bench_strategies():
    spec = importlib.util.spec_from_file_location("bench_strategies", ROOT / "bench" / "strategies.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def plans(only: str | None, count: int = 20) -> None:
    """Random plans per registry model: how many give other output bits node by node than through the blocks,
    and whether the shortcut gives exactly the bits of running every touched block node by node."""
    from registry_models import MODELS, fetch

    print("| model | candidates | plans | fused ≠ node by node | shortcut ≠ every block node by node |")
    print("|---|---|---|---|---|")
    for name in ("orientation", "ocr-tiny-rec", "ppocr-cls", "yolov8n", "magika"):
        if only and only not in name:
            continue
        path = fetch(name)
        if path is None:
            continue
        job = open_job(path, no_cache=True, atol=1e-3, **options_from_flags(list(MODELS[name].input_flags)))
        cat, be, feeds = job.catalog, job.backend, job.feeds_list[0]
        rng = np.random.default_rng(0)
        differs = short = 0
        for p in np.linspace(0.05, 0.95, count):
            plan = Plan(frozenset(c for c in cat.candidates if rng.random() < p), cat.candidates)
            fused, alone = be.run(plan, feeds), be.run_node_by_node(plan, feeds)
            real = executor_mod._Block.fp32_pair
            executor_mod._Block.fp32_pair = lambda self, fp16: True  # type: ignore[method-assign]
            try:
                every = be.run_node_by_node(plan, feeds)
            finally:
                executor_mod._Block.fp32_pair = real  # type: ignore[method-assign]
            differs += any(not np.array_equal(fused[k], alone[k], equal_nan=True) for k in fused)
            short += any(not np.array_equal(every[k], alone[k], equal_nan=True) for k in fused)
        print(f"| {name} | {len(cat.candidates)} | {count} | {differs} | {short} |", flush=True)
        job.close()


def scan(only: str | None) -> None:
    bs = _bench_strategies()
    tmp = Path(tempfile.mkdtemp())
    models = bs._fixture_cases(ROOT / "fixtures" / "exported", tmp) + bs._registry_cases(tmp, only)
    if only:
        models = [m for m in models if only in m[0]]
    print("| case | `auto`'s set | evaluations | excess through the blocks | node by node | verdicts | node-by-node run (s) |")
    print("|---|---|---|---|---|---|---|")
    for label, path, args in models:
        job = open_job(path, no_cache=True, **options_from_flags(args))
        oracle = job.oracle(idle=True, screen=True)
        r = run_search(oracle, "auto", {})
        plan = Plan(frozenset(r.fp32), job.catalog.candidates)
        fused = job.judge(plan)
        t0 = time.perf_counter()
        alone = job.judge(plan, run=job.backend.run_node_by_node)
        seconds = time.perf_counter() - t0
        what = ("same excess" if fused.excess == alone.excess else "**fails**" if not alone.passed else "other bits, passes")
        print(f"| {label} | {len(r.fp32)} | {r.evaluations.get('total')} | {fused.excess:.3g} | {alone.excess:.3g} | "
              f"{what} | {seconds:.2f} |", flush=True)
        job.close()


def command(cases: list[tuple[str, str, list[str]]], out: Path, modes: list[str], extra: list[str] = ()) -> None:
    """`bisector precision` per case and --second-opinion mode; (label, registry model, tolerance flags)."""
    from registry_models import MODELS, fetch

    print("| case | --second-opinion | exit | set | evaluations | wall (s) | excess | node by node: the search's set → final | its evaluations |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, name, tols in cases:
        path = fetch(name)
        if path is None:
            continue
        for mode in modes:
            folder = out / f"{label.replace(' ', '_')}_{'on' if mode == 'search' else mode}"
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "bisector.cli", "precision", str(path), "--fp16",
                                *MODELS[name].input_flags, *tols, "-o", str(folder), "--no-cache", "--no-mixed",
                                "--no-progress", "--second-opinion", mode, *extra], capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if not (folder / "constraints.json").is_file():
                print(f"| {label} | {mode} | {r.returncode} | {r.stderr.strip()[-200:]!r} |", flush=True)
                continue
            c = json.loads((folder / "constraints.json").read_text())
            n = c.get("node_by_node") or {}
            excess = "–" if c["headroom"] is None else f"{1 - c['headroom']:.3g}"
            print(f"| {label} | {mode} | {r.returncode} | {len(c['fp32_nodes'])} | {c['evaluations']['total']} | "
                  f"{wall:.1f} | {excess} | {n.get('searched_set_excess', '–')} → {n.get('excess', '–')} | "
                  f"{n.get('evaluations', '–')} |", flush=True)


def registry_tolerance_cases(only: str | None) -> list[tuple[str, str, list[str]]]:
    """bench/strategies.py's registry cases with an elementwise tolerance (the text-image case needs its image)."""
    bs = _bench_strategies()
    out = []
    for name, label, args in bs.REGISTRY_CASES:
        if "@text-image" in args or (only and only not in f"{name} {label}"):
            continue
        tol = args[args.index("--atol") + 1]
        out.append((f"{name} {tol}", name, list(args)))
    return out


def all_fp16(only: str | None) -> None:
    """The all-FP16 plan's excess (emulate, through the blocks) per registry tolerance case: how far past the
    tolerance FP16 error goes before any node is kept FP32 (how diffuse the search will be)."""
    from registry_models import MODELS, fetch

    print("| case | candidates | all-FP16 excess |")
    print("|---|---|---|")
    for label, name, tols in registry_tolerance_cases(only):
        path = fetch(name)
        if path is None:
            continue
        job = open_job(path, no_cache=True, **options_from_flags([*MODELS[name].input_flags, *tols]))
        try:
            cands = job.catalog.candidates
            print(f"| {label} | {len(cands)} | {job.judge(Plan(frozenset(), cands)).excess:.4g} |", flush=True)
        finally:
            job.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plans", action="store_true")
    ap.add_argument("--scan", action="store_true")
    ap.add_argument("--all-fp16", action="store_true", help="the all-FP16 excess of every registry tolerance case")
    ap.add_argument("--command", nargs="+", metavar="CASE TOL", help="pairs: model name, tolerance")
    ap.add_argument("--registry", action="store_true", help="--command on every registry case of "
                    "bench/strategies.py with an elementwise tolerance (--only filters)")
    ap.add_argument("--modes", default="off,search", help="--second-opinion modes for --command (off,check,search)")
    ap.add_argument("--extra", default="", help="more flags for --command's searches (e.g. \"--margin 0.5\")")
    ap.add_argument("--only", default=None)
    ap.add_argument("--out", default="/tmp/second-opinion-sets")
    a = ap.parse_args()
    if a.plans:
        plans(a.only)
    if a.scan:
        scan(a.only)
    if a.all_fp16:
        all_fp16(a.only)
    cases = [(f"{n} {t}", n, ["--atol", t, "--rtol", t]) for n, t in zip((a.command or [])[::2], (a.command or [])[1::2])]
    if a.registry:
        cases += registry_tolerance_cases(a.only)
    if cases:
        command(cases, Path(a.out), a.modes.split(","), a.extra.split())


if __name__ == "__main__":
    main()
