"""What a check command costs per candidate in `debug precision` (docs/benchmarks.md, "debug precision overhead").

On fixtures/planted.onnx, the same oracle answers ("passes iff two named nodes are FP32") given four ways, so every
run asks the same candidate sets:

- in-process `passes=` (bisector.debug_precision with a Python callable that only looks at the set): the search;
- check command `python -I -S check.py` reading `polygraphy_debug.json`: + writing the candidate's files + a
  Python process per candidate;
- the same with `--iter-artifact` in /dev/shm (tmpfs), to separate disk from process start;
- `sh -c 'exit 0'`-style trivial check (`true`): process start of the smallest program (a different, shorter
  search: everything passes).

    python bench/debug_overhead.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "fixtures" / "planted.onnx"
NEED = ["planted_exp", "planted_log"]
CHECK = ("import json, sys\n"
         "fp32 = set(json.load(open(sys.argv[1]))['fp32_nodes'])\n"
         "sys.exit(0 if set(sys.argv[2:]) <= fp32 else 1)\n")


def run_command(check: list[str], work: Path, iter_artifact: str = "polygraphy_debug.engine") -> dict:
    import bisector

    cwd = os.getcwd()
    os.chdir(work)
    try:
        t0 = time.perf_counter()
        r = bisector.debug_precision(MODEL, check, no_cache=True, iter_artifact=iter_artifact, hide_fail_output=True)
        wall = time.perf_counter() - t0
    finally:
        os.chdir(cwd)
    return _summary(r, wall)


def _summary(r, wall: float) -> dict:
    t = r.constraints.timings
    n = r.checks_run
    return {"wall": wall, "checks": n, "fp32": r.fp32_nodes, "write_per": t.get("write", 0.0) / n,
            "check_per": t["check"] / n, "search": t["search"]}


def run_inprocess() -> dict:
    import bisector

    need = set(NEED)
    t0 = time.perf_counter()
    r = bisector.debug_precision(MODEL, passes=lambda c: need <= c.fp32, no_cache=True)
    wall = time.perf_counter() - t0
    t = r.constraints.timings
    return {"wall": wall, "checks": r.checks_run, "fp32": r.fp32_nodes, "write_per": 0.0,
            "check_per": t["check"] / r.checks_run, "search": t["search"]}


def run_real(work: Path, in_process: bool) -> dict:
    """The realistic rewrite of the seeds' check: `bisector run MODEL --constraints polygraphy_debug.json …`."""
    import bisector

    spec = json.loads((ROOT / "fixtures" / "planted.json").read_text())
    check = [str(Path(sys.executable).parent / "bisector"), "run", str(MODEL), "--fp16", "--constraints",
             "polygraphy_debug.json", *spec["args"], "--no-cache"]
    cwd = os.getcwd()
    os.chdir(work)
    try:
        t0 = time.perf_counter()
        from bisector.cli.main import main as cli_main

        r = bisector.debug_precision(MODEL, check, no_cache=True, hide_fail_output=True, in_process=in_process,
                                     in_process_main=cli_main)
        wall = time.perf_counter() - t0
    finally:
        os.chdir(cwd)
    return _summary(r, wall)


def run_precision() -> dict:
    import bisector

    spec = json.loads((ROOT / "fixtures" / "planted.json").read_text())
    from bisector.app.options import options_from_flags

    t0 = time.perf_counter()
    r = bisector.precision(MODEL, no_cache=True, **options_from_flags(spec["args"]))
    wall = time.perf_counter() - t0
    n = r.constraints.evaluations.total
    return {"wall": wall, "checks": n, "fp32": r.fp32_nodes, "write_per": 0.0,
            "check_per": r.constraints.timings["backend_run"] / n, "search": r.constraints.timings["search"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--real", action="store_true", help="also the `bisector run` check against `bisector precision` "
                                                        "(a minute or two: one process per candidate)")
    args = ap.parse_args()
    import logging

    logging.getLogger("bisector").setLevel(logging.ERROR)
    rows: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        (work / "check.py").write_text(CHECK)
        shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else work
        for _ in range(args.repeat):
            rows.setdefault("in-process passes=", []).append(run_inprocess())
            rows.setdefault("check: python -I -S check.py", []).append(
                run_command([sys.executable, "-I", "-S", "check.py", "polygraphy_debug.json", *NEED], work))
            art = str(shm / f"bisector_bench_{os.getpid()}.engine")
            rows.setdefault("check: python, files on tmpfs", []).append(
                run_command([sys.executable, "-I", "-S", str(work / "check.py"), art[:-7] + ".json", *NEED], work, art))
            rows.setdefault("check: true (all pass)", []).append(run_command(["true"], work))
        if args.real:
            rows["precision (emulate, in-process)"] = [run_precision()]
            rows["check: bisector run, in process"] = [run_real(work, True)]
            rows["check: bisector run, --subprocess-check"] = [run_real(work, False)]
    base = statistics.median(r["search"] for r in rows["in-process passes="])
    print("| oracle | checks | FP32 set | search wall (median) | per candidate | of which: files | of which: check "
          "process | overhead per candidate vs in-process |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rs in rows.items():
        n = rs[0]["checks"]
        search = statistics.median(r["search"] for r in rs)
        per = search / n
        ref = base if rs[0]["fp32"] == rows["in-process passes="][0]["fp32"] else (
            statistics.median(r["search"] for r in rows["precision (emulate, in-process)"])
            if "bisector run" in name else 0.0)
        over = (search - ref) / n
        print(f"| {name} | {n} | {' '.join(rs[0]['fp32']) or '(none)'} | {search:.2f} s | {per * 1000:.0f} ms | "
              f"{statistics.median(r['write_per'] for r in rs) * 1000:.0f} ms | "
              f"{statistics.median(r['check_per'] for r in rs) * 1000:.1f} ms | {over * 1000:.0f} ms |")
    print(json.dumps({k: [{kk: vv for kk, vv in r.items() if kk != "fp32"} for r in v] for k, v in rows.items()}),
          file=sys.stderr)


if __name__ == "__main__":
    main()
