"""Two commands timed as whole processes, in turn (A B A B ...): wall seconds and peak resident memory of each run,
their medians, and the ratio A/B pair by pair.

    python bench/ab.py -n 3 --b "PYTHONPATH=/tmp/base python -m bisector.cli precision m.onnx ... -o B --no-cache" \
        -- python -m bisector.cli precision m.onnx ... -o A --no-cache

Why pairs: this project's machines drift by up to 3 x between hours (docs/benchmarks.md, "Scale, thirty-fifth
round"), so a ratio of runs taken side by side holds where two medians taken an hour apart do not. The peak is the
operating system's own account of each finished child (``wait4``'s ``ru_maxrss``), as ``/usr/bin/time -v``
reports it. A command's output goes to ``--log`` (appended; default: discarded). Leading ``NAME=value`` words set
the environment, as a shell would.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time


def _split_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    env = dict(os.environ)
    i = 0
    while i < len(words) and "=" in words[i] and not words[i].startswith("=") and words[i].split("=", 1)[0].isidentifier():
        key, value = words[i].split("=", 1)
        env[key] = value
        i += 1
    if i == len(words):
        raise SystemExit("ab.py: a command is needed after its NAME=value words")
    return env, words[i:]


def run_once(words: list[str], log: str | None) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MiB, exit status) of one run of `words`."""
    env, argv = _split_env(words)
    out = open(log, "ab") if log else subprocess.DEVNULL
    try:
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if log:
            out.close()  # type: ignore[union-attr]
    peak = usage.ru_maxrss / 1024 if sys.platform.startswith("linux") else usage.ru_maxrss / 2**20
    return wall, peak, proc.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=3, help="pairs counted (default 3)")
    ap.add_argument("--warmup", type=int, default=0, help="pairs run first and not counted (default 0)")
    ap.add_argument("--b", required=True, help="command B, one string split as a shell splits words")
    ap.add_argument("--log", help="append both commands' output to this file (default: discarded)")
    ap.add_argument("a", nargs=argparse.REMAINDER, help="-- command A")
    args = ap.parse_args(argv)
    a = args.a[1:] if args.a[:1] == ["--"] else args.a
    b = shlex.split(args.b)
    if not a:
        ap.error("command A is missing (after --)")
    runs: dict[str, list[tuple[float, float, int]]] = {"A": [], "B": []}
    for i in range(args.warmup + args.n):
        for name, words in (("A", a), ("B", b)):
            result = run_once(words, args.log)
            if i >= args.warmup:
                runs[name].append(result)
            print(f"{'warm-up' if i < args.warmup else 'pair ' + str(i - args.warmup + 1)} {name}: "
                  f"{result[0]:.2f} s, {result[1]:.1f} MiB, exit {result[2]}", flush=True)

    def row(label: str, values: list[float], unit: str) -> str:
        return (f"{label:<14} median {statistics.median(values):10.3f} {unit:<4} "
                f"(min {min(values):.3f}, max {max(values):.3f})")

    for k, (label, unit) in enumerate((("wall", "s"), ("peak", "MiB"))):
        va, vb = [r[k] for r in runs["A"]], [r[k] for r in runs["B"]]
        print(row(f"A {label}", va, unit))
        print(row(f"B {label}", vb, unit))
        print(row(f"A/B {label}", [x / y for x, y in zip(va, vb) if y], ""))
    return 0 if all(r[2] == 0 for rs in runs.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
