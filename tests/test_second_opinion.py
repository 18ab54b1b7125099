"""The final set judged a second way on emulate: every node of its FP16 cone run alone (bisector.app.second_opinion).

ONNX Runtime fuses FP32 nodes inside a block (a Conv with the BatchNormalization after it) and may compute an FP32
value an ulp away from the nodes run alone; near FP16's resolution a later rounding then goes the other way.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bisector.app import api
from bisector.backends.emulate import executor as executor_mod
from bisector.backends.emulate.backend import EmulateBackend
from bisector.fp16.plan import Plan
from bisector.fp16.points import rounding_points
from bisector.model.catalog import Catalog

from .conftest import PLANTED, main_cli


def conv_bn_model(layers: int = 6, channels: int = 8, size: int = 24, seed: int = 0) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu (HardSigmoid·x every other layer): the pattern ONNX Runtime folds and
    fuses inside a session, as in the mobile OCR models where fused and node-by-node verdicts were seen to differ."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = "x"
    for i in range(layers):
        w = rng.normal(0, 0.4, (channels, 3 if i == 0 else channels, 3, 3)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"),
                  numpy_helper.from_array(rng.uniform(0.5, 2, channels).astype(np.float32), f"s{i}"),
                  numpy_helper.from_array(rng.normal(0, 0.3, channels).astype(np.float32), f"b{i}"),
                  numpy_helper.from_array(rng.normal(0, 0.3, channels).astype(np.float32), f"m{i}"),
                  numpy_helper.from_array(rng.uniform(0.5, 2, channels).astype(np.float32), f"v{i}")]
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("BatchNormalization", [f"c{i}", f"s{i}", f"b{i}", f"m{i}", f"v{i}"], [f"n{i}"],
                                   name=f"bn{i}")]
        if i % 2:
            nodes += [helper.make_node("HardSigmoid", [f"n{i}"], [f"h{i}"], name=f"hsig{i}"),
                      helper.make_node("Mul", [f"n{i}", f"h{i}"], [f"a{i}"], name=f"hswish{i}")]
        else:
            nodes.append(helper.make_node("Relu", [f"n{i}"], [f"a{i}"], name=f"relu{i}"))
        x = f"a{i}"
    nodes += [helper.make_node("GlobalAveragePool", [x], ["pooled"], name="pool"),
              helper.make_node("Flatten", ["pooled"], ["y"], name="flatten")]
    graph = helper.make_graph(nodes, "conv_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                               [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _plans(cat: Catalog, n: int, seed: int = 0) -> list[Plan]:
    rng = np.random.default_rng(seed)
    return [Plan(frozenset(c for c in cat.candidates if rng.random() < p), cat.candidates)
            for p in np.linspace(0.05, 0.95, n)]


def _backend(model: onnx.ModelProto, block_size: int = 8) -> tuple[EmulateBackend, Catalog]:
    cat = Catalog.from_model(model)
    be = EmulateBackend(block_size=block_size)
    be.open(cat)
    return be, cat


def test_fused_blocks_without_an_fp32_pair_give_the_bits_of_every_node_run_alone(monkeypatch):
    """run_node_by_node runs fused the blocks where no FP32 node feeds another (rounding Cast pairs between all
    of their nodes leave ONNX Runtime nothing to fuse): their bits equal every touched block run node by node, on
    random plans of a model where fusion does change bits (checked here, or the test proves nothing)."""
    be, cat = _backend(conv_bn_model())
    x = {"x": np.random.default_rng(3).normal(0, 1, (1, 3, 24, 24)).astype(np.float32)}
    fused_differs = 0
    for plan in _plans(cat, 24):
        fused, alone = be.run(plan, x)["y"], be.run_node_by_node(plan, x)["y"]
        with monkeypatch.context() as m:
            m.setattr(executor_mod._Block, "fp32_pair", lambda self, fp16: True)
            every = be.run_node_by_node(plan, x)["y"]
        np.testing.assert_array_equal(alone, every)
        fused_differs += not np.array_equal(fused, alone)
    assert fused_differs >= 3  # ONNX Runtime's fusions moved the outputs' bits on these plans


def test_node_by_node_holds_only_the_live_tensors():
    """A node-by-node run returns the blocks' outputs only (block-internal tensors dropped as a fused run drops
    them), so the check costs a fused evaluation's memory, not run_all's every tensor."""
    be, cat = _backend(conv_bn_model())
    x = {"x": np.random.default_rng(3).normal(0, 1, (1, 3, 24, 24)).astype(np.float32)}
    plan = Plan(frozenset(n for n in cat.candidates if n.startswith(("bn", "relu", "hsig"))), cat.candidates)
    assert any(b.fp32_pair(plan.fp16) for b in be.executor.blocks)
    changed = be.executor.run_changed(be._boundary_reference(x), rounding_points(cat, plan), per_node=True)
    assert set(changed) <= set(cat.output_names)
    every = be.executor.run_changed(be.reference(x), rounding_points(cat, plan), fused=False)
    assert len(every) > 3 * len(cat.output_names)


def _disagreeing(monkeypatch, culprit: str, factor: float = 50.0) -> None:
    """Make the node-by-node judge disagree: where `culprit` is FP16, its run moves the outputs by `factor` x
    their FP16 error (what an FP32 ulp flipping a later rounding can do), while the fused judge is unchanged."""
    real = EmulateBackend.run_node_by_node

    def run_node_by_node(self, plan, feeds, outputs=None):
        out = real(self, plan, feeds, outputs)
        if culprit not in plan.fp16:
            return out
        ref = self.reference(feeds)
        return {k: ref[k] + factor * (v - ref[k]) + np.float32(1e-2) for k, v in out.items()}

    monkeypatch.setattr(EmulateBackend, "run_node_by_node", run_node_by_node)


def test_by_default_a_set_that_fails_node_by_node_is_kept_and_said_to_sit_at_the_edge(monkeypatch, tmp_path,
                                                                                       caplog, capsys):
    plain = api.precision(PLANTED, output_dir=None, atol=1e-1, no_cache=True)
    culprit = next(n for n in api_candidates(PLANTED) if n not in plain.fp32_nodes)
    _disagreeing(monkeypatch, culprit)
    with caplog.at_level(logging.WARNING, logger="bisector"):
        r = api.precision(PLANTED, output_dir=tmp_path / "out", atol=1e-1, no_cache=True)
    assert r.passed and r.fp32_nodes == plain.fp32_nodes
    nbn = r.constraints.node_by_node
    assert nbn["passed"] is False and nbn["searched_set_passed"] is False and nbn["extended"] is False
    assert nbn["evaluations"] == 1 and nbn["excess"] > 1
    assert "not with every node run alone" in caplog.text and "--confirm-on ort-cuda" in caplog.text
    assert "**Fails with every node run alone**" in (tmp_path / "out" / "report.md").read_text()
    assert main_cli("precision", str(PLANTED), "--fp16", "--atol", "1e-1", "--no-cache", "-o",
                    str(tmp_path / "cli")) == 0
    assert "fails with every node run alone: at the edge of the tolerance" in capsys.readouterr().out


def test_second_opinion_search_goes_on_until_a_set_passes_both_ways(monkeypatch, tmp_path, caplog):
    plain = api.precision(PLANTED, output_dir=None, atol=1e-1, no_cache=True)
    culprit = next(n for n in api_candidates(PLANTED) if n not in plain.fp32_nodes)
    _disagreeing(monkeypatch, culprit)
    with caplog.at_level(logging.WARNING, logger="bisector"):
        r = api.precision(PLANTED, output_dir=tmp_path / "out", atol=1e-1, no_cache=True, second_opinion="search")
    assert r.passed and culprit in r.fp32_nodes
    nbn = r.constraints.node_by_node
    assert nbn["searched_set_passed"] is False and nbn["extended"] is True and nbn["passed"] is True
    assert nbn["evaluations"] > 1
    assert "not with every node run alone" in caplog.text
    assert r.constraints.evaluations.total > plain.constraints.evaluations.total
    assert r.constraints.timings["second_opinion"] > 0
    written = json.loads((tmp_path / "out" / "constraints.json").read_text())
    assert written["node_by_node"] == nbn and culprit in written["fp32_nodes"]
    assert "The search's set failed with every node run alone" in (tmp_path / "out" / "report.md").read_text()
    # without the second opinion the search's own set stands
    off = api.precision(PLANTED, output_dir=None, atol=1e-1, no_cache=True, second_opinion="off")
    assert culprit not in off.fp32_nodes and off.constraints.node_by_node is None


def api_candidates(model) -> list[str]:
    return list(Catalog.load(model).candidates)


def test_a_set_that_passes_both_ways_is_recorded_and_kept():
    r = api.precision(PLANTED, output_dir=None, atol=1e-1, no_cache=True)
    nbn = r.constraints.node_by_node
    assert nbn["passed"] and nbn["searched_set_passed"] and not nbn["extended"] and nbn["evaluations"] in (0, 1)
    assert nbn["excess"] == pytest.approx(r.verdict.excess)


def test_a_cone_without_fused_fp32_nodes_needs_no_second_run():
    """All FP16: every value inside a block passes a rounding Cast pair, nothing fuses, no run is needed; a plan
    whose cone has FP32 nodes feeding each other needs one. The runs agree where none is needed."""
    be, cat = _backend(conv_bn_model())
    x = {"x": np.random.default_rng(3).normal(0, 1, (1, 3, 24, 24)).astype(np.float32)}
    none = Plan(frozenset(), cat.candidates)
    assert not be.node_by_node_differs(none)
    np.testing.assert_array_equal(be.run(none, x)["y"], be.run_node_by_node(none, x)["y"])
    assert not be.node_by_node_differs(Plan(frozenset(cat.candidates), cat.candidates))  # nothing FP16
    late = Plan(frozenset(n for n in cat.candidates if n.endswith(("4", "5")) or n in ("pool", "flatten")),
                cat.candidates)  # FP32 pairs only in the last layers
    assert be.node_by_node_differs(late)
    # a whole block FP32 upstream of every FP16 node: not recomputed at all (its outputs are the reference's)
    early = Plan(frozenset(be.executor.blocks[0].node_names), cat.candidates)
    assert be.executor.blocks[0].fp32_pair(early.fp16) and not be.node_by_node_differs(early)
    # one FP16 node in that block: the block is recomputed, and its FP32 pairs fuse
    assert be.node_by_node_differs(Plan(early.fp32 - {be.executor.blocks[0].node_names[-1]}, cat.candidates))


def test_no_evaluation_left_keeps_the_set_and_says_it_fails_node_by_node(monkeypatch, caplog):
    full = api.precision(PLANTED, output_dir=None, atol=1e-1, no_cache=True)
    culprit = next(n for n in api_candidates(PLANTED) if n not in full.fp32_nodes)
    _disagreeing(monkeypatch, culprit)
    budget = full.constraints.evaluations.new
    with caplog.at_level(logging.WARNING, logger="bisector"):
        r = api.precision(PLANTED, output_dir=None, atol=1e-1, no_cache=True, max_evals=budget,
                          second_opinion="search")
    assert r.fp32_nodes == full.fp32_nodes
    assert r.constraints.node_by_node["passed"] is False and r.constraints.node_by_node["extended"] is False
    assert "--max-evals leaves no evaluation" in caplog.text


def test_a_bad_second_opinion_is_a_usage_error(tmp_path, capsys):
    assert main_cli("precision", str(PLANTED), "--fp16", "--no-cache", "--second-opinion", "maybe") == 2
    assert "--second-opinion 'maybe': choose check, search, off" in capsys.readouterr().err


def test_verify_says_a_set_that_fails_node_by_node_sits_at_the_edge(monkeypatch, tmp_path, capsys):
    out = tmp_path / "out"
    r = api.precision(PLANTED, output_dir=out, atol=1e-1, no_cache=True)
    assert main_cli("verify", str(PLANTED), "--constraints", str(out / "constraints.json"), "--no-cache") == 0
    assert "pass node by node" in capsys.readouterr().out
    culprit = next(n for n in api_candidates(PLANTED) if n not in r.fp32_nodes)
    _disagreeing(monkeypatch, culprit)
    v = api.verify(PLANTED, out / "constraints.json", no_cache=True)
    assert v.passed and v.node_by_node is not None and not v.node_by_node.passed
    report = tmp_path / "v.json"
    code = main_cli("verify", str(PLANTED), "--constraints", str(out / "constraints.json"), "--no-cache",
                    "--json", str(report))
    assert code == 0 and "EDGE node by node" in capsys.readouterr().out
    assert json.loads(report.read_text())["node_by_node"]["passed"] is False
    assert main_cli("verify", str(PLANTED), "--constraints", str(out / "constraints.json"), "--no-cache",
                    "--no-second-opinion") == 0
    assert "node by node" not in capsys.readouterr().out


def test_a_block_run_node_by_node_drops_each_internal_tensor_after_its_last_reader():
    """`_Block.release`: every tensor made inside a block and read by no later block is dropped right after its
    last reader inside the block (outer-scope reads of subgraph nodes count: `Catalog.node_inputs`)."""
    be, cat = _backend(conv_bn_model(), block_size=8)
    for block in be.executor.blocks:
        made = {t: i for i, n in enumerate(block.nodes) for t in n.output if t}
        readers = {t: [i for i, n in enumerate(block.nodes) if t in cat.node_inputs(n.name)] for t in made}
        released = {t: i for i, ts in enumerate(block.release) for t in ts}
        assert sum(map(len, block.release)) == len(released)  # each at most once
        for t, i in made.items():
            if t in block.outputs:
                assert t not in released
            else:
                assert released[t] == max([i, *readers[t]])


def test_batch_says_which_models_sit_at_the_edge(monkeypatch, tmp_path):
    plain = api.precision(PLANTED, output_dir=None, atol=1e-1, no_cache=True)
    config = tmp_path / "nightly.toml"
    config.write_text(f"""
[defaults]
args = ["--fp16", "--no-cache", "--atol", "1e-1"]
output_dir = "out"

[[model]]
name = "planted"
path = "{PLANTED}"
""")
    js = tmp_path / "a.json"
    assert main_cli("batch", str(config), "--json", str(js)) == 0
    first = json.loads(js.read_text())["models"][0]
    assert first["node_by_node_passed"] is True and first["status"] == "ok"
    _disagreeing(monkeypatch, next(n for n in api_candidates(PLANTED) if n not in plain.fp32_nodes))
    assert main_cli("batch", str(config), "--json", str(js)) == 0  # the verdict stands: not a regression
    edge = json.loads(js.read_text())["models"][0]
    assert edge["node_by_node_passed"] is False and "edge" in edge["status"]
