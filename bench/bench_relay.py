"""Webhooks under load: `engram relay` delivering a mixed load to a receiver that fails some posts.

    .venv/bin/python -m bench.bench_relay [--seconds 60] [--clients 16] [--fail 0.1]

A private redis-server, `engram serve` (index on) and `engram relay` as separate processes; the
receiver (Starlette on uvicorn, loopback) in this one, refusing a ``--fail`` share of posts at
random with a 500 and checking every signature. The clients run bench_load's mix for
``--seconds``; then the relay is given time to drain. Reports the log's events against what the
receiver took: missing (must be 0), duplicates (must all be retried or redelivered posts),
refused posts, how long the relay took to drain after the load, and its throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import msgspec

from bench.bench_load import run_load
from bench.bench_search import warm_up
from engram_ledger.contracts import channels
from engram_ledger.services.adapters.redis_conn import open_redis
from engram_ledger.services.adapters.redis_server import RedisServer, free_port
from engram_ledger.services.bus.client import EngramClient
from tests.integration.test_relay import SECRET, Receiver
from tests.support import ENGRAM_CLI, ROOT, ServeProcess, engram_env


class RandomlyFailing(Receiver):
    """Refuses each post with probability ``share`` (seeded: the same run fails the same posts)."""

    def __init__(self, port: int, share: float) -> None:
        super().__init__(port, fail_every=10**12)
        self._random = random.Random(17)
        self._share = share

    def refuse(self, event_id: str) -> bool:
        return self._random.random() < self._share


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--fail", type=float, default=0.1, help="share of posts the receiver refuses")
    parser.add_argument("--drain-timeout", type=float, default=600)
    args = parser.parse_args()
    receiver = RandomlyFailing(free_port(), args.fail)
    await receiver.start()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        env = engram_env(ENGRAM_REDIS_URL=server.url, ENGRAM_DATA_DIR=tmp)
        serve = ServeProcess(env).start(timeout=60)
        secret_file = Path(tmp) / "relay.secret"
        secret_file.write_bytes(SECRET)
        relay = subprocess.Popen(
            [
                *(*ENGRAM_CLI, "relay", "--url", receiver.url, "--group", "bench"),
                *("--secret-file", str(secret_file), "--from-start"),
            ],
            env=env,
            cwd=ROOT,
        )
        redis = open_redis(server.url)
        try:
            async with EngramClient(server.url, timeout=30) as client:
                await warm_up(client)
                started = time.monotonic()
                times, errors, written = await run_load(client, args.seconds, args.clients)
                load_ended = time.monotonic()
            expected = [
                msgspec.json.decode(fields[b"e"])["event_id"] for _, fields in await redis.xrange(channels.event_log(0))
            ]
            wanted = set(expected)
            while not wanted <= {i for i, _ in receiver.accepted}:
                if time.monotonic() - load_ended > args.drain_timeout:
                    break
                await asyncio.sleep(0.1)
            drained = time.monotonic()
            dead = await redis.xlen(channels.relay_dead_letters("bench"))
        finally:
            relay.terminate()
            relay.wait(timeout=30)
            await redis.aclose()
            serve.stop()
            server.stop()
            await receiver.stop()
    copies = Counter(i for i, _ in receiver.accepted)
    missing = wanted - set(copies)
    duplicates = sum(c - 1 for c in copies.values())
    unexplained = [
        i for i, c in copies.items() if c > 1 and not any(s[0] == i and (s[1] > 1 or s[2]) for s in receiver.seen)
    ]
    results = {
        "seconds": args.seconds,
        "clients": args.clients,
        "fail_share": args.fail,
        "operations": sum(len(v) for v in times.values()),
        "load_errors": sum(errors.values()),
        "writes_replied": len(written),
        "events_in_log": len(expected),
        "events_delivered": len(copies),
        "missing": len(missing),
        "duplicates": duplicates,
        "duplicates_not_retried": len(unexplained),
        "posts_refused": len(receiver.refused),
        "bad_signatures": receiver.bad_signatures,
        "dead_letters": dead,
        "drain_after_load_s": round(drained - load_ended, 2),
        "delivered_per_s": round(len(copies) / max(drained - started, 1e-9), 1),
    }
    print(
        f"{results['events_in_log']} events from {args.seconds:g} s of load ({results['operations']} operations, "
        f"{results['load_errors']} errors); the receiver refused {results['posts_refused']} posts "
        f"({args.fail:.0%}); delivered {results['events_delivered']}, missing {results['missing']}, "
        f"duplicates {results['duplicates']} (not retried: {results['duplicates_not_retried']}), "
        f"dead letters {dead}, bad signatures {receiver.bad_signatures}; "
        f"drained {results['drain_after_load_s']} s after the load, {results['delivered_per_s']} events/s overall"
    )
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
