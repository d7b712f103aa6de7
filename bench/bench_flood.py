"""Fairness under a flood: what one caller sending as fast as it can does to everyone else.

    .venv/bin/python -m bench.bench_flood [--seconds 20] [--ordinary 15]

Starts a private redis-server and one `engram serve` (the index on: searches embed their
query), saves a few notes for each of ``--ordinary`` users, then runs those users' clients
(each in turn: a get_note, then a search, a short pause between requests) three times over
``--seconds``:

- alone: the baseline;
- beside a flooding agent (another process, one `EngramClient`, 20,000 saves and 20,000
  searches of one user sent at once, and again as soon as any is answered);
- beside a flooding agent that appends its requests to the inboxes itself (a pipeline of
  RPUSHes, no client, as the agent role may), as fast as Redis takes them, for as long as the
  run lasts.

Prints each run's ordinary p50/p99 and the flooded runs' p99 over the baseline's, and what
became of the flood's requests (answered, refused RATE_LIMITED). Then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.adapters.redis_server import RedisServer
from engram_ledger.services.bus.client import EngramClient
from tests.support import ROOT, ServeProcess, engram_env

NOTES_PER_USER = 5
PAUSE_SECONDS = 0.05
FLOOD_EACH = 20_000
TOPICS = ["window seats", "oat milk", "the Lisbon trip", "quarterly report", "dentist on Tuesday"]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def seed(url: str, users: int) -> dict[str, list[str]]:
    notes: dict[str, list[str]] = {}
    async with EngramClient(url, timeout=60) as client:
        for u in range(users):
            user = f"user-{u}"
            written = [
                await client.save(user, f"{user} mentioned {topic} ({i})", advise=False)
                for i, topic in enumerate(TOPICS[:NOTES_PER_USER])
            ]
            notes[user] = [w.note_id for w in written]
            for _ in range(12):  # the first search waits for the model to load
                try:
                    await client.search(user, "warm up", after=written[-1].token)
                    break
                except EngramError as e:
                    if e.code is not ErrorCode.TIMEOUT:
                        raise
    return notes


async def ordinary(url: str, notes: dict[str, list[str]], seconds: float) -> tuple[list[float], int]:
    """Every user's client in turn asks a get_note then a search; the latencies in ms, and errors."""
    latencies: list[float] = []
    errors = 0

    async def user_loop(user: str, ids: list[str]) -> None:
        nonlocal errors
        async with EngramClient(url, timeout=30) as client:
            end = time.monotonic() + seconds
            rng = random.Random(user)
            while time.monotonic() < end:
                for ask in (
                    lambda: client.get_note(user, rng.choice(ids)),
                    lambda: client.search(user, rng.choice(TOPICS)),
                ):
                    start = time.perf_counter()
                    try:
                        await ask()
                        latencies.append((time.perf_counter() - start) * 1000)
                    except EngramError:
                        errors += 1
                    await asyncio.sleep(PAUSE_SECONDS)

    await asyncio.gather(*(user_loop(user, ids) for user, ids in notes.items()))
    return latencies, errors


async def flood_with_client(url: str, seconds: float) -> dict[str, int]:
    """One agent's client: 20,000 saves and 20,000 searches of one user at once, each sent again
    as soon as it is answered (refused or not), until the time is up."""
    counts = {"answered": 0, "rate_limited": 0, "other_errors": 0}
    end = time.monotonic() + seconds
    async with EngramClient(url, timeout=60) as client:

        async def one(i: int, search: bool) -> None:
            while time.monotonic() < end:
                try:
                    if search:
                        await client.search("flood", f"flood query {i}")
                    else:
                        await client.save("flood", f"flood note {i} {uuid.uuid4().hex}", advise=False)
                    counts["answered"] += 1
                except EngramError as e:
                    counts["rate_limited" if e.code is ErrorCode.RATE_LIMITED else "other_errors"] += 1

        tasks = [asyncio.create_task(one(i, search)) for i in range(FLOOD_EACH) for search in (False, True)]
        await asyncio.sleep(seconds)
        for task in tasks:  # most still wait for one of the user's places
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return counts


async def flood_raw(url: str, seconds: float) -> dict[str, int]:
    """Requests written onto the streams directly, 500 to a pipeline, replies counted."""
    counts = {"sent": 0, "answered": 0, "rate_limited": 0}
    reply_to = channels.reply_channel(f"flood-{uuid.uuid4().hex}")
    redis = aioredis.Redis.from_url(url)
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(reply_to)
    end = time.monotonic() + seconds

    async def replies() -> None:
        while time.monotonic() < end + 5:
            message = await pubsub.get_message(timeout=0.5)
            if message is not None and message["type"] == "message":
                body = json.loads(json.loads(message["data"])["data"])
                counts["rate_limited" if body.get("code") == "RATE_LIMITED" else "answered"] += 1

    reader = asyncio.create_task(replies())
    i = 0
    while time.monotonic() < end:
        async with redis.pipeline(transaction=False) as pipe:
            for _ in range(500):
                i += 1
                body = (
                    {"type": "save_note", "command_id": f"raw-{i}", "user_id": "flood", "content": f"raw {i}"}
                    if i % 2
                    else {"type": "search_notes", "user_id": "flood", "query": f"raw query {i}"}
                )
                stream = channels.command_stream(0) if i % 2 else channels.query_stream(0)
                envelope = {"data": json.dumps(body), "headers": {"reply_to": reply_to, "correlation_id": str(i)}}
                pipe.rpush(channels.inbox(stream), json.dumps(envelope))
            await pipe.execute()
        counts["sent"] = i
        await asyncio.sleep(0)
    await reader
    await pubsub.aclose()
    await redis.aclose()
    return counts


def start_flooder(url: str, mode: str, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.bench_flood", "--flooder", mode, "--url", url, "--seconds", str(seconds)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        worker = ServeProcess(engram_env(ENGRAM_REDIS_URL=server.url, ENGRAM_DATA_DIR=tmp)).start(timeout=120)
        results: dict[str, object] = {"seconds": args.seconds, "ordinary_users": args.ordinary}
        try:
            notes = await seed(server.url, args.ordinary)
            for mode in args.modes.split(","):
                flooder = start_flooder(server.url, mode, args.seconds + 2) if mode != "alone" else None
                if flooder is not None:
                    await asyncio.sleep(2)  # the flood is under way before the measure starts
                latencies, errors = await ordinary(server.url, notes, args.seconds)
                flood = json.loads(flooder.communicate(timeout=300)[0].splitlines()[-1]) if flooder else None
                results[mode] = {
                    "p50_ms": round(pct(latencies, 0.5), 2),
                    "p99_ms": round(pct(latencies, 0.99), 2),
                    "requests": len(latencies),
                    "errors": errors,
                    "flood": flood,
                }
                if mode == "raw":
                    break
                # The next run starts on empty streams: what a flood left is answered first.
                async with aioredis.Redis.from_url(server.url) as redis:
                    streams = (channels.command_stream(0), channels.query_stream(0))
                    inboxes = [channels.inbox(s) for s in streams]
                    while [s for s in streams if await redis.xlen(s)] or [i for i in inboxes if await redis.llen(i)]:
                        await asyncio.sleep(0.5)
        finally:
            worker.stop()
            server.stop()
    base = results["alone"]
    assert isinstance(base, dict)
    for mode in args.modes.split(","):
        r = results[mode]
        assert isinstance(r, dict)
        ratio = r["p99_ms"] / base["p99_ms"]
        r["p99_over_alone"] = round(ratio, 2)
        print(
            f"{mode:>6}: ordinary p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms ({ratio:.2f}x alone), "
            f"{r['requests']} requests, {r['errors']} errors; flood {r['flood']}"
        )
    print(json.dumps(results))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--ordinary", type=int, default=15)
    parser.add_argument("--modes", default="alone,client,raw", help="which runs, in order (alone first)")
    parser.add_argument("--flooder", choices=["client", "raw"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flooder:
        flood = flood_with_client if args.flooder == "client" else flood_raw
        print(json.dumps(asyncio.run(flood(args.url, args.seconds))))
        return
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
