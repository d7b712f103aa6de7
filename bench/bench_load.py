"""Load test: mixed commands and queries from many clients for a fixed time, loopback only.

    .venv/bin/python -m bench.bench_load [--seconds 60] [--clients 16] [--cluster]

A private redis-server (AOF everysec) and `engram serve` (index on) as separate processes. Each
client loops over: save (no advice), update, get, list, search, recent; its reads wait for its
last write's token (read-your-writes, as an agent's session reads). Reports throughput, p50/p99
per operation, errors, lost commands (every replied write must be in the log exactly once) and
the service's memory growth, beside the floor of a bare Redis round trip. ``--cluster`` runs the
same on a local three-master Redis Cluster with six partitions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import redis.asyncio as aioredis

from bench.bench_core import summary
from bench.bench_search import rss_mb, warm_up
from bench.corpus import notes, question_text
from engram_ledger.contracts import channels
from engram_ledger.services.adapters.redis_conn import open_redis
from engram_ledger.services.adapters.redis_server import RedisServer
from engram_ledger.services.bus.client import EngramClient
from tests.support import ServeProcess, engram_env


async def run_load(
    client: EngramClient, seconds: float, clients: int
) -> tuple[dict[str, list[float]], dict[str, int], list[str]]:
    deadline = time.monotonic() + seconds
    times: dict[str, list[float]] = defaultdict(list)
    errors: dict[str, int] = defaultdict(int)
    written: list[str] = []  # command ids of replied writes

    async def caller(k: int) -> None:
        rng = random.Random(k)
        user = f"load-{k}"
        mine: list[str] = []
        token: str | None = None  # of this caller's last write: its reads wait for it, as a session's do
        i = 0
        while time.monotonic() < deadline:
            op = ("save", "update", "get", "list", "search", "recent")[i % 6] if mine else "save"
            command_id = f"{user}-{i}"
            t = time.perf_counter()
            try:
                if op == "save":
                    reply = await client.save(user, notes(k * 100_000 + i, 1)[0], advise=False, command_id=command_id)
                    mine.append(reply.note_id)
                    token = reply.token
                    written.append(command_id)
                elif op == "update":
                    updated = await client.update(
                        user, rng.choice(mine), content=notes(k * 7 + i, 1)[0], command_id=command_id
                    )
                    token = updated.token
                    written.append(command_id)
                elif op == "get":
                    await client.get_note(user, rng.choice(mine), after=token)
                elif op == "list":
                    await client.list_notes(user, after=token)
                elif op == "search":
                    await client.search(user, question_text(rng), after=token)
                else:
                    await client.list_recent(user, after=token)
                times[op].append((time.perf_counter() - t) * 1000)
            except Exception as e:
                errors[f"{op}: {getattr(e, 'code', type(e).__name__)}"] += 1
            i += 1

    await asyncio.gather(*[caller(k) for k in range(clients)])
    return times, errors, written


async def ping_floor(redis: aioredis.Redis, n: int = 500) -> dict[str, float]:
    """The raw floor: a Redis round trip from this client, before the load."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        await redis.ping()
        times.append((time.perf_counter() - t) * 1000)
    return summary(times)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--cluster", action="store_true", help="on a local 3-master Redis Cluster, 6 partitions")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.cluster:
            from tests.cluster import LocalCluster

            server: RedisServer | LocalCluster = LocalCluster(Path(tmp) / "cluster").start()
            extra = {"ENGRAM_REDIS_CLUSTER": "on", "ENGRAM_PARTITIONS": "6"}
        else:
            server = RedisServer(Path(tmp) / "redis").start()
            extra: dict[str, str] = {}
        # The encoder settings reach the service (engram_env passes no other ENGRAM_ variable).
        extra |= {k: v for k, v in os.environ.items() if k in ("ENGRAM_ENCODER", "ENGRAM_ENCODER_THREADS")}
        partitions = int(extra.get("ENGRAM_PARTITIONS", "1"))
        serve = ServeProcess(engram_env(ENGRAM_REDIS_URL=server.url, ENGRAM_DATA_DIR=tmp, **extra)).start(timeout=60)
        assert serve.process is not None
        redis = open_redis(server.url, args.cluster)
        try:
            floor = await ping_floor(redis)
            async with EngramClient(server.url, timeout=30, cluster=args.cluster) as client:
                await warm_up(client)
                rss_before = rss_mb(serve.process.pid)[0]
                times, errors, written = await run_load(client, args.seconds, args.clients)
                rss_after = rss_mb(serve.process.pid)[0]
            seen: dict[str, int] = defaultdict(int)
            for p in range(partitions):
                for _, fields in await redis.xrange(channels.event_log(p)):
                    seen[json.loads(fields[b"e"])["command_id"]] += 1
        finally:
            await redis.aclose()
            serve.stop()
            server.stop()
    lost = [c for c in written if seen.get(c, 0) != 1]
    total = sum(len(v) for v in times.values())
    results = {
        "seconds": args.seconds,
        "cluster": args.cluster,
        "redis_ping_floor": floor,
        "clients": args.clients,
        "operations_per_s": round(total / args.seconds, 1),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "writes_replied": len(written),
        "lost_or_duplicated_writes": len(lost),
        "per_operation": {op: summary(v) for op, v in sorted(times.items())},
        "serve_rss_mb": {"before": round(rss_before, 1), "after": round(rss_after, 1)},
    }
    print(
        f"{total} operations in {args.seconds:g} s from {args.clients} clients: "
        f"{results['operations_per_s']} ops/s, {results['errors']} errors {dict(errors)}, "
        f"{len(written)} writes replied, "
        f"{len(lost)} lost or duplicated"
    )
    for op, figures in results["per_operation"].items():  # type: ignore[union-attr]
        print(f"  {op:>7}: p50 {figures['p50_ms']} ms, p99 {figures['p99_ms']} ms, n={figures['n']}")
    print(f"serve RSS {rss_before:.0f} MB -> {rss_after:.0f} MB")
    print(f"floor: a bare Redis PING from this client, p50 {floor['p50_ms']} ms, p99 {floor['p99_ms']} ms")
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
