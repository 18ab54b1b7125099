"""Every model of the installed onnx wheel's backend tests through `bisector precision` (robustness, not speed).

    python bench/onnx_node_sweep.py [--jobs 2] [--only SUBSTRING] [--out DIR]

The node tests (one operator each, ~1900; those with a float tensor among their inputs or outputs, ~1400) are
generated from `onnx.backend.test.case.node`, and the wheel's `simple`, `pytorch-converted` and
`pytorch-operator` models are read as shipped. Each runs as `bisector precision MODEL --fp16 --no-cache` on
bisector's generated inputs with the default tolerances. The exit code is tallied, and every run that ends in
"internal error" or prints a traceback is listed: those are bisector's bugs. Exit 2 with a message (ONNX Runtime
cannot load an old opset, an input bisector cannot generate, a NaN golden from inputs outside an op's domain) is
the documented answer to an input bisector cannot judge. Exit 0 means the search ended on a passing 1-minimal set.

Results: docs/constructs.md, "Every model of the onnx wheel's backend tests".
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BISECTOR = [sys.executable, "-m", "bisector.cli"]


def _has_float_tensor(model) -> bool:
    return any(v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == 1
               for v in list(model.graph.input) + list(model.graph.output))


def collect(work: Path, only: str | None) -> list[Path]:
    """Model files: the node tests written under `work`, then the wheel's shipped ones."""
    import onnx.backend.test
    from onnx.backend.test.case.node import collect_testcases

    paths = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators' own numpy warnings (1/0 in reduce tests, ...)
        cases = collect_testcases()
    for case in cases:
        if only and only not in case.name or not _has_float_tensor(case.model):
            continue
        path = work / "node" / case.name / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(case.model.SerializeToString())
        paths.append(path)
    data = Path(onnx.backend.test.__file__).parent / "data"
    for kind in ("simple", "pytorch-converted", "pytorch-operator"):
        paths += [p for p in sorted((data / kind).glob("*/model.onnx")) if not only or only in p.parent.name]
    return paths


def run_one(model: Path, out: Path) -> tuple[str, int, str, bool]:
    name = f"{model.parent.parent.name}/{model.parent.name}"
    try:
        r = subprocess.run([*BISECTOR, "precision", str(model), "--fp16", "--no-cache", "-o", str(out / "o")],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
        code, text = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired:
        code, text = -1, "timeout after 300 s"
    last = next((ln for ln in reversed(text.splitlines()) if ln.startswith(("PASSED", "FAILED", "bisector:"))),
                text.strip().splitlines()[-1] if text.strip() else "")
    return name, code, last[:300], "Traceback" in text or "internal error" in text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", help="only models whose name contains this")
    ap.add_argument("--out", type=Path, help="keep the generated models and outputs here (default: a temp dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as td:
        work = args.out or Path(td)
        models = collect(work, args.only)
        print(f"{len(models)} models", flush=True)

        def one(i_model):
            i, model = i_model
            d = work / "runs" / str(i)
            d.mkdir(parents=True, exist_ok=True)
            return run_one(model, d)

        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(one, enumerate(models)))
    tally = collections.Counter(code for _, code, _, _ in results)
    print("exit codes:", ", ".join(f"{c}: {n}" for c, n in sorted(tally.items())))
    def reason(last: str) -> str:  # the message's opening words, names and paths left out
        text = re.sub(r"'[^']*'|/\S+", "…", last.removeprefix("bisector: error: "))
        text = re.sub(r"dtype \S+|is [A-Z][A-Z0-9]+:", lambda m: m.group(0).split()[0] + " …", text)  # types alike
        return " ".join(text.split()[:8])

    reasons = collections.Counter(reason(last) for _, code, last, _ in results if code == 2)
    for reason, n in reasons.most_common():
        print(f"  exit 2 x{n}: {reason} ...")
    bugs = [(name, code, last) for name, code, last, bad in results if bad or code not in (0, 1, 2)]
    for name, code, last in bugs:
        print(f"BUG? {name}: exit {code}: {last}")
    print(f"{len(bugs)} runs ended in an internal error, a traceback, a timeout or an unexpected exit code")
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
