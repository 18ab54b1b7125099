"""Device: one line comparing two searches' records (emulate's and ort-cuda's constraints.json): set sizes, the
nodes in common, new evaluations. Used by round25_audio.sh and round27_users.sh.

    python3 compare_sets.py EMULATE/constraints.json ORT_CUDA/constraints.json
"""
import json
import sys

e, g = (json.load(open(p)) for p in sys.argv[1:3])
print("sets: emulate %d, ort-cuda %d, common %d; evaluations %s / %s" % (
    len(e["fp32_nodes"]), len(g["fp32_nodes"]), len(set(e["fp32_nodes"]) & set(g["fp32_nodes"])),
    e["evaluations"]["new"], g["evaluations"]["new"]))
