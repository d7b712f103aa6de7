"""With Redis up and the service stopped, every CLI call ends: TIMEOUT after its timeout, then a
bounded shutdown, never a hang.

On Python 3.11 a cancel that lands in the same turn as a subscription read's own time limit is
taken for that limit, and the client's reply reader read on: about two calls in three hung for
good after printing TIMEOUT (the reader's 5 s quiet period meets the CLI's 10 s timeout). Each
call here runs ``engram get`` through the CLI's ``main`` on a thread of its own, so each has an
event loop of its own, as a process would."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from engram_ledger.contracts import channels
from engram_ledger.services import cli

CALLS = 20
TIMEOUT_SECONDS = 10.0  # the CLI's default, which meets the reply reader's quiet period
SHUTDOWN_SECONDS = 15.0  # the reader's stop grace (5 s) with room for a loaded machine


def test_every_call_to_a_stopped_service_ends(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with redis.Redis.from_url(redis_url) as r:
        r.set(channels.PARTITIONS_KEY, 1)  # a service ran here once, and is stopped now
    monkeypatch.setenv("ENGRAM_REDIS_URL", redis_url)
    codes: list[int] = []

    def call() -> None:
        codes.append(cli.main(["get", "--json", "--user", "zoe", "abcdefgh", "--timeout", str(TIMEOUT_SECONDS)]))

    threads = [threading.Thread(target=call, daemon=True) for _ in range(CALLS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + TIMEOUT_SECONDS + SHUTDOWN_SECONDS
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = sum(thread.is_alive() for thread in threads)
    assert hung == 0, f"{hung} of {CALLS} calls still running {SHUTDOWN_SECONDS:g} s after their timeout"
    assert codes == [1] * CALLS
