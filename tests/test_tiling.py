"""Row tiles (bisector.backends.emulate.tiling): the part of a model around a huge attention score matrix runs a
slice of query rows at a time, with the same results as the whole part at once."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bisector.backends.emulate import executor as ex
from bisector.backends.emulate import tiling
from bisector.backends.emulate.backend import EmulateBackend
from bisector.model.catalog import Catalog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import scale  # noqa: E402


@pytest.fixture
def small_tiles(monkeypatch):
    """Thresholds scaled down so that a test-sized attention (256 tokens: a 256 KB score matrix) is tiled."""
    monkeypatch.setattr(tiling, "TILE_FROM_BYTES", 128 << 10)
    monkeypatch.setattr(tiling, "TILE_BYTES", 32 << 10)
    calls: list[int] = []
    run_tiled = ex.NodeExecutor._run_tiled

    def spy(self, block, values, tiles, run):
        calls.append(tiles)
        return run_tiled(self, block, values, tiles, run)

    monkeypatch.setattr(ex.NodeExecutor, "_run_tiled", spy)
    return calls


def _plans(cat: Catalog, n: int, seed: int = 1) -> list[frozenset[str]]:
    rng = np.random.default_rng(seed)
    return [frozenset(cat.candidates)] + [frozenset(c for c in cat.candidates if rng.random() < 0.5)
                                         for _ in range(n)]


def _runs(cat: Catalog, feeds, plans, tile_from: int, monkeypatch, **backend) -> tuple[list, list]:
    """Every plan fused and node by node; and the executor's blocks."""
    monkeypatch.setattr(tiling, "TILE_FROM_BYTES", tile_from)
    be = EmulateBackend(**backend)
    be.open(cat)
    try:
        out = [be.run(p, feeds) for p in plans] + [be.run_node_by_node(p, feeds) for p in plans]
        return out, be.executor.blocks
    finally:
        be.close()


def _same_bits(a: list[dict], b: list[dict]) -> None:
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape
            np.testing.assert_array_equal(x[k].view(np.uint8), y[k].view(np.uint8))


@pytest.mark.parametrize("backend", [{}, {"arithmetic": "gpu"}, {"storage": "bf16"}])
def test_a_tiled_attention_computes_the_bits_of_the_whole_one(small_tiles, monkeypatch, backend):
    model, _ = scale.transformer_model(2, 64, 256, heads=4)  # scores (1, 4, 256, 256): 1 MB, rows on axis 2
    cat = Catalog.from_model(model)
    x = {"x": np.random.default_rng(5).uniform(-1, 1, (1, 256, 64)).astype(np.float32)}
    plans = _plans(cat, 4)
    whole, blocks0 = _runs(cat, x, plans, 0, monkeypatch, **backend)
    assert not any(b.tile for b in blocks0) and not small_tiles
    tiled, blocks = _runs(cat, x, plans, 128 << 10, monkeypatch, **backend)
    regions = [b for b in blocks if b.tile]
    assert len(regions) == 2  # one per layer: scores' MatMul, scale, Softmax, the MatMul by V, the heads' Transpose
    for b in regions:
        assert [n.op_type for n in b.nodes][:4] == ["MatMul", "Mul", "Softmax", "MatMul"]
        assert b.tile.axis == 2 and b.tile.rows_per_tile == 64
    assert small_tiles and set(small_tiles) == {4}  # 256 rows, 64 a tile: fused and node by node alike
    _same_bits(whole, tiled)


def test_the_vae_decoders_attention_is_tiled_and_its_residual_is_not(small_tiles, monkeypatch):
    # 1024 latent positions: 4 MB of scores; its blocks at 128² (4 channels) hold a few MB
    model = scale.vae_decoder_model(latent=32, channels=(16, 8, 4), groups=4)
    cat = Catalog.from_model(model)
    z = {"z": np.random.default_rng(2).uniform(-1, 1, (1, 4, 32, 32)).astype(np.float32)}
    plans = _plans(cat, 3)
    whole, _ = _runs(cat, z, plans, 0, monkeypatch)
    tiled, blocks = _runs(cat, z, plans, 128 << 10, monkeypatch)
    (region,) = [b for b in blocks if b.tile]
    ops = [n.op_type for n in region.nodes]
    # the output projection is a weight MatMul (row-local), the Transpose back maps the rows to the last axis; the
    # Reshape to an image and the residual Add of the whole input are not row-local: outside
    assert ops == ["MatMul", "Mul", "Softmax", "MatMul", "MatMul", "Transpose"]
    assert region.outputs and all(region.tile.axes[o] == 2 for o in region.outputs)
    assert small_tiles
    _same_bits(whole, tiled)


def _attention(order_v_late: bool = False, softmax_axis: int = -1, residual: bool = False,
               scores_out: bool = False, tokens: int = 256, dim: int = 16, mask: str = "") -> onnx.ModelProto:
    """x (1, T, D) -> Q, K, V projections -> softmax(Q Kᵀ) V (-> + x); optionally with V computed after the
    scores (an exporter's order), a Softmax over the rows, or the scores as a graph output."""
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal((dim, dim)).astype(np.float32), n)
             for n in ("wq", "wk", "wv")]
    v = [helper.make_node("MatMul", ["x", "wv"], ["v"], name="v")]
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
             helper.make_node("MatMul", ["x", "wk"], ["k"], name="k"),
             *([] if order_v_late else v),
             helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
             *(v if order_v_late else []),
             *([helper.make_node("Add", ["s", "mask"], ["sm"], name="masked")] if mask else []),
             helper.make_node("Softmax", ["sm" if mask else "s"], ["p"], name="softmax", axis=softmax_axis),
             helper.make_node("MatMul", ["p", "v"], ["o"], name="apply")]
    out = "o"
    if residual:
        nodes.append(helper.make_node("Add", ["o", "x"], ["y"], name="residual"))
        out = "y"
    outputs = [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)]
    if scores_out:
        outputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, None))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, dim])]
    if mask == "input":  # fed: sliced with the rows
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, tokens, tokens]))
    elif mask == "weight":  # a constant: the executor feeds weights itself, so the region stops before it
        inits.append(onnx.numpy_helper.from_array(
            np.triu(np.full((1, tokens, tokens), -1e4, np.float32), 1), "mask"))
    graph = helper.make_graph(nodes, "attention", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _regions(model: onnx.ModelProto, tile_from: int = 128 << 10) -> list[tiling.Region]:
    cat = Catalog.from_model(model)
    x = {"x": np.zeros(tuple(d.dim_value or 256 for d in model.graph.input[0].type.tensor_type.shape.dim),
                       np.float32)}
    nodes = [n for n in cat.model.graph.node if not cat.computes_weight(n)]
    return tiling.find_regions(nodes, cat.weights, tiling.concrete_shapes(cat.model, x), cat.tensor_types,
                               set(cat.output_names), 17, tile_from=tile_from)


def test_where_a_region_ends():
    (r,) = _regions(_attention())
    assert r.nodes == ("scores", "softmax", "apply") and r.entry == "q" and r.axis == 1 and not r.co
    # the residual Add reads x, as long as the rows: x is sliced with them, and the Add is in the region
    (r,) = _regions(_attention(residual=True))
    assert r.nodes == ("scores", "softmax", "apply", "residual") and r.co == {"x": 1}
    assert _regions(_attention(softmax_axis=1)) == []  # a Softmax across the rows mixes them: not row-local
    assert _regions(_attention(scores_out=True)) == []  # the huge tensor leaves the region: nothing saved
    assert _regions(_attention(), tile_from=2 << 20) == []  # 256 KB scores: under the threshold
    assert _regions(_attention(), tile_from=0) == []  # BISECTOR_TILE_FROM_MB=0: never



def test_a_region_is_tiled_only_where_its_block_holds_more_than_any_other(small_tiles, monkeypatch):
    """Where another block holds about as much as the region's whole run, the chunks that run leaves in ONNX
    Runtime's arena serve that block later, and tiles only add chunks of their own: not tiled."""
    cat = Catalog.from_model(_attention(residual=True))
    x = {"x": np.zeros((1, 256, 16), np.float32)}
    for over, tiled in ((1.5, True), (100.0, False)):  # its block holds 576 KB, the projections' 80 KB
        monkeypatch.setattr(tiling, "OVER_OTHERS", over)
        be = EmulateBackend()
        be.open(cat)
        be.run(frozenset(), x)
        assert any(b.tile for b in be.executor.blocks) is tiled
        be.close()


def test_nodes_between_a_regions_members_run_before_it(small_tiles, monkeypatch):
    """An exporter computes V after the scores: the region's block must run V's MatMul first."""
    model = _attention(order_v_late=True, residual=True)
    (r,) = _regions(model)
    assert r.nodes == ("scores", "softmax", "apply", "residual")
    cat = Catalog.from_model(model)
    nodes = [n for n in cat.model.graph.node if not cat.computes_weight(n)]
    order = [n.name for n in tiling.arrange(nodes, [r])]
    assert order.index("v") < order.index("scores") and order[-1] == "residual"
    x = {"x": np.random.default_rng(3).uniform(-1, 1, (1, 256, 16)).astype(np.float32)}
    plans = _plans(cat, 3)
    whole, _ = _runs(cat, x, plans, 0, monkeypatch)
    tiled, blocks = _runs(cat, x, plans, 128 << 10, monkeypatch)
    assert [b.tile is not None for b in blocks].count(True) == 1 and small_tiles
    _same_bits(whole, tiled)


def test_shapes_are_inferred_only_where_a_matmul_of_two_computed_tensors_may_be_huge(monkeypatch):
    """The first reference run infers every tensor's shape at its inputs (~0.1 ms a node) only where the model
    has an attention-like MatMul whose output the catalog could not size, or sized at TILE_FROM_BYTES or more."""
    asked: list[int] = []

    def infer(model, feeds):
        asked.append(1)
        return {}

    monkeypatch.setattr(tiling, "concrete_shapes", infer)
    transformer, _ = scale.transformer_model(1, 32, 16, heads=2)
    dynamic = _attention()
    dynamic.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "tokens"
    cases = [(scale.matmul_chain_model(40), False),  # MatMuls by weights only
             (transformer, False),  # scores (1, 2, 16, 16) known from the declared shapes: 2 KB
             (dynamic, True)]  # an attention whose tokens are unknown until the inputs come
    for model, expected in cases:
        asked.clear()
        cat = Catalog.from_model(model)
        feeds = {i.name: np.zeros([d.dim_value or 16 for d in i.type.tensor_type.shape.dim], np.float32)
                 for i in cat.model.graph.input}
        be = EmulateBackend()
        be.open(cat)
        be.run(frozenset(cat.candidates), feeds)
        be.run(frozenset(), feeds)
        be.close()
        assert bool(asked) is expected and len(asked) <= 1
    monkeypatch.setattr(tiling, "TILE_FROM_BYTES", 1024)  # the static transformer's 2 KB scores: asked now
    asked.clear()
    be = EmulateBackend()
    be.open(Catalog.from_model(transformer))
    be.run(frozenset(), {"x": np.zeros((1, 16, 32), np.float32)})
    be.close()
    assert asked == [1]


def test_inputs_of_other_shapes_run_whole(small_tiles, monkeypatch):
    """Row-locality was shown at the shapes of the first inputs (a broadcast along the rows holds for those):
    inputs of another shape later (a part of the batch, another input set) run the region whole, with the same
    results as an executor that never tiles."""
    model = _attention(residual=True)
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "tokens"
    cat = Catalog.from_model(model)
    rng = np.random.default_rng(4)
    first = {"x": rng.uniform(-1, 1, (1, 256, 16)).astype(np.float32)}
    other = {"x": rng.uniform(-1, 1, (1, 320, 16)).astype(np.float32)}
    plans = _plans(cat, 2)
    results = {}
    for tile_from in (0, 128 << 10):
        monkeypatch.setattr(tiling, "TILE_FROM_BYTES", tile_from)
        be = EmulateBackend()
        be.open(cat)
        be.run(frozenset(), first)
        small_tiles.clear()
        results[tile_from] = [be.run(p, other) for p in plans]
        assert not small_tiles  # never tiled at 320 tokens
        assert any(b.tile for b in be.executor.blocks) is bool(tile_from)
        be.close()
    _same_bits(results[0], results[128 << 10])


def test_a_mask_as_long_as_the_rows_is_sliced_with_them(small_tiles, monkeypatch):
    """A causal mask added to the scores is read row by row with them: a fed one is sliced along, and the tiled
    runs compute the whole ones' bits; a constant one (a weight, which sessions hold whole) ends the region."""
    model = _attention(mask="input")
    (r,) = _regions(model)
    assert r.nodes == ("scores", "masked", "softmax", "apply") and r.co == {"mask": 1}
    assert _regions(_attention(mask="weight")) == []  # the scores leave the region for the masked Add
    cat = Catalog.from_model(model)
    rng = np.random.default_rng(6)
    x = {"x": rng.uniform(-1, 1, (1, 256, 16)).astype(np.float32),
         "mask": np.triu(np.full((1, 256, 256), -1e4, np.float32), 1)}
    plans = _plans(cat, 3)
    whole, _ = _runs(cat, x, plans, 0, monkeypatch)
    tiled, blocks = _runs(cat, x, plans, 128 << 10, monkeypatch)
    assert any(b.tile for b in blocks) and small_tiles
    _same_bits(whole, tiled)
