"""Device: the GPU's excess of the all-FP32 plan (and of all-FP16 and of a set, if given) on ort-cuda at margin 1.
An all-FP32 plan should give ~0: where it does not, the GPU's "FP32" kernels are not FP32 (TF32, or another
algorithm) and every verdict carries that error. Run it twice, once with NVIDIA_TF32_OVERRIDE=0, to see TF32's part.

    python3 fp32_excess.py MODEL --atol A --rtol R [--input-shapes ...] [--constraints constraints.json]
"""
import argparse
import json
import os

from bisector.app.job import open_job


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--atol", required=True)
    ap.add_argument("--rtol", required=True)
    ap.add_argument("--input-shapes", nargs="*", default=[])
    ap.add_argument("--constraints", default=None)
    a = ap.parse_args()
    row = {"NVIDIA_TF32_OVERRIDE": os.environ.get("NVIDIA_TF32_OVERRIDE")}
    for backend in ("ort-cuda", "emulate"):
        job = open_job(a.model, atol=[a.atol], rtol=[a.rtol], margin=1.0, no_cache=True, input_shapes=a.input_shapes,
                       backend=backend)
        cands = list(job.catalog.candidates)
        row[backend] = {"all FP32": round(job.judge(job.plan(cands)).excess, 4),
                        "all FP16": round(job.judge(job.plan([])).excess, 4)}
        if a.constraints:
            fp32 = json.load(open(a.constraints))["fp32_nodes"]
            row[backend]["set"] = round(job.judge(job.plan(fp32)).excess, 4)
            lstm = [c for c in cands if job.catalog.nodes[c].op_type in ("LSTM", "GRU", "RNN")]
            if lstm:  # the set with its recurrent nodes FP16 / FP32 swapped in
                flip = [c for c in fp32 if c not in lstm] + [c for c in lstm if c not in fp32]
                row[backend]["set, recurrent flipped"] = round(job.judge(job.plan(flip)).excess, 4)
        job.close()
    print(json.dumps(row))


if __name__ == "__main__":
    main()
