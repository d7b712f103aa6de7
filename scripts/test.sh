#!/usr/bin/env bash
# Set-up, then the whole test suite (unit, integration, e2e, faults) against real Redis.
set -uo pipefail
cd "$(dirname "$0")/.."
ENGRAM_EXTRAS=dev,langgraph,openai-agents,autogen,integrations-test bash scripts/setup.sh || exit 1
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
  exit 1
fi
exit "$rc"
