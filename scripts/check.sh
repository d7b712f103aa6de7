#!/usr/bin/env bash
# The static checks: ruff, the layers (lint-imports) and mypy. scripts/test.sh runs the first two
# before the tests; mypy takes a minute, so it runs here.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports --no-cache --no-logo
# mypy reads the package from the files: engram_ledger/ holds a link to each top-level folder
# (docs/internals.md, "One package, read from the files").
.venv/bin/mypy -p engram_ledger.contracts -p engram_ledger.services -p engram_ledger.projections
