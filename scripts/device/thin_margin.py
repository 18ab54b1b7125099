"""Thin-margin cases (issue 19): does the FP32 set found on `emulate` hold on real GPU FP16, and at which margin?

Phases (each writes/reads one JSON file, so the CPU part runs here and only the GPU part on the device):

    search   here: for every case of fixtures/thin (generate.py) and every margin m, the emulate search as a user
             runs it (`python -m bisector.cli precision MODEL --fp16 … --json FILE`), with a margin m emulated by
             scaling the tolerances (atol·m, rtol·m) until --margin exists; records each found set and its size.
    judge    (device, or here for emulate only) every distinct found set, all-FP16 and all-FP32 judged at the
             case's own tolerance by `emulate` and by `ort-cuda` (TF32 off, in-process, the CLI's job); records
             each verdict's excess (required tolerance / tolerance, worst output; > 1 fails).
    cpu      emulate verdicts of the same plans under ORT CPU session variants (threads, graph optimisation level,
             NCHWc layout, prepacking, denormals-as-zero): does any verdict or excess change?
    report   markdown tables: per case and margin the set size, emulate excess and GPU excess; the margin choice.

    python scripts/device/thin_margin.py search --out docs/verification/thin/sets.json
    PYTHONPATH=/tmp/site python3 scripts/device/thin_margin.py judge --sets sets.json --out $OUT/judge.json
    python scripts/device/thin_margin.py report --sets sets.json --judge judge.json [--cpu cpu.json ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "fixtures" / "thin"))
MARGINS = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]
PY = sys.executable


def cases(models_dir: Path) -> dict:
    import generate  # fixtures/thin/generate.py

    return generate.generate(models_dir)


def scaled_args(case: dict, m: float) -> list[str]:
    return ["--load-inputs", case["inputs"], "--atol", f"{case['tolerance'] * m:.6g}", "--rtol",
            f"{case['rtol'] * m:.6g}"]


def run_search(case: dict, m: float, work: Path, backend: str = "emulate", arith: str = "storage") -> dict:
    jfile = work / f"{Path(case['model']).stem}_{m:g}_{backend}_{arith}.json"
    cmd = [PY, "-m", "bisector.cli", "precision", case["model"], "--fp16", *scaled_args(case, m), "--backend", backend,
           *(["--fp16-arithmetic", arith] if arith != "storage" else []),
           "--json", str(jfile), "--no-cache", "--no-progress", "--no-plot", "-o", str(work / "out")]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=work)
    res = {"rc": r.returncode, "seconds": round(time.perf_counter() - t0, 2)}
    if jfile.exists():
        j = json.loads(jfile.read_text())
        res.update(fp32=sorted(j["fp32_nodes"]), size=len(j["fp32_nodes"]), passed=j["passed"],
                   evaluations=j.get("evaluations", {}).get("new"), candidates=j.get("candidates"))
    else:
        res["stderr"] = r.stderr[-800:]
    return res


def cmd_search(a) -> int:
    work = Path(tempfile.mkdtemp(prefix="thin-search-"))
    cs = cases(Path(a.models))
    wanted = set(filter(None, a.cases.split(",")))
    margins = [float(x) for x in a.margins.split(",")] if a.margins else MARGINS
    out = {"machine": machine(), "margins": margins, "fp16_arithmetic": a.arith, "cases": {}}
    for name, case in cs.items():
        if wanted and name not in wanted:
            continue
        row = {"tolerance": case["tolerance"], "note": case["note"], "searches": {}}
        for m in margins:
            row["searches"][f"{m:g}"] = r = run_search(case, m, work, arith=a.arith)
            print(f"{name:18s} m={m:<4g} rc={r['rc']} size={r.get('size')} evals={r.get('evaluations')} "
                  f"{r['seconds']}s {r.get('stderr', '')[-200:]}", flush=True)
        out["cases"][name] = row
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


def machine() -> dict:
    import onnxruntime as ort

    info = {"machine": platform.machine(), "python": platform.python_version(), "onnxruntime": ort.__version__,
            "cpu_count": os.cpu_count()}
    try:
        txt = Path("/proc/cpuinfo").read_text()
        info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in txt.splitlines() if ln.startswith("model name")), "?")
        flags = next((ln.split(":", 1)[1].split() for ln in txt.splitlines() if ln.startswith("flags")), [])
        info["isa"] = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "avx_vnni") if f in flags]
    except OSError:
        pass
    return info


def job(case: dict, backend: str, **backend_options):
    from bisector.app.job import open_job

    if backend == "emulate-gpu":  # emulate with --fp16-arithmetic gpu
        backend, backend_options = "emulate", {**backend_options, "fp16_arithmetic": "gpu"}
    extra = dict(backend_options)
    arithmetic = extra.pop("fp16_arithmetic", "storage")
    return open_job(Path(case["model"]), backend=backend, fp16_arithmetic=arithmetic, no_cache=True, canary=False,
                    load_inputs=[Path(case["inputs"])], atol=case["tolerance"], rtol=case["rtol"], margin=1.0,
                    backend_extra=extra)


def excess(v) -> float:
    """bisector's statistic excess: min(max abs / atol, max rel / rtol) of the worst output (an upper bound)."""
    return max((c.excess for c in v.outputs.values()), default=0.0)


def elem_excess(j, fs: frozenset, atol: float, rtol: float) -> float:
    """The smallest s for which the plan passes with tolerances s·atol, s·rtol under elemwise semantics (an element
    fails only if abs > atol AND rel > rtol): max over elements of min(abs/atol, rel/rtol), over every input set
    and output. <= 1 exactly when the verdict passes; a margin m accepts a plan when this is <= m."""
    import numpy as np

    from bisector.compare import EPSILON
    try:
        from bisector.fp16.plan import Plan
    except ImportError:
        from bisector.plan import Plan  # type: ignore[no-redef]

    plan = Plan(fs, j.catalog.candidates)
    worst = 0.0
    for feeds, golden in zip(j.feeds_list, j.golden.outputs):
        outs = j.backend.run(plan, feeds, list(golden))
        for name, g in golden.items():
            gg = np.asarray(g, np.float64)
            d = np.abs(np.asarray(outs[name], np.float64) - gg)
            with np.errstate(all="ignore"):
                rel = d / np.where(gg == 0, EPSILON, np.abs(gg))
                s = np.minimum(d / atol, rel / rtol)
            s = np.where(np.isnan(s), np.inf, s)
            worst = max(worst, float(s.max()) if s.size else 0.0)
    return worst


def plans_of(row: dict) -> dict[str, list[str] | str]:
    """label -> FP32 set: all-FP16, every distinct set found, all-FP32."""
    plans: dict = {"all_fp16": []}
    for m, r in row["searches"].items():
        if "fp32" in r:
            plans[f"m{m}"] = r["fp32"]
    plans["all_fp32"] = "ALL"
    return plans


def judge_case(case: dict, row: dict, backends: list[str], patch=None) -> dict:
    res: dict = {}
    for backend in backends:
        j = job(case, backend)
        try:
            if patch is not None:
                patch(j)
            cands = j.catalog.candidates
            seen: dict[frozenset, dict] = {}
            out = {}
            for label, s in plans_of(row).items():
                fs = frozenset(cands) if s == "ALL" else frozenset(s)
                if fs not in seen:
                    v = j.oracle().evaluate(fs)
                    seen[fs] = {"passed": v.passed, "excess": round(elem_excess(j, fs, case["tolerance"], case["rtol"]), 5),
                                "excess_stat": round(excess(v), 5)}
                out[label] = seen[fs]
            res[backend] = out
            if backend == "ort-cuda":
                res["ort_cpu_fallback"] = {k: v.get("nodes", []) for k, v in getattr(j.backend, "cpu_fallback", {}).items()
                                           if v.get("nodes")}
        finally:
            j.close()
    return res


def cmd_judge(a) -> int:
    sets = json.loads(Path(a.sets).read_text())
    cs = cases(Path(a.models))
    backends = a.backends.split(",")
    if "ort-cuda" in backends:
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            backends.remove("ort-cuda")
            print("no CUDA provider: judging on emulate only", flush=True)
    out = {"machine": machine(), "backends": backends, "cases": {}}
    for name, row in sets["cases"].items():
        t0 = time.perf_counter()
        try:
            out["cases"][name] = judge_case(cs[name], row, backends)
        except Exception as e:  # noqa: BLE001
            out["cases"][name] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
        print(f"{name:18s} {time.perf_counter() - t0:.1f}s " + json.dumps(out["cases"][name])[:400], flush=True)
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


# ---- CPU variants ----------------------------------------------------------------------------------------------
def variants() -> dict:
    """name -> function(SessionOptions) applied to every session of the emulate executor."""
    import onnxruntime as ort

    L = ort.GraphOptimizationLevel

    def v(level=None, threads=None, config=None):
        def f(so):
            if level is not None:
                so.graph_optimization_level = level
            if threads is not None:
                so.intra_op_num_threads = threads
            for k, val in (config or {}).items():
                so.add_session_config_entry(k, val)
        return f

    return {
        "default": v(),
        "threads1": v(threads=1),
        "threads4": v(threads=4),
        "opt_extended(no NCHWc)": v(level=L.ORT_ENABLE_EXTENDED),
        "opt_basic": v(level=L.ORT_ENABLE_BASIC),
        "opt_disabled": v(level=L.ORT_DISABLE_ALL),
        "no_NchwcTransformer": v(config={}),  # filled below through disabled_optimizers
        "disable_prepacking": v(config={"session.disable_prepacking": "1"}),
        "denormal_as_zero": v(config={"session.set_denormal_as_zero": "1"}),
        "opt_disabled+threads1+no_prepack": v(level=L.ORT_DISABLE_ALL, threads=1,
                                              config={"session.disable_prepacking": "1"}),
    }


def patch_executor(name: str, fn):
    def patch(j):
        ex = getattr(j.backend, "executor", None)
        if ex is None:  # opened lazily
            j.backend.open(j.catalog)
            ex = j.backend.executor
        fn(ex._opts)
        if name == "no_NchwcTransformer":
            ex._disabled_optimizers = ["NchwcTransformer"]
            _wrap_disabled(ex)
        ex._sessions.clear()
    return patch


def _wrap_disabled(ex) -> None:
    import onnxruntime as ort

    real = ort.InferenceSession

    class _S(real):  # type: ignore[misc,valid-type]
        def __init__(self, model, sess_options=None, providers=None, **kw):
            kw.setdefault("disabled_optimizers", ex._disabled_optimizers)
            super().__init__(model, sess_options, providers=providers, **kw)

    bex = _executor_module()
    bex.ort.InferenceSession = _S  # type: ignore[attr-defined]


def _executor_module():
    try:
        import bisector.backends.emulate.executor as bex
    except ImportError:
        import bisector.executor as bex  # type: ignore[no-redef]
    return bex


def cmd_cpu(a) -> int:
    sets = json.loads(Path(a.sets).read_text())
    cs = cases(Path(a.models))
    out = {"machine": machine(), "cases": {}}
    vs = variants()
    wanted = set(filter(None, a.variants.split(","))) if a.variants else set(vs)
    import onnxruntime as ort

    real = ort.InferenceSession
    for name, row in sets["cases"].items():
        out["cases"][name] = {}
        for vname, fn in vs.items():
            if vname not in wanted:
                continue
            try:
                r = judge_case(cs[name], row, ["emulate"], patch=patch_executor(vname, fn))["emulate"]
            except Exception as e:  # noqa: BLE001
                r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            finally:
                _executor_module().ort.InferenceSession = real  # type: ignore[attr-defined]
            out["cases"][name][vname] = r
        base = out["cases"][name].get("default", {})
        diffs = {v: {p: (base[p]["excess"], r[p]["excess"]) for p in r if p in base and r[p]["excess"] != base[p]["excess"]}
                 for v, r in out["cases"][name].items() if v != "default" and "error" not in r}
        print(f"{name:18s} " + json.dumps({k: v for k, v in diffs.items() if v})[:600], flush=True)
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


# ---- report ----------------------------------------------------------------------------------------------------
def cmd_report(a) -> int:
    sets = json.loads(Path(a.sets).read_text())
    judge = json.loads(Path(a.judge).read_text()) if a.judge else {"cases": {}}
    print(report(sets, judge, a.max_growth, a.target, a.emu))
    return 0


def report(sets: dict, judge: dict, max_growth: float = 1.2, target: float = 0.9, emu_key: str = "emulate") -> str:
    margins = [f"{m:g}" for m in sets["margins"]]
    lines = ["| case | tol | all-FP16 excess (emu / GPU) | " + " | ".join(f"m={m}: size, emu, GPU" for m in margins) + " |",
             "|---|---|---|" + "---|" * len(margins)]
    per_margin = {m: {"ok": 0, "n": 0, "small": 0} for m in margins}
    for name, row in sets["cases"].items():
        jc = judge["cases"].get(name, {})
        emu, gpu = jc.get(emu_key, {}), jc.get("ort-cuda", {})
        f = lambda d, k: f"{d[k]['excess']:.3g}" if k in d else "–"  # noqa: E731
        cells = []
        base = row["searches"].get("1", {}).get("size")
        for m in margins:
            r = row["searches"].get(m, {})
            if "size" not in r:
                cells.append("–")
                continue
            k = f"m{m}"
            ok = k in gpu and gpu[k]["passed"]
            mark = "" if k not in gpu else (" ✓" if ok else " ✗")
            cells.append(f"{r['size']}, {f(emu, k)}, {f(gpu, k)}{mark}")
            if k in gpu:
                pm = per_margin[m]
                pm["n"] += 1
                pm["ok"] += ok
                pm["small"] += bool(base) and r["size"] <= max_growth * base
        lines.append(f"| {name} | {row['tolerance']:g} | {f(emu, 'all_fp16')} / {f(gpu, 'all_fp16')} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| margin | cases judged on GPU | hold on GPU | size ≤ %.1f× the m=1 set | both |" % max_growth)
    lines.append("|---|---|---|---|---|")
    for m, pm in per_margin.items():
        both = sum(1 for name, row in sets["cases"].items() if _both(row, judge, name, m, max_growth))
        lines.append(f"| {m} | {pm['n']} | {pm['ok']} | {pm['small']} | {both} |")
    return "\n".join(lines)


def _both(row, judge, name, m, max_growth) -> bool:
    gpu = judge["cases"].get(name, {}).get("ort-cuda", {})
    r = row["searches"].get(m, {})
    base = row["searches"].get("1", {}).get("size")
    k = f"m{m}"
    return k in gpu and gpu[k]["passed"] and bool(base) and r.get("size", 1e9) <= max_growth * base


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    models = str(Path(tempfile.gettempdir()) / "bisector-thin-models")
    s = sub.add_parser("search")
    s.add_argument("--out", required=True)
    s.add_argument("--models", default=models)
    s.add_argument("--cases", default="")
    s.add_argument("--margins", default="")
    s.add_argument("--arith", default="storage", help="--fp16-arithmetic of the searches")
    j = sub.add_parser("judge")
    j.add_argument("--sets", required=True)
    j.add_argument("--out", required=True)
    j.add_argument("--models", default=models)
    j.add_argument("--backends", default="emulate,emulate-gpu,ort-cuda")
    c = sub.add_parser("cpu")
    c.add_argument("--sets", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--models", default=models)
    c.add_argument("--variants", default="")
    r = sub.add_parser("report")
    r.add_argument("--sets", required=True)
    r.add_argument("--judge", default="")
    r.add_argument("--max-growth", type=float, default=1.2)
    r.add_argument("--target", type=float, default=0.9)
    r.add_argument("--emu", default="emulate", help="judge column for the emulate excess (emulate-gpu for --arith gpu sets)")
    a = ap.parse_args()
    return {"search": cmd_search, "judge": cmd_judge, "cpu": cmd_cpu, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
