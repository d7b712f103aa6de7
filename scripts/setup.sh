#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs Engram with its dev tools. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# ENGRAM_EXTRAS: the optional parts to install besides the dev tools (scripts/test.sh adds the
# framework adapters so their tests run).
extras="${ENGRAM_EXTRAS:-dev}"
stamp=".venv/.engram-installed-${extras//,/-}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[$extras]"
  touch "$stamp"
fi
