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
