"""Run inside a network namespace of its own (``unshare -n``). Starts a Redis in a second
namespace, joined to this one by a veth pair (a cable), and connects the way a serving process
does (its own client and its broker's). Then the Redis side drops every packet it would send, as
a host that vanished would (nothing answers, nothing is refused), and this times how long each
connection takes to fail (a write in flight on either client, a blocking read idle) and each
subscription to resubscribe, while watching that the event loop never stalls. Prints one JSON
line; ``test_lost_peer.py`` judges it.

The drop is on the far side on purpose: a packet dropped by this side's own queue is "local
congestion" to Linux, whose keepalive then keeps probing and never gives up."""

from __future__ import annotations

import asyncio
import ctypes
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from engram_ledger.projections.tracking import applied_notices
from engram_ledger.services.adapters.redis_conn import close_redis, open_redis, serving_options
from engram_ledger.services.adapters.redis_server import answers
from engram_ledger.services.bootstrap import make_broker
from engram_ledger.services.bus.requester import BusRequester
from tests.support import longest_stall, wait_until

# Far beyond what the serving options allow; a connection still waiting then counts as hung.
GIVE_UP_SECONDS = 45.0


async def time_to_fail(call: Any) -> dict[str, Any]:
    started = time.monotonic()
    try:
        await asyncio.wait_for(call, GIVE_UP_SECONDS)
    except TimeoutError:
        return {"outcome": "hung", "seconds": GIVE_UP_SECONDS}
    except Exception as e:  # what redis-py raises for a dead connection is the finding
        return {"outcome": type(e).__name__, "seconds": round(time.monotonic() - started, 1)}
    return {"outcome": "answered", "seconds": round(time.monotonic() - started, 1)}


async def time_until(what: str, happened: Callable[[], bool]) -> dict[str, Any]:
    """How long until ``happened``: a measurement (the test judges it), not a wait that fails."""
    started = time.monotonic()
    while not happened():
        if time.monotonic() - started > GIVE_UP_SECONDS:
            return {"outcome": "hung", "seconds": GIVE_UP_SECONDS}
        await asyncio.sleep(0.1)
    return {"outcome": what, "seconds": round(time.monotonic() - started, 1)}


def socket_timeouts(*clients: Redis) -> list[object]:
    return [client.connection_pool.connection_kwargs.get("socket_timeout", "redis-py's default") for client in clients]


async def probe(url: str, far: int) -> dict[str, Any]:
    own = open_redis(url, **serving_options(url))
    idle = open_redis(url, **serving_options(url))
    broker = make_broker(url)
    await broker.connect()
    brokers_client: Redis = broker.config.broker_config.connection.client  # type: ignore[attr-defined]
    requester = BusRequester(own)
    stop = asyncio.Event()
    watching = asyncio.create_task(longest_stall(stop))
    try:
        for client in (own, idle, brokers_client):
            assert await client.ping()
        # Engram's two subscriptions, idle: the notices of applied positions (a serving
        # process's read-your-writes waits) and a client's reply channel.
        notices = applied_notices(own)
        async with notices.watch(0, (0, 0)):
            assert notices._subscribed.is_set()
        await requester.start()
        replies_subscription = requester._pubsub
        # A subscription took the pool's connection: the write below goes on one already open.
        assert await own.set("a-write", "before")
        blocked = asyncio.create_task(time_to_fail(idle.xread({"nothing-comes": "$"}, block=0)))
        await asyncio.sleep(0.5)  # the read is on the wire and its connection idle
        # A queue of length 0 on the far end of the cable: nothing comes back from now on.
        sh("nsenter", "-t", str(far), "-n", "tc", "qdisc", "add", "dev", "far", "root", "pfifo", "limit", "0")
        found = await asyncio.gather(
            time_to_fail(own.set("a-write", "in flight")),
            time_to_fail(brokers_client.xadd("a-stream", {"a": "reply"})),
            blocked,
            time_until("resubscribing", lambda: not notices._subscribed.is_set()),
            time_until("resubscribing", lambda: requester._pubsub is not replies_subscription),
        )
        names = ["own client", "broker's client", "idle blocking read", "applied notices", "client's replies"]
        stop.set()
        return {
            "connections": dict(zip(names, found, strict=True)),
            "longest event loop stall": round(await watching, 1),
            "socket timeouts": socket_timeouts(own, brokers_client),
        }
    finally:
        stop.set()
        await watching
        await requester.stop()
        for client in (own, idle):
            await close_redis(client)
        await broker.stop()


NEAR, FAR, PORT = "10.77.0.1", "10.77.0.2", 6399
PR_SET_PDEATHSIG = 1


def sh(*command: str) -> None:
    subprocess.run(command, check=True)


def die_with_this_process() -> None:
    """In the far Redis before it starts: killed when the probe is, even by SIGKILL (the test's
    time limit), so no redis-server outlives it in a namespace nobody can see."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def main() -> None:
    logs = Path(tempfile.mkdtemp(prefix="lost-peer-"))
    # The far namespace waits for its end of the cable, then becomes the Redis.
    far = subprocess.Popen(
        [
            "unshare",
            "-n",
            "sh",
            "-c",
            f"read _ && ip link set lo up && ip addr add {FAR}/24 dev far && ip link set far up && "
            f"exec redis-server --bind {FAR} --port {PORT} --protected-mode no --save '' --appendonly no --dir {logs}",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        preexec_fn=die_with_this_process,
    )
    try:
        sh("ip", "link", "set", "lo", "up")
        sh("ip", "link", "add", "near", "type", "veth", "peer", "name", "far")
        sh("ip", "link", "set", "far", "netns", str(far.pid))
        sh("ip", "addr", "add", f"{NEAR}/24", "dev", "near")
        sh("ip", "link", "set", "near", "up")
        assert far.stdin is not None
        far.stdin.write(b"go\n")
        far.stdin.close()
        url = f"redis://{FAR}:{PORT}/0"

        def far_answers() -> bool:
            assert far.poll() is None, f"the far Redis exited ({far.poll()})"
            return answers(url)

        wait_until(far_answers, timeout=30, what="the far Redis answering")
        print(json.dumps(asyncio.run(probe(url, far.pid))), flush=True)
    finally:
        far.kill()
        far.wait()
        shutil.rmtree(logs, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
