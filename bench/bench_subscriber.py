"""Subscriber drain rate: how fast one subscriber (``EngramClient.events``) takes a backlog of
events off the log, acking each one after it is handled.

    .venv/bin/python -m bench.bench_subscriber [--events 10000] [--partitions 1] [--rounds 3]

Starts a private redis-server (AOF everysec, as compose.yaml) and `engram serve` (index off),
writes ``--events`` notes through the bus (``SaveNotes`` of 100), stops the service, then drains
the log from its start with a fresh consumer group per run: metadata only (no key), with the
content opened (the master key: one MGET of data keys and an unwrap per note), and acking a
whole batch at once (``Subscription.ack(*deliveries)``). The floor is the same Redis commands
with nothing of Engram's: XREADGROUP of 500 and one XACK per entry, no decoding. Runs are
interleaved, ``--rounds`` times; medians are reported. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.contracts.commands import NoteDraft
from engram_ledger.services.adapters.crypto import MasterKey
from engram_ledger.services.adapters.redis_server import RedisServer
from engram_ledger.services.bus.client import EngramClient
from tests.support import TEST_MASTER_KEY_B64, ServeProcess, engram_env, master_key_for_tests

AIM = 5_000  # events/s per subscriber


async def write(url: str, events: int) -> None:
    async with EngramClient(url, timeout=60) as client:
        for i in range(0, events, 100):
            drafts = [
                NoteDraft(content=f"user note {i + j}: a sentence of a typical length to remember") for j in range(100)
            ]
            await client.save_many(f"user-{(i // 100) % 16}", drafts[: events - i])


async def floor(url: str, partitions: int, group: str, events: int) -> float:
    redis = aioredis.Redis.from_url(url)
    for p in range(partitions):
        await redis.xgroup_create(channels.event_log(p), group, id="0")
    started = time.perf_counter()
    done = 0
    while done < events:
        for p in range(partitions):
            stream = channels.event_log(p)
            for _, entries in await redis.xreadgroup(group, "floor", {stream: ">"}, count=500) or []:
                for entry_id, _fields in entries:
                    await redis.xack(stream, group, entry_id)
                    done += 1
    elapsed = time.perf_counter() - started
    await redis.aclose()
    return events / elapsed


async def drain(url: str, group: str, events: int, key: MasterKey | None, batch_ack: bool) -> float:
    async with EngramClient(url, timeout=10) as client, client.events(group, from_start=True, key=key) as subscription:
        started = time.perf_counter()
        done = 0
        pending = []
        async for delivery in subscription:
            done += 1
            if batch_ack:
                pending.append(delivery)
                if len(pending) == 500 or done == events:
                    await subscription.ack(*pending)
                    pending = []
            else:
                await delivery.ack()
            if done == events:
                break
        return events / (time.perf_counter() - started)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        try:
            env = engram_env(
                ENGRAM_REDIS_URL=server.url,
                ENGRAM_DATA_DIR=tmp,
                ENGRAM_INDEX="off",
                ENGRAM_PARTITIONS=str(args.partitions),
                ENGRAM_MASTER_KEY=TEST_MASTER_KEY_B64,
            )
            serve = ServeProcess(env).start()
            try:
                await write(server.url, args.events)
            finally:
                serve.stop()  # the drain runs alone: no projection shares the cores
            key = master_key_for_tests()
            runs: dict[str, Callable[[str], Awaitable[float]]] = {
                "floor: XREADGROUP 500 + XACK each, no decoding": lambda g: floor(
                    server.url, args.partitions, g, args.events
                ),
                "events(), metadata only, ack each": lambda g: drain(server.url, g, args.events, None, False),
                "events(), content opened, ack each": lambda g: drain(server.url, g, args.events, key, False),
                "events(), metadata only, ack per 500": lambda g: drain(server.url, g, args.events, None, True),
            }
            rates: dict[str, list[float]] = {name: [] for name in runs}
            for round_ in range(args.rounds):
                for i, (name, run) in enumerate(runs.items()):
                    rates[name].append(await run(f"bench-{round_}-{i}"))
        finally:
            server.stop()
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(f"{args.events:,} events, {args.partitions} partition(s), median of {args.rounds} rounds")
    print(f"{'run':<50} {'events/s':>10}  {'aim':>8}")
    for name, rate in medians.items():
        verdict = "" if name.startswith("floor") else ("met" if rate >= AIM else "NOT met")
        print(f"{name:<50} {rate:>10,.0f}  {verdict:>8}")
    print(json.dumps({"events": args.events, "partitions": args.partitions, "rates": rates, "medians": medians}))


if __name__ == "__main__":
    asyncio.run(main())
