"""The house (DESIGN §2): imports point one way, commands go through the API, and the API works without the CLI."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "bisector"

# Layers from the top down; a module may import its own layer or any layer below it, never one above.
LAYERS = [
    ("cli",),
    ("app",),
    ("search", "sensitivity", "artifacts"),
    ("backends",),
    ("fp16",),
    ("model", "costs"),
    ("compare", "values", "files", "errors", "budget", "packed_sets", "text", "cores", "heap", "ort_pool", "machine"),
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[str]:
    """Every bisector module a file imports, at the top or inside functions."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            base = node.module
            out += [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return [m for m in out if m == "bisector" or m.startswith("bisector.")]


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return RANK.get(parts[1]) if len(parts) > 1 else None


def _sources() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py"))


def test_every_module_has_a_layer():
    assert all(_layer(_module(p)) is not None for p in _sources() if p.parent != PKG or p.name != "__init__.py")


def test_imports_point_down_the_house():
    upward = []
    for path in _sources():
        own = _layer(_module(path))
        if own is None:
            continue
        for target in _imports(path):
            layer = _layer(target)
            if layer is not None and layer < own:
                upward.append(f"{_module(path)} -> {target}")
    assert not upward, "imports that run up the house:\n" + "\n".join(sorted(set(upward)))


def test_only_the_cli_imports_the_cli():
    offenders = [f"{_module(p)} -> {t}" for p in _sources() if not _module(p).startswith("bisector.cli")
                 for t in _imports(p) if t.startswith("bisector.cli")]
    assert not offenders, offenders


def test_commands_import_only_the_api():
    allowed = ("bisector.app.api", "bisector.app.options", "bisector.cli", "bisector.errors")
    offenders = [f"{_module(p)} -> {t}" for p in (PKG / "cli" / "commands").glob("*.py")
                 for t in _imports(p) if t != "bisector.app" and not t.startswith(allowed)]
    assert not offenders, offenders


# Strategies are plugins: of the core they may use the budget's exception (part of the protocol) and the packed
# sets they remember their asked sets in; both are leaves that import nothing else of bisector
STRATEGY_IMPORTS = ("bisector.budget", "bisector.budget.BudgetExhausted", "bisector.packed_sets",
                    "bisector.packed_sets.SetMemo")


def test_strategies_import_only_the_budget_exception_and_packed_sets():
    offenders = [f"{p.name} -> {t}" for p in (ROOT / "strategies").glob("*.py") for t in _imports(p)
                 if t not in STRATEGY_IMPORTS]
    assert not offenders, offenders


def test_what_strategies_may_import_imports_nothing_else_of_bisector():
    offenders = [f"{m} -> {t}" for m in ("budget", "packed_sets") for t in _imports(PKG / f"{m}.py")
                 if t.startswith("bisector")]
    assert not offenders, offenders


def test_no_module_borrows_another_modules_private_helpers():
    offenders = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bisector"):
                offenders += [f"{_module(path)} -> {node.module}.{a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert not offenders, offenders


def test_import_checker_sees_an_upward_import(tmp_path):
    """The checker itself can fail: a model-layer file importing the search is reported."""
    fake = tmp_path / "bisector" / "model" / "x.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("def f():\n    from bisector.search.oracle import Oracle\n")
    assert _imports(fake) == ["bisector.search.oracle", "bisector.search.oracle.Oracle"]
    assert _layer("bisector.search.oracle") < _layer("bisector.model.x")


def test_python_api_finds_the_planted_set_without_the_cli(tmp_path):
    import bisector

    spec = json.loads((ROOT / "fixtures" / "planted.json").read_text())
    # atol 8e-2: planted.json's tolerance since inputs are Polygraphy's data loader's (fixtures/generate.py)
    result = bisector.precision(ROOT / "fixtures" / "planted.onnx", val_range={"x": (0, 1)}, atol=8e-2, rtol=2e-2,
                                margin=1.0, no_cache=True, output_dir=tmp_path / "out")
    assert result.passed and result.minimal
    assert sorted(result.fp32_nodes) == sorted(spec["fp32_nodes"])
    assert (tmp_path / "out" / "constraints.json").is_file()
    assert result.constraints.headroom is not None and 0 <= result.constraints.headroom <= 1
    # The same set verifies through the API, and a one-node-short set does not.
    v = bisector.verify(ROOT / "fixtures" / "planted.onnx", tmp_path / "out" / "constraints.json", no_cache=True)
    assert v.passed and v.fp32_nodes == sorted(spec["fp32_nodes"])
    short = bisector.evaluate(ROOT / "fixtures" / "planted.onnx", spec["fp32_nodes"][1:], val_range={"x": (0, 1)},
                              atol=8e-2, rtol=2e-2, no_cache=True)
    assert not short.passed and short.verdict.failing


def test_api_rejects_an_unknown_option():
    import bisector
    from bisector.errors import UsageError

    with pytest.raises(UsageError, match="atoll"):
        bisector.precision(ROOT / "fixtures" / "needs_constraints.onnx", atoll=0.1)


@pytest.mark.parametrize("options,fragment", [
    ({"val_range": {"x": (2, 1)}}, "low <= high"),
    ({"val_range": {"x": (float("nan"), 1)}}, "low <= high"),
    ({"val_range": {"x": (1, 2, 3)}}, "two numbers"),
    ({"val_range": {"x": 1}}, "two numbers"),
    ({"input_shapes": {"x": "1,2"}}, "non-negative integers"),
    ({"input_shapes": {"x": (-1, 2)}}, "non-negative integers"),
    ({"seed": 1.5}, "--seed"), ({"seed": "1"}, "--seed"), ({"iterations": 2.5}, "--iterations"),
    ({"margin": "0.9"}, "--margin"), ({"max_evals": 2.5}, "--max-evals"),
    ({"backend": "magic"}, "--backend 'magic'"), ({"search": "auto"}, "bisector.Search"),
], ids=lambda v: str(v))
def test_api_keywords_are_checked_like_their_flags(tmp_path, options, fragment):
    """Keyword values the flag parser would refuse ran (a reversed or 3-number val_range, max_evals=2.5) or raised
    TypeError/ValueError/AttributeError (backend="magic", seed="1", input_shapes={"x": "1,2"})."""
    import bisector
    from bisector.errors import UsageError

    with pytest.raises(UsageError, match=re.escape(fragment)):
        bisector.precision(ROOT / "fixtures" / "needs_constraints.onnx", atol=0.1, output_dir=None,
                           cache_dir=tmp_path, **options)


def test_api_takes_the_backend_by_name_and_val_range_as_a_token(tmp_path):
    """README: keywords named like the flags, `backend` among them; backend="emulate" was an AttributeError."""
    import bisector

    r = bisector.precision(ROOT / "fixtures" / "needs_constraints.onnx", backend="emulate", val_range="x:[1,2]",
                           atol=0.1, output_dir=None, cache_dir=tmp_path)
    assert r.fp32_nodes == ["Add", "Sub"] and r.passed


def test_margin_demands_headroom():
    """A plan whose error uses most of the tolerance passes at margin 1 and fails at a margin below its excess."""
    import bisector

    seed = ROOT / "fixtures" / "needs_constraints.onnx"
    common = dict(val_range={"x": (1, 2)}, atol=1e-1, no_cache=True)
    r = bisector.evaluate(seed, ["Add", "Sub"], margin=1.0, **common)
    excess = r.verdict.excess
    assert r.passed and 0 < excess < 1
    assert not bisector.evaluate(seed, ["Add", "Sub"], margin=excess * 0.99, **common).passed
    assert bisector.evaluate(seed, ["Add", "Sub"], margin=min(1.0, excess * 1.01), **common).passed


def test_confirm_on_rejudges_the_set_on_another_backend(tmp_path):
    """--confirm-on: the final set is judged again on the named backend (here emulate with the same rules, where it
    holds) and the record says which backend confirmed it; a backend whose package is missing is exit 2 up front."""
    import bisector
    from bisector.errors import UsageError

    seed = ROOT / "fixtures" / "needs_constraints.onnx"
    r = bisector.precision(seed, val_range={"x": (1, 2)}, atol=1e-1, no_cache=True, confirm_on="emulate")
    assert r.fp32_nodes == ["Add", "Sub"] and r.constraints.confirmed_on == "emulate"
    with pytest.raises(UsageError):
        bisector.precision(seed, val_range={"x": (1, 2)}, atol=1e-1, no_cache=True, confirm_on="ort-cuda")


def test_objective_is_recorded_with_the_sets_cost():
    import bisector

    seed = ROOT / "fixtures" / "needs_constraints.onnx"
    r = bisector.precision(seed, val_range={"x": (1, 2)}, atol=1e-1, no_cache=True, objective="flops")
    c = r.constraints
    assert c.objective == "flops" and r.fp32_nodes == ["Add", "Sub"]
    assert 0 < c.fp32_cost["set"] < c.fp32_cost["all_candidates"]


def test_confirm_on_outcome_wording():
    """--confirm-on's log line says whether the set found here failed there, not only how the final set relates to
    it (on the GPU a failing 3-node set was replaced by a different 2-node set, which the old wording called
    'extended')."""
    from bisector.app.precision import _confirm_outcome
    from bisector.search.judge import Verdict

    a, ab, abc, d = frozenset("a"), frozenset("ab"), frozenset("abc"), frozenset("d")
    ok, bad = Verdict(ab, True, {}, 0), Verdict(ab, False, {}, 0)
    assert _confirm_outcome([ok], ab, ab) == "holds"
    assert _confirm_outcome([ok], ab, a) == "holds (then shrunk)"
    assert _confirm_outcome([bad], ab, abc) == "fails (extended)"
    assert _confirm_outcome([bad], ab, d) == "fails, so it was replaced"
    assert _confirm_outcome([], ab, abc) == "was extended"
