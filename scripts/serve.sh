#!/usr/bin/env bash
# Set-up, then `engram serve` on the embedded defaults: Redis at ENGRAM_REDIS_URL, or the local one,
# or a private redis-server it starts; state under ENGRAM_DATA_DIR (default ~/.local/state/engram).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
exec .venv/bin/engram serve "$@"
