"""`bisector profile`: scores that predict the planted culprits, cheaply; profile.json, load_scores, profile.png."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from bisector.compare import Tolerance, compare_output
from bisector.errors import UsageError
from bisector.sensitivity import SATURATED, compute_scores, judge, load_scores
from bisector.values import PerOutput

from .conftest import PLANTED, SEED, main_cli, planted_spec


@pytest.fixture(scope="module")
def planted_profile(tmp_path_factory):
    spec = planted_spec()
    out = tmp_path_factory.mktemp("prof")
    fp32 = spec["fp32_nodes"]
    rc = main_cli("profile", PLANTED, *spec["args"], "-o", out, "--no-cache", "--fp32", *fp32)
    assert rc == 0
    return out, json.loads((out / "profile.json").read_text()), spec


def test_planted_nodes_are_in_the_top_of_the_profile(planted_profile):
    _, doc, spec = planted_profile
    names = [n["name"] for n in doc["nodes"]]
    planted = spec["fp32_nodes"]
    top = set(names[: len(planted) + 2])
    assert set(planted) <= top, {p: names.index(p) + 1 for p in planted}
    scores = [n["score"] for n in doc["nodes"]]
    assert scores == sorted(scores, reverse=True)
    assert [n["rank"] for n in doc["nodes"]] == list(range(1, len(names) + 1))
    for n in doc["nodes"]:
        assert {"name", "op", "score", "local", "downstream", "overflow", "underflow", "nan", "tensors"} <= set(n)


def test_consumers_of_bad_inputs_score_high_on_their_own(planted_profile):
    _, doc, _ = planted_profile
    by = {n["name"]: n for n in doc["nodes"]}
    # the consumer's input rounding is part of its local score
    assert by["planted_attenuate"]["local"] >= SATURATED  # reads planted_gain's output: inf in FP16
    reads = {t: c for t, c in by["planted_attenuate"]["tensors"].items() if c["role"] == "input"}
    assert any(c["overflow"] > 0 for c in reads.values()), reads
    assert by["planted_offset_sub"]["local"] > 1  # reads h + 20000 stored in FP16
    # the producer whose rounding the consumer amplifies is blamed through its consumer
    assert by["planted_offset_add"]["local"] < 1 < by["planted_offset_add"]["downstream"]
    assert by["planted_offset_add"]["via"] == "planted_offset_sub"
    assert by["planted_gain"]["overflow"] > 0


def test_plan_errors_recorded(planted_profile):
    _, doc, spec = planted_profile
    assert doc["plan"]["fp32_nodes"] == sorted(spec["fp32_nodes"])
    assert doc["plan"]["passed"] is True
    assert set(doc["timings"]) >= {"reference", "scores"}


def test_profile_png_is_a_readable_picture(planted_profile):
    out, _, _ = planted_profile
    png = out / "profile.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 800 and height >= 400
    assert len(data) > 50_000
    from PIL import Image

    with Image.open(png) as im:
        colours = im.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 20  # not a blank or single-colour image


def test_load_scores_round_trip_and_errors(planted_profile, tmp_path):
    out, doc, _ = planted_profile
    scores = load_scores(out / "profile.json")
    assert scores == {n["name"]: n["score"] for n in doc["nodes"]}
    with pytest.raises(UsageError):
        load_scores(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": [{"name": "a"}]}')
    with pytest.raises(UsageError):
        load_scores(bad)
    bad.write_text("not json")
    with pytest.raises(UsageError):
        load_scores(bad)


def test_compute_scores_needs_the_emulate_backend():
    from bisector.model.catalog import Catalog

    with pytest.raises(UsageError):
        compute_scores(Catalog.load(SEED), object(), [{}], Tolerance())


def test_elemwise_score_crosses_one_exactly_where_the_check_fails():
    rng = np.random.default_rng(3)
    tol = Tolerance(atol=PerOutput(1e-2), rtol=PerOutput(1e-3))
    for _ in range(200):
        g = (rng.standard_normal(50) * 10 ** rng.uniform(-4, 2)).astype(np.float32)
        a = (g + rng.standard_normal(50) * 10 ** rng.uniform(-5, 0)).astype(np.float32)
        s, counts = judge(a, g, tol)
        assert (s > 1) == (not compare_output("t", a, g, tol).passed)
    g = np.array([1.0, 70000.0, 1e-9], np.float32)
    a = np.array([1.0, np.inf, 0.0], np.float32)
    s, counts = judge(a, g, tol)
    assert s >= SATURATED and counts == {"overflow": 1, "underflow": 1, "nan": 0, "size": 3}
    assert judge(g, g, tol)[0] == 0.0


def test_profile_json_to_stdout_is_clean(tmp_path, capfd):
    rc = main_cli("profile", SEED, "--val-range", "x:[1,2]", "--atol", "1e-1", "-o", tmp_path, "--no-cache",
                  "--no-png", "--json", "-")
    out = capfd.readouterr().out
    assert rc == 0
    doc = json.loads(out)
    assert {n["name"] for n in doc["nodes"][:2]} == {"Add", "Sub"}  # the seed's culprits
    assert all(n["score"] > 1 for n in doc["nodes"][:2]) and all(n["score"] < 1 for n in doc["nodes"][2:])
    assert not (tmp_path / "profile.png").exists()


def test_profile_bad_flags_exit_2(tmp_path):
    assert main_cli("profile", SEED, "--fp32", "nope", "-o", tmp_path, "--no-cache") == 2
    assert main_cli("profile", tmp_path / "missing.onnx", "-o", tmp_path) == 2
