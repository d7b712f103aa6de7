"""The LangGraph adapter's overhead: ``EngramStore.get`` against ``EngramClient.get_note``.

    .venv/bin/python -m bench.bench_adapters [--items 200] [--rounds 3]

Starts a private redis-server and `engram serve` (ENGRAM_INDEX=off: gets never touch the index,
and no embedding competes for the CPU), puts ``--items`` items with ``EngramStore``, then reads
the same notes, interleaved so drift hits every method alike, through:

- ``EngramClient.get_note(user, id)``: the client's own read by id (the reference);
- ``EngramClient.get_by_key(user, category, key)``: the query the store sends, without and
  with the store's last write token as ``after`` (as the store sends it);
- ``EngramStore.aget`` (async: a hop onto the store's loop and back);
- ``EngramStore.get`` (sync, from this thread).

Prints p50/p95 per method, the ratios to ``get_note`` (aim: ``aget`` p50 within 1.5x), and one
JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.bench_core import pct
from engram_ledger.services.adapters.redis_server import RedisServer
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.integrations.langgraph import EngramStore, namespace_to_category
from tests.support import ServeProcess, engram_env

USER = "bench-adapters"
NAMESPACE = ("memories", "bench")


def figures(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(pct(values, 0.5), 3), "p95_ms": round(pct(values, 0.95), 3), "n": len(values)}


async def timed(call: Callable[[], Awaitable[Any]], into: list[float]) -> None:
    t = time.perf_counter()
    await call()
    into.append((time.perf_counter() - t) * 1000)


def timed_sync(call: Callable[[], Any], into: list[float]) -> None:
    t = time.perf_counter()
    call()
    into.append((time.perf_counter() - t) * 1000)


async def measure(url: str, items: int, rounds: int) -> dict[str, Any]:
    async with EngramClient(url) as client, EngramStore(url, user_id=USER) as store:
        keys = [f"item-{i}" for i in range(items)]
        for i, key in enumerate(keys):
            await store.aput(NAMESPACE, key, {"text": f"benchmark memory {i}: the user waters the ferns on day {i}"})
        category = namespace_to_category(NAMESPACE)
        ids = []
        for key in keys:
            note = await client.get_by_key(USER, category, key, after=store.token)
            assert note is not None
            ids.append(note.id)
        times: dict[str, list[float]] = {
            "get_note": [],
            "get_by_key": [],
            "get_by_key_after": [],
            "store_aget": [],
            "store_get": [],
        }
        for round_ in range(rounds + 1):  # the first round warms connections and caches up
            for key, note_id in zip(keys, ids, strict=True):
                sample: dict[str, list[float]] = {name: [] for name in times}
                await timed(lambda note_id=note_id: client.get_note(USER, note_id), sample["get_note"])
                await timed(lambda key=key: client.get_by_key(USER, category, key), sample["get_by_key"])
                await timed(
                    lambda key=key: client.get_by_key(USER, category, key, after=store.token),
                    sample["get_by_key_after"],
                )
                await timed(lambda key=key: store.aget(NAMESPACE, key), sample["store_aget"])
                # Blocking, as a sync LangGraph node calls it; this loop has nothing else to run.
                timed_sync(lambda key=key: store.get(NAMESPACE, key), sample["store_get"])
                if round_:
                    for name, value in sample.items():
                        times[name] += value
    reference = pct(times["get_note"], 0.5)
    return {
        "items": items,
        "rounds": rounds,
        **{name: figures(values) for name, values in times.items()},
        "p50_over_get_note": {name: round(pct(values, 0.5) / reference, 2) for name, values in times.items()},
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        serve = ServeProcess(engram_env(ENGRAM_REDIS_URL=server.url, ENGRAM_DATA_DIR=tmp, ENGRAM_INDEX="off")).start()
        try:
            results = await measure(server.url, args.items, args.rounds)
        finally:
            serve.stop()
            server.stop()
    for name in ("get_note", "get_by_key", "get_by_key_after", "store_aget", "store_get"):
        f = results[name]
        print(
            f"{name:<16} p50 {f['p50_ms']:.3f} ms  p95 {f['p95_ms']:.3f} ms  "
            f"({results['p50_over_get_note'][name]}x get_note's p50, n={f['n']})"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
