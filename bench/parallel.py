"""Parallel evaluation (issue 16): sequential rounds and total evaluations for P workers, and wall time.

    python bench/parallel.py                          # rounds table (N in {64,256,1000}, k in {1,2,4,8}, 5 seeds)
    python bench/parallel.py --quick                  # N in {64,256}, 3 seeds
    python bench/parallel.py --strategies-from strat  # the same with the strategies of a git ref (e.g. a branch)
    python bench/parallel.py --wall                   # + wall time through the real process pool (sleep latency)
    python bench/parallel.py --emulate                # + a real emulate search, 1 worker against --workers 2

Everything goes through the real driver (`run_search`), the oracle's `evaluate_many` and an executor. The rounds
table uses a synthetic monotone oracle (passes iff culprits ⊆ S) in an `InProcess` executor that *declares* P
workers: the oracle charges each call ceil(new plans / P) rounds, exactly what a pool of P needs when every
evaluation takes the same time (an engine build). `--wall` checks that against a real `ProcessPool` with a fixed
per-evaluation sleep. `--emulate` runs `bisector.precision` on bench/emulate_speed.py's conv network (>= 50 ms per
FP32 inference here) with and without `workers=2`.
"""

from __future__ import annotations

import argparse
import os
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def use_strategies_from(ref: str) -> str:
    """Shadow `bisector.strategies` with the `strategies/` folder of git ref `ref` (no install needed)."""
    out = Path(tempfile.mkdtemp(prefix="bisector-strategies-"))
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "strategies"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=tar.stdout, check=True)
    import bisector

    pkg_dir = out / "strategies"
    spec = importlib.util.spec_from_file_location("bisector.strategies", pkg_dir / "__init__.py",
                                                  submodule_search_locations=[str(pkg_dir)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["bisector.strategies"] = module
    spec.loader.exec_module(module)
    bisector.strategies = module  # type: ignore[attr-defined]
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], capture_output=True, text=True)
    return f"{ref} ({rev.stdout.strip()})"


def one_search(cands, culprits, workers: int, strategy: str):
    from bisector.search.driver import run_search
    from bisector.search.executors import InProcess, SyntheticSpec
    from bisector.search.oracle import Oracle

    oracle = Oracle(None, cands, [], [], None, executor=InProcess(SyntheticSpec(culprits), workers=workers))
    r = run_search(oracle, strategy)
    return r


def rounds_table(ns, ks, ps, seeds, strategy):
    from strategy_oracles import names, random_culprits

    print(f"| N | k | P=1 evaluations | " + " | ".join(f"P={p} rounds (×seq) / evals (×seq)" for p in ps if p > 1)
          + " | exact, 1-minimal |")
    print("|---|---|---|" + "---|" * (len([p for p in ps if p > 1])) + "---|")
    summary = {p: [] for p in ps}
    for n in ns:
        cands = names(n)
        for k in ks:
            per_p = {p: [0, 0] for p in ps}  # evaluations, rounds
            ok = True
            for seed in range(seeds):
                culprits = random_culprits(cands, k, 7919 * seed + 31 * n + k)
                base = None
                for p in ps:
                    r = one_search(cands, culprits, p, strategy)
                    ok &= r.fp32 == culprits and r.minimal
                    base = base or r.fp32
                    ok &= r.fp32 == base
                    per_p[p][0] += r.evaluations["new"]
                    per_p[p][1] += r.rounds
            seq = per_p[1][0] / seeds
            cells = []
            for p in ps:
                ev, rd = per_p[p][0] / seeds, per_p[p][1] / seeds
                summary[p].append((rd / seq, ev / seq))
                if p > 1:
                    cells.append(f"{rd:.1f} ({rd / seq:.2f}) / {ev:.1f} ({ev / seq:.2f})")
            print(f"| {n} | {k} | {seq:.1f} | " + " | ".join(cells) + f" | {'yes' if ok else 'NO'} |")
    print()
    for p in ps:
        if p > 1:
            rr = statistics.mean(x for x, _ in summary[p])
            er = statistics.mean(y for _, y in summary[p])
            print(f"P={p}: mean rounds / sequential evaluations = {rr:.2f}, mean evaluations / sequential = {er:.2f}")
    print()


def wall_check(n, k, ps, latency, strategy):
    from strategy_oracles import names, random_culprits

    from bisector.search.driver import run_search
    from bisector.search.executors import InProcess, ProcessPool, SyntheticSpec
    from bisector.search.oracle import Oracle

    cands = names(n)
    culprits = random_culprits(cands, k, 12345)
    print(f"Wall time, N={n}, k={k}, {latency * 1e3:.0f} ms per evaluation (sleep), real process pool "
          "(spawn start-up excluded):\n")
    print("| P | evaluations | rounds | wall s | rounds × latency s | answer exact |")
    print("|---|---|---|---|---|---|")
    for p in ps:
        spec = SyntheticSpec(culprits, latency)
        ex = InProcess(spec) if p == 1 else ProcessPool(spec, p)
        try:
            if p > 1:
                list(ex.run([frozenset()] * p))  # wait until every worker is up
            oracle = Oracle(None, cands, [], [], None, executor=ex)
            t0 = time.perf_counter()
            r = run_search(oracle, strategy)
            wall = time.perf_counter() - t0
        finally:
            ex.close()
        print(f"| {p} | {r.evaluations['new']} | {r.rounds} | {wall:.2f} | {r.rounds * latency:.2f} | "
              f"{r.fp32 == culprits} |")
    print()


def _bench_module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def planted_transformer(layers: int, d: int, seq: int):
    """bench/scale.py's transformer with a planted large-offset cancellation on the middle residual (Add 60000
    then Sub 60000: the residual is lost in FP16 storage), so the minimal FP32 set is known: those two nodes."""
    from onnx import helper, numpy_helper
    import numpy as np

    model, _ = _bench_module("scale").transformer_model(layers, d, seq, heads=8)
    g = model.graph
    at = next(i for i, n in enumerate(g.node) if n.name == f"l{layers // 2}_res1")
    h = g.node[at].output[0]
    g.initializer.append(numpy_helper.from_array(np.asarray(60000.0, np.float32), "planted_offset"))
    add = helper.make_node("Add", [h, "planted_offset"], ["planted_hi"], name="planted_add")
    sub = helper.make_node("Sub", ["planted_hi", "planted_offset"], ["planted_back"], name="planted_sub")
    for n in g.node[at + 1:]:
        n.input[:] = ["planted_back" if x == h else x for x in n.input]
    g.node.insert(at + 1, sub)
    g.node.insert(at + 1, add)
    return model, ["planted_add", "planted_sub"]


def emulate_check(blocks, size, channels, workers: list[str], repeats=1, kind="conv", layers=4, d=512, seq=128):
    import numpy as np
    import onnx

    from bisector.app.precision import precision

    es = _bench_module("emulate_speed")
    if kind == "transformer":
        model, planted = planted_transformer(layers, d, seq)
        shape, label = (1, seq, d), f"a {layers}-layer transformer, d={d}, {seq} tokens"
        tol = "1e-1"
    else:
        model, planted = es.build_model(blocks, size, channels)
        shape, label = (1, 3, size, size), f"{blocks} conv blocks of {channels} channels, input 1x3x{size}x{size}"
        tol = "1e-2"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speed.onnx"
        onnx.save(model, path)
        feeds = {"x": np.random.default_rng(1).uniform(0, 1, shape).astype(np.float32)}
        t_fp32 = es.fp32_inference_seconds(model, feeds)
        opts = dict(atol=[tol], rtol=[tol], cache_dir=Path(tmp) / "cache", resume=False)
        precision(path, max_evals=1, **opts)  # golden into the cache, so both runs read it
        print(f"Emulate: {label}, {len(model.graph.node)} nodes; one FP32 inference "
              f"{t_fp32 * 1e3:.0f} ms; whole `precision` call (journal off: every plan judged; worker start-up "
              f"included), runs interleaved, {repeats} of each; load average before: {_load()}\n")
        print("| workers | evaluations | rounds | wall s (each run) | median s | FP32 set | same set as 1 worker |")
        print("|---|---|---|---|---|---|---|")
        walls: dict[str, list[float]] = {w: [] for w in workers}
        info: dict[str, tuple] = {}
        for _ in range(repeats):
            for w in workers:  # "N" or "N:T" (T ORT threads per worker instead of cores / N)
                n, _, threads = w.partition(":")
                os.environ["BISECTOR_WORKER_THREADS"] = threads
                t0 = time.perf_counter()
                r = precision(path, workers=int(n) if int(n) > 1 else None, **opts)
                walls[w].append(time.perf_counter() - t0)
                info[w] = (r.constraints.evaluations.new, r.fp32_nodes, _ROUNDS.get(int(n), "-"))
        os.environ.pop("BISECTOR_WORKER_THREADS", None)
        for w in workers:
            ev, fp32, rounds = info[w]
            shown = "planted" if sorted(fp32) == sorted(planted) else f"{len(fp32)} nodes"
            label = w if ":" not in w else f"{w.split(':')[0]} ({w.split(':')[1]} threads each)"
            print(f"| {label} | {ev} | {rounds} | {', '.join(f'{x:.1f}' for x in walls[w])} | "
                  f"{statistics.median(walls[w]):.1f} | {shown} | {fp32 == info[workers[0]][1]} |")
        print(f"\nload average after: {_load()}")
    print()


_ROUNDS: dict[int, int] = {}


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _count_rounds() -> None:
    """Record the rounds of each precision() search (the driver's result), keyed by its workers."""
    import bisector.app.precision as P

    real = P.run_search

    def spy(*a, **kw):
        r = real(*a, **kw)
        _ROUNDS[r.workers] = r.rounds
        return r

    P.run_search = spy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--strategy", default="auto")
    ap.add_argument("--strategies-from", default=None, help="a git ref whose strategies/ to benchmark")
    ap.add_argument("--wall", action="store_true")
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--emulate", action="store_true")
    ap.add_argument("--size", type=int, default=144)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--no-table", action="store_true")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--variants", default="1,2", help="emulate: worker counts to compare, N or N:threads")
    ap.add_argument("--model", choices=["conv", "transformer"], default="conv", help="emulate: which network")
    ap.add_argument("--layers", type=int, default=4, help="--model transformer: layers")
    ap.add_argument("--d", type=int, default=512, help="--model transformer: width")
    ap.add_argument("--seq", type=int, default=128, help="--model transformer: tokens")
    args = ap.parse_args()
    source = "this checkout"
    if args.strategies_from:
        source = use_strategies_from(args.strategies_from)
    print(f"strategy `{args.strategy}` from {source}\n")
    ns = [64, 256] if args.quick else [64, 256, 1000]
    seeds = 3 if args.quick else 5
    if not args.no_table:
        rounds_table(ns, [1, 2, 4, 8], [1, 2, 4, 8], seeds, args.strategy)
    if args.wall:
        wall_check(256, 4, [1, 2, 4, 8], args.latency, args.strategy)
    if args.emulate:
        _count_rounds()
        emulate_check(args.blocks, args.size, args.channels, args.variants.split(","), args.repeats,
                      kind=args.model, layers=args.layers, d=args.d, seq=args.seq)


if __name__ == "__main__":
    main()
