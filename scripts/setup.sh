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
# framework adapters so their tests run). Each part installed leaves a stamp, so a later run that
# asks for no more than is installed (serve.sh after test.sh) installs nothing.
extras="${ENGRAM_EXTRAS:-dev}"
needed=0
for extra in ${extras//,/ }; do
  stamp=".venv/.engram-installed-$extra"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ]; then
    needed=1
  fi
done
if [ "$needed" -eq 1 ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # Releases before engram_ledger installed as "engram", claiming the import names contracts,
  # services and projections; a venv from one of them still has that package.
  .venv/bin/python -m pip uninstall --quiet --yes engram 2>/dev/null || true
  .venv/bin/python -m pip install --quiet -e ".[$extras]"
  for extra in ${extras//,/ }; do
    touch ".venv/.engram-installed-$extra"
  done
fi
