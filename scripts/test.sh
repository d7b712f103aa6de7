#!/usr/bin/env bash
# Set-up, then the whole test suite (unit, integration, e2e, faults) against real Redis, then the
# TypeScript client's.
set -uo pipefail
cd "$(dirname "$0")/.."
ENGRAM_EXTRAS=dev,langgraph,openai-agents,autogen,claude,adk,llamaindex,integrations-test bash scripts/setup.sh || exit 1
export HF_HUB_OFFLINE=1
# The layers (pyproject.toml, [tool.importlinter]) and the linter first: both take seconds, and
# each prints its report only when it finds something.
echo "test: checking the layers (lint-imports) and the code (ruff)"
layers=$(.venv/bin/lint-imports --no-cache --no-logo 2>&1) || { echo "$layers" >&2; exit 1; }
.venv/bin/ruff check --quiet . || exit 1
# Two workers (ENGRAM_TEST_WORKERS; 0 runs in this process), each test file on one of them: most
# of a test's time is a service, a Redis or a browser answering, which the other worker uses.
.venv/bin/python -m pytest -n "${ENGRAM_TEST_WORKERS:-2}" --dist loadfile "$@"
rc=$?
# pytest exits 5 when it collected no test; that is a failure of the suite, not a pass.
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  rc=1
fi
# The TypeScript client's tests (node's test runner), against an `engram serve` and `engram http`
# of their own; ENGRAM_TEST_TYPESCRIPT=off leaves them out. Its packages are installed from the
# lock file when node_modules is missing or older than it.
if [ "${ENGRAM_TEST_TYPESCRIPT:-on}" != "off" ]; then
  echo "test: the TypeScript client (clients/typescript)"
  (
    cd clients/typescript || exit 1
    command -v npm >/dev/null || { echo "npm is not installed: Node.js 20 or newer runs these tests" >&2; exit 1; }
    if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
      npm ci --no-audit --no-fund --loglevel=error || exit 1
    fi
    npm test --silent
  ) || rc=1
fi
exit "$rc"
