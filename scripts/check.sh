#!/usr/bin/env bash
# The static checks: ruff, the layers (lint-imports) and mypy. scripts/test.sh runs the first two
# before the tests; mypy takes a minute, so it runs here.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports --no-cache --no-logo
# mypy reads packages from folders: it gets engram_ledger as links to the top-level folders
# (setuptools maps them at install time, which mypy does not follow).
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/engram_ledger"
for folder in contracts services projections; do
  ln -s "$PWD/$folder" "$tree/engram_ledger/$folder"
done
MYPYPATH="$tree" .venv/bin/mypy -p engram_ledger.contracts -p engram_ledger.services -p engram_ledger.projections
