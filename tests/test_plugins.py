"""A strategy from a third-party package, found through the entry point group, usable and listed in --help."""

from __future__ import annotations

import json
import textwrap

from .conftest import SEED, run_cli

PLUGIN = textwrap.dedent('''
    class EverythingFP32:
        """A deliberately naive third-party strategy: keep every candidate FP32."""

        def __init__(self):
            self.calls = 0

        def search(self, candidates, passes, **hints):
            assert passes(frozenset(candidates))
            return frozenset(candidates)
''')


def _install_plugin(root):
    (root / "thirdparty_strategy.py").write_text(PLUGIN)
    dist = root / "thirdparty_strategy-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-strategy\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[bisector.strategies]\nall-fp32 = thirdparty_strategy:EverythingFP32\n")


def test_third_party_strategy_is_listed_and_used(tmp_path):
    plug = tmp_path / "plug"
    plug.mkdir()
    _install_plugin(plug)
    env = {"PYTHONPATH": str(plug), "COLUMNS": "200"}
    help_text = run_cli("precision", "--help", env=env).stdout
    assert "all-fp32" in help_text and "auto" in help_text
    out = tmp_path / "o"
    r = run_cli("precision", SEED, "--fp16", "--atol", "1e-1", "--val-range", "x:[1,2]", "--strategy", "all-fp32",
                "-o", out, "--cache-dir", tmp_path / "c", env=env)
    assert r.returncode == 0, r.stderr
    c = json.loads((out / "constraints.json").read_text())
    assert c["strategy"] == "all-fp32" and c["fp32_nodes"] == ["Add", "MatMul_0", "MatMul_1", "Sub"]
    # without the plugin on the path it is an unknown strategy (exit 2)
    r = run_cli("precision", SEED, "--fp16", "--strategy", "all-fp32", "--cache-dir", tmp_path / "c")
    assert r.returncode == 2 and "all-fp32" in r.stderr


def test_a_plugin_cannot_claim_minimality_it_did_not_prove(tmp_path):
    plug = tmp_path / "plug"
    plug.mkdir()
    _install_plugin(plug)
    out = tmp_path / "o"
    r = run_cli("precision", SEED, "--fp16", "--atol", "1e-1", "--val-range", "x:[1,2]", "--strategy", "all-fp32",
                "-o", out, "--cache-dir", tmp_path / "c", env={"PYTHONPATH": str(plug)})
    assert r.returncode == 0
    assert json.loads((out / "constraints.json").read_text())["minimal"] is False


def test_strategy_options_reach_the_strategy_typed_and_bad_ones_are_usage_errors(tmp_path, monkeypatch, capsys):
    """`--strategy-option KEY=VALUE` reaches the strategy's constructor as the type of its default (or of its
    annotation where the default is None); a key the strategy does not take, a value of the wrong type, or a
    token without `=` is exit 2 with the reason, no traceback."""
    import pytest

    from bisector.app.options import strategy_options
    from bisector.errors import UsageError
    from bisector.search import driver

    from .conftest import main_cli

    assert strategy_options("auto", ["use_prediction=false", "probes=12", "fallback_prefix=0.5", "shrink=single"]) == {
        "use_prediction": False, "probes": 12, "fallback_prefix": 0.5, "shrink": "single"}
    assert strategy_options("auto", ["probes=none"]) == {"probes": None}
    for bad, why in ((["nope=1"], "takes no such option"), (["use_prediction=maybe"], "expected a bool"),
                     (["probes=1.5"], "expected an int"), (["x"], "KEY=VALUE"), (["fallback_prefix=nan"], "float")):
        with pytest.raises(UsageError, match=why):
            strategy_options("auto", bad)

    seen: list = []
    real = driver.load_strategy
    monkeypatch.setattr(driver, "load_strategy", lambda name, options=None: seen.append(options) or real(name, options))
    args = ["precision", SEED, "--fp16", "--atol", "1e-1", "--val-range", "x:[1,2]", "-o", tmp_path / "o",
            "--no-cache", "--strategy-option", "use_prediction=off", "--strategy-option", "swaps=2"]
    assert main_cli(*args) == 0
    assert seen and seen[0]["use_prediction"] is False and seen[0]["swaps"] == 2
    recorded = json.loads((tmp_path / "o" / "constraints.json").read_text())["strategy_options"]
    assert recorded == {"use_prediction": False, "swaps": 2}  # the artifacts say how the search ran
    capsys.readouterr()
    assert main_cli(*args[:-1], "swaps=two") == 2
    err = capsys.readouterr().err
    assert "swaps=two" in err and "expected an int" in err and "Traceback" not in err
