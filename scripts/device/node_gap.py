"""Device: where the emulator and the GPU disagree, node by node. For one model and tolerance: each candidate alone
in FP16 (everything else FP32), judged by emulate (storage and gpu arithmetic) and by ort-cuda at margin 1; prints
the candidates whose GPU excess differs most from the emulator's, with their op types. One JSON object.

    python3 node_gap.py MODEL --atol A --rtol R [--input-shapes ...] [--val-range ...] [--top 15]
"""
import argparse
import json

from bisector.app.job import open_job


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--atol", required=True)
    ap.add_argument("--rtol", required=True)
    ap.add_argument("--input-shapes", nargs="*", default=[])
    ap.add_argument("--val-range", nargs="*", default=[])
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    opts = dict(atol=[a.atol], rtol=[a.rtol], margin=1.0, no_cache=True, input_shapes=a.input_shapes,
                val_range=a.val_range)
    excess = {}
    ops = {}
    for name, extra in (("ort-cuda", dict(backend="ort-cuda")), ("storage", dict(backend="emulate")),
                        ("gpu", dict(backend="emulate", fp16_arithmetic="gpu"))):
        job = open_job(a.model, **opts, **extra)
        cands = list(job.catalog.candidates)
        ops = {c: job.catalog.nodes[c].op_type for c in cands}
        excess[name] = {c: job.judge(job.plan([x for x in cands if x != c])).excess for c in cands}
        excess[name]["<all FP16>"] = job.judge(job.plan([])).excess
        job.close()
    rows = sorted(excess["storage"], key=lambda c: -abs(excess["ort-cuda"][c] - excess["storage"][c]))
    print(json.dumps({"model": a.model, "tolerance": [a.atol, a.rtol], "all FP16": {k: v["<all FP16>"] for k, v in excess.items()},
                      "largest gaps": [{"node": c, "op": ops.get(c), **{k: round(v[c], 4) for k, v in excess.items()}}
                                       for c in rows[: a.top]]}, indent=1))


if __name__ == "__main__":
    main()
