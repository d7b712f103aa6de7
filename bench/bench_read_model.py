"""Read-model benchmark: what reading the history costs, through the bus and at the reader.

    .venv/bin/python -m bench.bench_read_model [--repeat 300] [--out now.json] [--baseline before.json]

Starts a private redis-server and an in-process service (ENGRAM_INDEX=off: no model to load,
so only the read model is measured), saves 200 notes for one user, then measures the p50 of:
``get_note`` and ``list_notes`` (all 200, then a page of 20) through ``EngramClient``, and the
search's hydration (``HistoryReader.get_many`` of 10 and of 50 hits, the call a search makes
after the index answers) at the reader, without the bus. ``--baseline``: a JSON file an earlier
run wrote with ``--out``; each figure is then printed with its ratio to the baseline's.
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
from engram_ledger.services.bootstrap import build
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.config import Settings

USER = "bench-reader"
NOTES = 200
# About the size of a note an agent saves: a sentence or two, with a subject.
CONTENT = (
    "Note {i}: the user prefers window seats on long flights, drinks oat milk flat whites and "
    "wants meeting invites sent before nine in the morning, never on Fridays."
)


async def p50_ms(call: Callable[[], Awaitable[Any]], repeat: int) -> float:
    for _ in range(min(20, repeat)):  # warm connections and caches
        await call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        await call()
        times.append((time.perf_counter() - start) * 1000)
    return round(pct(times, 0.5), 3)


async def measure(url: str, data_dir: Path, repeat: int) -> dict[str, float]:
    settings = Settings(redis_url=url, data_dir=data_dir, redis_url_configured=True, index_enabled=False)
    engram = build(settings)
    ready = asyncio.Event()
    serving = asyncio.create_task(engram.run(ready))
    await asyncio.wait_for(ready.wait(), 30)
    try:
        async with EngramClient(url) as client:
            ids = []
            for i in range(NOTES):
                written = await client.save(USER, CONTENT.format(i=i), subject=f"Person {i % 7}", advise=False)
                ids.append(written.note_id)
            await client.list_notes(USER, after=written.token)
            history = engram.history
            return {
                "get_note_ms": await p50_ms(lambda: client.get_note(USER, ids[NOTES // 2]), repeat),
                "list_notes_200_ms": await p50_ms(lambda: client.list_notes(USER), max(repeat // 3, 1)),
                "list_notes_page_20_ms": await p50_ms(lambda: client.list_notes(USER, offset=100, limit=20), repeat),
                # The same reads at the reader, without the bus: what the read model itself costs.
                "reader_get_note_ms": await p50_ms(lambda: history.get_note(USER, ids[NOTES // 2]), repeat * 3),
                "reader_list_200_ms": await p50_ms(lambda: history.list_notes(USER, None, False), max(repeat // 3, 1)),
                "hydrate_10_ms": await p50_ms(lambda: history.get_many(USER, ids[:10]), repeat * 3),
                "hydrate_50_ms": await p50_ms(lambda: history.get_many(USER, ids[:50]), repeat * 3),
            }
    finally:
        engram.stopping.set()
        await serving


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--baseline", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        try:
            results = await measure(server.url, Path(tmp) / "data", args.repeat)
        finally:
            server.stop()
    baseline = json.loads(args.baseline.read_text()) if args.baseline else {}
    for name, value in results.items():
        line = f"{name:24} p50 {value:8.3f} ms"
        if name in baseline:
            line += f"   baseline {baseline[name]:8.3f} ms   ratio {value / baseline[name]:.2f}"
        print(line)
    if args.out:
        args.out.write_text(json.dumps(results) + "\n")
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
