"""Core benchmark: command round trips, sustained throughput, projection lag.

    .venv/bin/python -m bench.bench_core [--seconds 30] [--clients 32]

Starts a private redis-server (AOF everysec, like compose.yaml), `engram serve` (the core path:
ENGRAM_INDEX=off, so no embedding; bench_search.py measures the index) and an echo
server (the floor: a FastStream subscriber that only echoes, reached through the same client
transport) as separate processes, then measures from this
process through `EngramClient`, the CLI's own client. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.projections.history_reader import HistoryReader
from engram_ledger.services.adapters.crypto import load_master_key
from engram_ledger.services.adapters.redis_server import RedisServer
from engram_ledger.services.bootstrap import Engram, build
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.bus.requester import BusRequester
from engram_ledger.services.config import Settings
from tests.support import ROOT, ServeProcess, engram_env


@contextlib.asynccontextmanager
async def service_in_process(**settings: Any) -> AsyncIterator[tuple[Engram, Settings]]:
    """The real service in this process, on a private redis-server and a temporary data dir
    (``settings``: the rest of its ``Settings``), started and ready; stopped after."""
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        configured = Settings(redis_url=server.url, redis_url_configured=True, data_dir=Path(tmp), **settings)
        app = build(configured)
        ready = asyncio.Event()
        serving = asyncio.create_task(app.run(ready))
        try:
            await asyncio.wait_for(ready.wait(), 60)
            yield app, configured
        finally:
            app.stopping.set()
            await serving
            server.stop()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(pct(values, 0.5), 3), "p99_ms": round(pct(values, 0.99), 3), "n": len(values)}


async def floor(url: str, n: int, seconds: float, clients: int) -> tuple[list[float], float]:
    """The same client transport against a handler that only echoes: round trips, then requests/s."""
    echo = subprocess.Popen(
        [sys.executable, "-m", "bench.echo_server", url], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert echo.stdout and echo.stdout.readline().startswith("echo ready")
    redis = aioredis.Redis.from_url(url)
    bus = BusRequester(redis, 100_000)
    await bus.start()
    body = b'{"type":"save_note","command_id":"x","user_id":"bench","content":"a typical sentence to remember"}'
    times = []
    try:
        for i in range(n + 50):
            t = time.perf_counter()
            await bus.request("bench:echo", body, 5)
            if i >= 50:
                times.append((time.perf_counter() - t) * 1000)
        done = 0
        deadline = time.monotonic() + seconds

        async def caller() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                await bus.request("bench:echo", body, 5)
                done += 1

        await asyncio.gather(*[caller() for _ in range(clients)])
    finally:
        await bus.stop()
        await redis.aclose()
        echo.kill()
    return times, done / seconds


async def round_trips(client: EngramClient, n: int) -> tuple[list[float], list[float]]:
    saves, updates = [], []
    for i in range(n):
        t = time.perf_counter()
        written = await client.save("rt-user", f"round trip note {i}: the user prefers window seats")
        saves.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        await client.update("rt-user", written.note_id, content=f"round trip note {i}: the user prefers aisle seats")
        updates.append((time.perf_counter() - t) * 1000)
    return saves[50:], updates[50:]


async def sustained(client: EngramClient, reader: HistoryReader, seconds: float, clients: int) -> dict[str, object]:
    """Saves and updates from `clients` concurrent callers for `seconds`; meanwhile a watcher
    records when the projection's checkpoint passes each append (log entry ids carry Redis's
    clock in ms; same machine, same clock)."""
    deadline = time.monotonic() + seconds
    done = 0
    errors = 0
    appended: list[tuple[int, int]] = []
    lags: list[float] = []

    async def caller(k: int) -> None:
        nonlocal done, errors
        note_id = None
        i = 0
        while time.monotonic() < deadline:
            try:
                if note_id is None or i % 2 == 0:
                    reply = await client.save(f"load-{k}", f"sustained note {k}.{i} about the user's weekly schedule")
                    note_id = reply.note_id
                else:
                    reply = await client.update(f"load-{k}", note_id, content=f"changed {k}.{i}")
                _, entry = channels.parse_token(reply.token)
                appended.append(entry)
                done += 1
            except Exception:
                errors += 1
            i += 1

    async def watcher() -> None:
        seen = 0
        while time.monotonic() < deadline + 2:
            checkpoint = await reader.checkpoint(0)
            now_ms = time.time() * 1000
            pending = sorted(appended[seen:])
            while pending and pending[0] <= checkpoint:
                lags.append(now_ms - pending.pop(0)[0])
                seen += 1
            await asyncio.sleep(0.001)

    started = time.monotonic()
    await asyncio.gather(watcher(), *[caller(k) for k in range(clients)])
    elapsed = min(time.monotonic() - started, seconds)
    return {
        "commands": done,
        "errors": errors,
        "commands_per_s": round(done / elapsed, 1),
        "lag": summary(lags) if lags else None,
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--round-trips", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=1, help="engram serve processes sharing the groups")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        workers = [
            ServeProcess(engram_env(ENGRAM_REDIS_URL=server.url, ENGRAM_DATA_DIR=tmp, ENGRAM_INDEX="off")).start()
            for _ in range(args.workers)
        ]
        try:
            floor_times, floor_rate = await floor(server.url, args.round_trips, min(args.seconds, 10), args.clients)
            async with EngramClient(server.url) as client:
                saves, updates = await round_trips(client, args.round_trips)
                redis = aioredis.Redis.from_url(server.url)
                master = load_master_key(Path(tmp), env={})  # the one the workers generated
                load = await sustained(client, HistoryReader(redis, 1, master), args.seconds, args.clients)
                await redis.aclose()
        finally:
            for worker in workers:
                worker.stop()
            server.stop()
    results = {
        "floor_request_reply": summary(floor_times),
        "floor_requests_per_s": round(floor_rate, 1),
        "save_round_trip": summary(saves),
        "update_round_trip": summary(updates),
        "save_p50_over_floor": round(pct(saves, 0.5) / pct(floor_times, 0.5), 2),
        "sustained": {"seconds": args.seconds, "clients": args.clients, "workers": args.workers, **load},
    }
    print(
        f"floor (echo handler, same transport): p50 {results['floor_request_reply']['p50_ms']} ms, "
        f"p99 {results['floor_request_reply']['p99_ms']} ms, {results['floor_requests_per_s']} requests/s"
    )
    print(
        f"save round trip:   p50 {results['save_round_trip']['p50_ms']} ms, "
        f"p99 {results['save_round_trip']['p99_ms']} ms ({results['save_p50_over_floor']}x the floor)"
    )
    print(
        f"update round trip: p50 {results['update_round_trip']['p50_ms']} ms, "
        f"p99 {results['update_round_trip']['p99_ms']} ms"
    )
    print(
        f"sustained: {load['commands_per_s']} commands/s over {args.seconds:g} s with {args.clients} clients "
        f"and {args.workers} worker(s), "
        f"{load['errors']} errors ({load['commands_per_s'] / floor_rate:.0%} of the floor's rate); "
        f"event-to-read-model lag {load['lag']}"
    )
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
