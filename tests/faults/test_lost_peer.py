"""A serving process runs its Redis connections without a per-call timeout (it costs a tenth of
its throughput; see ``serving_options``). This is what stands in for it: when the network to
Redis goes silent, a connection with a request in flight and one idle in a blocking read both
fail within seconds (TCP_USER_TIMEOUT, keepalive), so a worker reconnects instead of waiting on
a dead socket for the kernel's quarter of an hour."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from services.adapters.redis_conn import (
    KEEPALIVE_IDLE_S,
    KEEPALIVE_INTERVAL_S,
    KEEPALIVE_PROBES,
    UNACKNOWLEDGED_LIMIT_MS,
)
from tests.support import ROOT


def can_cut_a_network() -> bool:
    """Network namespaces of our own (root), a veth pair between them, and tc to cut it."""
    if any(shutil.which(tool) is None for tool in ("unshare", "nsenter", "ip", "tc", "redis-server")):
        return False
    probe = subprocess.run(
        [
            "unshare",
            "-n",
            "sh",
            "-c",
            "ip link add near type veth peer name far && tc qdisc add dev far root pfifo limit 0",
        ],
        capture_output=True,
    )
    return probe.returncode == 0


def test_a_connection_to_a_redis_gone_silent_fails_within_seconds() -> None:
    if not can_cut_a_network():
        pytest.skip("needs network namespaces, a veth pair and tc (root) to cut a network")
    run = subprocess.run(
        ["unshare", "-n", sys.executable, "-m", "tests.faults.lost_peer_probe"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    # What TCP allows, with room for a loaded machine: data unacknowledged for the limit, or an
    # idle connection's probes (after the idle time, one per interval) all unanswered.
    limit = max(UNACKNOWLEDGED_LIMIT_MS / 1000, KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_PROBES) + 10
    for connection, result in found.items():
        assert result["outcome"] in {"ConnectionError", "TimeoutError"}, (connection, found)
        assert result["seconds"] <= limit, (connection, found)
