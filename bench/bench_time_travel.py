"""Time-travel benchmark: reading the past against reading the present, at scale.

    .venv/bin/python -m bench.bench_time_travel [--notes 10000] [--versions 5] [--repeat 200]

The real service in this process (index on, a private redis-server), one user with ``--notes``
notes of ``--versions`` versions each (saved in batches, then updated round by round through
the bus). Then the p50 through ``EngramClient`` of: ``get_note``, a page of ``list_notes`` (50)
and ``search`` (top 5), each now and as of two moments: ``recent`` (after the last round: few
notes changed since) and ``middle`` (after the middle round: every note changed since, the
as-of listing's worst case), each named by its time and by the token of the round's last
write. Also the raw floor of the same run: MiniLM's encode of one query (what a search always
pays). Then what keeping the past costs: points and bytes on disk of the
live index and of the timeline, and this process's RSS. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.bench_core import service_in_process
from bench.bench_read_model import p50_ms
from engram_ledger.contracts.commands import NoteDraft
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.projections.index_runtime import edge_directory, timeline_directory
from engram_ledger.services.bus.client import EngramClient

USER = "bench-past"
TOPICS = ["flights", "coffee", "meetings", "books", "running", "music", "cooking", "garden", "travel", "work"]


def text(i: int, version: int) -> str:
    topic = TOPICS[(i + version) % len(TOPICS)]
    return f"Note {i}, version {version}: the user's view on {topic} changed; detail {random.randint(0, 10**6)}."


def disk_bytes(directory: Path) -> int:
    """Bytes the files take on disk (Qdrant's segment files are sparse: their size overstates)."""
    return sum(f.stat().st_blocks * 512 for f in directory.rglob("*") if f.is_file())


async def fill(client: EngramClient, notes: int, versions: int) -> tuple[list[str], dict[str, str], str]:
    """The notes, the moments (``recent`` and ``middle`` by time, ``recent by token`` and
    ``middle by token``), and the last token."""
    ids: list[str] = []
    token = ""
    started = time.perf_counter()
    for start in range(0, notes, 100):
        drafts = [NoteDraft(content=text(i, 1), category=TOPICS[i % 3]) for i in range(start, min(notes, start + 100))]
        written = await client.save_many(USER, drafts)
        ids += [n.note_id for n in written.notes]
        token = written.token
    moments: dict[str, str] = {}
    for version in range(2, versions + 1):
        for start in range(0, notes, 32):
            replies = await asyncio.gather(
                *(client.update(USER, ids[i], content=text(i, version)) for i in range(start, min(notes, start + 32)))
            )
            token = replies[-1].token
        print(f"  round {version} of {versions} written ({time.perf_counter() - started:.0f} s)", flush=True)
        if version == (versions + 2) // 2:
            await asyncio.sleep(0.01)
            moments["middle"] = datetime.now(UTC).isoformat()
            moments["middle by token"] = token
    await asyncio.sleep(0.01)
    moments["recent"] = datetime.now(UTC).isoformat()
    moments["recent by token"] = token
    return ids, moments, token


async def run(notes: int, versions: int, repeat: int) -> dict[str, Any]:
    async with service_in_process() as (app, settings):
        assert app.index is not None
        await app.index.embedder.start()
        async with EngramClient(settings.redis_url, timeout=120) as client:
            started = time.perf_counter()
            ids, moments, token = await fill(client, notes, versions)
            fill_s = time.perf_counter() - started
            # Wait for the index to hold everything before reading (it embeds behind the writes).
            while True:
                try:
                    await client.search(USER, "warm up", after=token)
                    break
                except EngramError as e:
                    if e.code is not ErrorCode.TIMEOUT:
                        raise
            figures_lag = time.perf_counter() - started - fill_s
            rng = random.Random(7)
            sample = [ids[rng.randrange(len(ids))] for _ in range(repeat)]
            # Each query's words differ (a number), so no embedding comes from the encoder's cache.
            asked = iter(range(10**9))

            def query(i: int) -> str:
                return f"what does the user think about {TOPICS[i % len(TOPICS)]}? ({next(asked)})"

            figures: dict[str, Any] = {
                "notes": notes,
                "versions": versions,
                "fill_s": round(fill_s, 1),
                "index_lag_s": round(figures_lag, 1),
            }

            def cycling(make: Callable[[int], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
                counter = iter(range(10**9))
                return lambda: make(next(counter) % repeat)

            embedder = app.index.embedder
            figures["encode_floor_ms"] = await p50_ms(cycling(lambda i: embedder.embed([query(i)])), repeat)
            for label, as_of in [("now", None), *moments.items()]:
                figures[f"get_{label}_ms"] = await p50_ms(
                    cycling(lambda i, a=as_of: client.get_note(USER, sample[i], as_of=a)), repeat
                )
                figures[f"list_{label}_ms"] = await p50_ms(
                    cycling(lambda i, a=as_of: client.list_notes(USER, offset=(i * 50) % notes, limit=50, as_of=a)),
                    max(20, repeat // 4),
                )
                figures[f"search_{label}_ms"] = await p50_ms(
                    cycling(lambda i, a=as_of: client.search(USER, query(i), min_relevance=0, as_of=a)), repeat
                )
            runtime = app.index
            assert runtime.timeline is not None
            figures["live_points"] = await runtime.index.count()
            figures["timeline_points"] = await runtime.timeline.count()
            figures["live_disk_mb"] = round(disk_bytes(edge_directory(settings.data_dir, runtime.generation)) / 1e6, 1)
            figures["timeline_disk_mb"] = round(
                disk_bytes(timeline_directory(settings.data_dir, runtime.generation)) / 1e6, 1
            )
            figures["rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
            return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notes", type=int, default=10_000)
    parser.add_argument("--versions", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    figures = asyncio.run(run(args.notes, args.versions, args.repeat))
    print(
        f"\n{args.notes} notes x {args.versions} versions, one user (written in {figures['fill_s']} s, "
        f"indexed {figures['index_lag_s']} s later)"
    )
    labels = ("recent", "middle", "recent by token", "middle by token")
    print(f"{'read':<10}{'now p50':>10}" + "".join(f"{label:>18}{'ratio':>8}" for label in labels))
    for read in ("get", "list", "search"):
        now = figures[f"{read}_now_ms"]
        row = f"{read:<10}{now:>10.2f}"
        for label in labels:
            value = figures[f"{read}_{label}_ms"]
            row += f"{value:>18.2f}{value / now:>7.2f}x"
        print(row)
    print(f"raw floor: MiniLM encode of one query, p50 {figures['encode_floor_ms']} ms")
    print(
        f"index: live {figures['live_points']} points, {figures['live_disk_mb']} MB; timeline "
        f"{figures['timeline_points']} points, {figures['timeline_disk_mb']} MB; RSS {figures['rss_mb']} MB"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
