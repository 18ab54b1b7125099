"""On every fixture and test-vector model, random plans agree three ways: the fused block evaluation, the
node-by-node evaluation, and the mixed-precision ONNX run node by node. A few plans per model in `make test`,
sixty per model in `make test-slow`; plus the planted graph at 64 x 64 searched by every 1-minimal strategy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bisector.backends.emulate.backend import EmulateBackend
from bisector.model.catalog import Catalog
from bisector.backends.emulate.executor import NodeExecutor
from bisector.model.inputs import generate_inputs
from bisector.fp16.mixed import build_mixed_model
from bisector.fp16.plan import Plan
from bisector.values import parse_input_shapes, parse_val_range

from .conftest import FIXTURES, TESTVECTORS

CONSTRUCTS = FIXTURES / "constructs"
INDEX = json.loads((CONSTRUCTS / "constructs.json").read_text())


def _cases():
    yield "needs_constraints", FIXTURES / "needs_constraints.onnx", ["--val-range", "x:[1,2]"]
    yield "planted", FIXTURES / "planted.onnx", ["--val-range", "x:[0,1]"]
    yield "exported_cnn", FIXTURES / "exported" / "cnn.onnx", []
    yield ("exported_encoder", FIXTURES / "exported" / "encoder.onnx",
           ["--val-range", "ids:[0,999]", "--val-range", "mask:[1,1]", "--input-shapes", "ids:[1,32]",
            "--input-shapes", "mask:[1,32]"])
    for name, meta in sorted(INDEX.items()):
        yield name, CONSTRUCTS / f"{name}.onnx", meta["args"]
    for case in sorted(p.name for p in TESTVECTORS.iterdir() if p.is_dir()):
        yield f"tv_{case}", TESTVECTORS / case / "model.onnx", None


def _values(args, flag):
    out, it = [], iter(args or [])
    for tok in it:
        if tok == flag:
            out.append(next(it))
    return out


def _same(a: np.ndarray, b: np.ndarray, what: str) -> None:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=what)
    np.testing.assert_array_equal(np.isposinf(a), np.isposinf(b), err_msg=what)
    fin = np.isfinite(b)
    np.testing.assert_allclose(a[fin], b[fin], rtol=1e-6, atol=1e-6, err_msg=what)


@pytest.mark.parametrize("name,path,args", list(_cases()), ids=[c[0] for c in _cases()])
def test_random_plans_agree_three_ways(name, path, args):
    _agree(name, path, args, per_fraction=1)


@pytest.mark.slow
@pytest.mark.parametrize("name,path,args", list(_cases()), ids=[c[0] for c in _cases()])
def test_many_random_plans_agree_three_ways(name, path, args):
    _agree(name, path, args, per_fraction=12, seed=99)


def _agree(name, path, args, per_fraction: int, seed: int = 0):
    cat = Catalog.load(path)
    if args is None:
        feeds = dict(np.load(path.parent / "inputs.npz"))
    else:
        feeds = generate_inputs(cat, parse_val_range(_values(args, "--val-range")),
                                parse_input_shapes(_values(args, "--input-shapes")), seed=3)[0]
    be = EmulateBackend()
    be.open(cat)
    rng = np.random.default_rng(len(cat.candidates) + seed)
    plans = [frozenset(), frozenset(cat.candidates)]
    plans += [frozenset(n for n in cat.candidates if rng.random() < p) for p in (0.1, 0.3, 0.5, 0.7, 0.9) * per_fraction]
    for fp32 in plans:
        plan = Plan(fp32, cat.candidates)
        fused = be.run(plan, feeds)
        single = be.run_all(plan, feeds)
        mixed = NodeExecutor(Catalog.from_model(build_mixed_model(cat, plan))).run_reference(feeds)
        for out in cat.output_names:
            _same(fused[out], single[out], f"{name} {sorted(fp32)[:5]}: fused vs node by node, {out}")
            _same(mixed[out], single[out], f"{name} {sorted(fp32)[:5]}: mixed ONNX vs emulate, {out}")


@pytest.mark.slow
def test_planted_at_64x64_every_one_minimal_strategy_finds_the_planted_set(tmp_path):
    """The planted graph with 64 x 64 images (attention over 4096 tokens): a real-model-sized search."""
    import importlib.util

    import onnx

    from .conftest import main_cli, planted_spec

    spec_mod = importlib.util.spec_from_file_location("gen", FIXTURES / "generate.py")
    gen = importlib.util.module_from_spec(spec_mod)
    spec_mod.loader.exec_module(gen)
    gen.H = gen.W = 64
    model, planted = gen.planted_model()
    path = tmp_path / "planted64.onnx"
    onnx.save(model, path)
    spec = planted_spec()
    for strategy in ("auto", "greedy", "ddmin"):
        out = tmp_path / strategy
        assert main_cli("precision", path, "--fp16", *spec["args"], "--strategy", strategy, "-o", out,
                        "--cache-dir", tmp_path / "cache") == 0
        c = json.loads((out / "constraints.json").read_text())
        assert c["fp32_nodes"] == sorted(planted) and c["minimal"], strategy
