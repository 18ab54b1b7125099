"""Do the sets found on one input draw hold on others? (`precision --held-out`, bisector.app.held_out)

For each registry case (bench/strategies.py's REGISTRY_CASES) and each seed S of --seeds, every built-in 1-minimal
strategy searches on the inputs generated with seed S (the shared ONNX Runtime pool, as the command runs); each set
found is then judged on the inputs of every other seed, at the tolerance asked (margin 1, as `--held-out` judges).
Prints one row per case: per strategy, the judgements on other draws that passed and the set sizes per seed.

    python bench/held_out.py --case "ppocr-cls atol = rtol = 2e-5" --seeds 1,2,3,4
    python bench/held_out.py --cases default          # the nine cases of docs/benchmarks.md, "Held-out inputs"

With --flags (e.g. "--margin 0.5 --iterations 4"): each case is searched once with those flags (seed 1) by every
strategy, and each set judged on --held-out input sets after the searched ones (margin 1): issue 15's comparison
(set / smallest, evaluations / gt) where the sets are meant to hold beyond the inputs searched.

    python bench/held_out.py --cases default --flags "--margin 0.5 --iterations 4" --held-out 4

With --grown: the command's default strategy with --flags (`--grow-inputs R`: the input sets a set fails on join
the search), its final set judged on --held-out input sets after every one the command used.

    python bench/held_out.py --cases default --grown --flags "--grow-inputs 4" --held-out 4
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("BISECTOR_SHARED_POOL", "1")  # as `bisector precision` runs its sessions

DEFAULT_CASES = ["ppocr-cls atol = rtol = 2e-5", "ppocr-cls atol = rtol = 1e-4", "magika atol = rtol = 5e-6",
                 "yolov8n atol = rtol = 3e-3", "yolov8n atol = rtol = 1e-3", "ppocr-rec atol = rtol = 3e-3",
                 "orientation atol = rtol = 3e-4", "basic-pitch atol = rtol = 1e-2", "dnsmos atol = rtol = 1e-4"]


def _case(label: str) -> tuple[Path, list[str]]:
    """The registry case whose label starts with `label`: its model (fetched once) and its flags."""
    import strategies as S
    from registry_models import MODELS, fetch

    name, args = next((n, a) for n, lab, a in S.REGISTRY_CASES if f"{n} {lab}".startswith(label))
    if "@text-image" in args:
        raise SystemExit(f"{label}: inputs from a drawn image, not generated: no held-out draws here")
    path = fetch(name)
    if path is None:
        raise SystemExit(f"{label}: model not available")
    return path, [*MODELS[name].input_flags, *args]


def one_case(label: str, seeds: list[int]) -> dict:
    import strategies as S

    from bisector.app.job import open_job
    from bisector.app.options import options_from_flags

    path, flags = _case(label)
    jobs = {s: open_job(path, no_cache=True, **options_from_flags([*flags, "--seed", str(s)])) for s in seeds}
    try:
        judge = {s: jobs[s].oracle(idle=S.IDLE) for s in seeds}
        out = {"case": label, "runs": []}
        for s in seeds:
            t0 = time.perf_counter()
            found = S.run_on_oracle(list(judge[s].candidates), S._with_excess(judge[s]), S.MINIMAL)
            for strategy, r in found.items():
                fp32 = frozenset(r["result"])
                elsewhere = {}
                for other in seeds:
                    if other != s:
                        judge[other].passes(fp32)
                        v = judge[other].verdict_of(fp32)
                        elsewhere[other] = float("inf") if v is None else v.excess  # margin 1: excess <= 1 holds
                out["runs"].append({"seed": s, "strategy": strategy, "size": len(fp32), "evaluations": r["evaluations"],
                                    "elsewhere": elsewhere})
            print(f"  ({label}, seed {s}: {time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        return out
    finally:
        for job in jobs.values():
            job.close()


def searched_once(label: str, flags: list[str], held: int) -> str:
    """Every strategy on one search job (`flags`); each set judged on `held` input sets after the searched ones."""
    import strategies as S

    from bisector.app.job import open_job
    from bisector.app.options import options_from_flags

    path, case_flags = _case(label)
    search = open_job(path, no_cache=True, **options_from_flags([*case_flags, *flags]))
    seed = search.inputs_info["seed"] + search.inputs_info["iterations"]
    judge = open_job(path, no_cache=True, **options_from_flags([*case_flags, *flags, "--margin", "1", "--seed",
                                                                 str(seed), "--iterations", str(held)]))
    try:
        oracle, there = search.oracle(idle=S.IDLE), judge.oracle(idle=S.IDLE)
        found = S.run_on_oracle(list(oracle.candidates), S._with_excess(oracle), S.MINIMAL)
        smallest = min(len(r["result"]) for r in found.values())
        cells = []
        for strategy in ("auto", "gt", "greedy", "ddmin"):
            r = found[strategy]
            fp32 = frozenset(r["result"])
            ok = there.passes(fp32)
            v = there.verdict_of(fp32)
            cells.append(f"{len(fp32)} / {r['evaluations']}, {'holds' if ok else 'fails'} "
                         f"({v.excess if v is not None else float('inf'):.2f})")
        a = found["auto"]
        ratios = (f"{len(a['result']) / max(smallest, 1):.2f}; {a['evaluations'] / found['gt']['evaluations']:.2f}")
        return f"| {label} | " + " | ".join(cells) + f" | {ratios} |"
    finally:
        search.close()
        judge.close()


def grown_once(label: str, flags: list[str], held: int, save: Path | None = None) -> str:
    """The default strategy through the API with `flags` (e.g. "--grow-inputs 4"); the final set judged on `held`
    input sets after every one the command used (searched, or drawn as held-out), at margin 1. `save`: a folder
    for the command's constraints.json and report.md (no mixed model), one subfolder per case."""
    from bisector.app import api
    from bisector.app.job import open_job
    from bisector.app.options import options_from_flags

    path, case_flags = _case(label)
    opts = options_from_flags([*case_flags, *flags])
    t0 = time.perf_counter()
    out = None if save is None else save / "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in label)
    r = api.precision(path, no_cache=True, output_dir=out, mixed=False, **opts)
    wall = time.perf_counter() - t0
    rec = r.constraints.held_out or {}
    seed = opts.get("seed", 1) + opts.get("iterations", 1)
    if rec:
        seed = rec["seeds"][1] + 1 if rec.get("input_sets") else seed + (rec.get("searched_input_sets") or 0)
    import dataclasses

    from bisector.app.options import Search

    searching = {f.name for f in dataclasses.fields(Search)}  # not a job's options
    judged = options_from_flags([*case_flags, *flags, "--margin", "1", "--seed", str(seed), "--iterations", str(held)])
    judge = open_job(path, no_cache=True, **{k: v for k, v in judged.items() if k not in searching})
    try:
        there = judge.oracle()
        fp32 = frozenset(r.fp32_nodes)
        ok = there.passes(fp32)
        v = there.verdict_of(fp32)
    finally:
        judge.close()
    grown = rec.get("grown") or []
    sizes = " → ".join([str(grown[0]["set_before"])] + [str(g["set_after"]) for g in grown]) if grown else ""
    verdict = "—" if not rec else "passes" if rec.get("passed") else "not judged" if rec.get("passed") is None \
        else f"fails ({rec.get('excess') or float('inf'):.2f})"
    return (f"| {label} | {len(fp32)} / {r.constraints.evaluations.total} | {len(grown)} ({sizes or 'none'}) | "
            f"{rec.get('searched_input_sets') or opts.get('iterations', 1)} | {verdict} | "
            f"{'holds' if ok else 'fails'} ({v.excess if v is not None else float('inf'):.2f}) | {wall:.0f} s |")


def row(case: dict) -> str:
    cells, held, total, excess = [], 0, 0, []
    for strategy in ("auto", "gt", "greedy", "ddmin"):
        runs = [r for r in case["runs"] if r["strategy"] == strategy]
        ok = sum(e <= 1.0 for r in runs for e in r["elsewhere"].values())
        n = sum(len(r["elsewhere"]) for r in runs)
        held, total = held + ok, total + n
        excess += [e for r in runs for e in r["elsewhere"].values()]
        cells.append(f"{ok} / {n} ({', '.join(str(r['size']) for r in runs)})")
    excess.sort()
    return (f"| {case['case']} | " + " | ".join(cells) + f" | **{held} / {total}** | "
            f"{excess[0]:.2f}–{excess[-1]:.3g} (median {excess[len(excess) // 2]:.2f}) |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", default=[], help="a case label (prefix), repeatable")
    ap.add_argument("--cases", choices=["default"], help="the nine cases of docs/benchmarks.md")
    ap.add_argument("--seeds", default="1,2,3,4")
    ap.add_argument("--flags", default=None, help="search each case once with these flags (e.g. '--margin 0.5 "
                                                   "--iterations 4') and judge the sets on --held-out sets after")
    ap.add_argument("--held-out", type=int, default=4)
    ap.add_argument("--save", type=Path, default=None, help="with --grown: write each case's constraints.json "
                    "and report.md under this folder (to judge the sets elsewhere, e.g. on a GPU)")
    ap.add_argument("--grown", action="store_true", help="with --flags: the default strategy through `precision` "
                    "(e.g. --flags '--grow-inputs 4'), its final set judged on --held-out sets after all it used")
    a = ap.parse_args()
    labels = a.case + (DEFAULT_CASES if a.cases == "default" else [])
    if not labels:
        ap.error("give --case LABEL or --cases default")
    if a.flags is not None and a.grown:
        import shlex

        print(f"| case (`precision` with {a.flags}) | set / evaluations | rounds grown (set sizes) | input sets "
              f"searched | its last held-out check | on {a.held_out} input sets after all it used | wall |")
        print("|---|---|---|---|---|---|---|")
        for label in labels:
            print(grown_once(label, shlex.split(a.flags), a.held_out, a.save), flush=True)
        return
    if a.flags is not None:
        import shlex

        print(f"| case (searched with {a.flags}) | auto: set / evaluations, on {a.held_out} held-out sets (worst "
              "excess) | gt | greedy | ddmin | auto: set / smallest; evaluations / gt |")
        print("|---|---|---|---|---|---|")
        for label in labels:
            print(searched_once(label, shlex.split(a.flags), a.held_out), flush=True)
        return
    seeds = [int(s) for s in a.seeds.split(",")]
    print("| case | auto: held elsewhere (set per seed) | gt | greedy | ddmin | all | excess elsewhere (× tolerance) |")
    print("|---|---|---|---|---|---|---|")
    for label in labels:
        print(row(one_case(label, seeds)), flush=True)


if __name__ == "__main__":
    main()
