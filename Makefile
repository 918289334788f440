# stair_es developer entry points. Each target sets up .venv first (idempotent):
# torch==2.13.0 (CPU) is installed before the project so pip never pulls a CUDA build.
PY := .venv/bin/python

.PHONY: setup demo test test-all bench-tiny clean

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/stair-es demo

test: setup
	$(PY) -m pytest -q -m "not slow and not cluster"

test-all: setup
	$(PY) -m pytest -q

bench-tiny: setup
	$(PY) -m benchmarks.run tiny

clean:
	rm -rf .venv stair-es-demo .pytest_cache
