"""Device (twenty-second round): recorded sets judged on ort-cuda at margin 1 under ORT's default cuDNN algorithm
search and under HEURISTIC: the excess, one JSON line per set.

    python3 sets_excess.py MODEL TOL SHAPE constraints.json ...
"""
import json
import os
import sys

from bisector.app.job import open_job

model, tol, shape, sets = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
for variant in ("", "cudnn_conv_algo_search=HEURISTIC"):
    os.environ["BISECTOR_ORT_CUDA_OPTIONS"] = variant
    job = open_job(model, backend="ort-cuda", atol=[tol], rtol=[tol], margin=1.0, no_cache=True, input_shapes=[shape])
    for path in sets:
        fp32 = json.load(open(path))["fp32_nodes"]
        print(json.dumps({"variant": variant or "default (EXHAUSTIVE)", "set": os.path.basename(path), "size": len(fp32),
                          "excess": round(job.judge(job.plan(fp32)).excess, 3)}), flush=True)
    job.close()
