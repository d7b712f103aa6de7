#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs Engram with its dev tools. Safe to run again.
# Each step is one line here; what pip says goes to .venv/setup.log, whose last lines are shown
# when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
LOG=.venv/setup.log

say() { echo "setup: $*"; }

# Runs one step's command with its output in the log; a failure shows the log's end and its path.
quietly() {
  if ! "$@" >>"$LOG" 2>&1; then
    echo "setup: failed: $*" >&2
    echo "setup: the last lines of $PWD/$LOG:" >&2
    tail -n 30 "$LOG" | sed 's/^/    /' >&2
    echo "setup: the whole output is in $PWD/$LOG" >&2
    exit 1
  fi
}

if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "setup: Engram needs Python 3.11 or later; $PY is $("$PY" -V 2>&1 || echo missing) (choose one with PYTHON=...)" >&2
    exit 1
  fi
  say "creating .venv ($("$PY" -V))"
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
if [ "$needed" -eq 0 ]; then
  say ".venv is up to date (Engram with ${extras//,/, })"
  exit 0
fi
started=$SECONDS
echo "engram set-up, $(date -u +%Y-%m-%dT%H:%M:%SZ), extras: $extras" >"$LOG"
if compgen -G ".venv/.engram-installed-*" >/dev/null; then
  say "updating Engram's packages in .venv (pip's output: $LOG)"
else
  say "installing Engram and its dependencies into .venv (first run: a minute or more; pip's output: $LOG)"
fi
quietly .venv/bin/python -m pip install --progress-bar off --upgrade pip
# Releases before engram_ledger installed as "engram", claiming the import names contracts,
# services and projections; a venv from one of them still has that package.
.venv/bin/python -m pip uninstall --yes engram >>"$LOG" 2>&1 || true
quietly .venv/bin/python -m pip install --progress-bar off -e ".[$extras]"
for extra in ${extras//,/ }; do
  touch ".venv/.engram-installed-$extra"
done
# The embedding model's ONNX export, kept in the user's cache (~/.cache/engram/models) for every
# data dir: made here, so that no start of the service waits for it.
say "preparing the embedding model (once per machine: about a minute the first time)"
quietly env HF_HUB_OFFLINE=1 .venv/bin/python -m engram_ledger.services.cli model
say "done in $((SECONDS - started)) s"
