# Two commands do everything on a fresh machine (they create .venv and install on first use):
#   make demo   - run the main job on the bundled seed model
#   make test   - run the test suite (and the static type check of the TensorRT backend)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# tensorrt-stubs declares a dependency on the real tensorrt wheel, which cannot install without an NVIDIA
# driver; the stubs alone are all the type check needs, so they are installed without dependencies.
STUBS := tensorrt-stubs==10.13.0.35.1

.PHONY: install bytecode demo test test-slow bench typecheck fixtures clean

install: $(STAMP)

# An editable install leaves bisector's own modules uncompiled, and where PYTHONDONTWRITEBYTECODE is set (many
# containers, this project's machines) every command compiled them again: ~0.25 s of each start on a 2-core
# machine (docs/benchmarks.md, "Scale, thirty-seventh round"). Up-to-date files are skipped.
bytecode: $(STAMP)
	@$(PY) -m compileall -q bisector strategies

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps $(STUBS)
	touch $(STAMP)

demo: bytecode
	$(VENV)/bin/bisector precision fixtures/needs_constraints.onnx --fp16 --atol 1e-1 --val-range x:[1,2] -o bisector_out

test: bytecode
	$(PY) -m pytest -q -n 2 tests
	$(MAKE) --no-print-directory typecheck

typecheck: $(STAMP)
	$(PY) typecheck/check_tensorrt.py

test-slow: bytecode
	$(PY) -m pytest -q -n 2 -m slow tests

bench: bytecode
	$(PY) bench/strategies.py --quick
	$(PY) bench/fixture_searches.py
	$(PY) bench/emulate_speed.py
	$(PY) bench/profile_cost.py
	$(PY) bench/scale.py
	$(PY) bench/parallel.py --quick --wall
	$(PY) bench/debug_overhead.py
	$(PY) bench/estimates.py --no-registry

fixtures: $(STAMP)
	$(PY) fixtures/generate.py
	$(PY) fixtures/constructs.py

clean:
	rm -rf $(VENV) bisector_out .pytest_cache .mypy_cache
