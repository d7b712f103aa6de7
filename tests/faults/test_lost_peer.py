"""A serving process runs its Redis connections without a per-call timeout (it cost about a
tenth of its throughput; see ``serving_options``). This is what stands in for it: when the
network to Redis goes silent (no answer, no refusal), a connection with a request in flight, one
idle in a blocking read and the process's two subscriptions each fail within seconds
(TCP_USER_TIMEOUT, keepalive), so a worker reconnects instead of waiting on a dead socket for the
kernel's quarter of an hour; and no reader spins on the dead connection, freezing the process
(``subscription_messages``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from engram_ledger.services.adapters.redis_conn import CONNECT_TIMEOUT_S, UNACKNOWLEDGED_LIMIT_MS
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


def test_connections_to_a_redis_gone_silent_fail_within_seconds_and_nothing_freezes() -> None:
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
    assert found["socket timeouts"] == [None, None], found  # the service's own client, its broker's
    # TCP's doing, not a timeout of the client's: not before the unacknowledged-data limit, and
    # not later than that plus, for a subscription that tries once to reconnect, a connect's
    # time-out, with room for a loaded machine.
    earliest = UNACKNOWLEDGED_LIMIT_MS / 1000 - 1
    latest = UNACKNOWLEDGED_LIMIT_MS / 1000 + CONNECT_TIMEOUT_S + 10
    for connection, result in found["connections"].items():
        assert result["outcome"] in {"ConnectionError", "TimeoutError", "resubscribing"}, (connection, found)
        assert earliest <= result["seconds"] <= latest, (connection, found)
    assert found["longest event loop stall"] < 2, found
