"""Benchmark the built-in strategies on synthetic oracles (no ONNX).

    python bench/strategies.py            # full: N in {64,128,256,512,1000}, k in {1,2,4,8}, 10 seeds
    python bench/strategies.py --quick    # N in {64,128}, 5 seeds

Counts DISTINCT sets asked (the driver caches repeats). ``run_on_oracle`` is the hook for real fixtures: give it
candidates and a ``passes`` function (e.g. the emulate backend's oracle) and it runs every strategy on it.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from strategy_oracles import (  # noqa: E402
    either_of_pair,
    is_one_minimal,
    mismatched_pair,
    monotone,
    names,
    noisy,
    poisoned,
    random_culprits,
)

from bisector.strategies import CountingOracle, load_strategies  # noqa: E402

ORDER = ["auto", "greedy", "ddmin", "bisect", "linear"]


def run_on_oracle(
    candidates: Sequence[str],
    passes: Callable[[frozenset[str]], bool],
    strategies: Sequence[str] = tuple(ORDER),
    **hints: object,
) -> dict[str, dict[str, object]]:
    """Run each strategy on one oracle; per strategy: result, distinct evaluations, passes, 1-minimal, seconds."""
    found = load_strategies()
    out: dict[str, dict[str, object]] = {}
    for name in strategies:
        oracle = CountingOracle(passes)
        t0 = time.perf_counter()
        result = found[name]().search(list(candidates), oracle, **hints)
        out[name] = {
            "result": result,
            "evaluations": oracle.distinct,
            "passes": oracle(result),
            "one_minimal": is_one_minimal(oracle, result),
            "seconds": time.perf_counter() - t0,
        }
    return out


def synthetic(ns: list[int], ks: list[int], seeds: int, skip_linear_above: int) -> None:
    print("## Monotone oracles (passes iff culprits ⊆ S), random culprits\n")
    rows: dict[str, list[str]] = {s: [] for s in ORDER}
    for n in ns:
        cands = names(n)
        for k in ks:
            if k > n:
                continue
            stats = {s: [0, 0, 0] for s in ORDER}  # evals, size, exact
            for seed in range(seeds):
                culprits = random_culprits(cands, k, 7919 * seed + 31 * n + k)
                todo = [s for s in ORDER if not (s in ("linear", "greedy", "ddmin") and n > skip_linear_above)]
                res = run_on_oracle(cands, monotone(culprits), todo)
                for s, r in res.items():
                    stats[s][0] += r["evaluations"]
                    stats[s][1] += len(r["result"])
                    stats[s][2] += r["result"] == culprits
            lc = math.log2(math.comb(n, k))
            for s in ORDER:
                ev, size, exact = stats[s]
                if ev == 0:
                    continue
                mean = ev / seeds
                extra = f" | {1.3 * lc + 2:.1f} | {'yes' if mean <= 1.3 * lc + 2 else 'NO'}" if s == "auto" else ""
                rows[s].append(
                    f"| {n} | {k} | {mean:.1f} | {size / seeds:.1f} | {exact / seeds:.2f} | {mean / lc:.2f}{extra} |"
                )
    for s in ORDER:
        print(f"### {s}\n")
        head = "| N | k | mean distinct evals | mean FP32 size | exact | evals / log2 C(N,k) |"
        sep = "|---|---|---|---|---|---|"
        if s == "auto":
            head += " bound 1.3·log2C+2 | within |"
            sep += "---|---|"
        print(head)
        print(sep)
        print("\n".join(rows[s]))
        print()


def interactions(seeds: int) -> None:
    print("## Interactions and noise (N=128, 3 random culprits + the case below)\n")
    n = 128
    cands = names(n)
    everything = frozenset(cands)
    cases: list[tuple[str, Callable[[frozenset[str], tuple[str, str], int], Callable]]] = [
        ("pair needed together (both FP32)", lambda c, p, s: monotone(c | frozenset(p))),
        ("either of a pair suffices", lambda c, p, s: either_of_pair(c, p)),
        ("poison pair (both FP32 breaks it)", lambda c, p, s: poisoned(c, p)),
        ("pair must share precision", lambda c, p, s: mismatched_pair(c, p)),
        ("noisy 2% flips", lambda c, p, s: noisy(monotone(c), 0.02, s)),
    ]
    print("| case | strategy | mean distinct evals | mean FP32 size | passes | 1-minimal |")
    print("|---|---|---|---|---|---|")
    for label, make in cases:
        stats = {s: [0, 0, 0, 0] for s in ORDER}
        for seed in range(seeds):
            culprits = random_culprits(cands, 3, 1000 + seed)
            rest = [x for x in cands if x not in culprits]
            pair = (rest[(seed * 13) % len(rest)], rest[(seed * 29 + 50) % len(rest)])
            base = make(culprits, pair, seed)

            def f(s, base=base):  # all-FP32 passes in every case
                return s == everything or base(s)

            for s, r in run_on_oracle(cands, f).items():
                st = stats[s]
                st[0] += r["evaluations"]
                st[1] += len(r["result"])
                st[2] += bool(r["passes"])
                st[3] += bool(r["one_minimal"])
        for s in ORDER:
            ev, size, ok, minimal = stats[s]
            print(f"| {label} | {s} | {ev / seeds:.1f} | {size / seeds:.1f} | {ok}/{seeds} | {minimal}/{seeds} |")
    print()
    print("(For the noisy oracle 'passes' and '1-minimal' are judged by the same noisy oracle, answers cached.)\n")


def scored(seeds: int) -> None:
    print("## auto with scores (N=256, k=4)\n")
    n, k = 256, 4
    cands = names(n)
    print("| scores | mean distinct evals | exact |")
    print("|---|---|---|")
    for label in ("none", "informative (culprits top)", "uninformative"):
        ev = exact = 0
        for seed in range(seeds):
            culprits = random_culprits(cands, k, 500 + seed)
            hints: dict[str, object] = {}
            if label.startswith("informative"):
                hints["scores"] = {x: (1.0 if x in culprits else 0.0) for x in cands}
            elif label == "uninformative":
                hints["scores"] = {x: float((i * 7919) % 97) for i, x in enumerate(cands)}
            r = run_on_oracle(cands, monotone(culprits), ["auto"], **hints)["auto"]
            ev += r["evaluations"]
            exact += r["result"] == culprits
        print(f"| {label} | {ev / seeds:.1f} | {exact}/{seeds} |")
    print()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, few seeds")
    ap.add_argument("--seeds", type=int, default=None)
    args = ap.parse_args(argv)
    seeds = args.seeds or (5 if args.quick else 10)
    ns = [64, 128] if args.quick else [64, 128, 256, 512, 1000]
    t0 = time.perf_counter()
    synthetic(ns, [1, 2, 4, 8], seeds, skip_linear_above=10_000)
    interactions(seeds)
    scored(seeds)
    print(f"_{time.perf_counter() - t0:.1f} s_")


if __name__ == "__main__":
    main()
