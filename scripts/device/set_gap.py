"""Device (twenty-second round): from a recorded set S (FP32), move each other candidate x to FP32 too: excess of S and S+{x} on ort-cuda and on
the emulator (gpu arithmetic) at margin 1. The x whose FP32 lowers the GPU's excess most is where the GPU's FP16
differs in this plan.

    python3 set_gap.py MODEL constraints.json ATOL RTOL [INPUT_SHAPES ...]
"""
import json, sys
from bisector.app.job import open_job
model, cons, atol, rtol, shapes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
S = frozenset(json.load(open(cons))["fp32_nodes"])
res = {}
for name, extra in (("cuda", dict(backend="ort-cuda")), ("gpu", dict(backend="emulate", fp16_arithmetic="gpu")),
                    ("storage", dict(backend="emulate"))):
    job = open_job(model, atol=[atol], rtol=[rtol], margin=1.0, no_cache=True, input_shapes=shapes, **extra)
    o = job.oracle()
    cands = list(o.candidates)
    def ex(s):
        return round(o.evaluate(frozenset(s), count=False).excess, 3)
    row = {"S": ex(S), "all16": ex(()), "all32": ex(cands)}
    for x in cands:
        if x not in S:
            row[x] = ex(S | {x})
    res[name] = row
    ops = {c: job.catalog.nodes[c].op_type for c in cands}
    job.close()
print("S", {k: res[k]["S"] for k in res}, "all16", {k: res[k]["all16"] for k in res}, "all32", {k: res[k]["all32"] for k in res})
xs = [x for x in res["cuda"] if x not in ("S", "all16", "all32")]
xs.sort(key=lambda x: res["cuda"][x])
for x in xs[:12]:
    print(x, ops[x], "cuda", res["cuda"][x], "gpu", res["gpu"][x], "storage", res["storage"][x])
