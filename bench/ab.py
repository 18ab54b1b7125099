"""Two commands timed as whole processes, in turn (A B A B ...): wall seconds and peak resident memory of each run,
their medians, and the ratio A/B pair by pair.

    python bench/ab.py -n 3 --b "PYTHONPATH=/tmp/base python -m bisector.cli precision m.onnx ... -o B --no-cache" \
        -- python -m bisector.cli precision m.onnx ... -o A --no-cache

Why pairs: this project's machines drift by up to 3 x between hours (docs/benchmarks.md, "Scale, thirty-fifth
round"), so a ratio of runs taken side by side holds where two medians taken an hour apart do not. The peak is the
operating system's own account of each finished child (``wait4``'s ``ru_maxrss``), as ``/usr/bin/time -v``
reports it. A command's output goes to ``--log`` (appended; default: discarded). Leading ``NAME=value`` words set
the environment, as a shell would. ``--together`` starts A and B of each pair at the same moment, each pinned to
half of the CPUs (swapped every pair): where the machine drifts within minutes, the two then share its state
(docs/benchmarks.md, "Scale, thirty-eighth round": the same search ranged 18–28 s in turn, the ratios of pairs run
together 0.92–1.10); each command gets half the cores, which a multi-threaded one will notice.
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
    return run_together([words], log, None)[0]


def run_together(commands: list[list[str]], log: str | None,
                 cores: list[set[int]] | None) -> list[tuple[float, float, int]]:
    """(wall seconds, peak RSS in MiB, exit status) of each command, all started at once; `cores[i]`: the CPUs
    command i may run on (None: any)."""
    out = open(log, "ab") if log else subprocess.DEVNULL
    try:
        procs = []
        for i, words in enumerate(commands):
            env, argv = _split_env(words)
            pin = cores[i] if cores else None
            procs.append((subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                           preexec_fn=(lambda c=pin: os.sched_setaffinity(0, c)) if pin else None),
                          time.monotonic()))
        done: dict[int, tuple[float, float, int]] = {}
        started = {proc.pid: t0 for proc, t0 in procs}
        while len(done) < len(procs):  # whichever ends first is timed when it ends
            pid, status, usage = os.wait4(-1, 0)
            if pid not in started:
                continue
            peak = usage.ru_maxrss / 1024 if sys.platform.startswith("linux") else usage.ru_maxrss / 2**20
            done[pid] = (time.monotonic() - started[pid], peak, os.waitstatus_to_exitcode(status))
        for proc, _ in procs:
            proc.returncode = done[proc.pid][2]  # (reaped here: Popen must not wait for it again)
    finally:
        if log:
            out.close()  # type: ignore[union-attr]
    return [done[proc.pid] for proc, _ in procs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=3, help="pairs counted (default 3)")
    ap.add_argument("--warmup", type=int, default=0, help="pairs run first and not counted (default 0)")
    ap.add_argument("--b", required=True, help="command B, one string split as a shell splits words")
    ap.add_argument("--log", help="append both commands' output to this file (default: discarded)")
    ap.add_argument("--together", action="store_true",
                    help="start A and B of a pair at once, each on half of the CPUs (the halves swap every pair): "
                         "both see the same hour of the machine; each gets half its cores")
    ap.add_argument("a", nargs=argparse.REMAINDER, help="-- command A")
    args = ap.parse_args(argv)
    a = args.a[1:] if args.a[:1] == ["--"] else args.a
    b = shlex.split(args.b)
    if not a:
        ap.error("command A is missing (after --)")
    runs: dict[str, list[tuple[float, float, int]]] = {"A": [], "B": []}
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if args.together and len(cpus) < 2:
        ap.error("--together needs two CPUs or more")
    halves = [set(cpus[: len(cpus) // 2]), set(cpus[len(cpus) // 2:])]
    for i in range(args.warmup + args.n):
        if args.together:
            pinned = halves if i % 2 == 0 else halves[::-1]
            results = run_together([a, b], args.log, pinned)
        else:
            results = [run_once(words, args.log) for words in (a, b)]
        for name, result in zip("AB", results):
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
