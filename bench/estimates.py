"""Issue 15, item 2 ("tell the user early"): `auto`'s estimates of the evaluations in all, against the real totals.

    python bench/estimates.py                        # the fixtures' and registry models' cases of bench/strategies.py
    python bench/estimates.py --only "ppocr-rec,yolov8n"
    python bench/estimates.py --no-registry --chain  # + the 60-output MatMul/Tanh chain (bench/scale.py; ~1 min)

Each case runs `auto` on the real emulate oracle, as `bench/strategies.py --shared-pool` does (the command's
shared thread pool, the driver's hints), and records every estimate it sends through `progress` with the
evaluations spent when it came. Printed: per case, each estimate as `@spent: total (total / real total)`, the
set bound it gave; then per kind of estimate the median and worst |log2(estimate / real)| and how many came within
1.5 x and 2 x. The kinds:

  sparse     after the first culprit, as if the error were sparse ("about");
  switch     on switching to the diffuse search ("at least": the culprits so far);
  fallback   on falling back to group testing (set: at least the culprits so far);
  prefix     once the ranked search's shortest passing prefix is known (set: at most the prefix);
  culprits   once group testing's culprits pass, before the check (set: at most them).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))


def _bench_strategies():
    """bench/strategies.py (its name is the installed package's, so loaded by path)."""
    spec = importlib.util.spec_from_file_location("bench_strategies", ROOT / "bench" / "strategies.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def kind(e: dict) -> str:
    if e.get("at_least"):
        return "switch"
    if e.get("set_at_least"):
        return "fallback"
    if e.get("set_at_most"):
        return "culprits" if e.get("_phase") == "verify" else "prefix"  # gt's culprits are checked in "verify"
    return "sparse"


def run_case(S, label: str, path: Path, args: list[str]) -> dict | None:
    from bisector.app.job import open_job
    from bisector.app.options import options_from_flags
    from bisector.strategies import load_strategies

    job = open_job(path, no_cache=True, **options_from_flags(args))
    try:
        oracle = job.oracle(idle=True)
        if not oracle.passes(frozenset(oracle.candidates)):
            return None
        f = S._with_excess(oracle)
        hints = {"excess": f.excess, "predicted_ranking": f.predicted_ranking}
        canonical = getattr(f, "canonical", None)
        if canonical is not None:
            hints["canonical"] = canonical
        counting = S.CountingOracle(f, canonical=canonical)
        events: list[dict] = []

        def progress(d: dict) -> None:
            if "estimate" in d:
                e = {k: v for k, v in d["estimate"].items() if k != "advice"}
                events.append({**e, "spent": d.get("evaluations"), "_phase": d.get("phase")})

        result = load_strategies()["auto"]().search(list(oracle.candidates), counting, progress=progress, **hints)
        return {"case": label, "n": len(oracle.candidates), "set": len(result), "evaluations": counting.distinct,
                "ranking_runs": sum(st.get("runs", 0) for st in f.prediction_stats), "estimates": events}
    finally:
        job.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated parts of case labels")
    ap.add_argument("--no-fixtures", action="store_true")
    ap.add_argument("--no-registry", action="store_true")
    ap.add_argument("--chain", action="store_true", help="also the 60-output MatMul/Tanh chain at 1e-3")
    ap.add_argument("--json", type=Path, help="also write one JSON line per case here")
    args = ap.parse_args(argv)
    os.environ["BISECTOR_SHARED_POOL"] = "1"  # as the command runs its sessions
    S = _bench_strategies()
    tmp = tempfile.TemporaryDirectory()
    models: list[tuple[str, Path, list[str]]] = []
    if not args.no_fixtures:
        models += S._fixture_cases(ROOT / "fixtures" / "exported", Path(tmp.name))
    if not args.no_registry:
        models += S._registry_cases(Path(tmp.name))
    if args.chain:
        import onnx
        import scale

        chain = Path(tmp.name) / "chain60.onnx"
        onnx.save(scale.matmul_chain_model(600, output_every=10), chain)
        models.append(("matmul-tanh chain 1200, 60 outputs, 1e-3", chain, ["--atol", "1e-3", "--rtol", "1e-3"]))
    if args.only:
        parts = [p.strip() for p in args.only.split(",") if p.strip()]
        models = [m for m in models if any(p in m[0] for p in parts)]
    out = open(args.json, "w") if args.json else None
    by_kind: dict[str, list[float]] = {}
    print("| case | N | set / evaluations (+ ranking runs) | estimates: @spent: total (/ real), set |")
    print("|---|---|---|---|")
    for label, path, flags in models:
        row = run_case(S, label, path, flags)
        if row is None:
            print(f"| {label} | | all-FP32 fails: skipped | |")
            continue
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
        real = row["evaluations"]
        parts = []
        for e in row["estimates"]:
            k = kind(e)
            ratio = e["evaluations"] / max(real, 1)
            by_kind.setdefault(k, []).append(abs(math.log2(max(ratio, 1e-9))))
            bound = "≤" if e.get("set_at_most") else "≥" if (e.get("set_at_least") or e.get("at_least")) else "~"
            parts.append(f"{k} @{e['spent']}: {'≥' if e.get('at_least') else ''}{e['evaluations']} ({ratio:.2f}), "
                         f"set {bound}{e['set_size']}")
        print(f"| {label} | {row['n']} | {row['set']} / {real} (+{row['ranking_runs']}) | {'; '.join(parts)} |",
              flush=True)
    print("\n| estimate | count | median abs(log2(estimate / real)) | worst | within 1.5 x | within 2 x |")
    print("|---|---|---|---|---|---|")
    for k in ("sparse", "switch", "fallback", "prefix", "culprits"):
        v = by_kind.get(k)
        if not v:
            continue
        print(f"| {k} | {len(v)} | {statistics.median(v):.2f} | {max(v):.2f} | "
              f"{sum(x <= math.log2(1.5) for x in v)} | {sum(x <= 1.0 for x in v)} |")
    if out:
        out.close()
    tmp.cleanup()


if __name__ == "__main__":
    main()
