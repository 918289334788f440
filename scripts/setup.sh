#!/usr/bin/env bash
# One-time set-up of a local virtualenv for stair_es (idempotent).
# torch==2.13.0 goes in first: it is a CPU wheel, and an open `torch` requirement
# would otherwise let pip resolve a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${STAIR_ES_VENV:-.venv}
PY=${PYTHON:-python3}
STAMP="$VENV/.stair-es-installed"
if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
echo "torch==2.13.0" > "$VENV/constraints.txt"
"$VENV/bin/python" -m pip install -q -c "$VENV/constraints.txt" -e ".[dev]"
touch "$STAMP"
