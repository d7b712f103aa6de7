"""Semantic memory at scale: ingest, search latency, save-to-searchable, memory.

    .venv/bin/python -m bench.bench_search [--users 1000] [--notes-per-user 100] [--searches 1000]

Starts a private redis-server (AOF everysec) and `engram serve` (Qdrant Edge, MiniLM) as
separate processes, then from this process:

1. floor: MiniLM's own batched encode rate (batches of 64) on the first 4,096 of the texts to
   ingest, in this process while the service is idle (its model loaded), with the service's
   encoder (ENGRAM_ENCODER, ONNX Runtime by default) and with PyTorch;
2. ingest: every user's notes as SaveNotes batches of 100, four callers at once; notes/s is
   counted until the index projection's checkpoint passes the last append;
3. memory: the serve process's RSS (and peak) with everything indexed;
4. search: sequential SearchNotes (top_k 5, query embedding included) for random users; then,
   with the service idle, the bare encode of the same queries one at a time in this process
   (the floors: PyTorch's, and the service's encoder). Not interleaved with the searches: torch's
   OpenMP threads spin on after an encode and would take the cores from the search after it;
5. save-to-searchable: while background callers save at a steady rate, a probe saves a note and
   at once searches with the save's token; the time from sending the save to the search reply
   that contains the note.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

import redis.asyncio as aioredis
from tqdm import tqdm

from bench.bench_core import pct, summary
from bench.bench_encoder import single
from bench.corpus import notes, question_text
from engram_ledger.contracts import channels
from engram_ledger.contracts.channels import IndexKeys
from engram_ledger.contracts.commands import NoteDraft
from engram_ledger.contracts.errors import EngramError
from engram_ledger.projections.index import live_index_generation
from engram_ledger.projections.tracking import position_key
from engram_ledger.services.adapters.minilm import Encoder, load_encoder
from engram_ledger.services.adapters.redis_server import RedisServer
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.config import Settings
from tests.support import ServeProcess, engram_env


def rss_mb(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


async def index_position(redis: aioredis.Redis) -> tuple[int, int]:
    raw = await redis.get(IndexKeys(0, await live_index_generation(redis, 0)).checkpoint)
    return position_key(raw) if raw else (0, 0)


async def warm_up(client: EngramClient) -> None:
    """Wait until the service has loaded its model and opened its index."""
    deadline = time.monotonic() + 120
    while True:
        try:
            await client.search("user-0", "warm up the model")
            return
        except EngramError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


def encode_floor(encoder: Encoder, texts: list[str]) -> float:
    encoder.encode(texts[:64])  # warm
    started = time.perf_counter()
    for i in range(0, len(texts), 64):
        encoder.encode(texts[i : i + 64])
    return len(texts) / (time.perf_counter() - started)


async def ingest(client: EngramClient, redis: aioredis.Redis, users: int, per_user: int) -> dict[str, float]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for u in range(users):
        queue.put_nowait(u)
    appended: list[tuple[tuple[int, int], int]] = []  # (log position of a batch, notes in it)

    async def caller() -> None:
        while not queue.empty():
            u = queue.get_nowait()
            texts = notes(u, per_user)
            for start in range(0, per_user, 100):
                drafts = [NoteDraft(content=t) for t in texts[start : start + 100]]
                reply = await client.save_many(f"user-{u}", drafts)
                fresh = sum(1 for n in reply.notes if not n.duplicate)
                appended.append((channels.parse_token(reply.token)[1], fresh))

    started = time.perf_counter()
    with tqdm(total=users * per_user, desc="indexed", unit="note") as bar:
        callers = asyncio.gather(*[caller() for _ in range(4)])
        while True:
            await asyncio.sleep(0.5)
            position = await index_position(redis)
            indexed = sum(n for at, n in appended if at <= position)
            bar.update(indexed - bar.n)
            if callers.done() and all(at <= position for at, _ in appended):
                break
        await callers
    elapsed = time.perf_counter() - started
    saved = sum(n for _, n in appended)
    return {"notes": saved, "seconds": round(elapsed, 1), "notes_per_s": round(saved / elapsed, 1)}


async def search_latency(client: EngramClient, users: int, n: int) -> tuple[list[float], list[str]]:
    rng = random.Random(7)
    searches, queries = [], []
    asked: set[str] = set()
    for i in range(n + 50):
        # Every query is new: the service keeps recent embeddings, and a repeated query would
        # measure that cache instead of the embedding.
        query = question_text(rng)
        while query in asked:
            query = question_text(rng)
        asked.add(query)
        user = f"user-{rng.randrange(users)}"
        t = time.perf_counter()
        reply = await client.search(user, query, top_k=5)
        took = (time.perf_counter() - t) * 1000
        assert reply.results, f"no results for {user}"
        if i >= 50:
            searches.append(took)
            queries.append(query)
    return searches, queries


async def save_to_searchable(client: EngramClient, seconds: float, rate: float, users: int) -> dict[str, object]:
    deadline = time.monotonic() + seconds
    rng = random.Random(11)
    background: list[float] = []
    probes: list[float] = []
    misses = 0

    async def one_save() -> None:
        t = time.perf_counter()
        await client.save(f"user-{rng.randrange(users)}", notes(rng.randrange(10**9), 1)[0])
        background.append((time.perf_counter() - t) * 1000)

    async def load() -> None:
        tasks = []
        while time.monotonic() < deadline:
            tasks.append(asyncio.create_task(one_save()))
            await asyncio.sleep(1 / rate)
        await asyncio.gather(*tasks)

    async def probe() -> None:
        nonlocal misses
        i = 0
        while time.monotonic() < deadline:
            text = f"probe {i}: my locker code at the climbing gym is {rng.randrange(10**6):06d}"
            question = "what is the code of my locker at the gym?"
            t = time.perf_counter()
            written = await client.save(f"probe-{i}", text, advise=False)
            reply = await client.search(f"probe-{i}", question, top_k=5, after=written.token)
            probes.append((time.perf_counter() - t) * 1000)
            misses += written.note_id not in [h.note_id for h in reply.results]
            i += 1
            await asyncio.sleep(0.1)

    await asyncio.gather(load(), probe())
    return {
        "background_saves_per_s": round(len(background) / seconds, 1),
        "background_save": summary(background),
        "save_to_searchable": summary(probes),
        "probe_misses": misses,
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--notes-per-user", type=int, default=100)
    parser.add_argument("--searches", type=int, default=1000)
    parser.add_argument("--steady-seconds", type=float, default=30)
    parser.add_argument("--steady-rate", type=float, default=20, help="background saves/s during the probe")
    args = parser.parse_args()
    env = Settings.from_env()
    cache = env.model_cache or Path(tempfile.gettempdir()) / "engram-bench-models"
    reference, encoder = load_encoder("torch", cache), load_encoder(env.encoder, cache)
    sample = [t for u in range(40) for t in notes(u, args.notes_per_user)][:4096]
    results: dict[str, object] = {"users": args.users, "notes_per_user": args.notes_per_user}
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        serve = ServeProcess(
            engram_env(
                ENGRAM_REDIS_URL=server.url,
                ENGRAM_DATA_DIR=tmp,
                ENGRAM_ENCODER=env.encoder,
                ENGRAM_MODEL_CACHE=str(cache),
            )
        ).start()
        assert serve.process is not None
        redis = aioredis.Redis.from_url(server.url)
        try:
            async with EngramClient(server.url, timeout=120) as client:
                await warm_up(client)
                results["rss_idle_mb"] = round(rss_mb(serve.process.pid)[0], 1)
                # Measured while the service is idle, so neither slows the other.
                floor_rate = encode_floor(encoder, sample)
                results["encoder"] = env.encoder
                results["encode_floor_notes_per_s"] = round(floor_rate, 1)
                results["torch_encode_floor_notes_per_s"] = round(encode_floor(reference, sample), 1)
                ingested = await ingest(client, redis, args.users, args.notes_per_user)
                ingested["ratio_to_floor"] = round(ingested["notes_per_s"] / floor_rate, 2)
                results["ingest"] = ingested
                rss, peak = rss_mb(serve.process.pid)
                results["rss_mb"], results["rss_peak_mb"] = round(rss, 1), round(peak, 1)
                searches, queries = await search_latency(client, args.users, args.searches)
                torch_floors, floors = single(reference, queries), single(encoder, queries)
                results["search"] = summary(searches)
                results["encode_floor"] = summary(floors)
                results["torch_encode_floor"] = summary(torch_floors)
                results["search_p50_over_floor"] = round(pct(searches, 0.5) / pct(floors, 0.5), 2)
                results["search_p50_over_torch_floor"] = round(pct(searches, 0.5) / pct(torch_floors, 0.5), 2)
                results["steady"] = await save_to_searchable(client, args.steady_seconds, args.steady_rate, args.users)
                results["rss_after_mb"] = round(rss_mb(serve.process.pid)[0], 1)
        finally:
            await redis.aclose()
            serve.stop()
            server.stop()
    ing = results["ingest"]
    print(
        f"encode floor (MiniLM batched, this process): {results['encode_floor_notes_per_s']} notes/s with "
        f"{results['encoder']}, {results['torch_encode_floor_notes_per_s']} notes/s with PyTorch"
    )
    print(
        f"ingest: {ing['notes']} notes in {ing['seconds']} s = {ing['notes_per_s']} notes/s indexed "  # type: ignore[index]
        f"({ing['ratio_to_floor']:.0%} of the floor)"  # type: ignore[index]
    )
    print(
        f"serve RSS: idle {results['rss_idle_mb']} MB, at {ing['notes']} notes {results['rss_mb']} MB "  # type: ignore[index]
        f"(peak {results['rss_peak_mb']} MB), after the steady run {results['rss_after_mb']} MB"
    )
    print(
        f"search: {results['search']}; bare encode of the same queries: {results['encoder']} "
        f"{results['encode_floor']} (search p50 {results['search_p50_over_floor']}x), PyTorch "
        f"{results['torch_encode_floor']} (search p50 {results['search_p50_over_torch_floor']}x)"
    )
    print(f"steady: {results['steady']}")
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
