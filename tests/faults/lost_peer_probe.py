"""Run inside a network namespace of its own (``unshare -n``). Starts a Redis in a second
namespace, joined to this one by a veth pair (a cable), and connects the way a serving process
does (its own client and its broker's). Then the Redis side drops every packet it would send, as
a host that vanished would (nothing answers, nothing is refused), and this times how long each
connection takes to fail: one with a request in flight, one idle in a blocking read. Prints one
JSON line; ``test_lost_peer.py`` judges it.

The drop is on the far side on purpose: a packet dropped by this side's own queue is "local
congestion" to Linux, whose keepalive then keeps probing and never gives up."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from services.adapters.redis_conn import open_redis, serving_options
from services.adapters.redis_server import answers
from services.bootstrap import make_broker

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


async def probe(url: str, far: int) -> dict[str, Any]:
    own = open_redis(url, **serving_options(url))
    idle = open_redis(url, **serving_options(url))
    broker = make_broker(url)
    await broker.connect()
    brokers_client: Redis = broker.config.broker_config.connection.client  # type: ignore[attr-defined]
    try:
        for client in (own, idle, brokers_client):
            assert await client.ping()
        blocked = asyncio.create_task(time_to_fail(idle.xread({"nothing-comes": "$"}, block=0)))
        await asyncio.sleep(0.5)  # the read is on the wire and its connection idle
        # A queue of length 0 on the far end of the cable: nothing comes back from now on.
        sh("nsenter", "-t", str(far), "-n", "tc", "qdisc", "add", "dev", "far", "root", "pfifo", "limit", "0")
        in_flight = await asyncio.gather(
            time_to_fail(own.set("a-write", "in flight")),
            time_to_fail(brokers_client.xadd("a-stream", {"a": "reply"})),
        )
        return {"own client": in_flight[0], "broker's client": in_flight[1], "idle blocking read": await blocked}
    finally:
        for client in (own, idle):
            await client.aclose()
        await broker.stop()


NEAR, FAR, PORT = "10.77.0.1", "10.77.0.2", 6399


def sh(*command: str) -> None:
    subprocess.run(command, check=True)


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
        deadline = time.monotonic() + 10
        while not answers(url):
            assert time.monotonic() < deadline and far.poll() is None, f"the far Redis did not start ({far.poll()})"
            time.sleep(0.05)
        print(json.dumps(asyncio.run(probe(url, far.pid))), flush=True)
    finally:
        far.kill()
        far.wait()


if __name__ == "__main__":
    sys.exit(main())
